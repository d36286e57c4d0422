"""Modules that moved still import from their old paths, as the very same module."""

import importlib
import subprocess
import sys

import pytest

from elmo_jax._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_is_the_moved_module(old):
    moved = importlib.import_module(old)
    assert moved is importlib.import_module(MOVED[old])
    assert moved.__name__ == MOVED[old] and moved.__spec__.name == MOVED[old]


def test_old_paths_import_in_a_fresh_process():
    # `from OLD import name` and `import OLD` before anything imported the new path
    lines = [f"import {old}\nassert {old}.__name__ == {MOVED[old]!r}" for old in sorted(MOVED)]
    code = "\n".join(lines) + "\nfrom elmo_jax.weights import load_weights\nprint('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_hub_keeps_its_names():
    from elmo_jax import hub
    from elmo_jax.hub import resolve_model  # the name users have always imported from here
    from elmo_jax.resolve import resolve_model as resolver

    assert resolve_model is resolver and hub.resolve_model is resolver
    for name in hub.__all__:
        assert getattr(hub, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        hub.nope  # noqa: B018
