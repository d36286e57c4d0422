"""``remat_steps`` in the training step: the same loss and gradients, far less memory.

The unoptimised path is ``remat_steps=0`` (every activation kept), and XLA's own
convolution gradient for the char CNN's hand-written one.  With ``remat_steps=k``
the char CNN, the LSTM (input gates included) and the sampled softmax run in chunks of
``k`` steps that are recomputed in the backward pass.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.config import PRESETS
from elmo_jax.model.encoder import conv1d, encode_tokens, encode_tokens_remat
from elmo_jax.model.lstm import zero_state
from elmo_jax.train.losses import make_loss_fn
from elmo_jax.train.step import init_train_state, lm_losses, make_optimizer, train_step

TINY = PRESETS["tiny"]
VOCAB, NEG = 300, 64


def _batch(B, T, seed=0):
    rng = np.random.default_rng(seed)
    C = TINY.char_cnn.max_characters_per_token
    batch = {}
    for d in ("fwd", "bwd"):
        ids = rng.integers(1, 262, (B, T, C)).astype(np.int32)
        ids[1, T - 3 :] = 0  # a row that ends early: padding tokens
        batch[f"{d}_char_ids"] = jnp.asarray(ids)
        batch[f"{d}_targets"] = jnp.asarray(rng.integers(0, VOCAB, (B, T)), jnp.int32)
        batch[f"{d}_mask"] = jnp.asarray(ids[..., 0] > 0, jnp.float32)
    return batch


def _rel(a, b):
    return float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))


def test_conv1d_backward_equals_autodiff_of_the_xla_convolution():
    """The hand-written convolution gradient (fast inside loops) against JAX's own."""
    x = jax.random.normal(jax.random.key(0), (5, 12, 4))
    for width in (1, 3, 7):
        w = jax.random.normal(jax.random.key(width), (width, 4, 6))
        ct = jax.random.normal(jax.random.key(10 + width), (5, 12 - width + 1, 6))

        def xla(x, w):
            return jax.lax.conv_general_dilated(x, w, (1,), "VALID", dimension_numbers=("NWC", "WIO", "NWC"))

        assert _rel(conv1d(x, w), xla(x, w)) <= 1e-6
        ours = jax.grad(lambda x, w: jnp.sum(conv1d(x, w) * ct), argnums=(0, 1))(x, w)  # noqa: B023 - called here
        ref = jax.grad(lambda x, w: jnp.sum(xla(x, w) * ct), argnums=(0, 1))(x, w)  # noqa: B023 - called here
        for a, b in zip(ours, ref):
            assert a.shape == b.shape and _rel(a, b) <= 1e-5


def test_encoder_in_recomputed_chunks_equals_the_plain_encoder():
    params = init_train_state(jax.random.key(0), TINY, VOCAB, make_optimizer("adagrad", 0.2, 1.0, 10.0))
    params = params["params"]["bilm"]
    ids = jnp.stack([_batch(3, 11)["fwd_char_ids"], _batch(3, 11, seed=1)["fwd_char_ids"]])
    f_plain = lambda p: encode_tokens(p, TINY, ids)  # noqa: E731
    f_remat = lambda p: encode_tokens_remat(p, TINY, ids, 4)  # noqa: E731  (11 = 4 + 4 + 3: a padded chunk)
    assert _rel(f_remat(params), f_plain(params)) <= 1e-6
    w = jax.random.normal(jax.random.key(5), f_plain(params).shape)
    g_plain = jax.jit(jax.grad(lambda p: jnp.sum(f_plain(p) * w)))(params)
    g_remat = jax.jit(jax.grad(lambda p: jnp.sum(f_remat(p) * w)))(params)
    for a, b in zip(jax.tree.leaves(g_remat), jax.tree.leaves(g_plain)):
        assert _rel(a, b) <= 1e-5


def test_loss_and_gradients_equal_the_unrematerialised_step():
    remat_steps = 3  # 10 = 3 + 3 + 3 + 1: the last chunk is padded
    B, T = 3, 10
    opt = make_optimizer("adagrad", 0.2, 1.0, 10.0)
    params = init_train_state(jax.random.key(0), TINY, VOCAB, opt)["params"]
    loss_fn = make_loss_fn(VOCAB, NEG).fn  # sampled softmax: VOCAB > NEG
    batch = _batch(B, T)
    state = jax.tree.map(lambda s: s + 0.1, zero_state(TINY, B))  # a carried, non-zero state

    def objective(p, k):
        return lm_losses(
            p,
            TINY,
            batch,
            state,
            loss_fn,
            sample_rng=jax.random.key(1),
            dropout_rng=jax.random.key(2),
            dropout_rate=0.1,
            remat_steps=k,
        )

    vg = jax.jit(jax.value_and_grad(objective, has_aux=True), static_argnums=1)
    (l0, (s0, m0)), g0 = vg(params, 0)
    (l1, (s1, m1)), g1 = vg(params, remat_steps)
    assert abs(float(l1 - l0)) <= 1e-5 * abs(float(l0))
    for a, b in zip(jax.tree.leaves((s1, m1, g1)), jax.tree.leaves((s0, m0, g0))):
        assert _rel(a, b) <= 1e-5


def test_remat_keeps_training_memory_nearly_flat_in_the_window_length():
    """Compiled temp memory of the whole train_step (XLA's own accounting, no run needed)."""
    B = 4
    opt = make_optimizer("adagrad", 0.2, 1.0, 10.0)
    loss_fn = make_loss_fn(VOCAB, NEG).fn
    state = jax.eval_shape(lambda: init_train_state(jax.random.key(0), TINY, VOCAB, opt))
    lstm_state = jax.eval_shape(lambda: zero_state(TINY, B))
    key = jax.random.key(0)

    def temp_mb(T, k):
        batch = jax.eval_shape(lambda: _batch(B, T))
        step = jax.jit(
            functools.partial(train_step, config=TINY, optimizer=opt, loss_fn=loss_fn, dropout_rate=0.1, remat_steps=k)
        )
        return step.lower(state, lstm_state, batch, key, key).compile().memory_analysis().temp_size_in_bytes / 2**20

    plain_128, remat_16, remat_128 = temp_mb(128, 0), temp_mb(16, 8), temp_mb(128, 8)
    assert remat_128 < 0.25 * plain_128  # a fraction of what the plain step needs
    assert remat_128 < 2.0 * remat_16  # and nearly flat: 8x the length, < 2x the memory
