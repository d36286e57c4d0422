import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax import ElmoConfig
from elmo_jax.model.heads import (
    component_head,
    component_head_init,
    components,
    scalar_mix,
    scalar_mix_init,
    scalar_mix_penalty,
)

TINY = ElmoConfig.preset("tiny")


def test_scalar_mix_equal_weights_is_average_times_gamma():
    layers = jax.random.normal(jax.random.key(0), (3, 2, 4, 8))
    params = scalar_mix_init(3, gamma=2.0)
    np.testing.assert_allclose(scalar_mix(params, layers), 2.0 * layers.mean(0), atol=1e-6)


def test_scalar_mix_softmax_weights_select_a_layer():
    layers = jax.random.normal(jax.random.key(0), (3, 2, 4, 8))
    params = {"scalars": jnp.array([0.0, 50.0, 0.0]), "gamma": jnp.array(1.0)}
    np.testing.assert_allclose(scalar_mix(params, layers), layers[1], atol=1e-5)
    assert float(scalar_mix_penalty(params)) == 2500.0


def test_scalar_mix_layer_norm_ignores_masked_positions():
    layers = jax.random.normal(jax.random.key(1), (3, 1, 5, 8)) * 4 + 3
    mask = jnp.array([[1, 1, 1, 0, 0]])
    garbage = layers.at[:, :, 3:].set(1e4)
    params = scalar_mix_init(3)
    a = scalar_mix(params, layers, mask, layer_norm=True)[:, :3]
    b = scalar_mix(params, garbage, mask, layer_norm=True)[:, :3]
    np.testing.assert_allclose(a, b, atol=1e-5)
    normed = (layers[0, :, :3] - layers[0, :, :3].mean()) / layers[0, :, :3].std()
    one = {"scalars": jnp.array([60.0, 0.0, 0.0]), "gamma": jnp.array(1.0)}
    np.testing.assert_allclose(scalar_mix(one, layers, mask, layer_norm=True)[:, :3], normed, atol=1e-4)


def test_scalar_mix_wrong_layer_count():
    with pytest.raises(ValueError, match="scalar_mix_init"):
        scalar_mix(scalar_mix_init(2), jnp.zeros((3, 1, 1, 4)))


def test_component_head_concatenates_five_components_times_one_matrix():
    p = TINY.projection_dim
    layers = jax.random.normal(jax.random.key(2), (3, 2, 4, 2 * p))
    params = component_head_init(jax.random.key(3), TINY)
    assert params["w"].shape == (5 * p, 512)
    x = components(layers)
    np.testing.assert_array_equal(x[..., :p], layers[0, ..., :p])  # token layer
    np.testing.assert_array_equal(x[..., p : 2 * p], layers[1, ..., :p])  # forward 1
    np.testing.assert_array_equal(x[..., 2 * p : 3 * p], layers[2, ..., :p])  # forward 2
    np.testing.assert_array_equal(x[..., 3 * p : 4 * p], layers[1, ..., p:])  # backward 1
    np.testing.assert_array_equal(x[..., 4 * p :], layers[2, ..., p:])  # backward 2
    out = component_head(params, layers)
    assert out.shape == (2, 4, 512)
    np.testing.assert_allclose(out, x @ params["w"], atol=1e-5)
    assert component_head_init(jax.random.key(3), TINY, out_dim=64)["w"].shape == (5 * p, 64)


def test_heads_jit_and_differentiate():
    layers = jax.random.normal(jax.random.key(4), (3, 2, 4, 2 * TINY.projection_dim))
    grads = jax.jit(jax.grad(lambda p: jnp.sum(scalar_mix(p, layers) ** 2)))(scalar_mix_init(3))
    assert np.isfinite(grads["scalars"]).all() and float(grads["gamma"]) != 0.0
    head = component_head_init(jax.random.key(5), TINY, out_dim=16)
    g = jax.jit(jax.grad(lambda p: jnp.sum(component_head(p, layers) ** 2)))(head)
    assert float(jnp.abs(g["w"]).max()) > 0
