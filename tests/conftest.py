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
            f"reference fixtures not found at {BILM_FIXTURES} (../shared beside the repo, or "
            f"set ELMO_JAX_SHARED); they are not shipped with the project"
        )
    return BILM_FIXTURES


@pytest.fixture
def bilm_fixtures() -> Path:
    return require_fixtures()
