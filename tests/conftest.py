"""Shared test helpers: where the reference fixtures live, tiny models."""

import os
from pathlib import Path

import numpy as np
import pytest

# Compiling is most of this suite's time on a CPU, and LLVM's optimisation passes are most of
# each compile: the tests compile with them off, which takes the compile-heavy tests to 0.3-0.8x
# their time (the whole suite to about 0.7x, measured on a 2-core Zen 5).  XLA's own graph
# passes (fusion, layout) still run; what changes is only the machine code, which may round
# differently, as another CPU's does: the tests allow for that (CROSS_PROGRAM_TOLERANCE), and
# the README check runs the main job as users compile it.  ELMO_JAX_TEST_XLA_OPT=default tests
# the programs as users compile them (or give a level, 0-3).  Set before jax is imported; the
# subprocesses the tests start inherit it (with `device_env` where they emulate devices).
_XLA_OPT = os.environ.get("ELMO_JAX_TEST_XLA_OPT", "0").strip() or "0"
if _XLA_OPT not in ("default", "0", "1", "2", "3"):  # XLA would abort the first compile, silently
    raise pytest.UsageError(
        f"ELMO_JAX_TEST_XLA_OPT={_XLA_OPT!r} is not a setting: give 'default' (compile as "
        f"users do) or an LLVM optimisation level 0-3 (unset: 0)"
    )
if _XLA_OPT != "default" and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level={_XLA_OPT}".strip()

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ELMO_JAX_SHARED", REPO.parent / "shared"))
BILM_FIXTURES = SHARED / "fixtures" / "bilm-tf"


# Two differently compiled programs (another jit, other shapes or padding, another fusion, or
# the same program on another kind of CPU: AVX2 and AVX-512 code round differently) give the
# same float32 values only up to rounding: 14 of 48 elements of an embedding differed by one
# ulp (1.5e-8) between `Elmo.embed` and a separately jitted forward on AVX2.  Bit-equality is
# right only where the same compiled program runs twice (a resume, a restart, a reload).
CROSS_PROGRAM_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def assert_close_across_programs(actual, desired, err_msg: str = "") -> None:
    """``actual`` and ``desired``, computed by two differently compiled programs, agree to
    float32 rounding (:data:`CROSS_PROGRAM_TOLERANCE`)."""
    np.testing.assert_allclose(np.asarray(actual), np.asarray(desired), err_msg=err_msg, **CROSS_PROGRAM_TOLERANCE)


def device_env(devices: int, **extra: str) -> dict:
    """The environment for a subprocess that emulates ``devices`` CPU devices and imports this
    checkout: this one's, its XLA flags kept, plus ``extra``."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def require_fixtures() -> Path:
    """The bilm-tf fixture folder, or skip: it lives in ../shared, outside this repo."""
    if not (BILM_FIXTURES / "model" / "lm_weights.hdf5").exists():
        pytest.skip(
            f"needs the bilm-tf fixture, not shipped with this project: the files of allenai/bilm-tf's "
            f"tests/fixtures (model/lm_weights.hdf5, model/options.json, model/lm_embeddings_*.hdf5, "
            f"data/vocab_test.txt, train/) at {BILM_FIXTURES} (../shared/fixtures/bilm-tf beside the "
            f"checkout, or set ELMO_JAX_SHARED to the folder holding fixtures/bilm-tf)"
        )
    return BILM_FIXTURES


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A random ``tiny`` model (seed 5) saved as options.json + weights.hdf5, one per test
    module; a module that wants another model defines its own ``model_dir``."""
    from elmo_jax import Elmo

    d = tmp_path_factory.mktemp("model")
    Elmo.random("tiny", seed=5).save(d)
    return d


@pytest.fixture(scope="module")
def elmo(model_dir):
    """``model_dir``'s model, loaded (a module that wants another defines its own ``elmo``)."""
    from elmo_jax import Elmo

    return Elmo.load(model_dir)


@pytest.fixture
def bilm_fixtures() -> Path:
    return require_fixtures()


_CACHE_FOLDER = pytest.StashKey[str]()


def pytest_configure(config):
    """One compilation cache per test process (a fresh folder each session, so CI times stay
    cold-start honest): many tests build the same tiny programs, and each pytest-xdist
    worker compiles each once.  Not shared between the workers: jax writes an entry in
    place, so a worker could read another's half-written entry (jax then warns and
    compiles, which a test counting warnings would see); sharing saved 4 % (542 -> 522 s),
    within the noise.  Subprocesses started by tests do not inherit it."""
    import tempfile

    import jax

    folder = tempfile.mkdtemp(prefix="elmo-jax-test-xla-cache-")
    config.stash[_CACHE_FOLDER] = folder
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
    import shutil

    folder = config.stash.get(_CACHE_FOLDER, None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def unmount(folder) -> None:
    """Unmount a test's tmpfs: memory maps that only a reference cycle still holds (a failed
    run's traceback) are released first, and a mount still busy is detached lazily, so that
    no test leaves a mount behind."""
    import gc
    import subprocess

    gc.collect()
    if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def wait_for(what: str, ready, procs=(), timeout_s: float = 900.0) -> None:
    """Poll ``ready()`` until it is true: the event a test needs (a step done, a file written
    by the run), never a proxy of it and never a guess of how long it takes.  A process of
    ``procs`` that ends first fails the test with its output; ``timeout_s`` only bounds a run
    that hangs (it is far beyond any healthy run, loaded machine included), and it fails the
    test rather than going on as if the event had happened."""
    import time

    start = time.monotonic()
    while not ready():
        for p in procs:
            if p.poll() is not None:
                out = p.stdout.read() if getattr(p, "stdout", None) else ""
                raise AssertionError(f"the run ended (status {p.returncode}) before {what}:\n{out}")
        if time.monotonic() - start > timeout_s:
            for p in procs:
                p.kill()
            raise AssertionError(f"no sign of {what} after {timeout_s:.0f} s: the run hangs")
        time.sleep(0.1)


def train_steps_logged(workdir) -> list[int]:
    """The steps of the complete train records a run has written to ``workdir/metrics.jsonl``
    (the run writes one per ``log_every`` steps, each line at once; a line being written is
    not counted)."""
    import json

    path = Path(workdir) / "metrics.jsonl"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    steps = []
    for line in text.splitlines(keepends=True):
        if line.endswith("\n"):
            record = json.loads(line)
            if record.get("kind") == "train":
                steps.append(int(record["step"]))
    return steps
