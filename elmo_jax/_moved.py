"""Old module paths that still import: ``import elmo_jax.embedder`` gives the module now at
``elmo_jax.embedding.embedder`` (the same module object, so attributes set through either name
are seen through both).

The old paths are not files: a file left at the old path would stop git from following the
move.  Code inside the package imports the new paths; these are for users' code.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "elmo_jax.embed_file": "elmo_jax.embedding.embed_file",
    "elmo_jax.embed_input": "elmo_jax.embedding.embed_input",
    "elmo_jax.embed_layouts": "elmo_jax.embedding.embed_layouts",
    "elmo_jax.embed_state": "elmo_jax.embedding.embed_state",
    "elmo_jax.embedder": "elmo_jax.embedding.embedder",
    "elmo_jax.embeddings_reader": "elmo_jax.embedding.embeddings_reader",
    "elmo_jax.manylangs": "elmo_jax.formats.manylangs",
    "elmo_jax.torch_pickle": "elmo_jax.formats.torch_pickle",
    "elmo_jax.train.export": "elmo_jax.formats.training_run",
    "elmo_jax.weights": "elmo_jax.formats.hdf5",
    "elmo_jax.workdir_model": "elmo_jax.formats.run_exports",
}
"""Old dotted module path -> the path it moved to."""


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # The import system stamped the alias's spec on the module: give it its own back.
        module.__spec__ = self.own_spec


class MovedModules(importlib.abc.MetaPathFinder):
    """Finds each old path of :data:`MOVED` as an alias of its new module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(MOVED[fullname]))


def install() -> None:
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())  # before any finder that could find a stale old file
