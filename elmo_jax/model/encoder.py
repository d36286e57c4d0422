"""The character-CNN token encoder: char ids -> one context-free vector per token.

``char ids [..., C] -> char embeddings [..., C, D] -> convolutions (VALID, bias) ->
max over positions -> activation -> concat [..., F] -> highway x n -> projection [..., P]``

A vocabulary model (``config.vocab``, e.g. ELMoForManyLangs) reads ``[word id, char ids]``
(``[..., 1 + C]``); with a word table its word vector ``[..., W]`` is put in front of the
highway output before the projection (``[W + F] -> [P]``).

Parameters (a plain dict pytree, see :func:`init_encoder`)::

    char_embed  [262, D]                 row 0 is the padding row (kept at zero);
                                         [n_chars + 1, D] for a vocabulary model
    word_embed  [n_words + 1, W]         vocabulary models with a word table only; row 0 padding
    cnn         list of {w: [width, D, n], b: [n]}
    highway     list of {w_carry, w_transform: [F, F], b_carry, b_transform: [F]}
    proj        {w: [W + F, P], b: [P]}  when W + F != P, and always for a vocabulary model
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax import chars
from elmo_jax.config import ElmoConfig
from elmo_jax.model.chunks import from_chunks, to_chunks
from elmo_jax.model.platform import target_platform
from elmo_jax.model.precision import accumulator, einsum, product_dtype

_ACTIVATIONS = {"relu": jax.nn.relu, "tanh": jnp.tanh}


def init_encoder(key: jax.Array, config: ElmoConfig) -> dict:
    """Fresh encoder parameters, initialised as the reference trainer does."""
    c = config.char_cnn
    f = c.n_filters
    keys = iter(jax.random.split(key, 3 + len(c.filters) + 2 * c.n_highway + (config.word_dim > 0)))
    n_rows = chars.N_CHARS if config.vocab is None else c.n_characters
    table = jax.random.uniform(next(keys), (n_rows, c.embedding_dim), minval=-1.0, maxval=1.0)
    table = table.at[0].set(0.0)
    cnn = []
    for width, n in c.filters:
        shape = (width, c.embedding_dim, n)
        if c.activation == "relu":
            w = jax.random.uniform(next(keys), shape, minval=-0.05, maxval=0.05)
        else:
            w = jax.random.normal(next(keys), shape) * np.sqrt(1.0 / (width * c.embedding_dim))
        cnn.append({"w": w, "b": jnp.zeros((n,))})
    highway = []
    for _ in range(c.n_highway):
        std = np.sqrt(1.0 / f)
        highway.append(
            {
                "w_carry": jax.random.normal(next(keys), (f, f)) * std,
                "b_carry": jnp.full((f,), -2.0),
                "w_transform": jax.random.normal(next(keys), (f, f)) * std,
                "b_transform": jnp.zeros((f,)),
            }
        )
    params = {"char_embed": table, "cnn": cnn, "highway": highway}
    if config.word_dim:
        assert config.vocab is not None  # word_dim is 0 without one
        words = jax.random.uniform(next(keys), (config.vocab.n_words + 1, config.word_dim), minval=-0.25, maxval=0.25)
        params["word_embed"] = words.at[0].set(0.0)
    if config.has_char_projection:
        p, f = config.projection_dim, config.projection_input_dim
        params["proj"] = {
            "w": jax.random.normal(next(keys), (f, p)) * np.sqrt(1.0 / f),
            "b": jnp.zeros((p,)),
        }
    return params


def encode_tokens(
    params: dict,
    config: ElmoConfig,
    char_ids: jax.Array,
    dtype=jnp.float32,
    in_loop: bool = False,
    trim_levels: tuple[int, ...] | None = None,
) -> jax.Array:
    """Token vectors ``[..., P]`` for char ids ``[..., C]`` (any leading shape).

    A token whose ids are all 0 (padding) gets a well-defined but meaningless vector;
    callers mask it.  ``dtype`` is the compute dtype of the matmuls (accumulation is f32).
    ``in_loop=True`` differentiates the convolutions with :func:`conv1d`'s hand-written
    gradient, for use inside ``lax`` loops; at top level XLA's own is ~8 % faster.

    On the CPU the convolutions and their max-pool run over :data:`CNN_CHUNK_TOKENS` tokens
    at a time (see there); the highway layers and the projection always see all tokens.
    ``trim_levels``: the char counts the convolutions may be cut to (default
    :data:`TRIM_LEVELS`; differentiated passes use :data:`GRAD_TRIM_LEVELS`).
    """
    if char_ids.ndim > 3 and target_platform() != "cpu":
        # Rows split over devices ([..., B, T, C]) stay split only if no leading axis is
        # merged into them: a [R, B, T] -> [N] flatten made XLA gather every device's rows
        # and run the whole global batch's CNN on each device.  One pass per leading slice.
        return jnp.stack([encode_tokens(params, config, x, dtype, in_loop, trim_levels) for x in char_ids])
    levels = TRIM_LEVELS if trim_levels is None else tuple(trim_levels)
    if not all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in levels):
        raise ValueError(f"trim_levels must be char counts (integers), got {trim_levels!r}")
    lead = char_ids.shape[:-1]
    ids_NC = char_ids.reshape(-1, char_ids.shape[-1])
    if config.vocab is not None:  # [word id, chars]: the word column is read after the highways
        word_N, ids_NC = ids_NC[:, 0], ids_NC[:, 1:]
    chunk = cnn_chunk_tokens(ids_NC.shape[0])
    if chunk:
        # Tokens sorted by the chars they need, so that each chunk is trimmed to its own
        # longest word (TRIM_LEVELS); chunks run in a loop, where only conv1d's own
        # gradient is fast (see conv1d).
        need_N = chars_needed(ids_NC, config)
        order_N = jnp.argsort(need_N)
        h_MKF = jax.lax.map(
            lambda xs: _char_cnn_trimmed(params, config, xs[0], xs[1], dtype, conv1d, levels),  # (ids, need) per chunk
            (to_chunks(ids_NC[order_N], 0, chunk), to_chunks(need_N[order_N], 0, chunk)),
        )
        h_NF = _unsort_rows(from_chunks(h_MKF, 0, ids_NC.shape[0]), order_N)
    else:
        h_NF = _char_cnn_trimmed(
            params, config, ids_NC, chars_needed(ids_NC, config), dtype, conv1d if in_loop else _conv, levels
        )
    for hw in params["highway"]:
        hd = h_NF.astype(dtype)
        carry = jax.nn.sigmoid(_dense(hd, hw["w_carry"], dtype) + hw["b_carry"])
        transform = jax.nn.relu(_dense(hd, hw["w_transform"], dtype) + hw["b_transform"])
        h_NF = carry * transform + (1.0 - carry) * h_NF
    if config.word_dim:
        words_NW = jnp.asarray(params["word_embed"])[word_N] * (word_N > 0)[:, None]
        h_NF = jnp.concatenate([words_NW.astype(h_NF.dtype), h_NF], axis=-1)
    if "proj" in params:
        h_NF = _dense(h_NF.astype(dtype), params["proj"]["w"], dtype) + params["proj"]["b"]
    return h_NF.reshape(*lead, h_NF.shape[-1])


CNN_CHUNK_TOKENS = 32
"""Tokens per pass of the convolutions on the CPU.

The convolution outputs (``[tokens, C - w + 1, filters]``, 400 kB per token with the
standard filters) are only max-pooled, so computing them for a few tokens at a time keeps
them in the cache instead of writing and re-reading them from memory: measured on the
2-core benchmark machine, the ``small`` encoder on 1,280 tokens went from 399 to 264 ms
(chunks of 16: 271, 64: 280, 128: 285).  Accelerators get no chunking: there one big
convolution fills the device and a loop of small ones would not.
"""


def cnn_chunk_tokens(n_tokens: int) -> int:
    """Chunk size for :func:`encode_tokens`' convolutions over ``n_tokens``; 0 = one pass."""
    if target_platform() != "cpu" or n_tokens < 2 * CNN_CHUNK_TOKENS:
        return 0
    return CNN_CHUNK_TOKENS


TRIM_LEVELS = (12, 16, 20, 24)
"""Char positions the convolutions may be cut to when every token of a pass is short enough.

A token's char ids end in a run of one repeated id (the padding char; 0 for a padding
token), and every convolution window inside that run gives the same output, so the
max-pool needs the positions up to the run's start plus one window inside it: the first
``L + w`` chars (:func:`chars_needed`), where ``L`` is where the run starts and ``w`` the
widest filter.  A pass runs its convolutions on the first ``n`` positions for the
smallest level ``n`` that holds every one of its tokens (``n = 12``: tokens of up to 3
bytes with the standard widths; 16: 7 bytes; 20: 11; 24: 15), on all of them otherwise;
the choice is a ``lax.switch``, so shapes stay static and the result is the same.  Levels
not above the widest filter or not below ``max_characters_per_token`` are skipped.  On
the CPU the chunks of :data:`CNN_CHUNK_TOKENS` tokens are formed after sorting the tokens
by this need, so most chunks hold only short words and take a low level.
"""

GRAD_TRIM_LEVELS = (24,)
"""The levels for passes that are differentiated (training): under ``jax.grad`` every
branch of the ``lax.switch`` writes the residuals of all branches, so more levels made the
``small`` training step slower (6.1 -> 6.8 s at 128 x 20) and its compile longer (7.6 ->
13 s) on the 2-core benchmark machine; one level plus the full width is what it had before.
"""


def _widest_filter(config: ElmoConfig) -> int:
    return max(width for width, _ in config.char_cnn.filters)


def chars_needed(ids_NC: jax.Array, config: ElmoConfig) -> jax.Array:
    """Per token ``[N]``: how many leading chars the convolutions need (see :data:`TRIM_LEVELS`)."""
    pos_C = jnp.arange(1, ids_NC.shape[-1] + 1)
    run_start_N = jnp.max(jnp.where(ids_NC != ids_NC[:, -1:], pos_C, 0), axis=-1, initial=0)
    return run_start_N + _widest_filter(config)


def _char_cnn_trimmed(
    params: dict, config: ElmoConfig, ids_NC: jax.Array, need_N: jax.Array, dtype, conv_fn, trim_levels: tuple[int, ...]
) -> jax.Array:
    """:func:`_char_cnn` on the first chars only, as many as the pass's tokens need
    (``need_N`` from :func:`chars_needed`; the smallest of ``trim_levels`` that holds them
    all, else all)."""
    n_chars = ids_NC.shape[-1]
    levels = sorted(n for n in trim_levels if _widest_filter(config) < n < n_chars)
    if not levels:
        return _char_cnn(params, config, ids_NC, dtype, conv_fn)
    need = jnp.max(need_N, initial=0)
    branches = [
        functools.partial(lambda n, ids: _char_cnn(params, config, ids[:, :n], dtype, conv_fn), n)
        for n in levels + [n_chars]
    ]
    return jax.lax.switch(jnp.sum(need > jnp.asarray(levels)), branches, ids_NC)


def _char_cnn(params: dict, config: ElmoConfig, ids_NC: jax.Array, dtype, conv_fn) -> jax.Array:
    """Char embeddings, convolutions, max over positions, activation -> ``[N, F]``."""
    # Multiplying by the mask keeps row 0 out of both the output and its gradient.
    x_NCD = (jnp.asarray(params["char_embed"])[ids_NC] * (ids_NC > 0)[..., None]).astype(dtype)
    act = _ACTIVATIONS[config.char_cnn.activation]
    pooled = []
    for conv in params["cnn"]:
        w_KDn = conv["w"].astype(dtype)
        if target_platform() == "cpu":
            max_Nn = jnp.max(conv_fn(x_NCD, w_KDn, product_dtype(dtype)), axis=1)
        else:
            max_Nn = conv_max(x_NCD, w_KDn, product_dtype(dtype))
        pooled.append(act(max_Nn.astype(accumulator(dtype)) + conv["b"]))
    return jnp.concatenate(pooled, axis=-1)


def _conv(x_NCD: jax.Array, w_KDn: jax.Array, out_dtype) -> jax.Array:
    return jax.lax.conv_general_dilated(
        x_NCD,
        w_KDn,
        window_strides=(1,),
        padding="VALID",
        dimension_numbers=("NWC", "WIO", "NWC"),
        preferred_element_type=out_dtype,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def conv1d(x_NCD: jax.Array, w_KDn: jax.Array, out_dtype=None) -> jax.Array:
    """VALID 1-D convolution over the characters -> ``[N, C - K + 1, n]``.

    Its backward pass is written with a forward convolution (input gradient: the output
    gradient against the flipped kernel) and one matmul per kernel offset (weight
    gradient) instead of XLA's convolution-gradient ops: the same numbers (to 3e-7) and 30x
    faster inside a loop, where XLA:CPU runs those gradient ops on a slow path (the
    rematerialised encoder runs in a ``lax.map``); at top level it is ~8 % slower, so
    :func:`encode_tokens` uses it only when told it runs in a loop.
    """
    return _conv(x_NCD, w_KDn, out_dtype)


def _conv1d_fwd(x_NCD, w_KDn, out_dtype):
    return _conv(x_NCD, w_KDn, out_dtype), (x_NCD, w_KDn)


def _conv1d_bwd(out_dtype, residuals, dy_NWn):
    x_NCD, w_KDn = residuals
    K, W = w_KDn.shape[0], dy_NWn.shape[1]
    dy = dy_NWn.astype(x_NCD.dtype)
    dx_NCD = _conv(jnp.pad(dy, ((0, 0), (K - 1, K - 1), (0, 0))), jnp.flip(w_KDn, 0).transpose(0, 2, 1), out_dtype)
    dw_KDn = jnp.stack(
        [jnp.einsum("nwd,nwf->df", x_NCD[:, k : k + W, :], dy, preferred_element_type=out_dtype) for k in range(K)]
    )
    return dx_NCD.astype(x_NCD.dtype), dw_KDn.astype(w_KDn.dtype)


conv1d.defvjp(_conv1d_fwd, _conv1d_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def conv_max(x_NCD: jax.Array, w_KDn: jax.Array, out_dtype=None) -> jax.Array:
    """Max over positions of the VALID convolution -> ``[N, n]``, whose backward pass keeps
    only where each maximum was.

    Autodiff of ``max(conv(x))`` saves the whole convolution output (``[N, C - K + 1, n]``,
    400 kB per token with the standard filters) for the backward pass, and on a TPU XLA
    copies it into another layout on the way. Here the backward pass keeps ``x``, ``w`` and
    the position of each maximum (one byte per token and filter) and builds the output
    gradient from them (a one-hot a convolution gradient can read as it goes). Ties go to
    the first position, where autodiff splits them evenly; a tie in a char CNN is a window
    inside the padding run, every one of which holds the same chars, so the parameter
    gradients are the same up to rounding (tested). Used on accelerators; the CPU keeps
    its chunked path (see :data:`CNN_CHUNK_TOKENS`).
    """
    return jnp.max(_conv(x_NCD, w_KDn, out_dtype), axis=1)


def _conv_max_fwd(x_NCD, w_KDn, out_dtype):
    y_NWn = _conv(x_NCD, w_KDn, out_dtype)
    where = jnp.uint8 if y_NWn.shape[1] <= 256 else jnp.int32
    return jnp.max(y_NWn, axis=1), (x_NCD, w_KDn, jnp.argmax(y_NWn, axis=1).astype(where))


def _conv_max_bwd(out_dtype, residuals, g_Nn):
    x_NCD, w_KDn, argmax_Nn = residuals
    y_shape = jax.eval_shape(functools.partial(_conv, out_dtype=out_dtype), x_NCD, w_KDn)
    at_max_NWn = jnp.arange(y_shape.shape[1])[None, :, None] == argmax_Nn[:, None, :].astype(jnp.int32)
    dy_NWn = jnp.where(at_max_NWn, g_Nn[:, None, :], 0).astype(y_shape.dtype)
    _, conv_vjp = jax.vjp(functools.partial(_conv, out_dtype=out_dtype), x_NCD, w_KDn)
    return conv_vjp(dy_NWn)


conv_max.defvjp(_conv_max_fwd, _conv_max_bwd)


@jax.custom_vjp
def _unsort_rows(x_sorted_N_: jax.Array, order_N: jax.Array) -> jax.Array:
    """Rows back in their original order: ``out[order[i]] = x_sorted[i]``.

    Written as a gather with the inverse permutation; its gradient is the gather with
    ``order`` (autodiff would give a scatter-add, which XLA:CPU runs row by row).
    """
    return x_sorted_N_[jnp.argsort(order_N)]


def _unsort_rows_fwd(x_sorted_N_, order_N):
    return _unsort_rows(x_sorted_N_, order_N), order_N


def _unsort_rows_bwd(order_N, g_N_):
    return g_N_[order_N], None


_unsort_rows.defvjp(_unsort_rows_fwd, _unsort_rows_bwd)


def _dense(x: jax.Array, w: jax.Array, dtype) -> jax.Array:
    return einsum("nf,fp->np", x, w, dtype)


def encode_tokens_remat(
    params: dict, config: ElmoConfig, char_ids_RBTC: jax.Array, chunk_steps: int, dtype=jnp.float32
) -> jax.Array:
    """:func:`encode_tokens` over ``[R, B, T, C]`` in chunks of ``chunk_steps`` time steps,
    each recomputed in the backward pass -> ``[R, B, T, P]`` (the same values).

    For training on long windows.  The char CNN's largest tensor, the convolution output
    (``[tokens, C - w + 1, filters]``: 400 kB per token with the standard filters), exists for
    one chunk at a time in both passes, and the backward pass keeps only the chunks' char
    ids; so the encoder's memory no longer grows with ``T`` beyond its inputs and outputs.
    The price is one more encoder forward pass per step.
    """
    ids_NRBKC = to_chunks(char_ids_RBTC, 2, chunk_steps)

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def chunk(ids_RBKC):
        # conv1d's own gradient is for XLA:CPU's loops; elsewhere XLA's reads each output
        # gradient once instead of once per kernel offset (16 GB less per step on a v5e).
        return encode_tokens(
            params, config, ids_RBKC, dtype=dtype, in_loop=target_platform() == "cpu", trim_levels=GRAD_TRIM_LEVELS
        )

    return from_chunks(jax.lax.map(chunk, ids_NRBKC), 2, char_ids_RBTC.shape[2])
