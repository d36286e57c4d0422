import json

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax import ElmoConfig, batch_to_ids
from elmo_jax.model.bilm import add_boundary_vectors, bilm, init_params, marker_vectors, reverse_within_length
from elmo_jax.model.encoder import encode_tokens
from elmo_jax.model.lstm import lstm_stack
from elmo_jax.formats.hdf5 import load_weights

TINY = ElmoConfig.preset("tiny")
forward = jax.jit(bilm, static_argnums=1)


@pytest.mark.fidelity
def test_parity_with_reference_trainer_stateful(bilm_fixtures):
    """The 10 batches of 3 sentences, state carried, against bilm-tf's own outputs."""
    model = bilm_fixtures / "model"
    cfg = ElmoConfig.from_json_file(model / "options.json")
    params = load_weights(model / "lm_weights.hdf5", cfg)
    sentences = json.loads((model / "lm_embeddings_sentences.json").read_text())
    expected = [h5py.File(model / f"lm_embeddings_{k}.hdf5", "r") for k in range(3)]
    p = cfg.projection_dim
    state = None
    for i in range(10):
        batch = [sentences[k][i].split(" ") for k in range(3)]
        layers, state = forward(params, cfg, batch_to_ids(batch), state)
        for k in range(3):
            top = np.asarray(layers[-1, k, : len(batch[k])])
            got = np.stack([top[:, :p], top[:, p:]])
            want = expected[k][str(i)][...]
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=f"batch {i} sentence {k}")


def test_stateless_differs_from_stateful(bilm_fixtures):
    model = bilm_fixtures / "model"
    cfg = ElmoConfig.from_json_file(model / "options.json")
    params = load_weights(model / "lm_weights.hdf5", cfg)
    ids = batch_to_ids([["a", "b"], ["c"]])
    first, state = forward(params, cfg, ids)
    again, _ = forward(params, cfg, ids)
    carried, _ = forward(params, cfg, ids, state)
    np.testing.assert_array_equal(np.asarray(first), np.asarray(again))
    assert np.abs(np.asarray(carried) - np.asarray(first))[1:].max() > 1e-4


def test_padding_invariance_both_directions():
    params = init_params(jax.random.key(1), TINY)
    short = ["the", "bank", "of", "it"]
    alone, _ = forward(params, TINY, batch_to_ids([short]))
    batch, _ = forward(params, TINY, batch_to_ids([["x"] * 9, short, ["y"] * 13], max_length=16))
    np.testing.assert_allclose(np.asarray(batch[:, 1, :4]), np.asarray(alone[:, 0]), atol=1e-6, rtol=0)
    assert not np.asarray(batch[:, 1, 4:]).any()
    assert batch.shape == (3, 3, 16, 64)


def test_backward_stack_is_forward_machinery_on_reversed_sentence():
    params = init_params(jax.random.key(2), TINY)
    tokens = ["w1", "w2", "w3", "w4", "w5"]
    layers, _ = forward(params, TINY, batch_to_ids([tokens]))
    # Run the backward parameters as direction 0 on the reversed token sequence.
    swapped = jax.tree.map(lambda a: a[::-1], params["lstm"])
    e = add_boundary_vectors(
        encode_tokens(params, TINY, jnp.asarray(batch_to_ids([tokens]))), jnp.array([5]), *marker_vectors(params, TINY)
    )
    reversed_e = e[:, ::-1]
    mask = jnp.ones((2, 1, 7), bool)
    outs, _ = lstm_stack(swapped, TINY, jnp.stack([reversed_e, reversed_e]), mask)
    p = TINY.projection_dim
    for n, h in enumerate(outs):
        expected_bwd = np.asarray(h[0, 0, ::-1][1:6])
        np.testing.assert_allclose(np.asarray(layers[n + 1, 0, :, p:]), expected_bwd, atol=1e-6)


def test_reverse_within_length_is_an_involution():
    x = jnp.arange(12).reshape(2, 6)
    lengths = jnp.array([4, 6])
    r = reverse_within_length(x, lengths)
    assert r.tolist() == [[3, 2, 1, 0, 4, 5], [11, 10, 9, 8, 7, 6]]
    assert reverse_within_length(r, lengths).tolist() == x.tolist()


def test_layer_zero_is_token_encoding_duplicated_and_context_free():
    params = init_params(jax.random.key(3), TINY)
    layers, _ = forward(params, TINY, batch_to_ids([["bank", "river"], ["money", "bank"]]))
    layers = np.asarray(layers)
    p = TINY.projection_dim
    np.testing.assert_array_equal(layers[0, ..., :p], layers[0, ..., p:])
    np.testing.assert_allclose(layers[0, 0, 0], layers[0, 1, 1], atol=1e-6)
    assert np.abs(layers[2, 0, 0] - layers[2, 1, 1]).max() > 1e-3


def test_gradients_finite_and_match_finite_differences():
    with jax.enable_x64(True):
        params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), init_params(jax.random.key(4), TINY))
        ids = jnp.asarray(batch_to_ids([["a", "bank", "."], ["of", "river"]]))
        proj = jax.random.normal(jax.random.key(5), (3, 2, 3, TINY.output_dim), jnp.float64)

        def scalar(p):
            layers, _ = bilm(p, TINY, ids, dtype=jnp.float64)
            return jnp.sum(jnp.tanh(layers) * proj)

        grads = jax.jit(jax.grad(scalar))(params)
        assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
        leaves, treedef = jax.tree.flatten(params)
        direction = [
            jax.random.normal(k, l.shape, jnp.float64)
            for k, l in zip(jax.random.split(jax.random.key(6), len(leaves)), leaves)
        ]
        direction[0] = direction[0].at[0].set(0.0)  # the padding row is constant
        tangent = jax.tree.unflatten(treedef, direction)
        eps = 1e-6
        plus = jax.tree.map(lambda a, d: a + eps * d, params, tangent)
        minus = jax.tree.map(lambda a, d: a - eps * d, params, tangent)
        value = jax.jit(scalar)  # one compile for both points
        numeric = (value(plus) - value(minus)) / (2 * eps)
        analytic = sum(jnp.sum(g * d) for g, d in zip(jax.tree.leaves(grads), direction))
        np.testing.assert_allclose(float(analytic), float(numeric), rtol=1e-5)
        assert abs(float(analytic)) > 1e-3
