"""The hub's per-model download locks (``<models>/.locks/<key>.lock``): a holder killed by
``kill -9`` cannot remove its file; the file names its holder, and the next process that
takes a lock there removes it, while a live holder's file is left alone."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

pytest.importorskip("fcntl", reason="the download locks are flock()s (not on Windows)")

_HOLDER = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    from elmo_jax.hub import lock

    with lock.exclusive_lock(Path(sys.argv[1]), sys.argv[2], False):
        print("holding", flush=True)
        time.sleep(600)
""")


def _holder(tmp_path, lock, spec):
    script = tmp_path / "holder.py"
    script.write_text(_HOLDER, encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(lock), spec],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout.readline().strip() == "holding"
    return proc


def test_a_lock_left_by_a_killed_holder_names_it_and_the_next_run_removes_it(tmp_path):
    from elmo_jax.hub import lock

    locks = tmp_path / "models" / ".locks"
    locks.parent.mkdir()
    killed = _holder(tmp_path, locks / "a.lock", "model-a")
    live = _holder(tmp_path, locks / "c.lock", "model-c")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=60)
        assert (locks / "a.lock").read_text(encoding="utf-8") == f"pid {killed.pid} fetching model-a\n"
        with lock.exclusive_lock(locks / "b.lock", "model-b", False):  # another model: it works, and cleans
            assert sorted(p.name for p in locks.iterdir()) == ["b.lock", "c.lock"]
        assert sorted(p.name for p in locks.iterdir()) == ["c.lock"]  # the live holder's is kept
        assert (locks / "c.lock").read_text(encoding="utf-8") == f"pid {live.pid} fetching model-c\n"
    finally:
        for proc in (killed, live):
            proc.kill()
            proc.wait(timeout=60)
    with lock.exclusive_lock(locks / "a.lock", "model-a", False):  # the killed one's own model: works
        pass
    assert list(locks.iterdir()) == []
