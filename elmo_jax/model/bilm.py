"""The biLM: token encoder + forward and backward LSTM stacks -> ELMo's layers.

:func:`bilm` is the inference path: it takes sentences' char ids (no markers), adds
``<S>`` / ``</S>`` around each sentence at its own length, runs the forward stack on the
sentence and the backward stack on the sentence reversed within its length (so padding
never touches a real position in either direction), and returns the layers without the
markers::

    layers [L+1, B, T, 2P]: 0 = [e; e], l = [forward_l; backward_l]

The work is split in two: the char CNN (:func:`elmo_jax.model.encoder.encode_tokens`) and
:func:`bilm_from_token_vectors`, which adds the marker vectors and runs the LSTMs.  ``bilm``
is the composition of the two, so a caller holding precomputed token vectors (a vocabulary
cache) runs the same code from the second step.

Parameters: ``{"char_embed", "cnn", "highway", ["proj"], "lstm"}`` (encoder + LSTM).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax import chars
from elmo_jax.config import ElmoConfig
from elmo_jax.model.encoder import encode_tokens, init_encoder
from elmo_jax.model.lstm import init_lstm, lstm_stack


def init_params(key: jax.Array, config: ElmoConfig) -> dict:
    """A fresh, randomly initialised biLM (encoder and both LSTM stacks, no softmax)."""
    k_enc, k_lstm = jax.random.split(key)
    return {**init_encoder(k_enc, config), "lstm": init_lstm(k_lstm, config)}


def sentence_lengths(char_ids_BTC: jax.Array) -> jax.Array:
    """Tokens per sentence: positions whose char ids are not all zero."""
    return jnp.sum(jnp.any(char_ids_BTC > 0, axis=-1), axis=-1).astype(jnp.int32)


def reverse_within_length(x_BT_: jax.Array, lengths_B: jax.Array) -> jax.Array:
    """Reverse each row's first ``length`` steps along axis 1; padding stays in place.

    Its own inverse, so the same call maps backward outputs back to sentence order.
    """
    t = jnp.arange(x_BT_.shape[1])[None, :]
    n = lengths_B[:, None]
    idx_BT = jnp.where(t < n, n - 1 - t, t)
    idx = idx_BT.reshape(idx_BT.shape + (1,) * (x_BT_.ndim - 2))
    return jnp.take_along_axis(x_BT_, idx, axis=1)


def marker_char_ids(config: ElmoConfig) -> jax.Array:
    """Token ids ``[2, config.token_id_width]`` of ``<S>`` and ``</S>`` (a vocabulary
    model's ``<bos>`` / ``<eos>``)."""
    n_chars = config.char_cnn.max_characters_per_token
    if config.vocab is not None:
        return jnp.asarray(np.asarray(config.vocab.marker_rows(n_chars), np.int32))
    return jnp.asarray(
        np.stack([chars.token_to_ids(chars.BOS_TOKEN, n_chars), chars.token_to_ids(chars.EOS_TOKEN, n_chars)])
    )


def marker_vectors(params: dict, config: ElmoConfig, dtype=jnp.float32) -> tuple[jax.Array, jax.Array]:
    """The context-free token vectors ``[P]`` of ``<S>`` and ``</S>``."""
    e = encode_tokens(params, config, marker_char_ids(config), dtype=dtype)
    return e[0], e[1]


def add_boundary_vectors(e_BTP: jax.Array, lengths_B: jax.Array, bos_P: jax.Array, eos_P: jax.Array) -> jax.Array:
    """``[B, T, P] -> [B, T+2, P]`` with ``bos`` at 0 and ``eos`` right after each sentence;
    positions past ``</S>`` (and whole rows of length -1) are zero."""
    shifted = jnp.pad(e_BTP, ((0, 0), (1, 1), (0, 0)))
    pos_1T1 = jnp.arange(shifted.shape[1])[None, :, None]
    end_B11 = lengths_B[:, None, None] + 1
    out = jnp.where(
        pos_1T1 == 0, bos_P.astype(shifted.dtype), jnp.where(pos_1T1 == end_B11, eos_P.astype(shifted.dtype), shifted)
    )
    full_B11 = jnp.where(lengths_B >= 0, lengths_B + 2, 0)[:, None, None]
    return jnp.where(pos_1T1 < full_B11, out, 0.0)


def bilm(
    params: dict,
    config: ElmoConfig,
    char_ids_BTC: jax.Array,
    state: dict | None = None,
    lengths_B: jax.Array | None = None,
    dtype=jnp.float32,
    markers: tuple[jax.Array, jax.Array] | None = None,
) -> tuple[jax.Array, dict]:
    """ELMo layers ``[L+1, B, T, 2P]`` and the final LSTM state for a batch of sentences.

    ``state`` (``{"h": [L, 2, B, P], "c": [L, 2, B, H]}``) defaults to zeros, which makes
    every call deterministic; pass the returned state back in to carry it across batches
    as the original implementations do.  ``lengths_B`` defaults to the count of non-padding
    positions; give it explicitly to tell an empty sentence (length 0: ``<S> </S>`` is run
    and updates the state) from a padding row (length -1: nothing runs, the state passes
    through).  Positions past a sentence's end are zero in every layer.

    This is :func:`bilm_from_token_vectors` applied to the char CNN's token vectors.
    ``markers``: the ``<S>`` / ``</S>`` vectors from :func:`marker_vectors`, for callers
    that embed many batches with the same parameters (they depend on nothing else); by
    default they are encoded here.
    """
    if lengths_B is None:
        lengths_B = sentence_lengths(char_ids_BTC)
    n_batch, n_time, n_chars = char_ids_BTC.shape
    ids_NC = char_ids_BTC.reshape(-1, n_chars)
    if markers is None:
        # The markers ride along in the same encoder pass: one read of its weights, not two
        # (for a single sentence that second pass was ~10 % of the time).
        ids_NC = jnp.concatenate([ids_NC, marker_char_ids(config)])
    e_NP = encode_tokens(params, config, ids_NC, dtype=dtype)
    if markers is None:
        e_NP, markers = e_NP[:-2], (e_NP[-2], e_NP[-1])
    e_BTP = e_NP.reshape(n_batch, n_time, e_NP.shape[-1])
    return bilm_from_token_vectors(params, config, e_BTP, lengths_B, state, dtype=dtype, markers=markers)


def bilm_from_token_vectors(
    params: dict,
    config: ElmoConfig,
    e_BTP: jax.Array,
    lengths_B: jax.Array,
    state: dict | None = None,
    dtype=jnp.float32,
    markers: tuple[jax.Array, jax.Array] | None = None,
) -> tuple[jax.Array, dict]:
    """:func:`bilm` from context-free token vectors ``[B, T, P]`` instead of char ids.

    ``e_BTP`` holds each sentence's token vectors (no markers; values past a sentence's
    length are ignored), e.g. looked up in a vocabulary cache instead of running the char
    CNN.  ``lengths_B`` as in :func:`bilm` (required here).  The ``<S>`` / ``</S>`` vectors
    are computed from ``params`` unless ``markers`` gives them.
    """
    n_time = e_BTP.shape[1]
    bos_P, eos_P = marker_vectors(params, config, dtype) if markers is None else markers
    full_lengths_B = jnp.where(lengths_B >= 0, lengths_B + 2, 0)
    mask_BT = jnp.arange(n_time + 2)[None, :] < full_lengths_B[:, None]
    e_BTP = add_boundary_vectors(e_BTP, lengths_B, bos_P, eos_P)
    x_RBTP = jnp.stack([e_BTP, reverse_within_length(e_BTP, full_lengths_B)])
    mask_RBT = jnp.stack([mask_BT, mask_BT])
    outputs, new_state = lstm_stack(params["lstm"], config, x_RBTP, mask_RBT, state, dtype=dtype)
    layers = [jnp.concatenate([e_BTP, e_BTP], axis=-1)]
    for h_RBTP in outputs:
        bwd = reverse_within_length(h_RBTP[1], full_lengths_B)
        layers.append(jnp.concatenate([h_RBTP[0], bwd], axis=-1))
    # Drop the markers: real tokens sit at 1..n.
    real_BT1 = (jnp.arange(n_time)[None, :] < lengths_B[:, None])[..., None]
    out = jnp.stack([jnp.where(real_BT1, layer[:, 1 : n_time + 1], 0.0) for layer in layers])
    return out, new_state
