"""The token index: built once (in memory, on disk, in parallel: the same arrays), read by
the batcher with numpy gathers (the same batches and states as reading the source), and
never half-written or silently stale."""

import json
import multiprocessing
import os
import pickle
from collections import Counter

import numpy as np
import pytest

from elmo_jax import chars
from elmo_jax.data.batches import IndexChunkEncoder, LMBatcher
from elmo_jax.data.text_source import InMemorySource, LocalTextSource
from elmo_jax.data.token_index import TokenIndex, TokenIndexError, build_token_index, open_or_build
from elmo_jax.data.vocab import Vocabulary
from test_batches import _corpus
from test_data_pipeline import BEFORE, _digest


@pytest.fixture(scope="module")
def data():
    sents = _corpus(n=90, max_len=25)
    source = InMemorySource(sents)
    return source, Vocabulary.build(sents, max_size=30), build_token_index(source)


@pytest.mark.parametrize("case", range(len(BEFORE)))
@pytest.mark.parametrize("read_chunk", [1, 7, 1024])
def test_batches_from_the_index_are_those_of_the_previous_implementation(data, case, read_chunk):
    _, vocab, index = data
    kwargs, n_batches, digest = BEFORE[case]
    assert _digest(LMBatcher(index, vocab, read_chunk=read_chunk, **kwargs)) == (n_batches, digest)


def test_a_folder_index_read_by_worker_processes_gives_the_same_batches(data, tmp_path):
    source, vocab, _ = data
    index = build_token_index(source, tmp_path / "index", workers=2)
    for kwargs, n_batches, digest in BEFORE[:3]:
        with LMBatcher(index, vocab, read_chunk=5, workers=2, prefetch=3, **kwargs) as batcher:
            assert _digest(batcher) == (n_batches, digest)
    assert not multiprocessing.active_children()
    # what travels to a worker: the folder's path and one vocabulary id per type, no corpus
    assert len(pickle.dumps(index)) < 500
    encoder = IndexChunkEncoder(index, vocab, 50)
    assert len(pickle.dumps(encoder)) < 1000 + 4 * index.num_types


def test_memory_folder_and_parallel_builds_hold_the_same_index(data, tmp_path):
    source, _, in_memory = data
    folder = build_token_index(source, tmp_path / "serial")
    # 13 ranges of 7 sentences in 3 processes: types first seen in later ranges are merged
    parallel = build_token_index(source, tmp_path / "parallel", workers=3, range_size=7)
    for index in (folder, parallel):
        assert index.folder is not None
        np.testing.assert_array_equal(index.offsets_n1, in_memory.offsets_n1)
        np.testing.assert_array_equal(index.ids_N, in_memory.ids_N)
        np.testing.assert_array_equal(index.counts_V, in_memory.counts_V)
        assert index.types() == in_memory.types()
    # the index is a sentence source standing for the one it was built from
    sents = list(source)
    assert list(parallel) == sents
    assert parallel.get_batch([3, 0, 89, 3]) == source.get_batch([3, 0, 89, 3])
    assert parallel[-1] == sents[-1] and len(parallel) == len(source) == 90
    assert parallel.num_tokens() == source.num_tokens()
    assert parallel.content_id() == source.content_id()
    # types in order of first occurrence, with their counts: what Vocabulary.build reads
    assert list(parallel.counts().items()) == list(Counter(t for s in sents for t in s).items())
    with pytest.raises(IndexError, match="out of range"):
        parallel[90]


def test_char_table_holds_each_types_char_ids_then_the_markers_and_padding(tmp_path):
    long_word = "x" * 40
    sents = [["<S>", "héllo", long_word], [], ["日本", "</S>", "a"]]  # an empty sentence too
    source = InMemorySource(sents)
    for index in (build_token_index(source), build_token_index(source, tmp_path / "i")):
        for C in (12, 50):
            table = index.char_table(C)
            types = index.types()
            assert table.shape == (len(types) + 3, C) and table.dtype == np.int16
            np.testing.assert_array_equal(table[: len(types)], chars.tokens_to_ids(types, C))
            markers = chars.batch_to_ids([[chars.BOS_TOKEN, chars.EOS_TOKEN]], C)[0]
            np.testing.assert_array_equal(table[len(types) : len(types) + 2], markers)
            assert not table[-1].any()  # the padding row
    assert sorted(f for f in os.listdir(tmp_path / "i") if f.startswith("chars_")) == ["chars_12.bin", "chars_50.bin"]
    # and a batcher over sentences with markers, an empty sentence and a cut token agrees
    vocab = Vocabulary.build(sents)
    args = dict(batch_size=2, unroll_steps=3, max_characters_per_token=12, seed=1, num_epochs=2)
    assert _digest(LMBatcher(index, vocab, **args)) == _digest(LMBatcher(source, vocab, **args))


def test_states_move_between_source_and_index_batchers(data):
    """A checkpoint written while reading the source resumes on the index, and back."""
    source, vocab, index = data
    args = dict(batch_size=3, unroll_steps=5, seed=2, read_chunk=4)
    reference = [next(b) for b in [LMBatcher(source, vocab, **args)] for _ in range(40)]
    a = LMBatcher(source, vocab, **args)
    for _ in range(13):
        next(a)
    b = LMBatcher(index, vocab, **args)
    b.set_state(json.loads(json.dumps(a.get_state())))
    for i in range(13, 27):
        got = next(b)
        for k in got:
            np.testing.assert_array_equal(got[k], reference[i][k], err_msg=f"{k} @ {i}")
    c = LMBatcher(source, vocab, **args)
    c.set_state(b.get_state())
    np.testing.assert_array_equal(next(c)["bwd_char_ids"], reference[27]["bwd_char_ids"])


class FailingSource(InMemorySource):
    def get_batch(self, indices):
        if 40 in [int(i) for i in indices]:
            raise RuntimeError("the disk went away at sentence 40")
        return super().get_batch(indices)


def test_damaged_stale_or_failed_indexes_never_serve_batches(data, tmp_path):
    source, _, _ = data
    folder = tmp_path / "index"
    logs = []
    index = open_or_build(source, folder, log=logs.append)
    assert any("indexing 90 sentences" in line for line in logs)
    logs.clear()
    assert open_or_build(source, folder, log=logs.append).num_tokens() == index.num_tokens()
    assert logs == []  # opened, not rebuilt

    # a cut file is named, and rebuilt by open_or_build
    ids = folder / "ids.bin"
    with open(ids, "r+b") as f:
        f.truncate(ids.stat().st_size - 4)
    with pytest.raises(TokenIndexError, match="ids.bin has .* bytes.*damaged"):
        TokenIndex.open(folder)
    with pytest.raises(TokenIndexError, match="damaged"):
        open_or_build(source, folder, may_build=False)
    rebuilt = open_or_build(source, folder, log=logs.append)
    assert any("rebuilding the token index" in line for line in logs)
    np.testing.assert_array_equal(rebuilt.ids_N, data[2].ids_N)

    # any file cut short is caught on opening, not when a batch reads it
    types_file = folder / "types.json"
    types_file.write_text(types_file.read_text(encoding="utf-8")[:-5], encoding="utf-8")
    with pytest.raises(TokenIndexError, match="types.json has .* bytes.*damaged"):
        TokenIndex.open(folder)
    open_or_build(source, folder)

    # other sentences: another content id, so the index is made again
    other = InMemorySource([["new", "text"]] * 5)
    assert list(open_or_build(other, folder)) == [["new", "text"]] * 5
    with pytest.raises(TokenIndexError, match="no token index of this data"):
        open_or_build(source, folder, may_build=False)

    # a build that fails leaves the previous index whole, and no temporary folder
    with pytest.raises(RuntimeError, match="disk went away"):
        build_token_index(FailingSource(list(source)), folder)
    assert list(TokenIndex.open(folder)) == [["new", "text"]] * 5
    assert sorted(os.listdir(tmp_path)) == ["index"]

    with pytest.raises(TokenIndexError, match="no complete token index"):
        TokenIndex.open(tmp_path / "nothing")


def test_an_index_of_prepared_local_text_reads_as_the_text_does(tmp_path):
    sents = _corpus(n=40, max_len=12)
    path = tmp_path / "corpus.txt"
    path.write_text("".join(" ".join(s) + "\n" for s in sents), encoding="utf-8")
    source = LocalTextSource(str(path), tmp_path / "tfds")
    index = open_or_build(source, tmp_path / "index", workers=2)
    assert index.content_id() == source.content_id()
    assert list(index) == list(source) == sents
    vocab = Vocabulary.build(index.counts(), max_size=25)
    assert vocab == Vocabulary.build(source, max_size=25)
    args = dict(batch_size=3, unroll_steps=4, seed=3, num_epochs=1)
    assert _digest(LMBatcher(index, vocab, **args)) == _digest(LMBatcher(source, vocab, **args))


def test_training_reads_its_index_made_once_and_logs_its_wait_for_data(tmp_path):
    """A run indexes its text once (a resume opens the index), trains on it, and records the
    fraction of its time spent waiting for batches."""
    from test_train import _cfg

    from elmo_jax.train.loop import train

    logs = []
    cfg = _cfg(tmp_path, max_steps=3, checkpoint_every=3)
    train(cfg, str(tmp_path / "run"), progress=False, log=logs.append)
    assert sum("indexing" in line for line in logs) == 1
    index = TokenIndex.open(tmp_path / "run" / "token_index" / "train")
    assert len(index) == 60 and index.content_id() == LocalTextSource(cfg.data, cfg.data_dir).content_id()
    logs.clear()
    train(_cfg(tmp_path, max_steps=5, checkpoint_every=3), str(tmp_path / "run"), progress=False, log=logs.append)
    assert any("resuming from" in line for line in logs) and not any("indexing" in line for line in logs)
    records = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    waits = [r["data_wait"] for r in records if r["kind"] == "train"]
    assert len(waits) == 5 and all(0.0 <= w <= 1.0 for w in waits)


def test_an_index_gone_from_under_the_workers_is_their_error_and_no_worker_is_left(data, tmp_path):
    import shutil

    from elmo_jax.data.prefetch import DataWorkerError

    source, vocab, _ = data
    index = build_token_index(source, tmp_path / "index")
    batcher = LMBatcher(index, vocab, batch_size=2, unroll_steps=4, read_chunk=8, workers=2)
    shutil.rmtree(tmp_path / "index")  # workers open the folder on their first chunk
    with pytest.raises(DataWorkerError, match="holds no complete token index"):
        for _ in range(100):
            next(batcher)
    batcher.close()
    assert not multiprocessing.active_children()


def test_a_killed_builds_leftovers_are_removed_and_bad_arguments_named(data, tmp_path):
    """A build killed by a signal cannot clean up: the next build on the host removes its
    temporary folder once its process is gone (a running build's is kept)."""
    import socket
    import subprocess
    import sys

    source, _, _ = data
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    host = socket.gethostname().replace("_", "-")
    stale = tmp_path / f".index.building_{host}_{dead}_abc.tmp"
    stale.mkdir()
    (stale / "ids.bin").write_bytes(b"x" * 100)
    alive = tmp_path / f".index.building_{host}_{os.getpid()}_abc.tmp"
    alive.mkdir()
    build_token_index(source, tmp_path / "index")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["index", alive.name])

    with pytest.raises(ValueError, match="range_size must be >= 1"):
        build_token_index(source, range_size=0)
    index = TokenIndex.open(tmp_path / "index")
    with pytest.raises(IndexError, match="sentence index 90 out of range"):
        index.get_batch([3, 90])
    with pytest.raises(IndexError, match="sentence index -1 out of range"):
        index.get_batch([-1])


def test_an_index_damaged_in_place_is_refused_on_opening_and_rebuilt(data, tmp_path):
    """Damage that keeps every file's size (ids swapped, an id out of range, a version-1
    index without digests) never reaches a batch: opening refuses it (SHA-256 of each file
    against meta.json) and open_or_build rebuilds it from the source."""
    source, _, built = data
    folder = tmp_path / "index"
    open_or_build(source, folder)
    ids_path = folder / "ids.bin"
    good = np.fromfile(ids_path, dtype=np.int32)
    assert len(good) > 400

    def damage(ids):
        ids.tofile(ids_path)
        assert ids_path.stat().st_size == good.nbytes  # in place: the sizes meta.json records hold

    permuted = good.copy()
    at = np.random.default_rng(0).choice(len(good), size=200, replace=False)
    permuted[at] = good[np.roll(at, 1)]  # 200 ids moved: other sentences, every id in range
    assert (permuted != good).any()
    out_of_range = good.copy()
    out_of_range[7] = 10**6  # was an IndexError traceback in the middle of training
    for bad in (permuted, out_of_range):
        damage(bad)
        with pytest.raises(TokenIndexError, match=r"ids.bin is not the file that was written .*delete .* rebuilt"):
            TokenIndex.open(folder)
        logs = []
        rebuilt = open_or_build(source, folder, log=logs.append)
        assert any("rebuilding the token index" in line and "ids.bin" in line for line in logs), logs
        np.testing.assert_array_equal(rebuilt.ids_N, built.ids_N)
        assert list(rebuilt) == list(source)
    # an index from before the digests were recorded is made again, not trusted
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    (folder / "meta.json").write_text(json.dumps({**meta, "version": 1, "sha256": None}), encoding="utf-8")
    logs = []
    open_or_build(source, folder, log=logs.append)
    assert any("indexing 90 sentences" in line for line in logs)
    assert json.loads((folder / "meta.json").read_text(encoding="utf-8"))["version"] == 2
