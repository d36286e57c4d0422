"""examples/embed.ipynb runs top to bottom (on a random tiny model: ELMO_MODEL=random) and draws its figure."""

import os
import sys

import pytest

from tests.conftest import REPO


def test_embed_notebook_executes_and_plots(monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e .[test])")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e .[test])")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install -e .[test])")
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e .[test])")
    nb = nbformat.read(REPO / "examples" / "embed.ipynb", as_version=4)
    # It is committed with its outputs (GitHub shows the figure without running anything).
    saved = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in saved), "commit the notebook executed, with its outputs"
    # The kernel imports elmo_jax from this checkout and uses the random model.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("ELMO_MODEL", "random")  # hermetic: not the checkout's runs/tiny, no export
    from jupyter_client.kernelspec import NATIVE_KERNEL_NAME

    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name=NATIVE_KERNEL_NAME, resources={"metadata": {"path": str(REPO / "examples")}}
    )
    # Run the kernel with this interpreter, whatever kernelspecs are installed.
    client.kernel_manager_class = _manager_for(sys.executable)
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure was drawn"
    text = "".join(o.get("text", "") for o in outputs)
    assert "ok" in text.split()


def _manager_for(python):
    from jupyter_client.manager import AsyncKernelManager

    class Manager(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            return [python, "-m", "ipykernel_launcher", "-f", self.connection_file]

    return Manager
