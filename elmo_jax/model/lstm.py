"""Projected LSTM stacks, both directions at once.

Both directions run in one ``lax.scan``: every array carries a leading direction axis
``R = 2`` (0 = forward, 1 = backward).  The backward direction is given its input already
reversed (within each sequence's length), so for the scan both directions read left to
right.  Training feeds two different streams; inference feeds a sentence and its reversal.

Per layer and direction (gate order i, j, f, o along the last axis of the 4H gates)::

    z = x W_x + h_prev W_h + b
    c = sigmoid(f + 1.0) * c_prev + sigmoid(i) * tanh(j)        clip to +-cell_clip
    h = (sigmoid(o) * tanh(c)) W_p                               clip to +-proj_clip

The forget bias 1.0 is a constant of the computation, not a parameter.  ``x W_x`` for all
time steps is one matmul outside the scan; only ``h W_h`` and the projection run per step.
Layers after the first add their input to their output when ``use_skip_connections``.

Parameters: a list, one dict per layer::

    w_x [R, I, 4H]   w_h [R, P, 4H]   b [R, 4H]   w_p [R, H, P]

State (carried between windows or batches): ``{"h": [L, R, B, P], "c": [L, R, B, H]}``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from elmo_jax.config import ElmoConfig
from elmo_jax.model.chunks import from_chunks, to_chunks
from elmo_jax.model.platform import target_platform
from elmo_jax.model.precision import accumulator, einsum

N_DIRECTIONS = 2


def init_lstm(key: jax.Array, config: ElmoConfig) -> list[dict]:
    """Glorot-uniform kernels and zero biases, as TensorFlow's LSTMCell defaults."""
    l = config.lstm
    layers = []
    for k in jax.random.split(key, l.n_layers):
        kx, kh, kp = jax.random.split(k, 3)
        n_in = l.projection_dim
        # The reference kernel is one [I + P, 4H] matrix; Glorot bounds use its full shape.
        bound = (6.0 / (n_in + l.projection_dim + 4 * l.dim)) ** 0.5
        bound_p = (6.0 / (l.dim + l.projection_dim)) ** 0.5
        layers.append(
            {
                "w_x": jax.random.uniform(kx, (N_DIRECTIONS, n_in, 4 * l.dim), minval=-bound, maxval=bound),
                "w_h": jax.random.uniform(kh, (N_DIRECTIONS, l.projection_dim, 4 * l.dim), minval=-bound, maxval=bound),
                "b": jnp.zeros((N_DIRECTIONS, 4 * l.dim)),
                "w_p": jax.random.uniform(kp, (N_DIRECTIONS, l.dim, l.projection_dim), minval=-bound_p, maxval=bound_p),
            }
        )
    return layers


def zero_state(config: ElmoConfig, batch_size: int, dtype=jnp.float32) -> dict:
    """The all-zero LSTM state for ``batch_size`` rows in both directions."""
    l = config.lstm
    return {
        "h": jnp.zeros((l.n_layers, N_DIRECTIONS, batch_size, l.projection_dim), dtype),
        "c": jnp.zeros((l.n_layers, N_DIRECTIONS, batch_size, l.dim), dtype),
    }


def lstm_layer(
    layer: dict,
    config: ElmoConfig,
    x_RBTI: jax.Array,
    mask_RBT: jax.Array,
    h0_RBP: jax.Array,
    c0_RBH: jax.Array,
    dtype=jnp.float32,
    remat_steps: int = 0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One layer over time for both directions -> ``(h_RBTP, h_last_RBP, c_last_RBH)``.

    Where ``mask`` is 0 the state is carried through unchanged and the output is 0, so
    the final state is the state after each row's last real step.  ``x W_x + b`` for all
    steps is one matmul here; the recurrence is :func:`recurrence` (hand-written backward
    pass).  ``remat_steps > 0`` keeps only each chunk's inputs and first state for the
    backward pass and recomputes the rest (``jax.checkpoint`` per chunk of that many steps,
    input gates included), so the layer's backward memory is ``T x I`` inputs plus one
    chunk's activations instead of ``T x (4H + H + 2P)``; the results are identical.
    """
    l = config.lstm
    clips = (l.cell_clip, l.proj_clip, jnp.dtype(dtype))

    def input_gates(x_RBKI, mask_RBK):
        # The matmul in its natural layout, then one transpose to time-major: asking einsum
        # for "trbg" directly is 1.5-6x slower on XLA:CPU (it transposes inside the dot).
        gx_RBKG = einsum("rbti,rig->rbtg", x_RBKI, layer["w_x"], dtype) + layer["b"][:, None, None, :]
        gx_KRBG = jnp.moveaxis(gx_RBKG, 2, 0)
        return gx_KRBG, jnp.moveaxis(mask_RBK, -1, 0)[..., None].astype(gx_KRBG.dtype)

    n_time = x_RBTI.shape[2]
    if remat_steps <= 0 or n_time <= remat_steps:
        h_TRBP, h_last, c_last = recurrence(
            layer["w_h"], layer["w_p"], *input_gates(x_RBTI, mask_RBT), h0_RBP, c0_RBH, *clips
        )
        return jnp.moveaxis(h_TRBP, 0, 2), h_last, c_last

    # Chunks of remat_steps steps; padding steps have mask 0 and leave the state unchanged.
    # The input gates are computed inside the chunk, so the backward pass keeps only the
    # chunk's inputs [R, B, K, I] and its first state, not the 4H-wide gates.
    @functools.partial(jax.checkpoint, prevent_cse=False)
    def chunk(carry, xs):
        h_KRBP, h_last, c_last = recurrence(layer["w_h"], layer["w_p"], *input_gates(*xs), *carry, *clips)
        return (h_last, c_last), h_KRBP

    (h_last, c_last), h_NKRBP = jax.lax.scan(
        chunk, (h0_RBP, c0_RBH), (to_chunks(x_RBTI, 2, remat_steps), to_chunks(mask_RBT, 2, remat_steps))
    )
    h_TRBP = from_chunks(h_NKRBP, 0, n_time)
    return jnp.moveaxis(h_TRBP, 0, 2), h_last, c_last


def _cell(z_RBG, c_prev_RBH, cell_clip):
    """Gate activations and the new cell: ``(c_raw, c, (sigmoid i, tanh j, sigmoid f, sigmoid o))``."""
    i, j, f, o = jnp.split(z_RBG, 4, axis=-1)
    gates = (jax.nn.sigmoid(i), jnp.tanh(j), jax.nn.sigmoid(f + 1.0), jax.nn.sigmoid(o))
    c_raw = gates[2] * c_prev_RBH + gates[0] * gates[1]
    c = c_raw if cell_clip is None else jnp.clip(c_raw, -cell_clip, cell_clip)
    return c_raw, c, gates


def _clip_grad(x, g, bound):
    """Cotangent through ``jnp.clip(x, -bound, bound)`` (ties get half, as JAX's min/max)."""
    if bound is None:
        return g
    ax = jnp.abs(x)
    return jnp.where(ax < bound, g, jnp.where(ax == bound, 0.5 * g, 0.0))


def _step_fn(w_h, w_p, cell_clip, proj_clip, dtype, keep_residuals: bool):
    """One time step ``(carry, (gx, mask)) -> (carry, out)`` with the weights cast to ``dtype``."""
    w_h = w_h.astype(dtype)
    w_p = w_p.astype(dtype)

    def step(carry, inputs):
        h_RBP, c_RBH = carry
        gx_RBG, m_RB1 = inputs
        z = gx_RBG + einsum("rbp,rpg->rbg", h_RBP, w_h, dtype)
        _, c, gates = _cell(z, c_RBH, cell_clip)
        hp = einsum("rbh,rhp->rbp", gates[3] * jnp.tanh(c), w_p, dtype)
        h = hp if proj_clip is None else jnp.clip(hp, -proj_clip, proj_clip)
        keep = m_RB1 > 0
        new_carry = (jnp.where(keep, h, h_RBP), jnp.where(keep, c, c_RBH))
        out = jnp.where(keep, h, 0.0)
        return new_carry, ((out, z, h_RBP, c_RBH, hp) if keep_residuals else out)

    return step


def _recurrence_scan(w_h, w_p, gx_TRBG, mask_TRB1, h0_RBP, c0_RBH, cell_clip, proj_clip, dtype, keep_residuals: bool):
    step = _step_fn(w_h, w_p, cell_clip, proj_clip, dtype, keep_residuals)
    return jax.lax.scan(step, (h0_RBP, c0_RBH), (gx_TRBG, mask_TRB1))


def steps_in_use(mask_T_: jax.Array) -> jax.Array:
    """1 + the last time step (axis 0) whose mask is non-zero in any row; 0 if none is."""
    active_T = jnp.any(mask_T_ > 0, axis=tuple(range(1, mask_T_.ndim)))
    return jnp.max(jnp.where(active_T, jnp.arange(1, mask_T_.shape[0] + 1), 0), initial=0)


def _recurrence_active_steps(w_h, w_p, gx_TRBG, mask_TRB1, h0_RBP, c0_RBH, cell_clip, proj_clip, dtype):
    """:func:`_recurrence_scan` without residuals, stopping after the last step that any row
    uses: a step whose mask is 0 in every row leaves the state as it is and outputs 0, so
    the steps after the last active one are skipped instead of run (the padding of a length
    bucket: up to a third of the steps).  Same numbers as the scan; not differentiable (a
    ``while_loop`` with a computed trip count), so it serves the primal of :func:`recurrence`.
    """
    n_time = gx_TRBG.shape[0]
    if n_time == 0:
        return _recurrence_scan(w_h, w_p, gx_TRBG, mask_TRB1, h0_RBP, c0_RBH, cell_clip, proj_clip, dtype, False)
    step = _step_fn(w_h, w_p, cell_clip, proj_clip, dtype, False)
    n_steps = steps_in_use(mask_TRB1)
    carry0 = (h0_RBP, c0_RBH)
    out_aval = jax.eval_shape(step, carry0, (gx_TRBG[0], mask_TRB1[0]))[1]
    out0_TRBP = jnp.zeros((n_time,) + out_aval.shape, out_aval.dtype)

    def body(loop):
        t, carry, out_TRBP = loop
        carry, out = step(carry, (gx_TRBG[t], mask_TRB1[t]))
        return t + 1, carry, jax.lax.dynamic_update_index_in_dim(out_TRBP, out, t, 0)

    _, carry, out_TRBP = jax.lax.while_loop(lambda loop: loop[0] < n_steps, body, (0, carry0, out0_TRBP))
    return carry, out_TRBP


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def recurrence(w_h, w_p, gx_TRBG, mask_TRB1, h0_RBP, c0_RBH, cell_clip, proj_clip, dtype):
    """The LSTM recurrence given the input gates -> ``(h_TRBP, h_last_RBP, c_last_RBH)``.

    ``gx_TRBG`` is ``x W_x + b`` (time-major), ``mask_TRB1`` 1 for real steps.  Its backward
    pass is written out: a reverse scan that emits the gate cotangents of every step, after
    which the weight gradients are *one* matmul over all steps each
    (``dW_h = sum_t h_{t-1}^T dz_t``), instead of autodiff's rank-B update of the whole
    ``[P, 4H]`` gradient carried through every step (for ``original``, 32 MB of memory
    traffic per step and direction).  Equal to autodiff of the same scan to float rounding.
    Not differentiated (inference) on the CPU, it stops after the last step that any row
    uses (:func:`_recurrence_active_steps`).  Accelerators keep the scan: on an H200 the loop,
    whose trip count lives on the device, was 1.10-1.29x slower than the scan even with a
    quarter of the steps skipped (``benchmarks/step_skip.py``).
    """
    if target_platform() == "cpu":
        (h_last, c_last), h_TRBP = _recurrence_active_steps(
            w_h, w_p, gx_TRBG, mask_TRB1, h0_RBP, c0_RBH, cell_clip, proj_clip, dtype
        )
    else:
        (h_last, c_last), h_TRBP = _recurrence_scan(
            w_h, w_p, gx_TRBG, mask_TRB1, h0_RBP, c0_RBH, cell_clip, proj_clip, dtype, False
        )
    return h_TRBP, h_last, c_last


def _recurrence_fwd(w_h, w_p, gx_TRBG, mask_TRB1, h0_RBP, c0_RBH, cell_clip, proj_clip, dtype):
    # (Writing z over gx in place, as the backward pass does with dz, was tried: on a TPU, gx
    # comes in another layout than the loop's, and XLA copied it, which cost twice the zero
    # fill it saved.)
    (h_last, c_last), (h_TRBP, z, h_prev, c_prev, hp) = _recurrence_scan(
        w_h, w_p, gx_TRBG, mask_TRB1, h0_RBP, c0_RBH, cell_clip, proj_clip, dtype, True
    )
    residuals = (w_h, w_p, mask_TRB1, z, h_prev, c_prev, hp)
    return (h_TRBP, h_last, c_last), residuals


def _recurrence_bwd(cell_clip, proj_clip, dtype, residuals, cotangents):
    w_h, w_p, mask_TRB1, z_T, h_prev_T, c_prev_T, hp_T = residuals
    dh_out_TRBP, dh_last, dc_last = cotangents
    w_h_c = w_h.astype(dtype)
    w_p_c = w_p.astype(dtype)

    # The gate cotangents dz_t are written over z_t (read only by this step): a scan's stacked
    # output would be a new [T, R, B, 4H] buffer that XLA fills with zeros first (335 MB per
    # layer for `original` at 128 rows per chip).
    def step(carry, inputs):
        t, (dh_RBP, dc_RBH), z_TRBG = carry  # cotangents of the state carried out of this step
        dh_out, m, c_prev, hp = inputs
        z = z_TRBG[t]
        c_raw, c, (si, tj, sf, so) = _cell(z, c_prev, cell_clip)
        tc = jnp.tanh(c)
        dh_new = m * (dh_out + dh_RBP)  # the new h is both output and carry where m = 1
        dhp = _clip_grad(hp, dh_new, proj_clip)
        da = einsum("rbp,rhp->rbh", dhp, w_p_c, dtype)
        dc = m * dc_RBH + da * so * (1.0 - tc * tc)
        dc_raw = _clip_grad(c_raw, dc, cell_clip)
        dz = jnp.concatenate(
            [
                dc_raw * tj * si * (1.0 - si),
                dc_raw * si * (1.0 - tj * tj),
                dc_raw * c_prev * sf * (1.0 - sf),
                da * tc * so * (1.0 - so),
            ],
            axis=-1,
        )
        dh_prev = einsum("rbg,rpg->rbp", dz, w_h_c, dtype) + (1.0 - m) * dh_RBP
        dc_prev = dc_raw * sf + (1.0 - m) * dc_RBH
        return (t - 1, (dh_prev, dc_prev), jax.lax.dynamic_update_index_in_dim(z_TRBG, dz, t, 0)), (dhp, so * tc)

    (_, (dh0, dc0), dz_T), (dhp_T, a_T) = jax.lax.scan(
        step, (z_T.shape[0] - 1, (dh_last, dc_last), z_T), (dh_out_TRBP, mask_TRB1, c_prev_T, hp_T), reverse=True
    )
    dw_h = einsum("trbp,trbg->rpg", h_prev_T, dz_T, dtype).astype(w_h.dtype)
    dw_p = einsum("trbh,trbp->rhp", a_T, dhp_T, dtype).astype(w_p.dtype)
    return dw_h, dw_p, dz_T, jnp.zeros_like(mask_TRB1), dh0, dc0


recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def lstm_stack(
    layers: list[dict],
    config: ElmoConfig,
    x_RBTP: jax.Array,
    mask_RBT: jax.Array,
    state: dict | None = None,
    *,
    dropout_rate: float = 0.0,
    rng: jax.Array | None = None,
    dtype=jnp.float32,
    remat_steps: int = 0,
) -> tuple[list[jax.Array], dict]:
    """All layers, both directions -> (``[h_RBTP per layer]``, final state).

    Dropout (training only, needs ``rng``) is applied to each layer's input; the skip
    connection adds the dropped-out input, as the reference trainer does.  ``remat_steps``:
    see :func:`lstm_layer` (only matters when differentiating).
    """
    n_batch = x_RBTP.shape[1]
    if state is None:
        state = zero_state(config, n_batch, accumulator(dtype))
    outputs, hs, cs = [], [], []
    inputs = x_RBTP
    for n, layer in enumerate(layers):
        if dropout_rate > 0.0:
            assert rng is not None  # dropout needs one (train.step checks that it has one)
            rng, sub = jax.random.split(rng)
            inputs = dropout(sub, inputs, dropout_rate)
        h_RBTP, h_last, c_last = lstm_layer(
            layer,
            config,
            inputs,
            mask_RBT,
            state["h"][n],
            state["c"][n],
            dtype=dtype,
            remat_steps=remat_steps,
        )
        if n > 0 and config.lstm.use_skip_connections:
            h_RBTP = h_RBTP + inputs * mask_RBT[..., None]
        outputs.append(h_RBTP)
        hs.append(h_last)
        cs.append(c_last)
        inputs = h_RBTP
    return outputs, {"h": jnp.stack(hs), "c": jnp.stack(cs)}


def dropout(rng: jax.Array, x: jax.Array, rate: float) -> jax.Array:
    """Inverted dropout: zero with probability ``rate``, scale the rest by 1/(1-rate)."""
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)
