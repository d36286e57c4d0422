"""What .ci/run runs besides the suite: the fidelity subset compiled as users compile it, and
the docs site built strictly."""

import configparser
import re

from tests.conftest import REPO


def test_the_fidelity_subset_is_registered_marked_and_run_optimised_in_ci():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg", encoding="utf-8")
    markers = cfg["tool:pytest"]["markers"]
    assert re.search(r"^\s*fidelity:", markers, re.MULTILINE), "the fidelity marker is not registered"
    marked = sum(
        p.read_text(encoding="utf-8").count("@pytest.mark.fidelity\n") for p in (REPO / "tests").glob("test_*.py")
    )
    assert marked >= 25, marked
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    # The default addopts exclude slow tests with -m; a second -m replaces it, so it keeps that exclusion.
    assert 'ELMO_JAX_TEST_XLA_OPT=default python -m pytest -m "fidelity and not slow" -q' in ci
    assert "set -euo pipefail" in ci  # pytest's exit 5 (nothing selected) stops CI


def test_ci_builds_the_docs_strictly_with_the_docs_extra():
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -q -e '.[docs]'" in ci and "mkdocs build --strict" in ci
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg", encoding="utf-8")
    docs = cfg["options.extras_require"]["docs"]
    assert all(tool in docs for tool in ("mkdocs-material", "mkdocstrings[python]", "mkdocs-jupyter"))
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    for page in re.findall(r"([\w./-]+\.(?:md|ipynb))\s*$", nav, re.MULTILINE):
        assert (REPO / "docs" / page).exists(), page
