"""The pretraining batcher: streams, windows, backward stream, epochs, state, sharding."""

import json
from collections import Counter

import numpy as np
import pytest

from elmo_jax import chars
from elmo_jax.data.batches import LMBatcher
from elmo_jax.data.text_source import InMemorySource, LocalTextSource
from elmo_jax.data.vocab import Vocabulary


def _corpus(n=60, seed=0, max_len=15):
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(40)] + ["héllo", "日本"]
    # distinct sentences (an index word makes each unique) of varied lengths, one empty-ish
    return [[f"s{i}"] + [words[j] for j in rng.integers(0, len(words), rng.integers(0, max_len))] for i in range(n)]


def _char_table(vocab, C=50):
    return chars.batch_to_ids([vocab.tokens], C)[0]  # [V, C], row = char ids of vocab token


def _rows(batches, direction, start_token):
    """Per row: the stream of tokens read by that row (first input + masked targets)."""
    B = batches[0][f"{direction}_targets"].shape[0]
    streams = [[start_token] for _ in range(B)]
    for b in batches:
        tg, mk = b[f"{direction}_targets"], b[f"{direction}_mask"]
        for r in range(B):
            # masks are a prefix: once a row is dry it stays dry
            n = int(mk[r].sum())
            assert mk[r, :n].all() and not mk[r, n:].any()
            streams[r].extend(tg[r, :n].tolist())
    return streams


def _split(stream, vocab, first, last):
    """Split a row stream of ids into sentences delimited by first ... last markers."""
    out, cur = [], None
    for tok in vocab.decode(stream):
        if tok == first and cur is None:
            cur = []
        elif tok == last:
            out.append(cur)
            cur = None
        else:
            cur.append(tok)
    assert cur is None or cur == [], "a row stream ended inside a sentence"
    return out


def _epoch(batcher):
    out = []
    for b in batcher:
        out.append(b)
    return out


def test_batch_keys_shapes_and_dtypes():
    sents = _corpus()
    vocab = Vocabulary.build(sents)
    b = next(LMBatcher(InMemorySource(sents), vocab, batch_size=4, unroll_steps=7, max_characters_per_token=20))
    assert set(b) == {"fwd_char_ids", "fwd_targets", "fwd_mask", "bwd_char_ids", "bwd_targets", "bwd_mask"}
    for d in ("fwd", "bwd"):
        assert b[f"{d}_char_ids"].shape == (4, 7, 20) and b[f"{d}_char_ids"].dtype == np.int32
        assert b[f"{d}_targets"].shape == (4, 7) and b[f"{d}_targets"].dtype == np.int32
        assert b[f"{d}_mask"].shape == (4, 7) and b[f"{d}_mask"].dtype == np.float32
        assert b[f"{d}_mask"].all()  # the first batch of a big enough corpus is full


def test_targets_are_inputs_shifted_across_windows_and_every_token_once_per_epoch():
    sents = _corpus()
    vocab = Vocabulary.build(sents)
    table = _char_table(vocab)
    batcher = LMBatcher(InMemorySource(sents), vocab, batch_size=3, unroll_steps=5, seed=3, num_epochs=1)
    batches = _epoch(batcher)
    with pytest.raises(StopIteration):
        next(batcher)
    n_tokens = sum(len(s) + 1 for s in sents)
    # All batches full but the last few (the rows running dry at the end of the epoch).
    full = [bool(b["fwd_mask"].all()) for b in batches]
    assert all(full[: len(full) - 4])
    for d, start in (("fwd", "<S>"), ("bwd", "</S>")):
        B = 3
        for r in range(B):
            inputs = np.concatenate([b[f"{d}_char_ids"][r][b[f"{d}_mask"][r] > 0] for b in batches])
            targets = np.concatenate([b[f"{d}_targets"][r][b[f"{d}_mask"][r] > 0] for b in batches])
            # input j+1 is target j, also across window edges
            np.testing.assert_array_equal(inputs[1:], table[targets[:-1]])
            np.testing.assert_array_equal(inputs[0], chars.token_to_ids(start))
            # masked positions are zero
            for b in batches:
                assert not b[f"{d}_char_ids"][r][b[f"{d}_mask"][r] == 0].any()
    fwd = [s for row in _rows(batches, "fwd", vocab.bos_id) for s in _split(row, vocab, "<S>", "</S>")]
    assert Counter(map(tuple, fwd)) == Counter(map(tuple, sents))
    assert sum(len(s) + 1 for s in fwd) == n_tokens


def test_backward_stream_is_reversed_sentences_in_its_own_order():
    sents = _corpus()
    vocab = Vocabulary.build(sents)
    batches = _epoch(LMBatcher(InMemorySource(sents), vocab, batch_size=2, unroll_steps=6, seed=1, num_epochs=1))
    b0 = batches[0]
    # the backward stream starts with </S>, then the last word of a sentence
    assert b0["bwd_char_ids"][0, 0].tolist() == chars.token_to_ids("</S>").tolist()
    bwd_rows = _rows(batches, "bwd", vocab.eos_id)
    bwd = [s for row in bwd_rows for s in _split(row, vocab, "</S>", "<S>")]
    assert Counter(tuple(s[::-1]) for s in bwd) == Counter(map(tuple, sents))
    fwd = [s for row in _rows(batches, "fwd", vocab.bos_id) for s in _split(row, vocab, "<S>", "</S>")]
    assert [s[::-1] for s in bwd] != fwd  # separately shuffled


def test_epochs_reshuffle_and_cover_the_data():
    sents = _corpus(n=30)
    vocab = Vocabulary.build(sents)
    batcher = LMBatcher(InMemorySource(sents), vocab, batch_size=2, unroll_steps=8, seed=5, num_epochs=3)
    per_epoch = {}
    for b in batcher:
        per_epoch.setdefault(batcher.epoch, []).append(b)
    assert sorted(per_epoch) == [0, 1, 2]
    orders = []
    for e, bs in per_epoch.items():
        rows = _rows(bs, "fwd", vocab.bos_id)
        got = [s for row in rows for s in _split(row, vocab, "<S>", "</S>")]
        assert Counter(map(tuple, got)) == Counter(map(tuple, sents)), f"epoch {e}"
        orders.append(got)
    assert orders[0] != orders[1] != orders[2]
    # steps per epoch from the data: (words + </S>) // (B * T)
    assert batcher.steps_per_epoch == sum(len(s) + 1 for s in sents) // 16


def test_state_round_trip_reproduces_the_following_batches():
    sents = _corpus(n=40)
    vocab = Vocabulary.build(sents)

    def make():
        return LMBatcher(InMemorySource(sents), vocab, batch_size=3, unroll_steps=4, seed=11, read_chunk=7)

    a = make()
    for _ in range(37):
        next(a)
    state = json.loads(json.dumps(a.get_state()))  # JSON-serializable
    assert len(json.dumps(state)) < 2000
    expected = [next(a) for _ in range(120)]  # crosses at least one epoch boundary
    assert a.epoch >= 1
    b = make()
    next(b)  # some other position; set_state must override it
    b.set_state(state)
    for want in expected:
        got = next(b)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    # a mismatched batcher refuses the state
    c = LMBatcher(InMemorySource(sents), vocab, batch_size=2, unroll_steps=4, seed=11)
    with pytest.raises(ValueError, match="batch_size"):
        c.set_state(state)


def test_state_round_trip_with_local_text(tmp_path):
    sents = _corpus(n=25)
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(" ".join(s) for s in sents) + "\n", encoding="utf-8")
    src = LocalTextSource(str(path), tmp_path / "tfds")
    vocab = Vocabulary.build(src)
    a = LMBatcher(src, vocab, batch_size=2, unroll_steps=5, seed=2)
    for _ in range(9):
        next(a)
    state = a.get_state()
    expected = [next(a) for _ in range(30)]
    b = LMBatcher(LocalTextSource(str(path), tmp_path / "tfds"), vocab, batch_size=2, unroll_steps=5, seed=2)
    b.set_state(state)
    for want in expected:
        got = next(b)
        assert all(np.array_equal(got[k], want[k]) for k in want)


def test_sharding_partitions_the_sentences():
    sents = _corpus(n=41)
    vocab = Vocabulary.build(sents)
    seen = []
    for p in range(2):
        batcher = LMBatcher(
            InMemorySource(sents),
            vocab,
            batch_size=2,
            unroll_steps=6,
            num_epochs=1,
            process_index=p,
            process_count=2,
        )
        assert batcher.steps_per_epoch == sum(len(s) + 1 for s in sents) // (2 * 2 * 6)
        got = [s for row in _rows(list(batcher), "fwd", vocab.bos_id) for s in _split(row, vocab, "<S>", "</S>")]
        assert Counter(map(tuple, got)) == Counter(map(tuple, sents[p::2]))
        seen.append({tuple(s) for s in got})
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == {tuple(s) for s in sents}
    with pytest.raises(ValueError, match="process_index"):
        LMBatcher(InMemorySource(sents), vocab, 2, process_index=2, process_count=2)


def test_eval_mode_reads_in_order_once():
    sents = _corpus(n=5)
    vocab = Vocabulary.build(sents[:2])  # most words unknown as targets
    batcher = LMBatcher(InMemorySource(sents), vocab, batch_size=1, unroll_steps=4, shuffle=False, num_epochs=1)
    batches = list(batcher)
    rows = _rows(batches, "fwd", vocab.bos_id)
    flat_expected = [vocab.bos_id]
    for s in sents:
        flat_expected += vocab.encode(s).tolist() + [vocab.eos_id, vocab.bos_id]
    assert rows[0] == flat_expected[:-1]
    assert vocab.unk_id in rows[0]
    # unknown target words still get their real characters as inputs
    inputs = np.concatenate([b["fwd_char_ids"][0][b["fwd_mask"][0] > 0] for b in batches])
    expected_inputs = chars.batch_to_ids([["<S>"] + sum(([*s, "</S>", "<S>"] for s in sents), [])[:-2]])[0]
    np.testing.assert_array_equal(inputs, expected_inputs)


def test_fixture_corpus_with_fixture_vocab(bilm_fixtures):
    lines = (bilm_fixtures / "train" / "data.txt").read_text(encoding="utf-8").splitlines()
    sents = [line.split() for line in lines if line.strip()]
    vocab = Vocabulary.load(bilm_fixtures / "train" / "vocab.txt")
    batcher = LMBatcher(InMemorySource(sents), vocab, batch_size=2, unroll_steps=10, seed=0, num_epochs=1)
    batches = list(batcher)
    assert batcher.steps_per_epoch == (sum(map(len, sents)) + len(sents)) // 20
    total = sum(int(b["fwd_mask"].sum()) for b in batches)
    # every </S>-terminated word once, plus the <S> of every sentence but each row's first
    rows_used = sum(1 for r in range(2) if batches[0]["fwd_mask"][r].any())
    assert total == sum(len(s) + 2 for s in sents) - rows_used
    fwd = [s for row in _rows(batches, "fwd", vocab.bos_id) for s in _split(row, vocab, "<S>", "</S>")]
    assert sorted(fwd) == sorted(vocab.decode(vocab.encode(s)) for s in sents)


def test_small_token_table_gives_the_same_batches():
    sents = _corpus(n=30)
    vocab = Vocabulary.build(sents[:10])
    a = LMBatcher(InMemorySource(sents), vocab, batch_size=3, unroll_steps=5, seed=4, num_epochs=2)
    b = LMBatcher(InMemorySource(sents), vocab, batch_size=3, unroll_steps=5, seed=4, num_epochs=2, char_cache_size=16)
    got_a, got_b = list(a), list(b)
    assert len(got_a) == len(got_b)
    for x, y in zip(got_a, got_b):
        assert all(np.array_equal(x[k], y[k]) for k in x)
