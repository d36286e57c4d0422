"""Probes on vectors whose answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from elmo_jax import probes as P
from elmo_jax.data import synthetic as S
from elmo_jax.data import synthetic_scores as SS


@pytest.fixture(scope="module")
def corpus():
    lang = S.make_language(0)
    rng = np.random.default_rng(10)
    sents, labels = SS.sample_corpus(lang, 1000, rng)
    return lang, sents, labels


def _row(rows, view):
    return next(r for r in rows if r["view"] == view)


def test_oracle_vectors_resolve_senses_by_side(corpus):
    """Exact posteriors: full layers ~100%, each half fails on the other side's words."""
    lang, sents, labels = corpus
    emb = SS.oracle_embeddings(lang, sents)
    rows = P.probe_table(emb, labels, sentences=sents, class_steps=100)
    assert [r["view"] for r in rows] == [
        "layer 0",
        "layer 1",
        "layer 1 fwd",
        "layer 1 bwd",
        "layer 2",
        "layer 2 fwd",
        "layer 2 bwd",
        "majority baseline",
    ]
    base = _row(rows, "majority baseline")
    full, fwd, bwd = _row(rows, "layer 1"), _row(rows, "layer 1 fwd"), _row(rows, "layer 1 bwd")
    assert full["wsd"] > 0.99 and full["n_wsd_test"] > 100
    assert fwd["wsd_left"] > 0.99 and fwd["wsd_both"] > 0.99
    assert bwd["wsd_right"] > 0.99 and bwd["wsd_both"] > 0.99
    assert fwd["wsd_right"] < 0.75 and bwd["wsd_left"] < 0.75  # about chance
    assert _row(rows, "layer 0")["wsd"] < 0.75  # the word alone says nothing about its sense
    assert base["wsd"] < 0.7
    assert full["word_class"] > 0.98 and base["word_class"] < 0.4
    assert 0.9 < base["word_class_per_word"] < full["word_class"]
    text = P.format_probe_table(rows)
    assert "layer 2 bwd" in text and "majority baseline" in text


def test_random_vectors_score_like_chance(corpus):
    _, sents, labels = corpus
    rng = np.random.default_rng(0)
    emb = [rng.normal(size=(3, len(s), 32)).astype(np.float32) for s in sents]
    rows = P.probe_table(emb, labels, class_steps=100)
    base = _row(rows, "majority baseline")
    for r in rows[:-1]:
        assert 0.3 < r["wsd"] < 0.7, r  # two roughly balanced senses per word
        assert abs(r["word_class"] - base["word_class"]) < 0.06, r


def test_nearest_neighbour_only_looks_at_the_same_word():
    # the nearest training vector overall belongs to another word with another sense
    vectors = np.array([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [1.0, 0.05]])
    senses = ["a#x", "b#y", "b#z", "b#y"]
    is_test = np.array([False, False, False, True])
    out = P.wsd_nearest_neighbour(vectors, senses, is_test)
    assert out["acc"] == 0.0  # nearest 'b' is b#z -> wrong, though a#x is closer
    out = P.wsd_nearest_neighbour(vectors[[0, 1, 2, 3]], ["a#x", "b#z", "b#y", "b#y"], is_test)
    assert out["acc"] == 1.0
    assert out["majority"] == 0.0 or out["majority"] == 1.0


def test_equal_vectors_tie_to_the_first_training_row_whatever_the_rounding():
    # A context-free layer: every occurrence of "w" has the same vector, so the similarities
    # differ only by rounding (which moves with the CPU's vector code).  Whatever that noise,
    # the first training row (sense a) is the neighbour: of the 3 test rows, only the "a" one is right.
    base = np.tile(np.random.default_rng(0).normal(size=(1, 16)).astype(np.float32), (8, 1))
    senses = ["w#a", "w#a", "w#b", "w#a", "w#b", "w#a", "w#b", "w#b"]
    is_test = np.array([0, 0, 0, 0, 0, 1, 1, 1], dtype=bool)
    for seed in range(5):
        noise = np.random.default_rng(seed).normal(scale=1e-7, size=base.shape).astype(np.float32)
        out = P.wsd_nearest_neighbour(base + noise, senses, is_test)
        assert out["acc"] == pytest.approx(1 / 3), seed
    # Real differences beyond the tie tolerance still decide.
    moved = base.copy()
    moved[4] += 0.5 * np.abs(base[4]).max()
    moved[6:] = moved[4]
    assert P.wsd_nearest_neighbour(moved, senses, is_test)["acc"] == 1.0  # 6, 7 find row 4 (b)


def test_majority_baseline_and_sides():
    senses = ["w#a"] * 6 + ["w#b"] * 2 + ["v#a", "v#b", "v#b", "v#b"]
    sides = ["left"] * 8 + ["right"] * 4
    is_test = np.array([0, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 1], dtype=bool)
    vectors = np.random.default_rng(0).normal(size=(12, 4))
    out = P.wsd_nearest_neighbour(vectors, senses, is_test, sides)
    # w: train majority a; test a, a, b -> 2/3.  v: train {a, b, b}: majority b; test b -> 1
    assert out["majority_left"] == pytest.approx(2 / 3)
    assert out["majority_right"] == 1.0
    assert out["n_left"] == 3 and out["n_right"] == 1 and math.isnan(out["acc_both"])
    assert out["majority"] == pytest.approx(3 / 4)


def test_logistic_regression_learns_separable_classes():
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(5, 20)) * 3
    y = rng.integers(0, 5, 3000)
    x = centres[y] + rng.normal(size=(3000, 20))
    acc = P.logistic_regression_probe(x[:2000], y[:2000], x[2000:], y[2000:])
    assert acc > 0.97
    noise = rng.normal(size=(3000, 20))
    assert P.logistic_regression_probe(noise[:2000], y[:2000], noise[2000:], y[2000:]) < 0.35


def test_split_is_deterministic():
    a, b = P.split_sentences(101, 0.5, seed=3), P.split_sentences(101, 0.5, seed=3)
    assert (a == b).all() and a.sum() == 50
    assert not (a == P.split_sentences(101, 0.5, seed=4)).all()
    with pytest.raises(ValueError, match="test_fraction"):
        P.split_sentences(10, 1.0)


def test_bad_shapes_are_reported(corpus):
    _, sents, labels = corpus
    emb = [np.zeros((3, len(s), 8), np.float32) for s in sents[:5]]
    with pytest.raises(ValueError, match="label"):
        P.probe_table(emb, labels[:4])
    emb[2] = np.zeros((3, len(sents[2]) + 1, 8), np.float32)
    with pytest.raises(ValueError, match=r"embeddings\[2\]"):
        P.probe_table(emb, labels[:5])


def test_explicit_split_and_token_subsets(corpus):
    """Probes fitted on one set of sentences, scored on another, and on a flagged subset."""
    lang, sents, labels = corpus
    emb = SS.oracle_embeddings(lang, sents)
    is_test = np.arange(len(sents)) < 300  # first 300 sentences are the test side
    n_tokens = sum(len(s) for s in sents)
    test_tokens = np.concatenate([np.full(len(s), t) for s, t in zip(sents, is_test)])
    # flag the test tokens whose form never occurs on the training side (an "unseen" set)
    train_forms = {w for s, t in zip(sents, is_test) if not t for w in s}
    unseen = np.array([w not in train_forms for s in sents for w in s])
    rows = P.probe_table(
        emb, labels, sentences=sents, class_steps=100, is_test=is_test, token_subsets={"unseen": unseen}
    )
    base = _row(rows, "majority baseline")
    assert base["n_class_test"] == int(test_tokens.sum())
    assert base["n_class_test_unseen"] == int((unseen & test_tokens).sum()) > 0
    # oracle posteriors carry the class, so the probe gets unseen forms right where the
    # per-word majority (which has never seen them) cannot do better than the top class
    full = _row(rows, "layer 1")
    assert full["word_class_unseen"] > 0.9
    assert base["word_class_per_word_unseen"] == pytest.approx(base["word_class_unseen"])
    assert "class/unseen" in P.format_probe_table(rows)
    with pytest.raises(ValueError, match="one bool per sentence"):
        P.probe_table(emb, labels, is_test=is_test[:-1])
    with pytest.raises(ValueError, match="token_subsets"):
        P.probe_table(emb, labels, is_test=is_test, token_subsets={"x": unseen[: n_tokens - 1]})
