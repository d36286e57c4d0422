"""The LSTM recurrence's hand-written backward pass and its rematerialised form.

Reference: JAX's own autodiff of the same scan (``_recurrence_scan``), which is the
unoptimised path.  Inputs are scaled so that both clips (cell and projection) are active,
rows have different lengths and the initial state is non-zero.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax.config import PRESETS
from elmo_jax.model import lstm as L
from elmo_jax.model.bilm import bilm, init_params
from tests.conftest import assert_close_across_programs

TINY = PRESETS["tiny"]
R, B, T = 2, 3, 9


def _inputs(config, scale=3.0):
    P, H = config.lstm.projection_dim, config.lstm.dim
    layer = L.init_lstm(jax.random.key(0), config)[0]
    # large weights and a positive forget bias saturate the cell and the projection
    layer = {
        **layer,
        "w_x": layer["w_x"] * scale,
        "w_p": layer["w_p"] * 4 * scale,
        "b": layer["b"].at[..., 2 * config.lstm.dim : 3 * config.lstm.dim].set(scale),
    }
    x = jax.random.normal(jax.random.key(1), (R, B, T, P)) * scale
    lengths = np.array([T, 5, 2])
    mask = jnp.asarray(np.arange(T)[None, :] < lengths[:, None])
    mask = jnp.stack([mask, mask[::-1]])  # the two directions get different rows
    h0 = jax.random.normal(jax.random.key(2), (R, B, P)) * 0.5
    c0 = jax.random.normal(jax.random.key(3), (R, B, H)) * 0.5
    return layer, x, mask, h0, c0


def _objective(config, mask, *, reference, remat_steps=0, dtype=jnp.float32):
    def f(layer, x, h0, c0):
        if reference:
            l = config.lstm
            gx = L.einsum("rbti,rig->trbg", x, layer["w_x"], dtype) + layer["b"][None, :, None, :]
            m = jnp.moveaxis(mask, -1, 0)[..., None].astype(gx.dtype)
            (h_last, c_last), h = L._recurrence_scan(
                layer["w_h"], layer["w_p"], gx, m, h0, c0, l.cell_clip, l.proj_clip, jnp.dtype(dtype), False
            )
            h = jnp.moveaxis(h, 0, 2)
        else:
            h, h_last, c_last = L.lstm_layer(layer, config, x, mask, h0, c0, dtype=dtype, remat_steps=remat_steps)
        weights = (jnp.arange(h.size).reshape(h.shape) % 7 - 3.0) / 3.0
        # every output reaches the loss: the sequence, the final h and the final c
        return jnp.sum(h * weights) + jnp.sum(h_last**2) + jnp.sum(jnp.sin(c_last)), h

    return f


def _rel_err(a, b):
    return float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))


@pytest.mark.fidelity
@pytest.mark.parametrize("remat_steps", [0, 2, 4, 8])
def test_handwritten_backward_equals_autodiff(remat_steps):
    layer, x, mask, h0, c0 = _inputs(TINY)
    fast = _objective(TINY, mask, reference=False, remat_steps=remat_steps)
    ref = _objective(TINY, mask, reference=True)
    (v1, h1), g1 = jax.value_and_grad(fast, argnums=(0, 1, 2, 3), has_aux=True)(layer, x, h0, c0)
    (v2, h2), g2 = jax.value_and_grad(ref, argnums=(0, 1, 2, 3), has_aux=True)(layer, x, h0, c0)
    # two programs (the handwritten scan, the reference one): equal up to float32 rounding, which
    # is 1e-7-1e-6 here and moves with the machine code (1.5e-6 without LLVM's optimisation)
    assert _rel_err(h1, h2) <= 1e-5
    assert abs(float(v1 - v2)) <= 1e-5 * abs(float(v2))
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        assert float(jnp.max(jnp.abs(b))) > 0.0
        assert _rel_err(a, b) <= 1e-5
    # the clips were exercised (otherwise the test would not cover their gradients)
    assert float(jnp.max(jnp.abs(h1))) == pytest.approx(TINY.lstm.proj_clip)
    _, _, c_last = L.lstm_layer(layer, TINY, x, mask, h0, c0)
    assert float(jnp.max(jnp.abs(c_last))) == pytest.approx(TINY.lstm.cell_clip)


def test_clip_free_config_and_padding_steps_pass_state_through():
    config = dataclasses.replace(TINY, lstm=dataclasses.replace(TINY.lstm, cell_clip=None, proj_clip=None))
    layer, x, mask, h0, c0 = _inputs(config, scale=1.0)
    g1 = jax.grad(lambda *a: _objective(config, mask, reference=False, remat_steps=4)(*a)[0], argnums=(0, 1, 2, 3))(
        layer, x, h0, c0
    )
    g2 = jax.grad(lambda *a: _objective(config, mask, reference=True)(*a)[0], argnums=(0, 1, 2, 3))(layer, x, h0, c0)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        assert _rel_err(a, b) <= 1e-5
    # a row that is all padding returns its initial state and no gradient to its inputs
    empty = jnp.zeros_like(mask)
    h, h_last, c_last = L.lstm_layer(layer, config, x, empty, h0, c0)
    np.testing.assert_array_equal(np.asarray(h_last), np.asarray(h0))
    np.testing.assert_array_equal(np.asarray(c_last), np.asarray(c0))
    assert not np.asarray(h).any()


@pytest.mark.fidelity
def test_inference_skips_steps_no_row_uses_with_the_scans_numbers():
    """On the CPU the primal recurrence stops after the last step any row uses; its outputs, final
    state and zeros past each row's end equal the full scan's exactly, also with a step in
    the middle that no row uses and with no step used at all."""
    layer, x, mask, h0, c0 = _inputs(TINY)
    l = TINY.lstm
    gx = L.einsum("rbti,rig->trbg", x, layer["w_x"], jnp.float32) + layer["b"][None, :, None, :]
    m_full = np.ones((T, R, B, 1), np.float32)
    trailing = m_full.copy()
    trailing[6:] = 0.0  # the last 3 steps are padding in every row (a length bucket)
    trailing[5:, 0, 1] = 0.0
    trailing[4:, 1, 2] = 0.0  # rows of different lengths
    hole = trailing.copy()
    hole[3] = 0.0  # no row uses step 3, later steps are used
    for m in (m_full, trailing, hole, np.zeros_like(m_full)):
        m = jnp.asarray(m)
        args = (layer["w_h"], layer["w_p"], gx, m, h0, c0, l.cell_clip, l.proj_clip, jnp.dtype(jnp.float32))
        fast = jax.jit(L.recurrence, static_argnums=(6, 7, 8))(*args)
        (h_last, c_last), h = jax.jit(L._recurrence_scan, static_argnums=(6, 7, 8, 9))(*args, False)
        for a, b in zip(fast, (h, h_last, c_last)):  # two programs: equal up to rounding
            assert_close_across_programs(a, b)
        assert not np.asarray(fast[0])[np.asarray(m[..., 0]) == 0].any()
    # the loop's trip count: the last step any row uses, not the array's length
    assert [int(L.steps_in_use(jnp.asarray(m))) for m in (m_full, trailing, hole, 0 * m_full)] == [T, 6, 6, 0]
    # no time steps at all, or no rows: empty outputs and the state passed through
    for n_time, n_rows in ((0, B), (T, 0)):
        m = jnp.ones((n_time, R, n_rows, 1))
        h0_, c0_ = h0[:, :n_rows], c0[:, :n_rows]
        h, h_last, c_last = L.recurrence(
            layer["w_h"],
            layer["w_p"],
            gx[:n_time, :, :n_rows],
            m,
            h0_,
            c0_,
            l.cell_clip,
            l.proj_clip,
            jnp.dtype(jnp.float32),
        )
        assert h.shape == (n_time, R, n_rows, l.projection_dim)
        np.testing.assert_array_equal(np.asarray(h_last), np.asarray(h0_))
        np.testing.assert_array_equal(np.asarray(c_last), np.asarray(c0_))


def test_bfloat16_stays_within_documented_tolerance():
    """bf16 matmuls (f32 params, cell state and accumulation): outputs within 2e-2 of f32.

    Documented in the README (section "Speed"): the biLM's layers move by at most ~1 % of
    their largest value on random tiny weights.
    """
    params = init_params(jax.random.key(7), TINY)
    ids = jax.random.randint(jax.random.key(8), (4, 12, TINY.char_cnn.max_characters_per_token), 1, 260)
    f32, _ = jax.jit(lambda p: bilm(p, TINY, ids))(params)
    b16, _ = jax.jit(lambda p: bilm(p, TINY, ids, dtype=jnp.bfloat16))(params)
    assert b16.dtype == jnp.float32
    err = _rel_err(b16, f32)
    assert 0.0 < err <= 2e-2
