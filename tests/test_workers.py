"""Data worker processes under faults: none outlives its trainer (kill -9 or
SIGTERM during text preparation or the token index build), a Ctrl-C is one line, a worker
killed during training is replaced without changing a batch, closing never waits on a dead
or stuck worker, and a script without a ``__main__`` guard gets an error naming the fix.

Faults are injected at an event (a worker announces it holds a task, then blocks), never
after a sleep; every wait has a deadline so a regression fails instead of hanging.

The module's top level imports only the standard library and pytest: the worker processes
of the subprocess runs import it to find the blocking task and the source below.
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[1]
ANNOUNCE = "ELMO_JAX_TEST_ANNOUNCE"  # folder where a blocking task writes its worker's pid


# -- tasks run in the worker processes of the subprocess runs ---------------------------------
def _announce_and_block(*args):
    """Stands for a worker's task: says it runs (a file named by its pid), then never ends."""
    folder = os.environ[ANNOUNCE]
    with open(os.path.join(folder, f"{os.getpid()}.tmp"), "w") as f:
        f.write(" ".join(map(str, args)))
    os.replace(os.path.join(folder, f"{os.getpid()}.tmp"), os.path.join(folder, str(os.getpid())))
    threading.Event().wait()


# The trainer (`elmo-jax train`) with the task of one stage replaced by _announce_and_block.
_TRAINER = textwrap.dedent("""\
    import sys
    sys.path.insert(0, {repo!r})
    from tests.test_workers import _announce_and_block

    if __name__ == "__main__":
        from elmo_jax.data import text_source, token_index
        if sys.argv[1] == "prepare":
            text_source.write_range = _announce_and_block
        else:
            token_index._index_held_range = _announce_and_block
        from elmo_jax.cli import main
        sys.exit(main(sys.argv[2:]))
""")


class _Sentences:
    """A picklable sentence source of ``n`` two-word sentences (no TFDS, no file)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def get_batch(self, indices):
        return [["word", str(i % 7)] for i in indices]


class _KillsItsReader:
    """A sentence source whose every read kills the worker process reading it."""

    def __len__(self):
        return 20

    def get_batch(self, indices):
        os.kill(os.getpid(), signal.SIGKILL)

    def num_tokens(self):
        return 40


# A token index build in 2 workers (4 ranges), each task replaced by _announce_and_block; a
# Ctrl-C ends it with one line, as the command line does.
_INDEXER = textwrap.dedent("""\
    import sys
    sys.path.insert(0, {repo!r})
    from tests.test_workers import _Sentences, _announce_and_block

    if __name__ == "__main__":
        from elmo_jax.data import token_index
        token_index._index_held_range = _announce_and_block
        try:
            token_index.build_token_index(_Sentences(40), workers=2, range_size=10)
        except KeyboardInterrupt:
            print("indexer: interrupted", file=sys.stderr)
            sys.exit(130)
""")


# -- processes --------------------------------------------------------------------------------
def _stat(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])  # state, parent pid
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid):
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _descendants(pid):
    parents = {int(e): _stat(int(e)) for e in os.listdir("/proc") if e.isdigit()}
    out, frontier = [], {pid}
    while frontier:
        below = {p for p, s in parents.items() if s is not None and s[1] in frontier}
        out += sorted(below)
        frontier = below
    return out


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "?"


def _assert_all_end(pids, what, timeout_s=30.0):
    """Each process ends (an event; the deadline only turns a regression into a failure)."""
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = {p: (_stat(p), _cmdline(p)) for p in pids if _alive(p)}
    assert not left, f"processes outlived {what} (pid: (state, parent pid), command line): {left}"


def _started(cmd, announce, what):
    """Start ``cmd`` in its own session; return it once one of its workers runs its task."""
    env = {**os.environ, ANNOUNCE: str(announce), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )

    def announced():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"{what} ended before its workers ran:\n{out}\n{err}")
        return any(p.name.isdigit() for p in announce.iterdir())

    try:
        wait_for(f"a worker of {what} to start its task", announced)
    except BaseException:
        proc.kill()
        raise
    return proc


def _indexer(tmp_path):
    script = tmp_path / "indexer.py"
    script.write_text(_INDEXER.format(repo=str(REPO)), encoding="utf-8")
    announce = tmp_path / "announce"
    announce.mkdir()
    return _started([sys.executable, str(script)], announce, "the index build"), announce


def _trainer(tmp_path, stage, n_sentences):
    """`elmo-jax train` with data_workers=2 on a tiny corpus, blocked in ``stage``'s workers
    once they run; returns the process (its own session) and the announce folder."""
    import numpy as np

    rng = np.random.default_rng(0)
    words = ["the", "bank", "river", "money", "she", "went", "to", "a", "of"]
    corpus = tmp_path / "train.txt"
    corpus.write_text(
        "\n".join(" ".join(rng.choice(words, size=rng.integers(1, 6))) for _ in range(n_sentences)) + "\n",
        encoding="utf-8",
    )
    script = tmp_path / "trainer.py"
    script.write_text(_TRAINER.format(repo=str(REPO)), encoding="utf-8")
    announce = tmp_path / "announce"
    announce.mkdir()
    micro = {"dim": "16", "projection_dim": "8", "embedding_dim": "4", "filters": "[[1,8],[2,8]]", "n_highway": "1"}
    cmd = [
        sys.executable,
        str(script),
        stage,
        "train",
        "--workdir",
        str(tmp_path / "run"),
        "--no-progress",
        f"--config.data={corpus}",
        f"--config.data_dir={tmp_path / 'tfds'}",
        "--config.data_workers=2",
        "--config.model=tiny",
        *(f"--config.model_overrides.{k}={v}" for k, v in micro.items()),
        "--config.batch_size=2",
        "--config.unroll_steps=4",
        "--config.max_steps=2",
    ]
    return _started(cmd, announce, f"the trainer ({stage})"), announce


# The token index is built by workers when it has at least 2 ranges of 4,096 sentences.
_STAGES = {"prepare": 200, "index": 5000}


def _kill_and_check(proc, announce, sig, what):
    below = _descendants(proc.pid)
    workers = [int(p.name) for p in announce.iterdir() if p.name.isdigit()]
    assert workers and set(workers) <= set(below), (workers, below)
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    _assert_all_end(below, what)


def _interrupt(proc):
    """A terminal's Ctrl-C: SIGINT to the whole process group; returns (status, stderr)."""
    below = _descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the process did not stop on Ctrl-C") from None
    _assert_all_end(below, "a Ctrl-C")
    return proc.returncode, err


@pytest.mark.parametrize("sig", [signal.SIGKILL, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_workers_die_with_their_owner_killed_during_an_index_build(tmp_path, sig):
    proc, announce = _indexer(tmp_path)
    _kill_and_check(proc, announce, sig, f"an index build killed by {sig.name}")


def test_ctrl_c_during_an_index_build_leaves_only_the_owners_line(tmp_path):
    """The workers ignore SIGINT (no KeyboardInterrupt of theirs); their owner stops them."""
    status, err = _interrupt(_indexer(tmp_path)[0])
    assert status == 130 and err.strip() == "indexer: interrupted", err


@pytest.mark.slow  # the real trainer, a fresh interpreter each: about 15 s each on 2 loaded cores
@pytest.mark.parametrize(
    "stage, sig", [("prepare", signal.SIGKILL), ("index", signal.SIGKILL), ("index", signal.SIGTERM)]
)
def test_no_worker_outlives_a_trainer_killed_before_its_loop(tmp_path, stage, sig):
    """kill -9 (or SIGTERM: no stop handler before the loop) during text preparation or the
    token index build, data_workers=2: no process of the run is left."""
    proc, announce = _trainer(tmp_path, stage, _STAGES[stage])
    _kill_and_check(proc, announce, sig, f"a trainer killed by {sig.name} during {stage}")


@pytest.mark.slow  # the real trainer: about 20 s on 2 loaded cores
def test_ctrl_c_during_the_trainers_index_build_is_one_line(tmp_path):
    status, err = _interrupt(_trainer(tmp_path, "index", _STAGES["index"])[0])
    # TFDS logs its data configuration at the start (before the fault): not part of the stop
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("WARNING:absl:")]
    assert status == 130, err
    assert len(lines) == 1 and "interrupted" in lines[0], err


# -- training batches -------------------------------------------------------------------------
def _batcher(workers, log=None):
    from elmo_jax.data.batches import LMBatcher
    from elmo_jax.data.text_source import InMemorySource
    from elmo_jax.data.vocab import Vocabulary

    sys.path.insert(0, str(REPO / "tests"))
    from test_batches import _corpus

    sents = _corpus(n=90, max_len=25)
    return LMBatcher(
        InMemorySource(sents),
        Vocabulary.build(sents, max_size=30),
        batch_size=3,
        unroll_steps=5,
        seed=4,
        num_epochs=2,
        read_chunk=4,
        workers=workers,
        prefetch=2,
        log=log,
    )


def _pool_pids(batcher):
    pool = batcher._provider._pool
    return [p.pid for p in (pool._processes or {}).values()] if pool is not None else []


def _same(a, b):
    import numpy as np

    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_worker_killed_during_training_is_replaced_and_the_batches_are_unchanged():
    """kill -9 of one data worker, then of every worker of the new pool: new workers encode the
    chunks not received from the same positions; every batch is the uninterrupted run's, and the
    log says so.

    The pool starts its processes as tasks find none idle, so a fast worker can leave the second
    one unstarted: the test kills the workers there are, never waits for a second."""
    with _batcher(0) as b:
        reference = list(b)
    logs = []
    with _batcher(2, logs.append) as b:
        got = [next(b) for _ in range(5)]
        wait_for("a data worker", lambda: _pool_pids(b))
        first = _pool_pids(b)
        os.kill(first[0], signal.SIGKILL)
        _assert_all_end(first[:1], "kill -9")
        got += [next(b) for _ in range(40)]
        wait_for("a new data worker", lambda: _pool_pids(b))
        second = _pool_pids(b)
        assert not set(second) & set(first)
        for pid in second:
            os.kill(pid, signal.SIGKILL)
        _assert_all_end(second, "kill -9")
        got += list(b)
        assert b._provider.replacements == 2
    assert len(got) == len(reference) and all(_same(x, y) for x, y in zip(got, reference))
    assert len(logs) == 2, logs
    assert f"worker process {first[0]} ended (killed by SIGKILL)" in logs[0] and "batches are unchanged" in logs[0]
    _assert_all_end(first + second + _pool_pids(b), "the batcher's close")


def test_workers_that_keep_dying_stop_the_batches_with_one_line():
    """No endless replacing: after MAX_REPLACEMENTS new pools that all died before a chunk
    arrived, ``next`` raises one line naming the dead worker and the likely causes."""
    from elmo_jax.data.batches import LMBatcher
    from elmo_jax.data.prefetch import MAX_REPLACEMENTS, DataWorkerError
    from elmo_jax.data.vocab import Vocabulary

    logs = []
    with LMBatcher(
        _KillsItsReader(), Vocabulary.build([["a"]]), batch_size=2, unroll_steps=3, workers=1, log=logs.append
    ) as b:
        with pytest.raises(DataWorkerError) as info:
            next(b)
        pids = _pool_pids(b)
    message = str(info.value)
    assert "\n" not in message and "(killed by SIGKILL)" in message and "out of memory" in message, message
    assert len(logs) == MAX_REPLACEMENTS and all("killed by SIGKILL" in line for line in logs), logs
    _assert_all_end(pids, "the batcher's close")


def test_close_never_waits_on_a_stuck_worker():
    """Workers that neither work nor exit (stopped by SIGSTOP) are killed by close."""
    b = _batcher(2)
    next(b)
    wait_for("a data worker", lambda: _pool_pids(b))
    pids = _pool_pids(b)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    closing = threading.Thread(target=b.close, daemon=True)
    closing.start()
    closing.join(timeout=120)
    assert not closing.is_alive(), "close waited on stopped workers"
    _assert_all_end(pids, "close")


# -- scripts ----------------------------------------------------------------------------------
_UNGUARDED_INDEX = textwrap.dedent("""\
    import sys
    sys.path.insert(0, {repo!r})
    from elmo_jax.data.token_index import build_token_index
    from tests.test_workers import _Sentences

    build_token_index(_Sentences(40), workers=2, range_size=10)
""")

_UNGUARDED_TRAIN = textwrap.dedent("""\
    from elmo_jax.train.config_loader import parse_config_args
    from elmo_jax.train.loop import train

    cfg, _ = parse_config_args(["--config.data={data}", "--config.data_dir={tfds}", "--config.data_workers=2",
                                "--config.model=tiny", "--config.max_steps=1", "--config.batch_size=2"])
    train(cfg, {workdir!r}, progress=False)
""")


def _run_unguarded(script):
    run = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert "DataWorkerError" in last and 'if __name__ == "__main__":' in last and str(script) in last, run.stderr
    assert "out of memory" not in run.stderr.lower() and "BrokenPipeError" not in run.stderr, run.stderr


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    """Python starts each worker by importing the main script: without the guard the
    workers would run the script's work too.  They stop at once and the error names the fix."""
    script = tmp_path / "unguarded.py"
    script.write_text(_UNGUARDED_INDEX.format(repo=str(REPO)), encoding="utf-8")
    _run_unguarded(script)


@pytest.mark.slow  # a fresh interpreter imports JAX, and so does each worker: about 20 s
def test_a_training_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    corpus = tmp_path / "train.txt"
    corpus.write_text("the bank of the river\nshe went to the bank\n" * 20, encoding="utf-8")
    script = tmp_path / "unguarded.py"
    script.write_text(
        _UNGUARDED_TRAIN.format(data=corpus, tfds=tmp_path / "tfds", workdir=str(tmp_path / "run")), encoding="utf-8"
    )
    _run_unguarded(script)
    assert not (tmp_path / "run" / "checkpoints").exists()  # no worker trained


@pytest.mark.slow  # two tiny training runs, one in a fresh interpreter: about 40 s on 2 loaded cores
def test_a_data_worker_killed_during_training_is_replaced_and_the_losses_are_unchanged(tmp_path):
    """kill -9 of one data worker after a checkpoint: the run goes on (the log says the
    worker was replaced) and every step's loss is the one of a run without workers."""
    import json

    from elmo_jax.train.config_loader import parse_config_args
    from elmo_jax.train.loop import train

    sys.path.insert(0, str(REPO / "tests"))
    from test_train import MICRO, _corpus, _losses

    steps = 60  # several epochs of 40 sentences: the workers encode each epoch's chunks anew
    args = [
        *(f"--config.model_overrides.{k}={json.dumps(v).replace(' ', '')}" for k, v in MICRO.items()),
        f"--config.data={_corpus(tmp_path, n=40)}",
        f"--config.data_dir={tmp_path / 'tfds'}",
        "--config.batch_size=4",
        "--config.unroll_steps=5",
        "--config.num_negatives=4",
        "--config.epochs=1000",
        "--config.checkpoint_every=2",
        "--config.log_every=1",
        f"--config.max_steps={steps}",
    ]
    cfg, rest = parse_config_args(args + ["--config.data_workers=0"])
    assert not rest
    train(cfg, str(tmp_path / "reference"), progress=False)
    reference = _losses(tmp_path / "reference")

    workdir = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "train.py"),
            "--workdir",
            str(workdir),
            "--no-progress",
            *args,
            "--config.data_workers=2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:

        def checkpointed():
            assert proc.poll() is None, proc.stdout.read()
            return any(p.name.isdigit() for p in (workdir / "checkpoints").glob("*"))

        wait_for("a checkpoint", checkpointed, timeout_s=300)
        # the workers: children of the fork server, itself a child of the trainer
        children = set(_descendants(proc.pid)) - {p for p in _descendants(proc.pid) if _stat(p)[1] == proc.pid}
        assert children, "no data worker"  # started as chunks are asked for: 1 or 2
        victim = min(children)
        os.kill(victim, signal.SIGKILL)
        try:
            out, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"the run hung after its worker was killed:\n{proc.communicate()[0]}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert f"data worker process {victim} ended (killed by SIGKILL)" in out and "batches are unchanged" in out, out
    resumed = _losses(workdir)
    assert sorted(resumed) == sorted(reference) == list(range(1, steps + 1))
    for step in reference:
        assert resumed[step] == pytest.approx(reference[step], abs=1e-6), step
