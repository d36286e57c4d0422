"""The benchmark scripts refuse bad options before measuring anything (they are not run here)."""

import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize("args, message", [
    (["--memory-lengths", "abc"], "--memory-lengths 'abc': give positive integers"),
    (["--presets", ""], "--presets '' has an empty entry"),
    (["--train-batch", "0"], "--train-batch must be at least 1, got 0"),
    (["--vocab", "100", "--negatives", "200"], "--vocab 100 must exceed --negatives 200"),
    (["--out", "/proc/nope/x.json"], "cannot write the results file /proc/nope/x.json"),
    (["--shapes", "64by20"], "is not BATCHxLENGTH"),
])
def test_run_py_refuses_bad_options_up_front(args, message, tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run.py"), *args], capture_output=True,
                          text=True, timeout=60, env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no temp dir was made


@pytest.mark.parametrize("value", ["0", "abc", "-5"])
def test_accelerator_script_refuses_a_bad_stage_limit(value, tmp_path):
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "accelerator.sh"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=30, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "TRAIN_TIMEOUT": value})
    assert proc.returncode == 2
    assert f"TRAIN_TIMEOUT={value} is not a whole number of seconds >= 1" in proc.stderr
    assert not (tmp_path / "out").exists()  # stopped before any stage
