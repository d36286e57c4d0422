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
    blocks = check.parse_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    assert check.refuse_unmarked(blocks) == []
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
        (3, "python", "downloads a released model"), (7, "bash", None), (15, "python", None)]
    refused = check.refuse_unmarked(blocks)
    assert len(refused) == 1 and refused[0].startswith("README.md line 7: this block downloads a released model")
    import pytest

    with pytest.raises(ValueError, match="must give its reason"):
        check.parse_blocks("<!-- readme-check: skip -->\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="never closed"):
        check.parse_blocks("```bash\nls\n")
