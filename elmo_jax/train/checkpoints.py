"""Training checkpoints with orbax-checkpoint: arrays + a JSON record, written atomically.

A checkpoint at step ``n`` holds

* ``state``: ``{"train": {params, opt_state, step}, "lstm": carried LSTM state}`` (arrays),
* ``meta``: JSON — the data position (the batcher's state), the training config, the
  model's ``options.json`` dict, the vocabulary size and anything else the loop records.

orbax writes each step into a temporary folder and renames it when complete, so an
interrupted save never replaces the previous checkpoint.

Multi-process runs pass *global* ``jax.Array``s (the train state replicated over a mesh of
all devices, the LSTM state sharded by rows): every process calls :meth:`Checkpoints.save`
with the same step, orbax writes each array shard once (replicated arrays by one replica
only) and the JSON ``meta`` from process 0 only, and finalizes the step after all
processes are done.  The loop therefore puts per-process information (data positions)
into ``meta`` as a list indexed by process.  Host numpy arrays are still accepted (a
single-process caller).  The vocabulary lives beside the
checkpoints as ``vocab.txt`` in the workdir (it never changes during a run).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from elmo_jax.errors import ElmoError


class CheckpointError(ElmoError):
    """A checkpoint that cannot be restored into the requested run."""


class Checkpoints:
    """The checkpoints of one workdir (``WORKDIR/checkpoints/<step>``)."""

    def __init__(self, workdir: str | os.PathLike, keep: int = 3):
        self.directory = os.path.join(os.path.abspath(os.fspath(workdir)), "checkpoints")
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def save(self, step: int, state: Any, meta: dict) -> None:
        """Save ``state`` (host arrays, or global ``jax.Array``s from every process of a
        multi-process job) and the JSON ``meta`` (written by process 0) as step ``step``."""
        state = jax.tree.map(lambda x: x if isinstance(x, jax.Array) else np.asarray(x), state)
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            force=True,
        )

    def read_meta(self, step: int | None = None) -> dict:
        step = self._require(step)
        out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return out["meta"]

    def restore(self, template: Any, step: int | None = None) -> tuple[Any, dict]:
        """Arrays shaped like ``template`` and the JSON meta of ``step`` (default latest).

        ``template`` leaves: arrays or ``jax.ShapeDtypeStruct``s give host numpy arrays;
        ``jax.ShapeDtypeStruct``s with a ``sharding`` give global ``jax.Array``s laid out
        that way (every process of a multi-process job must call this).
        """
        step = self._require(step)

        def abstract_leaf(x):
            if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is not None:
                return x
            return np.zeros(x.shape, x.dtype)

        abstract = jax.tree.map(abstract_leaf, template)
        try:
            out = self._manager.restore(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(
                f"checkpoint {self.path(step)} does not fit this run's model/optimizer/batch "
                f"layout: {e}"
            ) from None
        state = jax.tree.map(lambda x: x if isinstance(x, jax.Array) else np.asarray(x), out["state"])
        for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(abstract)):
            if got.shape != want.shape:
                raise CheckpointError(
                    f"checkpoint {self.path(step)} holds an array of shape {got.shape} where this "
                    f"run expects {want.shape}"
                )
        return state, out["meta"]

    def wait(self) -> None:
        """Block until pending asynchronous saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def _require(self, step: int | None) -> int:
        if step is None:
            step = self.latest_step()
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        return step
