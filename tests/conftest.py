"""Shared test helpers: where the reference fixtures live, tiny models."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ELMO_JAX_SHARED", REPO.parent / "shared"))
BILM_FIXTURES = SHARED / "fixtures" / "bilm-tf"


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


@pytest.fixture
def bilm_fixtures() -> Path:
    return require_fixtures()


_CACHE_FOLDER = pytest.StashKey[str]()


def pytest_configure(config):
    """One compilation cache for this test session (a fresh folder each session, so CI times
    stay cold-start honest): many tests build the same tiny programs, and each pytest-xdist
    worker compiles each once.  Subprocesses started by tests do not inherit it."""
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
