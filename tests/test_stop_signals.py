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
import time

import pytest

from tests.conftest import REPO, wait_for

MICRO_TRAIN = [f"--config.model_overrides.{k}={v}" for k, v in
               {"dim": "16", "projection_dim": "8", "embedding_dim": "4", "filters": "[[1,8],[2,8]]",
                "n_highway": "1"}.items()] + ["--config.batch_size=2", "--config.unroll_steps=4"]


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
    "train.py": ([sys.executable, str(REPO / "train.py"), "--workdir", "run", "--no-progress",
                  "--config.max_steps=2", *MICRO_TRAIN], "elmo-jax train"),
    "elmo-jax demo": ([sys.executable, "-c", "import sys; from elmo_jax.cli import entry; sys.argv[0] = 'elmo-jax'; "
                       "entry()", "demo"], "elmo-jax demo"),
    "finetune_heads": ([sys.executable, str(REPO / "examples" / "finetune_heads.py"), "--quick"], "finetune_heads"),
    "flax_tagger": ([sys.executable, str(REPO / "examples" / "flax_tagger.py"), "--quick"], "flax_tagger"),
    "bench_embed": ([sys.executable, str(REPO / "examples" / "bench_embed.py"), "--quick"], "bench_embed"),
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
