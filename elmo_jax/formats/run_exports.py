"""A training workdir used as a model: its newest checkpoint, exported once into the cache.

``Elmo.load("runs/tiny")``, ``elmo-jax embed ... --model runs/tiny``, ``ElmoLayer("runs/tiny")``
and the examples' model argument all reach :func:`elmo_jax.resolve.resolve_model`, which hands a
folder that :func:`is_training_workdir` recognises to :func:`workdir_model`.  That exports
the run's newest checkpoint with :func:`elmo_jax.formats.training_run.export` (the same files as
``elmo-jax export``) into::

    $ELMO_JAX_HOME/runs/<run folder name>-<hash of its real path>/step-<N>-<checkpoint stamp>/

and returns that folder.  The next use of the same checkpoint reads the cached export; a
newer checkpoint (or a run trained again from scratch into the same folder, whose
checkpoint has another modification time) is exported again, and the run's older cached
exports are removed.  The workdir itself is only read.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path
from typing import Callable

from elmo_jax.errors import ElmoError

RUNS_FOLDER = "runs"  # under the cache root the resolver passes


def is_training_workdir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder that ``elmo-jax train`` wrote (config.json + checkpoints/)."""
    path = os.fspath(path)
    return os.path.isfile(os.path.join(path, "config.json")) and os.path.isdir(os.path.join(path, "checkpoints"))


def workdir_model(
    workdir: str | os.PathLike, cache_root: str | os.PathLike, *, log: Callable[[str], None] | None = None
) -> Path:
    """The folder (options.json + weights.hdf5 + vocab.txt + softmax.hdf5) of ``workdir``'s
    newest checkpoint, exported into ``cache_root/runs`` on first use (module docstring).

    Raises :class:`ElmoError` for a workdir without a checkpoint, and what
    :func:`elmo_jax.formats.training_run.export` raises for a damaged one (naming ``--step``)."""
    from elmo_jax.formats.hdf5 import OPTIONS_FILE, WEIGHTS_FILE
    from elmo_jax.train.checkpoints import Checkpoints
    from elmo_jax.formats.training_run import export

    if log is None:
        log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    real = os.path.realpath(os.fspath(workdir))
    ckpts = Checkpoints(real, create=False)
    try:
        step = ckpts.latest_step()
        checkpoint = ckpts.path(step) if step is not None else None
    finally:
        ckpts.close()
    if step is None:
        raise ElmoError(
            f"{workdir} is a training workdir without a checkpoint yet: train it first "
            f"(`elmo-jax train --workdir {workdir}`), or give a model folder"
        )
    assert checkpoint is not None
    stamp = os.stat(checkpoint).st_mtime_ns
    run_key = f"{os.path.basename(real) or 'run'}-{hashlib.sha256(real.encode()).hexdigest()[:12]}"
    runs = Path(cache_root) / RUNS_FOLDER / run_key
    folder = runs / f"step-{step}-{stamp:x}"
    if (folder / OPTIONS_FILE).is_file() and (folder / WEIGHTS_FILE).is_file():
        return folder
    log(
        f"{workdir} is a training workdir: exporting its checkpoint of step {step} to {folder} "
        f"(once per checkpoint; `elmo-jax export {workdir} DIR` writes a folder of your own)"
    )
    runs.mkdir(parents=True, exist_ok=True)
    export(real, folder, overwrite=True)
    for old in runs.iterdir():  # the run's earlier exports: superseded by this one
        if old.is_dir() and old.name != folder.name and old.name.startswith("step-") and ".tmp-" not in old.name:
            shutil.rmtree(old, ignore_errors=True)
    return folder


__all__ = ["is_training_workdir", "workdir_model"]
