"""A stop signal that arrives while a program starts (numpy, jax and XLA loading, the first
compilation) ends it with 130 (SIGINT) / 143 (SIGTERM) and one line on stderr, never a
traceback, an "Exception ignored" echo, an ImportError, or a run that goes on to exit 0:
``train.py``, ``elmo-jax`` commands and the examples.

The moments are events of the process, not guesses: "jaxlib" is when jax's compiled
extension is mapped into it (jax is being imported), "+N s" is N seconds after that
(XLA's initialisation, then the first compilation)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import REPO, wait_for

MICRO_TRAIN = [
    f"--config.model_overrides.{k}={v}"
    for k, v in {
        "dim": "16",
        "projection_dim": "8",
        "embedding_dim": "4",
        "filters": "[[1,8],[2,8]]",
        "n_highway": "1",
    }.items()
] + ["--config.batch_size=2", "--config.unroll_steps=4"]


def _mapped(pid: int, name: str) -> bool:
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            return name in f.read()
    except OSError:
        return False


def _stop_at(cmd, sig, after_jaxlib_s: float | None, tmp_path):
    """Run ``cmd``; send ``sig`` once jaxlib is mapped and ``after_jaxlib_s`` more seconds
    passed (None: once numpy is, before jax); return (status, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        library = "_multiarray_umath" if after_jaxlib_s is None else "jaxlib"
        wait_for(f"{library} to load", lambda: _mapped(proc.pid, library), [proc], timeout_s=300)
        time.sleep(after_jaxlib_s or 0.0)
        assert proc.poll() is None, f"the program ended before the signal: {proc.communicate()}"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


def _assert_one_line_stop(status, err, sig, program):
    assert status == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], (status, err)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("WARNING:absl:")]
    assert len(lines) == 1 and lines[0].startswith(f"{program}: stopped by {sig.name}"), err


_PROGRAMS = {
    "train.py": (
        [
            sys.executable,
            str(REPO / "train.py"),
            "--workdir",
            "run",
            "--no-progress",
            "--config.max_steps=2",
            *MICRO_TRAIN,
        ],
        "elmo-jax train",
    ),
    "elmo-jax demo": (
        [sys.executable, "-c", "import sys; from elmo_jax.cli import entry; sys.argv[0] = 'elmo-jax'; entry()", "demo"],
        "elmo-jax demo",
    ),
    "finetune_heads": ([sys.executable, str(REPO / "examples" / "finetune_heads.py"), "--quick"], "finetune_heads"),
    "flax_tagger": ([sys.executable, str(REPO / "examples" / "flax_tagger.py"), "--quick"], "flax_tagger"),
    "bench_embed": (
        [sys.executable, str(REPO / "examples" / "bench_embed.py"), "--presets", "tiny", "--batches", "1"],
        "bench_embed",
    ),
}


@pytest.mark.parametrize("program, sig", [("elmo-jax demo", signal.SIGINT), ("finetune_heads", signal.SIGTERM)])
def test_a_signal_during_jax_import_is_one_line(tmp_path, program, sig):
    cmd, name = _PROGRAMS[program]
    _assert_one_line_stop(*_stop_at(cmd, sig, 0.0, tmp_path), sig, name)


@pytest.mark.slow  # a fresh interpreter per case, up to a few seconds each on 2 loaded cores
@pytest.mark.parametrize("program", sorted(_PROGRAMS))
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("after_jaxlib_s", [None, 0.0, 0.4, 1.5, 3.0])
def test_a_signal_at_any_moment_of_start_up_is_one_line(tmp_path, program, sig, after_jaxlib_s):
    cmd, name = _PROGRAMS[program]
    _assert_one_line_stop(*_stop_at(cmd, sig, after_jaxlib_s, tmp_path), sig, name)


# -- elmo-jax embed: a stop in the middle of a group ------------------------------------------
def test_sigterm_while_embedding_a_group_stops_it_at_once_with_143_and_resumes(tmp_path, monkeypatch, capsys):
    """SIGTERM while a group is being embedded (not written) ends the command before that group's
    work goes on: status 143 (a stop, not bad input's 2), one line saying where it stopped, and
    the same command continues from the last checkpoint."""
    from elmo_jax.cli import main
    from elmo_jax.embedding.embedder import Elmo

    src = tmp_path / "in.txt"
    src.write_text("".join(f"w{i} x y\n" for i in range(24)), encoding="utf-8")
    out = tmp_path / "out.hdf5"
    cmd = ["embed", str(src), str(out), "--top", "--preset", "tiny", "--no-progress", "--group-lines", "8"]
    original, calls = Elmo.embed, []

    def embed(self, *a, **k):
        calls.append("called")
        if len(calls) == 2:  # the second group, while it is computed
            os.kill(os.getpid(), signal.SIGTERM)
            calls.append("went on after the signal")
        return original(self, *a, **k)

    monkeypatch.setattr(Elmo, "embed", embed)
    assert main(cmd) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert calls == ["called", "called"]
    assert len(err) == 1 and err[0].startswith(
        "elmo-jax embed: stopped by SIGTERM after line 8 of 24; the partial output is kept in"
    ), err
    monkeypatch.setattr(Elmo, "embed", original)
    assert main(cmd) == 0 and out.exists()
    assert "resuming from line 9" in capsys.readouterr().err


# -- Ctrl-C while a process pool starts a worker ----------------------------------------------
_INDEXER = textwrap.dedent("""\
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from tests.test_workers import _Sentences, _announce_and_block

    if __name__ == "__main__":
        import multiprocessing.context as mpc
        from elmo_jax.data import token_index
        token_index._index_held_range = _announce_and_block
        original, started = mpc.ForkServerProcess.start, []

        def start(self):  # the second worker: started, and the pool has not recorded it yet
            original(self)
            started.append(self.pid)
            if len(started) == 2:
                open(os.path.join(os.environ["ELMO_JAX_TEST_ANNOUNCE"], "between"), "w").close()
                time.sleep(3)

        mpc.ForkServerProcess.start = start
        try:
            token_index.build_token_index(_Sentences(40), workers=2, range_size=10)
        except KeyboardInterrupt:
            print("indexer: interrupted", file=sys.stderr)
            sys.exit(130)
""")


def test_ctrl_c_while_a_pool_starts_a_worker_stops_every_worker(tmp_path):
    """A Ctrl-C between a worker's start and the pool recording it left a worker nobody
    stopped, and the owner's exit waited for it for ever; now the signal acts once the worker
    is recorded, and every worker ends with the owner."""
    sys.path.insert(0, str(REPO / "tests"))
    from test_workers import _assert_all_end, _descendants

    script = tmp_path / "indexer.py"
    script.write_text(_INDEXER.format(repo=str(REPO)), encoding="utf-8")
    announce = tmp_path / "announce"
    announce.mkdir()
    env = {**os.environ, "ELMO_JAX_TEST_ANNOUNCE": str(announce), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        wait_for(
            "a worker's task and the second worker's start",
            lambda: (
                {"between"} <= {p.name for p in announce.iterdir()}
                and any(p.name.isdigit() for p in announce.iterdir())
            ),
            [proc],
            timeout_s=300,
        )
        below = _descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("the index build did not stop on Ctrl-C") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    _assert_all_end(below, "a Ctrl-C")
    assert proc.returncode == 130 and err.strip() == "indexer: interrupted", err


_BLOCKED_INDEXER = textwrap.dedent("""\
    import sys
    sys.path.insert(0, {repo!r})
    from tests.test_workers import _Sentences, _announce_and_block

    if __name__ == "__main__":
        from elmo_jax.data import token_index
        token_index._index_held_range = _announce_and_block
        token_index.build_token_index(_Sentences(40), workers=2, range_size=10)
""")


def test_kill_9_during_an_index_build_leaves_no_leaked_semaphore_warning(tmp_path):
    """The owner killed by kill -9: multiprocessing's resource tracker removes the pool's
    semaphores without a "resource_tracker: ... leaked semaphore" line on the terminal."""
    script = tmp_path / "indexer.py"
    script.write_text(_BLOCKED_INDEXER.format(repo=str(REPO)), encoding="utf-8")
    announce = tmp_path / "announce"
    announce.mkdir()
    env = {**os.environ, "ELMO_JAX_TEST_ANNOUNCE": str(announce), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        wait_for("a worker's task", lambda: any(p.name.isdigit() for p in announce.iterdir()), [proc], timeout_s=300)
        proc.kill()
        err = proc.stderr.read()  # to its end: when the tracker, which shares it, has ended too
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert "leaked" not in err and "resource_tracker" not in err, err


def test_sigterm_during_a_download_is_143(monkeypatch, capsys):
    """A download stopped by SIGTERM keeps its part and says so, with SIGTERM's status."""
    from elmo_jax import resolve
    from elmo_jax.cli import main
    from elmo_jax.train.stop import Stopped

    def resolve_stopped(*a, **k):
        raise Stopped("SIGTERM")

    monkeypatch.setattr(resolve, "resolve_model", resolve_stopped)
    assert main(["download", "small", "--no-progress"]) == 143
    assert "elmo-jax download: interrupted; the part already downloaded is kept" in capsys.readouterr().err


def test_a_stopped_process_of_a_multi_process_embed_says_where_in_one_line(monkeypatch, capsys):
    """One process of a multi-process embed stopped by SIGTERM: 143 and one line, not an
    error's 2 (nor a traceback and 1)."""
    from elmo_jax import cli
    from elmo_jax.embedding.embed_file import EmbedStopped

    def exit_now(code):
        raise SystemExit(code)

    def run():
        raise EmbedStopped("SIGTERM", "stopped by SIGTERM after line 8 of 24; the partial output is kept")

    monkeypatch.setattr(cli, "_exit_now", exit_now)
    with pytest.raises(SystemExit) as stop:
        cli._run_in_process_group("embed", run)
    assert stop.value.code == 143
    assert capsys.readouterr().err.splitlines() == [
        "elmo-jax embed (process 0): stopped by SIGTERM after line 8 of 24; the partial output is kept"
    ]


def test_undoing_the_stop_handlers_keeps_a_hook_installed_after_them(monkeypatch):
    """A command's stop handlers end with the command; an unraisable hook put in front of
    theirs meanwhile (storage_echoes' filter of orbax's late "Event loop is closed" echoes,
    which come at exit) must stay, or the echoes print around the command's one line."""
    import signal
    import sys

    from elmo_jax.storage_echoes import drop_closed_loop_echoes
    from elmo_jax.train import stop

    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # put back after the test
    handlers = {s: signal.getsignal(s) for s in stop.STOP_SIGNALS}
    try:
        undo = stop._install(lambda *a: None, lambda name: name)
        drop_closed_loop_echoes()
        echo_filter = sys.unraisablehook
        undo()
        assert sys.unraisablehook is echo_filter
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
