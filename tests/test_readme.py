"""The README check (.ci/readme_check.py): how it reads blocks and marks; CI runs the blocks."""

import importlib.util
import sys

from tests.conftest import REPO


def _checker():
    spec = importlib.util.spec_from_file_location("readme_check", REPO / ".ci" / "readme_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # (dataclasses look their module up there)
    spec.loader.exec_module(mod)
    return mod


def test_the_readme_marks_every_block_that_cannot_run_here():
    check = _checker()
    assert check.refuse_unmarked(check.load_blocks(str(REPO))) == []  # the docs pages' blocks too
    blocks = check.parse_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    runnable = [b for b in blocks if not b.skip]
    # The two commands of the quick start come first; the main job runs for real.
    assert runnable[0].code.strip().endswith("pip install -e . && python train.py")
    assert "max_steps" in check.quick_version(runnable[0].code) and "max_steps" not in runnable[0].code
    # The test command is the one .ci/run runs.
    test_block = next(b for b in blocks if "pytest" in b.code and "venv" in b.code)
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert test_block.skip and "pip install -q -e '.[test]'" in ci and "python -m pytest -q" in ci
    assert ".venv-test" in test_block.code  # not the main job's .venv


def test_marks_and_refusals():
    check = _checker()
    text = """intro
<!-- readme-check: skip: downloads a released model -->
```python
Elmo.load("original")
```

```bash
elmo-jax download small
```

```
not a command
```

```python
print("runs")
```
"""
    blocks = check.parse_blocks(text)
    assert [(b.line, b.language, b.skip) for b in blocks] == [
        (3, "python", "downloads a released model"),
        (7, "bash", None),
        (15, "python", None),
    ]
    refused = check.refuse_unmarked(blocks)
    assert len(refused) == 1 and refused[0].startswith("README.md line 7: this block downloads a released model")
    import pytest

    with pytest.raises(ValueError, match="must give its reason"):
        check.parse_blocks("<!-- readme-check: skip -->\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="never closed"):
        check.parse_blocks("```bash\nls\n")


def test_the_docs_pages_are_checked_after_the_readme_in_the_sites_order(tmp_path):
    check = _checker()
    docs = check.documents(str(REPO))
    assert docs[0] == "README.md" and "docs/index.md" in docs and "docs/flax.md" in docs
    # every page of the site, and nothing else
    pages = {str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md")}
    assert set(docs[1:]) == pages
    (tmp_path / "docs").mkdir()
    for name in ("a.md", "b.md", "stray.md"):
        (tmp_path / "docs" / name).write_text("x\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text(
        "nav:\n  - Start: b.md\n  - Guides:\n      - a.md\n  - Nb: n.ipynb\n", encoding="utf-8"
    )
    assert check.documents(str(tmp_path)) == ["README.md", "docs/b.md", "docs/a.md", "docs/stray.md"]


def test_a_block_repeated_in_a_guide_runs_once_and_errors_name_the_page():
    check = _checker()
    readme = check.parse_blocks("```bash\nls\n```\n\n```python\nprint(1)\n```\n", "README.md")
    guide = check.parse_blocks(
        "```bash\nls\n```\n\n<!-- readme-check: skip: why -->\n```python\nprint(1)\n```\n\n```bash\nls -l\n```\n",
        "docs/g.md",
    )
    blocks = readme + guide
    again = check.repeats(blocks)
    assert {i: b.where for i, b in again.items()} == {2: "README.md line 1"}
    refused = check.refuse_unmarked(check.parse_blocks("```bash\nelmo-jax download small\n```\n", "docs/g.md"))
    assert refused[0].startswith("docs/g.md line 1: this block downloads a released model")
    import pytest

    with pytest.raises(ValueError, match="docs/g.md line 1: a code block that is never closed"):
        check.parse_blocks("```bash\nls\n", "docs/g.md")


def test_the_readme_is_short_and_no_page_names_a_tracker():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.split("\n")) <= 300
    import re

    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"\bissues? #?\d|#\d{2,}\b", text, re.IGNORECASE), page
