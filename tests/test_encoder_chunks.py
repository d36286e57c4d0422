"""Speed rearrangements of the encoder leave its numbers alone (issue 7).

On the CPU the char CNN runs in chunks of ``CNN_CHUNK_TOKENS`` tokens (a loop, with the
hand-written convolution gradient), and :func:`bilm` encodes ``<S>``/``</S>`` in the same
pass as the sentences.  The unoptimised paths are one convolution pass over all tokens
(chunking switched off) and the markers encoded on their own.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from elmo_jax import ElmoConfig, batch_to_ids
from elmo_jax.model import encoder
from elmo_jax.model.bilm import bilm, bilm_from_token_vectors, init_params
from elmo_jax.model.encoder import encode_tokens
from elmo_jax.weights import load_weights

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


def test_chunk_size_rule(monkeypatch):
    monkeypatch.setattr(encoder, "CNN_CHUNK_TOKENS", 4)
    assert encoder.cnn_chunk_tokens(7) == 0  # fewer than two chunks: one pass
    assert encoder.cnn_chunk_tokens(8) == (4 if jax.default_backend() == "cpu" else 0)


@pytest.mark.parametrize("source", ["random", "fixture"])
def test_chunked_char_cnn_equals_one_pass(monkeypatch, request, source):
    if source == "fixture":
        cfg, params = _fixture_model(request.getfixturevalue("bilm_fixtures"))
    else:
        cfg, params = TINY, init_params(jax.random.key(0), TINY)
    ids = _ids(5, 7, cfg.char_cnn.max_characters_per_token)  # 35 tokens: chunks of 4 + a padded one
    chunked, whole = _chunked_and_whole(monkeypatch, lambda: jax.jit(lambda p, i: encode_tokens(p, cfg, i))(params, ids), 4)
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


def test_markers_in_the_sentence_pass_equal_markers_encoded_alone(bilm_fixtures):
    cfg, params = _fixture_model(bilm_fixtures)
    ids = _ids(3, 5, cfg.char_cnn.max_characters_per_token, seed=2)
    lengths = jnp.sum(jnp.any(ids > 0, axis=-1), axis=-1)
    one_pass, _ = jax.jit(bilm, static_argnums=1)(params, cfg, ids, None, lengths)
    separate, _ = bilm_from_token_vectors(params, cfg, encode_tokens(params, cfg, ids), lengths)
    assert _rel(one_pass, separate) <= 1e-6
