"""The benchmark scripts refuse bad options before measuring anything (they are not run here)."""

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.parametrize(
    "args, message",
    [
        (["--memory-lengths", "abc"], "--memory-lengths 'abc': give positive integers"),
        (["--presets", ""], "--presets '' has an empty entry"),
        (["--train-batch", "0"], "--train-batch must be at least 1, got 0"),
        (["--vocab", "100", "--negatives", "200"], "--vocab 100 must exceed --negatives 200"),
        (["--out", "/proc/nope/x.json"], "cannot write the results file /proc/nope/x.json"),
        (["--shapes", "64by20"], "is not BATCHxLENGTH"),
    ],
)
def test_run_py_refuses_bad_options_up_front(args, message, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "run.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no temp dir was made


@pytest.mark.parametrize("value", ["0", "abc", "-5"])
def test_accelerator_script_refuses_a_bad_stage_limit(value, tmp_path):
    proc = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "accelerator.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "TRAIN_TIMEOUT": value},
    )
    assert proc.returncode == 2
    assert f"TRAIN_TIMEOUT={value} is not a whole number of seconds >= 1" in proc.stderr
    assert not (tmp_path / "out").exists()  # stopped before any stage


def test_a_failed_first_round_keeps_the_rounds_that_worked():
    """With --rounds, a round whose worker failed (e.g. timed out) must not take the row down."""
    import argparse

    saved = list(sys.path)
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import run as bench  # it puts its own folders on sys.path too
    finally:
        sys.path[:] = saved
    suite = bench.Suite.__new__(bench.Suite)
    suite.args = argparse.Namespace(rounds=3, no_e2e=True)
    suite.reps, suite.peer_ok, suite.peer_device = [], True, "cpu"
    ours = iter(
        [
            {"error": "timed out"},
            {"tokens_per_s": 100.0, "median_s": 0.2, "times": [0.2]},
            {"tokens_per_s": 120.0, "median_s": 0.1667, "times": [0.1667]},
        ]
    )
    suite.ours = lambda *a: next(ours)
    suite.peer = lambda *a: {"tokens_per_s": 50.0, "median_s": 0.4, "times": [0.4]}
    row = {}
    suite._ours_and_peer(row, [], [])
    assert row["ours"]["tokens_per_s"] == 110.0 and "error" not in row["ours"]
    assert row["ours"]["failed_rounds"] == ["timed out"] and len(row["ours"]["rounds"]) == 2
    assert row["round_ratios"] == [2.0, 2.4]


def test_accelerator_script_stages_accept_their_options(tmp_path):
    """A lent GPU is rare and its minutes scarce: every stage of accelerator.sh must get past
    its option parsing.  On the CPU with 4 s per stage each stage is cut at its limit (or
    finishes); an option that a script no longer knows would end its stage at once with
    exit 2, which is what this looks for."""
    limits = {
        name: "4" for name in ("TRAIN_TIMEOUT", "EMBED_TIMEOUT", "AGREE_TIMEOUT", "TRAIN_LARGE_TIMEOUT", "TEST_TIMEOUT")
    }
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "accelerator.sh"), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHON": sys.executable,
            "HOME": str(tmp_path),
            "JAX_PLATFORMS": "cpu",
            **limits,
        },
    )
    log = (out / "run.log").read_text()
    ends = [line for line in log.splitlines() if line.startswith("== stage ")]
    assert [line.split()[2] for line in ends] == ["train:", "embed:", "agreement:", "train_large:", "tests:"], log
    for line in ends:
        assert "CUT at its 4 s limit" in line or ": exit 0 " in line, f"{line}\n{log}"
    assert "error:" not in log and "unrecognized arguments" not in log, log
    assert proc.returncode in (0, 1)


def test_benchmark_results_record_the_cpus_vector_extensions():
    """Every benchmark header/result names the CPU and its vector extensions (AVX2 and
    AVX-512 machines give other numbers): one helper, benchmarks/machine.py."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import machine

    assert machine.vector_extensions("fpu sse2 avx fma avx2 f16c bmi2") == ["avx", "avx2", "f16c", "fma"]
    assert machine.vector_extensions("avx2 AVX512F avx512_vnni amx_tile amx_bf16 sse4_2") == [
        "amx_bf16",
        "amx_tile",
        "avx2",
        "avx512_vnni",
        "avx512f",
    ]
    info = machine.machine_info()
    assert isinstance(info["vector_extensions"], list) and info["cpu_model"]
    if platform.machine() == "x86_64" and Path("/proc/cpuinfo").exists():
        assert "avx" in info["vector_extensions"]  # every x86-64 CPU this project runs on
    assert info["cpu_model"] in machine.cpu_summary(info)
    # "AMD EPYC" alone does not say which core: Zen 3 is AVX2 only, Zen 4 and Zen 5 AVX-512.
    assert [
        machine.amd_core(25, 1),
        machine.amd_core(25, 0x11),
        machine.amd_core(25, 0xA0),
        machine.amd_core(26, 2),
        machine.amd_core(6, 143),
    ] == ["Zen 3", "Zen 4", "Zen 4", "Zen 5", None]
    if info.get("cpu_core"):
        assert f"{info['cpu_core']} (family {info['cpu_family']} model" in machine.cpu_summary(info)
    for script in ("run.py", "data.py", "step_skip.py", "fixture_agreement.py"):
        assert "machine_info" in (REPO / "benchmarks" / script).read_text(encoding="utf-8"), script
