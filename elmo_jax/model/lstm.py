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

import jax
import jax.numpy as jnp

from elmo_jax.config import ElmoConfig
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
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One layer over time for both directions -> ``(h_RBTP, h_last_RBP, c_last_RBH)``.

    Where ``mask`` is 0 the state is carried through unchanged and the output is 0, so
    the final state is the state after each row's last real step.
    """
    l = config.lstm
    w_h = layer["w_h"].astype(dtype)
    w_p = layer["w_p"].astype(dtype)
    gx_TRBG = einsum("rbti,rig->trbg", x_RBTI, layer["w_x"], dtype) + layer["b"][None, :, None, :]
    mask_TRB1 = jnp.moveaxis(mask_RBT, -1, 0)[..., None].astype(bool)

    def step(carry, inputs):
        h_RBP, c_RBH = carry
        gx_RBG, m_RB1 = inputs
        z = gx_RBG + einsum("rbp,rpg->rbg", h_RBP, w_h, dtype)
        i, j, f, o = jnp.split(z, 4, axis=-1)
        c = jax.nn.sigmoid(f + 1.0) * c_RBH + jax.nn.sigmoid(i) * jnp.tanh(j)
        if l.cell_clip is not None:
            c = jnp.clip(c, -l.cell_clip, l.cell_clip)
        h = einsum("rbh,rhp->rbp", jax.nn.sigmoid(o) * jnp.tanh(c), w_p, dtype)
        if l.proj_clip is not None:
            h = jnp.clip(h, -l.proj_clip, l.proj_clip)
        h_out = jnp.where(m_RB1, h, 0.0)
        return (jnp.where(m_RB1, h, h_RBP), jnp.where(m_RB1, c, c_RBH)), h_out

    (h_last, c_last), h_TRBP = jax.lax.scan(step, (h0_RBP, c0_RBH), (gx_TRBG, mask_TRB1))
    return jnp.moveaxis(h_TRBP, 0, 2), h_last, c_last


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
) -> tuple[list[jax.Array], dict]:
    """All layers, both directions -> (``[h_RBTP per layer]``, final state).

    Dropout (training only, needs ``rng``) is applied to each layer's input; the skip
    connection adds the dropped-out input, as the reference trainer does.
    """
    n_batch = x_RBTP.shape[1]
    if state is None:
        state = zero_state(config, n_batch, accumulator(dtype))
    outputs, hs, cs = [], [], []
    inputs = x_RBTP
    for n, layer in enumerate(layers):
        if dropout_rate > 0.0:
            rng, sub = jax.random.split(rng)
            inputs = dropout(sub, inputs, dropout_rate)
        h_RBTP, h_last, c_last = lstm_layer(
            layer, config, inputs, mask_RBT, state["h"][n], state["c"][n], dtype=dtype
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

