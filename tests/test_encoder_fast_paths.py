"""Speed rearrangements of the encoder leave its numbers alone.

On the CPU the char CNN runs in chunks of ``CNN_CHUNK_TOKENS`` tokens (a loop, with the
hand-written convolution gradient) after sorting the tokens by length; the convolutions
see only the first ``n`` chars (``n`` one of ``TRIM_LEVELS``) when every token of a pass
(chunk) is short enough; and :func:`bilm` encodes ``<S>``/``</S>`` in
the same pass as the sentences.  The unoptimised paths are one convolution pass over all
tokens and all chars (chunking and trimming switched off) and the markers encoded alone.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax import ElmoConfig, batch_to_ids
from elmo_jax.model import encoder
from elmo_jax.model.bilm import bilm, bilm_from_token_vectors, init_params, marker_vectors
from elmo_jax.model.encoder import encode_tokens
from elmo_jax.formats.hdf5 import load_weights

TINY = ElmoConfig.preset("tiny")
WORDS = "the quick brown fox jumps over a lazy dog while seven tired otters sing".split()


def _ids(n_sentences, n_tokens, n_chars, seed=0):
    rng = np.random.default_rng(seed)
    lengths = [n_tokens] + list(rng.integers(1, n_tokens + 1, n_sentences - 1))
    sents = [[WORDS[i] for i in rng.integers(0, len(WORDS), n)] for n in lengths]
    return jnp.asarray(batch_to_ids(sents, n_chars))


def _rel(a, b):
    return float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-30))


def _fixture_model(bilm_fixtures):
    model = bilm_fixtures / "model"
    cfg = ElmoConfig.from_json_file(model / "options.json")
    return cfg, load_weights(model / "lm_weights.hdf5", cfg)


def _chunked_and_whole(monkeypatch, fn, chunk):
    """``fn()`` with chunks of ``chunk`` tokens, then with one pass (chunking off).

    The chunk size is read when tracing: ``fn`` must jit a new function on every call."""
    monkeypatch.setattr(encoder, "CNN_CHUNK_TOKENS", chunk)
    chunked = fn()
    monkeypatch.setattr(encoder, "CNN_CHUNK_TOKENS", 10**9)
    return chunked, fn()


def _trimmed_and_full(monkeypatch, fn):
    """``fn()`` with the char trimming of the encoder on, then off (all 50 chars always)."""
    trimmed = fn()
    monkeypatch.setattr(encoder, "TRIM_LEVELS", ())
    return trimmed, fn()


def test_chunk_size_rule(monkeypatch):
    monkeypatch.setattr(encoder, "CNN_CHUNK_TOKENS", 4)
    assert encoder.cnn_chunk_tokens(7) == 0  # fewer than two chunks: one pass
    assert encoder.cnn_chunk_tokens(8) == (4 if jax.default_backend() == "cpu" else 0)


@pytest.mark.fidelity
@pytest.mark.parametrize("source", ["random", "fixture"])
def test_chunked_char_cnn_equals_one_pass(monkeypatch, request, source):
    if source == "fixture":
        cfg, params = _fixture_model(request.getfixturevalue("bilm_fixtures"))
    else:
        cfg, params = TINY, init_params(jax.random.key(0), TINY)
    ids = _ids(5, 7, cfg.char_cnn.max_characters_per_token)  # 35 tokens: chunks of 4 + a padded one
    chunked, whole = _chunked_and_whole(
        monkeypatch, lambda: jax.jit(lambda p, i: encode_tokens(p, cfg, i))(params, ids), 4
    )
    assert chunked.shape == whole.shape == (5, 7, cfg.projection_dim)
    assert _rel(chunked, whole) <= 1e-5
    # Whole ELMo layers too (the markers go through the same chunks).
    chunked, whole = _chunked_and_whole(monkeypatch, lambda: jax.jit(lambda p, i: bilm(p, cfg, i)[0])(params, ids), 4)
    assert _rel(chunked, whole) <= 1e-5


def test_chunked_char_cnn_gradients_equal_one_pass(monkeypatch):
    params = init_params(jax.random.key(1), TINY)
    ids = _ids(4, 6, TINY.char_cnn.max_characters_per_token, seed=1)
    w = jax.random.normal(jax.random.key(2), (4, 6, TINY.projection_dim))

    def grad():
        return jax.jit(jax.grad(lambda p: jnp.sum(encode_tokens(p, TINY, ids) * w)))(params)

    chunked, whole = _chunked_and_whole(monkeypatch, grad, 5)
    leaves = jax.tree.leaves(whole)
    assert any(float(jnp.max(jnp.abs(g))) > 0 for g in leaves)
    for a, b in zip(jax.tree.leaves(chunked), leaves):
        assert a.shape == b.shape and _rel(a, b) <= 1e-5


@pytest.mark.fidelity
def test_markers_in_the_sentence_pass_equal_markers_encoded_alone(bilm_fixtures):
    cfg, params = _fixture_model(bilm_fixtures)
    ids = _ids(3, 5, cfg.char_cnn.max_characters_per_token, seed=2)
    lengths = jnp.sum(jnp.any(ids > 0, axis=-1), axis=-1)
    one_pass, _ = jax.jit(bilm, static_argnums=1)(params, cfg, ids, None, lengths)
    separate, _ = bilm_from_token_vectors(params, cfg, encode_tokens(params, cfg, ids), lengths)
    assert _rel(one_pass, separate) <= 1e-6


@pytest.mark.fidelity
def test_precomputed_markers_equal_markers_in_the_pass(bilm_fixtures):
    """What Elmo.embed does: <S> / </S> encoded once, then passed to every bilm call."""
    cfg, params = _fixture_model(bilm_fixtures)
    ids = _ids(3, 5, cfg.char_cnn.max_characters_per_token, seed=5)
    lengths = jnp.sum(jnp.any(ids > 0, axis=-1), axis=-1)
    fn = jax.jit(bilm, static_argnums=1)
    in_pass, state_a = fn(params, cfg, ids, None, lengths)
    given, state_b = fn(params, cfg, ids, None, lengths, markers=marker_vectors(params, cfg))
    assert _rel(in_pass, given) <= 1e-6
    assert _rel(state_a["h"], state_b["h"]) <= 1e-6
    # The markers are used: other marker vectors give other outputs.
    bos, eos = marker_vectors(params, cfg)
    other, _ = fn(params, cfg, ids, None, lengths, markers=(eos, bos))
    assert _rel(in_pass, other) > 1e-3


def _level_taken(cfg, ids):
    """The number of chars the convolutions of one pass over ``ids`` see."""
    widest = max(w for w, _ in cfg.char_cnn.filters)
    need = int(jnp.max(encoder.chars_needed(ids.reshape(-1, ids.shape[-1]), cfg)))
    return min([n for n in encoder.TRIM_LEVELS if widest < n and need <= n] + [ids.shape[-1]])


@pytest.mark.fidelity
@pytest.mark.parametrize("source", ["random", "fixture"])
@pytest.mark.parametrize("longest", [1, 6, 9, 13, 17, 30])
def test_trimmed_chars_equal_all_chars(monkeypatch, request, source, longest):
    """Short words with a longest word of each size, so that every level of TRIM_LEVELS
    and the full width run (checked); padding tokens (id 0 tails) in all."""
    if source == "fixture":
        cfg, params = _fixture_model(request.getfixturevalue("bilm_fixtures"))
    else:
        cfg, params = TINY, init_params(jax.random.key(3), TINY)
    n_chars = cfg.char_cnn.max_characters_per_token
    sents = [["a", "x" * longest, "b"], ["i", "a", "b", "c"]]
    ids = jnp.asarray(batch_to_ids(sents, n_chars))
    widest = max(w for w, _ in cfg.char_cnn.filters)
    # A word of n bytes needs n + 2 (its begin/end chars) + widest chars.
    expected = {
        4: {1: 12, 6: 12, 9: 16, 13: 20, 17: 24, 30: n_chars},  # tiny
        5: {1: 12, 6: 16, 9: 16, 13: 20, 17: 24, 30: n_chars},
    }[widest]  # the bilm-tf fixture
    assert _level_taken(cfg, ids) == expected[longest]
    trimmed, full = _trimmed_and_full(monkeypatch, lambda: jax.jit(lambda p, i: encode_tokens(p, cfg, i))(params, ids))
    assert trimmed.shape == full.shape
    assert _rel(trimmed, full) <= 1e-5

    w = jax.random.normal(jax.random.key(4), ids.shape[:-1] + (cfg.projection_dim,))

    def grad():
        return jax.jit(jax.grad(lambda p: jnp.sum(encode_tokens(p, cfg, ids) * w)))(params)

    g_trimmed, g_full = _trimmed_and_full(monkeypatch, grad)
    for a, b in zip(jax.tree.leaves(g_trimmed), jax.tree.leaves(g_full)):
        assert a.shape == b.shape and _rel(a, b) <= 1e-5


@pytest.mark.fidelity
@pytest.mark.parametrize("source", ["random", "fixture"])
def test_length_sorted_chunks_equal_one_full_pass(monkeypatch, request, source):
    """Many tokens of mixed lengths (1-40 bytes) in chunks of 4: sorted, every chunk cut to
    its own level, put back in order; against one pass over all chars, values and gradients
    (with the inference levels and with the training levels)."""
    if source == "fixture":
        cfg, params = _fixture_model(request.getfixturevalue("bilm_fixtures"))
    else:
        cfg, params = TINY, init_params(jax.random.key(8), TINY)
    rng = np.random.default_rng(8)
    sents = [
        ["y" * int(n) for n in rng.choice([1, 2, 3, 5, 8, 11, 14, 18, 25, 40], size=int(k))]
        for k in rng.integers(1, 9, size=6)
    ]
    ids = jnp.asarray(batch_to_ids(sents, cfg.char_cnn.max_characters_per_token))
    w = jax.random.normal(jax.random.key(9), ids.shape[:-1] + (cfg.projection_dim,))
    monkeypatch.setattr(encoder, "CNN_CHUNK_TOKENS", 4)
    assert encoder.cnn_chunk_tokens(ids.shape[0] * ids.shape[1]) == (4 if jax.default_backend() == "cpu" else 0)

    def run(levels):
        enc = jax.jit(lambda p: encode_tokens(p, cfg, ids, trim_levels=levels))
        grad = jax.jit(jax.grad(lambda p: jnp.sum(encode_tokens(p, cfg, ids, trim_levels=levels) * w)))
        return enc(params), grad(params)

    out, g = run(None)
    out_train, g_train = run(encoder.GRAD_TRIM_LEVELS)
    monkeypatch.setattr(encoder, "CNN_CHUNK_TOKENS", 10**9)
    out_full, g_full = run(())
    assert out.shape == out_full.shape == ids.shape[:-1] + (cfg.projection_dim,)
    assert _rel(out, out_full) <= 1e-6 and _rel(out_train, out_full) <= 1e-6
    assert any(float(jnp.max(jnp.abs(x))) > 0 for x in jax.tree.leaves(g_full))
    for a, b, c in zip(jax.tree.leaves(g), jax.tree.leaves(g_train), jax.tree.leaves(g_full)):
        assert a.shape == c.shape and _rel(a, c) <= 1e-5 and _rel(b, c) <= 1e-5


def test_trim_levels_must_be_char_counts():
    params = init_params(jax.random.key(10), TINY)
    ids = _ids(1, 2, TINY.char_cnn.max_characters_per_token)
    for bad in [(12.5,), ("16",), (True,)]:
        with pytest.raises(ValueError, match="trim_levels must be char counts"):
            encode_tokens(params, TINY, ids, trim_levels=bad)
    # Levels that cannot apply (not above the widest filter, not below the char count) are ignored.
    out = encode_tokens(params, TINY, ids, trim_levels=(0, 3, 50, 10**6))
    assert _rel(out, encode_tokens(params, TINY, ids, trim_levels=())) <= 1e-6


def test_trimming_respects_any_tail_id(monkeypatch):
    """Ids not from ``batch_to_ids`` (a tail that mixes the padding char and 0) still give
    the all-chars result: the trimmed path is only taken where it changes nothing."""
    params = init_params(jax.random.key(5), TINY)
    ids = np.asarray(batch_to_ids([["ab", "cd"]], TINY.char_cnn.max_characters_per_token))
    ids[0, 0, 30:] = 0  # padding chars up to 30, then zeros: the repeated run starts at 30
    ids = jnp.asarray(ids)
    trimmed, full = _trimmed_and_full(monkeypatch, lambda: jax.jit(lambda p, i: encode_tokens(p, TINY, i))(params, ids))
    assert _rel(trimmed, full) <= 1e-6


def test_filters_wider_than_the_trimmed_chars_use_all_chars(monkeypatch):
    """A config whose widest filter does not fit in any of TRIM_LEVELS never traces a trimmed path."""
    cfg = dataclasses.replace(TINY, char_cnn=dataclasses.replace(TINY.char_cnn, filters=((1, 4), (30, 8))))
    params = init_params(jax.random.key(6), cfg)
    ids = _ids(2, 3, cfg.char_cnn.max_characters_per_token)
    out = jax.jit(lambda p, i: encode_tokens(p, cfg, i))(params, ids)
    assert out.shape == (2, 3, cfg.projection_dim) and bool(jnp.all(jnp.isfinite(out)))
    monkeypatch.setattr(encoder, "TRIM_LEVELS", ())
    assert _rel(out, jax.jit(lambda p, i: encode_tokens(p, cfg, i))(params, ids)) <= 1e-6


@pytest.mark.parametrize("shape", [(0, 3), (2, 0)])
def test_empty_batches_encode_and_embed_to_empty_arrays(shape):
    """No sentences, or sentences with no tokens: empty outputs, as before the fast paths."""
    params = init_params(jax.random.key(7), TINY)
    ids = jnp.zeros(shape + (TINY.char_cnn.max_characters_per_token,), jnp.int32)
    assert encode_tokens(params, TINY, ids).shape == shape + (TINY.projection_dim,)
    layers, _ = bilm(params, TINY, ids)
    assert layers.shape == (TINY.lstm.n_layers + 1,) + shape + (2 * TINY.projection_dim,)


def test_conv_max_equals_autodiff_of_max_over_the_convolution():
    """The accelerators' pooled convolution (its backward keeps only where each maximum was):
    values and both gradients equal autodiff's on inputs without ties."""
    x = jax.random.normal(jax.random.key(3), (6, 11, 5))
    w = jax.random.normal(jax.random.key(4), (3, 5, 7))
    g = jax.random.normal(jax.random.key(5), (6, 7))

    def loss(fn):
        return jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(fn(x, w) * g), argnums=(0, 1)))(x, w)

    (got, (dx, dw)), (want, (dx_want, dw_want)) = (
        loss(lambda x, w: encoder.conv_max(x, w, jnp.float32)),
        loss(lambda x, w: jnp.max(encoder._conv(x, w, jnp.float32), axis=1)),
    )
    assert _rel(got, want) <= 1e-6 and _rel(dx, dx_want) <= 1e-6 and _rel(dw, dw_want) <= 1e-6
    assert float(jnp.max(jnp.abs(dx))) > 0 and float(jnp.max(jnp.abs(dw))) > 0


def test_the_accelerators_char_cnn_gradients_equal_the_cpus():
    """Real char ids, whose padding runs give tied maxima (autodiff splits a tie evenly,
    conv_max gives it to the first position): the encoder traced for a TPU (conv_max, no
    chunks) has the same outputs and parameter gradients as the CPU's path. Short words
    and padding tokens included, so ties occur (checked)."""
    from elmo_jax.model.platform import compiling_for

    params = init_params(jax.random.key(6), TINY)
    ids = _ids(4, 6, TINY.char_cnn.max_characters_per_token, seed=3)
    w = jax.random.normal(jax.random.key(7), (4, 6, TINY.projection_dim))
    x = params["char_embed"][ids.reshape(-1, ids.shape[-1])]
    y = encoder._conv(x, params["cnn"][0]["w"], jnp.float32)
    assert int(jnp.sum(y == jnp.max(y, axis=1, keepdims=True))) > y.shape[0] * y.shape[2]  # ties

    def grad():
        return jax.jit(jax.value_and_grad(lambda p: jnp.sum(encode_tokens(p, TINY, ids) * w)))(params)

    cpu_loss, cpu_grads = grad()
    with compiling_for("tpu"):
        acc_loss, acc_grads = grad()
    assert _rel(acc_loss, cpu_loss) <= 1e-6
    for a, b in zip(jax.tree.leaves(acc_grads), jax.tree.leaves(cpu_grads)):
        assert a.shape == b.shape and _rel(a, b) <= 1e-5
