"""The batcher's bulk fill and its worker processes: same batches as before, exact resume with
any worker count, clean shutdown (worker errors, SIGTERM, kill -9)."""

import hashlib
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from elmo_jax.data.batches import LMBatcher
from elmo_jax.data.prefetch import DataWorkerError
from elmo_jax.data.text_source import InMemorySource
from elmo_jax.data.vocab import Vocabulary
from test_batches import _corpus
from test_train import MICRO, REPO, _corpus as _train_corpus, _losses

# sha256 (first 32 hex digits) of every batch of the run plus the final state, computed with
# the per-row implementation this replaced (elmo_jax 7058beb) on _corpus(n=90, max_len=25)
# with a 30-word vocabulary: the new fill gives byte-identical batches and states.
BEFORE = [
    (dict(batch_size=3, unroll_steps=5, seed=4, num_epochs=2), 184, "af32d6ef4dedab8a87d564407930b23e"),
    (dict(batch_size=2, unroll_steps=7, shuffle=False, num_epochs=1), 99, "5b8336ab0ea88e4a7a7ce6229980412e"),
    (
        dict(batch_size=4, unroll_steps=4, seed=9, num_epochs=2, process_index=1, process_count=2),
        91,
        "661dace349c2d84f2cc24acdfc9571d5",
    ),
    (
        dict(batch_size=5, unroll_steps=30, seed=1, num_epochs=1, max_characters_per_token=12),
        10,
        "4aa43efe1d75b4e8d122e5f39220d298",
    ),
]


def _digest(batcher):
    h = hashlib.sha256()
    n = 0
    for b in batcher:
        for k in sorted(b):
            h.update(k.encode())
            h.update(str(b[k].dtype).encode())
            h.update(str(b[k].shape).encode())
            h.update(np.ascontiguousarray(b[k]).tobytes())
        n += 1
    h.update(json.dumps(batcher.get_state(), sort_keys=True).encode())
    return n, h.hexdigest()[:32]


@pytest.fixture(scope="module")
def data():
    sents = _corpus(n=90, max_len=25)
    return InMemorySource(sents), Vocabulary.build(sents, max_size=30)


@pytest.mark.parametrize("case", range(len(BEFORE)))
@pytest.mark.parametrize("read_chunk", [1, 7, 1024])
def test_batches_are_those_of_the_previous_implementation(data, case, read_chunk):
    source, vocab = data
    kwargs, n_batches, digest = BEFORE[case]
    assert _digest(LMBatcher(source, vocab, read_chunk=read_chunk, **kwargs)) == (n_batches, digest)


def test_workers_give_the_previous_implementations_batches(data):
    source, vocab = data
    for kwargs, n_batches, digest in BEFORE[:2]:
        with LMBatcher(source, vocab, read_chunk=5, workers=2, prefetch=3, **kwargs) as batcher:
            assert _digest(batcher) == (n_batches, digest)
    assert not multiprocessing.active_children()


def test_state_is_the_next_batch_to_consume_whatever_was_built_ahead(data):
    """Resume at any step, from and into any worker count, gives the uninterrupted stream."""
    source, vocab = data
    args = dict(batch_size=3, unroll_steps=5, seed=2, read_chunk=4)
    reference = [next(b) for b in [LMBatcher(source, vocab, **args)] for _ in range(70)]
    rng = random.Random(0)
    with LMBatcher(source, vocab, workers=2, prefetch=6, **args) as a:
        position = 0
        for workers_next in (0, 1, 2, 0):
            for _ in range(rng.randrange(1, 15)):
                got = next(a)
                for k in got:
                    np.testing.assert_array_equal(got[k], reference[position][k], err_msg=f"{k} @ {position}")
                position += 1
            state = json.loads(json.dumps(a.get_state()))  # as a checkpoint stores it
            with LMBatcher(source, vocab, workers=workers_next, **args) as b:
                b.set_state(state)
                for i in range(3):
                    got = next(b)
                    np.testing.assert_array_equal(got["bwd_char_ids"], reference[position + i]["bwd_char_ids"])
                    np.testing.assert_array_equal(got["fwd_targets"], reference[position + i]["fwd_targets"])
        a.set_state(state)  # jumping back drops what the workers built ahead
        np.testing.assert_array_equal(next(a)["fwd_char_ids"], reference[position]["fwd_char_ids"])
    assert not multiprocessing.active_children()


class BrokenSource(InMemorySource):
    """Fails (in a worker) when asked for sentence 17."""

    def get_batch(self, indices):
        if 17 in [int(i) for i in indices]:
            raise RuntimeError("disk on fire while reading sentence 17")
        return super().get_batch(indices)


def test_an_error_in_a_worker_is_raised_in_the_consumer_and_no_worker_is_left(data):
    _, vocab = data
    source = BrokenSource(_corpus(n=90, max_len=25))
    batcher = LMBatcher(source, vocab, batch_size=2, unroll_steps=5, shuffle=False, read_chunk=4, workers=2)
    with pytest.raises(DataWorkerError, match="disk on fire while reading sentence 17") as info:
        for _ in range(1000):
            next(batcher)
    assert "get_batch" in str(info.value)  # the worker's traceback is part of the message
    assert multiprocessing.active_children()
    batcher.close()
    assert not multiprocessing.active_children()


def _descendants(pid):
    """Pids of the processes below ``pid`` (from /proc)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    out, frontier = [], [pid]
    while frontier:
        below = [p for p, pp in parent.items() if pp in frontier]
        out += below
        frontier = below
    return out


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _assert_all_exit(pids, what, grace_s=10.0):
    """The processes end within ``grace_s`` (workers poll for their trainer every 0.5 s;
    multiprocessing's fork server and resource tracker leave when their pipes close)."""
    deadline = time.monotonic() + grace_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {}
    for p in pids:
        if _alive(p):
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    left[p] = f.read().replace(b"\0", b" ")[:120]
            except OSError:
                pass
    assert not left, f"processes outlived {what}: {left}"


def _wait_for_train_lines(proc, workdir, n, timeout=150):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = workdir / "metrics.jsonl"
        if path.exists() and path.read_text().count('"kind": "train"') >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early:\n{proc.stdout.read()}")
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("no progress")


@pytest.mark.slow  # three tiny training runs, two of them fresh interpreters: 35-80 s on 2 cores
def test_kill_9_with_workers_then_sigterm_resume_exactly_and_leave_no_process(tmp_path):
    """kill -9 at a random step while 2 workers run, resume with 1 worker, SIGTERM: the
    losses are the uninterrupted in-thread run's, and no worker outlives its trainer."""
    from elmo_jax.train.config_loader import parse_config_args
    from elmo_jax.train.loop import train

    steps = 8
    args = [
        *(f"--config.model_overrides.{k}={json.dumps(v).replace(' ', '')}" for k, v in MICRO.items()),
        f"--config.data={_train_corpus(tmp_path, n=200)}",
        f"--config.data_dir={tmp_path / 'tfds'}",
        "--config.batch_size=4",
        "--config.unroll_steps=5",
        "--config.num_negatives=4",
        "--config.epochs=1000",
        "--config.checkpoint_every=1",
        "--config.log_every=1",
    ]
    cfg, rest = parse_config_args(args + [f"--config.max_steps={steps}", "--config.data_workers=0"])
    assert not rest
    train(cfg, str(tmp_path / "reference"), progress=False)
    reference = _losses(tmp_path / "reference")
    assert sorted(reference) == list(range(1, steps + 1))

    workdir = tmp_path / "run"
    cmd = [
        sys.executable,
        str(REPO / "train.py"),
        "--workdir",
        str(workdir),
        "--no-progress",
        *args,
        "--config.max_steps=none",
    ]
    kill_at = random.Random().randrange(2, steps - 2)
    first = subprocess.Popen(
        cmd + ["--config.data_workers=2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    _wait_for_train_lines(first, workdir, kill_at)
    deadline = time.monotonic() + 60  # at least one finished checkpoint to resume from
    while not any(p.name.isdigit() for p in (workdir / "checkpoints").glob("*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = _descendants(first.pid)
    assert len(workers) >= 2, "the run has no data worker processes"
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    _assert_all_exit(workers, "a killed trainer")

    second = subprocess.Popen(
        cmd + ["--config.data_workers=1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    _wait_for_train_lines(second, workdir, steps)
    workers = _descendants(second.pid)
    assert workers
    second.send_signal(signal.SIGTERM)
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 143, out  # stopped, resumable
    assert "resuming from" in out and "SIGTERM: saved" in out
    _assert_all_exit(workers, "a trainer stopped by SIGTERM")
    resumed = _losses(workdir)
    for step in range(1, steps + 1):
        assert resumed[step] == pytest.approx(reference[step], abs=1e-6), (step, kill_at)


def test_parallel_counts_give_the_same_vocabulary_in_the_same_order():
    """Token counts come from the token index (built in 3 processes here): the same counts in
    the same first-occurrence order as one pass over the source, so the same vocabulary."""
    from collections import Counter

    from elmo_jax.data.token_index import build_token_index

    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(3000)]
    sents = [[words[j] for j in rng.zipf(1.3, rng.integers(1, 12)) % 3000] for _ in range(9000)]
    source = InMemorySource(sents)
    serial = Counter(t for s in sents for t in s)
    parallel = build_token_index(source, workers=3).counts()
    assert list(serial.items()) == list(parallel.items())  # counts and first-occurrence order
    assert Vocabulary.build(parallel, max_size=500) == Vocabulary.build(sents, max_size=500)
    assert not multiprocessing.active_children()


def test_sentences_are_read_from_the_raw_records_and_other_layouts_fall_back():
    from elmo_jax.data.example_proto import example_text

    text = "ein Satz mit ünïcode".encode()
    bytes_list = b"\x0a" + bytes([len(text)]) + text
    feature = b"\x0a" + bytes([len(bytes_list)]) + bytes_list
    entry = b"\x0a\x04text\x12" + bytes([len(feature)]) + feature
    features = b"\x0a" + bytes([len(entry)]) + entry
    example = b"\x0a" + bytes([len(features)]) + features
    assert example_text(example) == text
    other_key = example.replace(b"text", b"txet")
    assert example_text(other_key) is None
    assert example_text(example[:-3]) is None  # truncated
    assert example_text(b"\x08\x01") is None  # a varint field: not this layout


def test_records_of_the_writers_layout_and_other_encodings_of_it_read_the_same():
    """The writer's own bytes are recognised by their header; the same message with a
    length written in a longer (valid) varint takes the field-by-field path, same text."""
    from elmo_jax.data.example_proto import example_text, text_example

    for text in [b"", b"a", "ein Satz mit ünïcode".encode(), b"x" * 127, b"y" * 128, b"z" * 20000]:
        record = text_example(text)
        assert example_text(record) == text
    text = b"five!"
    record = text_example(text)
    padded = record[: -len(text) - 1] + bytes([0x80 | len(text), 0x00]) + text  # BytesList.value length in 2 bytes
    bigger = bytearray(padded)
    for i in (1, 3, 11, 13):  # every enclosing length grows by the one extra byte
        bigger[i] += 1
    assert example_text(bytes(bigger)) == text
    assert example_text(bytes(bigger)[:-1]) is None  # cut short: neither path accepts it
