"""The built-in synthetic corpus: determinism, exact scoring, sampler/scorer agreement, files."""

from __future__ import annotations

import argparse
import itertools
import math
from collections import Counter

import numpy as np
import pytest

from elmo_jax.data import synthetic as S
from elmo_jax.data import synthetic_corpus as SC
from elmo_jax.data import synthetic_scores as SS

SMALL = dict(n_train=300, n_heldout=40)


@pytest.fixture(scope="module")
def lang():
    return S.make_language(0)


def _brute_force_log_prob(language: S.SyntheticLanguage, tokens) -> float:
    """Sum over every state path (restricted to states that can emit each token)."""
    ids = [language.vocab.index(w) for w in tokens]
    cands = [np.flatnonzero(language.emit[:, i] > 0).tolist() for i in ids]
    total = 0.0
    for path in itertools.product(*cands):
        p = language.start[path[0]] * language.emit[path[0], ids[0]]
        for a, b, i in zip(path, path[1:], ids[1:]):
            p *= language.trans[a, b] * language.emit[b, i]
        total += p * language.end[path[-1]]
    if language.max_len is not None:
        total /= language.length_distribution(language.max_len).sum()
    return math.log(total) if total > 0 else -math.inf


# ---------------------------------------------------------------- determinism


def test_same_seed_gives_byte_identical_files_and_other_seed_differs(tmp_path):
    a = SC.write_corpus(tmp_path / "a", seed=7, **SMALL)
    SC.write_corpus(tmp_path / "b", seed=7, **SMALL)
    SC.write_corpus(tmp_path / "c", seed=8, **SMALL)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == ["heldout.labels.jsonl", "heldout.txt", "stats.json", "train.labels.jsonl", "train.txt"]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    train_a = (tmp_path / "a" / "train.txt").read_bytes()
    assert train_a != (tmp_path / "c" / "train.txt").read_bytes()
    assert a["seed"] == 7 and a["n_train_sentences"] == 300


def test_different_seeds_give_different_stems():
    v0, v1 = set(S.make_language(0).vocab), set(S.make_language(1).vocab)
    assert v0 != v1
    assert {"bank", "the", "米"} <= v0 & v1  # the fixed part of the grammar is shared


# ---------------------------------------------------------------- exact scoring


@pytest.mark.parametrize("max_len", [None, 4])
def test_log_prob_equals_brute_force_path_sum_on_random_hmm(max_len):
    language = S.random_language(3, n_states=3, n_words=4, max_len=max_len)
    rng = np.random.default_rng(0)
    for n in range(1, 6):
        toks = [language.vocab[i] for i in rng.integers(0, 4, n)]
        expected = _brute_force_log_prob(language, toks)
        if max_len is not None and n > max_len:
            assert language.log_prob(toks) == -math.inf
        else:
            assert language.log_prob(toks) == pytest.approx(expected, rel=1e-10, abs=1e-10)


def test_log_prob_equals_brute_force_on_default_language(lang):
    rng = np.random.default_rng(1)
    checked = 0
    while checked < 12:
        toks, _, _ = lang.sample_sentence(rng)
        if len(toks) > 6:
            continue
        assert lang.log_prob(toks) == pytest.approx(_brute_force_log_prob(lang, toks), abs=1e-9)
        checked += 1
    assert lang.log_prob(["bank", "the"]) == -math.inf  # impossible order
    assert lang.log_prob(["zzzunknownzzz"]) == -math.inf


def test_batched_and_single_scoring_agree(lang):
    rng = np.random.default_rng(2)
    sents = [lang.sample_sentence(rng)[0] for _ in range(40)]
    batch = lang.log_probs(sents, batch_size=7)
    single = [lang.log_prob(s) for s in sents]
    np.testing.assert_allclose(batch, single, rtol=1e-12)


def test_probabilities_of_all_sentences_sum_to_one():
    language = S.random_language(5, n_states=3, n_words=3, end_prob=0.4, max_len=6)
    sents = [[language.vocab[i] for i in seq] for n in range(1, 7) for seq in itertools.product(range(3), repeat=n)]
    total = np.exp(language.log_probs(sents)).sum()
    assert total == pytest.approx(1.0, abs=1e-12)
    # without a length limit the same sentences hold P(len <= 6)
    free = S.random_language(5, n_states=3, n_words=3, end_prob=0.4)
    assert np.exp(free.log_probs(sents)).sum() == pytest.approx(free.length_distribution(6).sum(), abs=1e-12)


def test_sampler_and_scorer_describe_the_same_distribution():
    language = S.random_language(11, n_states=3, n_words=3, end_prob=0.45, max_len=5)
    sents = [[language.vocab[i] for i in seq] for n in range(1, 6) for seq in itertools.product(range(3), repeat=n)]
    p = np.exp(language.log_probs(sents))
    entropy = float(-(p * np.log(p)).sum())
    rng = np.random.default_rng(0)
    n = 20000
    draws = [tuple(language.sample_sentence(rng)[0]) for _ in range(n)]
    nll = -language.log_probs([list(d) for d in draws])
    # Monte-Carlo estimate of the entropy agrees with the exact enumeration
    assert abs(nll.mean() - entropy) < 4 * nll.std() / math.sqrt(n)
    # and the frequencies of the most likely sentences match their probabilities
    freq = Counter(draws)
    for i in np.argsort(-p)[:15]:
        k = freq[tuple(sents[i])]
        assert abs(k / n - p[i]) < 4.5 * math.sqrt(p[i] * (1 - p[i]) / n) + 1e-4


def test_default_language_length_distribution_matches_sampler(lang):
    rng = np.random.default_rng(3)
    lens = np.array([len(lang.sample_sentence(rng)[0]) for _ in range(4000)])
    dist = lang.length_distribution(lang.max_len)
    dist = dist / dist.sum()
    mean = float((np.arange(len(dist)) * dist).sum())
    sd = math.sqrt(float(((np.arange(len(dist)) - mean) ** 2 * dist).sum()))
    assert abs(lens.mean() - mean) < 4 * sd / math.sqrt(len(lens))
    assert lens.min() == 1 and 25 <= lens.max() <= lang.max_len
    assert abs((lens == 1).mean() - dist[1]) < 0.02


# ---------------------------------------------------------------- linguistic properties


def test_senses_are_resolved_by_the_declared_side(lang):
    """Exact posteriors: left-resolved senses are known from the left only, etc."""
    rng = np.random.default_rng(4)
    sents, labels = SS.sample_corpus(lang, 1500, rng)
    emb = SS.oracle_embeddings(lang, sents)
    n_states = len(lang.state_names)
    sense_state = {s: i for i, s in enumerate(lang.state_senses) if s}
    seen = Counter()
    for e, lab in zip(emb, labels):
        for t, (sense, side) in enumerate(zip(lab["senses"], lab["resolved_by"])):
            if sense == S.NO_SENSE:
                continue
            k = sense_state[sense]
            fwd, bwd = e[1, t, k], e[1, t, n_states + k]
            seen[side] += 1
            if side in ("left", "both"):
                assert fwd == pytest.approx(1.0, abs=1e-5)
            else:
                assert fwd < 0.9  # the left context leaves the sense open
            if side in ("right", "both"):
                assert bwd == pytest.approx(1.0, abs=1e-5)
            else:
                assert bwd < 0.9
    assert all(seen[s] >= 20 for s in ("left", "right", "both")), seen


def test_labels_align_and_mark_every_polysemous_token(lang):
    rng = np.random.default_rng(5)
    sents, labels = SS.sample_corpus(lang, 2000, rng)
    classes = set(lang.state_classes)
    for toks, lab in zip(sents, labels):
        assert len(lab["classes"]) == len(lab["senses"]) == len(lab["resolved_by"]) == len(toks)
        for w, c, s, r in zip(toks, lab["classes"], lab["senses"], lab["resolved_by"]):
            assert c in classes
            if w in lang.polysemous:
                assert s.startswith(w + "#") and r == lang.polysemous[w]["side"]
            else:
                assert s == S.NO_SENSE and r == S.NO_SENSE
    assert any("花#spend" in lab["senses"] for lab in labels)
    assert any(any(ord(ch) > 0x4E00 for ch in " ".join(t)) for t in sents)  # Chinese present


def test_heldout_has_unseen_inflections_of_seen_stems(lang, tmp_path):
    rng = np.random.default_rng(6)
    train, _ = SS.sample_corpus(lang, 5000, rng)
    heldout, _ = SS.sample_corpus(lang, 1000, rng)
    seen = {w for s in train for w in s}
    seen_stems = {lang.lemmas[w] for w in seen if w in lang.lemmas}
    unseen = {w for s in heldout for w in s} - seen
    productive = [w for w in unseen if lang.lemmas.get(w) in seen_stems]
    assert len(productive) >= 20, (len(unseen), sorted(unseen)[:20])
    # every lemma entry is a real inflection: the form starts with its stem or a prefix + stem
    for form, stem in list(lang.lemmas.items())[::50]:
        core = form[2:] if form.startswith(("re", "un")) and not form.startswith(stem) else form
        assert core[: max(1, len(stem) - 1)] == stem[: max(1, len(stem) - 1)], (form, stem)
    # the default corpus (what `python train.py` trains on) has them too, counted in stats
    stats = SC.write_corpus(tmp_path / "c")
    assert stats["heldout_unseen_forms_of_seen_stems"] >= 30


def test_zipf_like_frequencies(lang):
    rng = np.random.default_rng(7)
    sents, _ = SS.sample_corpus(lang, 5000, rng)
    counts = np.array(sorted(Counter(w for s in sents for w in s).values(), reverse=True))
    assert len(counts) > 500
    slope = (math.log(counts[499]) - math.log(counts[9])) / (math.log(500) - math.log(10))
    assert -2.0 < slope < -0.7, slope


def test_optimum_below_bigram_below_unigram(tmp_path):
    stats = SC.write_corpus(tmp_path / "c", seed=0, n_train=3000, n_heldout=300)
    # collapsing unseen forms into <UNK> can only make the text more predictable
    assert stats["optimum_heldout_perplexity_train_vocab"] < stats["optimum_heldout_perplexity"]
    assert stats["optimum_heldout_perplexity_train_vocab"] < stats["bigram_heldout_perplexity"]
    assert stats["bigram_heldout_perplexity"] < stats["unigram_heldout_perplexity"]
    sides = {p["word"]: p["side"] for p in stats["polysemous"]}
    assert set(sides.values()) == {"left", "right", "both"}


# ---------------------------------------------------------------- files and CLI


def test_load_corpus_round_trip(tmp_path):
    SC.write_corpus(tmp_path / "c", seed=2, **SMALL)
    lang = S.make_language(2)
    rng = np.random.default_rng(np.random.SeedSequence([2, 1]))
    train, train_labels = SS.sample_corpus(lang, SMALL["n_train"], rng)
    sents, labels = SC.load_corpus(tmp_path / "c", "train")
    assert sents == train and labels == train_labels
    held, _ = SC.load_corpus(tmp_path / "c")
    assert len(held) == SMALL["n_heldout"]


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        (dict(seed=-1), ValueError, "seed"),
        (dict(seed=1.5), TypeError, "seed"),
        (dict(seed="3"), TypeError, "seed"),
        (dict(seed=True), TypeError, "seed"),
        (dict(n_train=0), ValueError, "n_train"),
        (dict(n_train=2.0), TypeError, "n_train"),
        (dict(n_heldout=-5), ValueError, "n_heldout"),
    ],
)
def test_bad_arguments_are_named(tmp_path, kwargs, exc, name):
    args = dict(SMALL, **kwargs)
    with pytest.raises(exc, match=name):
        SC.write_corpus(tmp_path / "x", **args)
    assert list(tmp_path.iterdir()) == []


def test_refuses_non_empty_dir_unless_overwrite(tmp_path):
    out = tmp_path / "c"
    out.mkdir()
    SC.write_corpus(out, seed=1, **SMALL)  # an empty folder is fine
    (out / "mine.txt").write_text("keep me")
    before = (out / "train.txt").read_bytes()
    with pytest.raises(FileExistsError, match="overwrite"):
        SC.write_corpus(out, seed=2, **SMALL)
    assert (out / "mine.txt").read_text() == "keep me"
    assert (out / "train.txt").read_bytes() == before
    SC.write_corpus(out, seed=2, overwrite=True, **SMALL)
    assert not (out / "mine.txt").exists()
    assert (out / "train.txt").read_bytes() != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # no temporary folders left
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(NotADirectoryError):
        SC.write_corpus(f, **SMALL)


def test_failure_leaves_nothing_behind(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(SS, "ngram_baselines", boom)  # fails after the text files are written
    with pytest.raises(RuntimeError, match="disk on fire"):
        SC.write_corpus(tmp_path / "new", **SMALL)
    assert list(tmp_path.iterdir()) == []
    # an existing corpus survives a failed overwrite untouched
    monkeypatch.undo()
    SC.write_corpus(tmp_path / "old", seed=1, **SMALL)
    before = {p.name: p.read_bytes() for p in (tmp_path / "old").iterdir()}
    monkeypatch.setattr(SS, "ngram_baselines", boom)
    with pytest.raises(RuntimeError):
        SC.write_corpus(tmp_path / "old", seed=2, overwrite=True, **SMALL)
    assert {p.name: p.read_bytes() for p in (tmp_path / "old").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]


def test_corpus_command(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="elmo-jax")
    SC.add_corpus_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["corpus", str(tmp_path / "c"), "--seed", "3", "--n-train", "200", "--n-heldout", "30"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "optimum" in out and "bigram" in out and "unigram" in out
    assert (tmp_path / "c" / "stats.json").exists()
    assert args.func(args) == 2  # exists now, no --overwrite
    assert "overwrite" in capsys.readouterr().err
    args = parser.parse_args(["corpus", str(tmp_path / "d"), "--seed", "-4"])
    assert args.func(args) == 2
    assert "seed" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_domain_b_shifts_vocabulary_and_senses_and_leaves_domain_a_alone(lang, tmp_path):
    b = S.make_language(0, domain="b")
    shared = set(lang.vocab) & set(b.vocab)
    assert 0.6 * len(lang.vocab) < len(shared) < 0.9 * len(lang.vocab)  # a quarter of the stems are new
    assert set(lang.polysemous) == set(b.polysemous)
    rng = np.random.default_rng(0)

    def money_share(language):
        _, labels = SS.sample_corpus(language, 4000, rng)
        senses = Counter(s for lab in labels for s in lab["senses"] if s.startswith("bank#"))
        return senses["bank#money"] / sum(senses.values())

    assert money_share(lang) > 0.45 and money_share(b) < 0.3  # 0.55 in domain a, 0.2 in b
    # The most frequent nouns differ: the Zipf ranks are reshuffled.
    top = {
        name: Counter(
            w
            for s in SS.sample_corpus(lg, 2000, np.random.default_rng(1))[0]
            for w in s
            if lg.lemmas.get(w) and not w.endswith("s")
        ).most_common(10)
        for name, lg in (("a", lang), ("b", b))
    }
    assert len({w for w, _ in top["a"]} & {w for w, _ in top["b"]}) < 5
    stats = SC.write_corpus(tmp_path / "b", domain="b", **SMALL)
    assert stats["domain"] == "b" and "domain" not in SC.write_corpus(tmp_path / "a", **SMALL)
    with pytest.raises(ValueError, match="domain must be one of 'a', 'b'"):
        S.make_language(0, domain="c")
