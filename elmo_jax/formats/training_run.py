"""From a training checkpoint to frozen inference weights.

``export(workdir, out_dir)`` writes::

    out_dir/options.json    the architecture, in the released models' spelling
    out_dir/weights.hdf5    the biLM in the released HDF5 layout (elmo_jax.formats.hdf5)
    out_dir/vocab.txt       the target vocabulary (one token per line)
    out_dir/softmax.hdf5    the shared softmax: datasets softmax/W [V, P], softmax/b [V]

``Elmo.load(out_dir)`` reads the first two; the softmax file lets training continue from
an export.  The folder is written under a temporary name (``OUT_DIR.tmp_HOST_PID_*``; one that a
killed export left is removed by the next export to ``OUT_DIR``) and renamed when complete.
An ``out_dir`` inside what a training workdir manages (``RUN/checkpoints/...``) is refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any

import h5py
import jax
import numpy as np

from elmo_jax.atomic import owned_temp_dir, process_alive, replace_dir
from elmo_jax.config import ElmoConfig
from elmo_jax.data.vocab import Vocabulary
from elmo_jax.formats.hdf5 import OPTIONS_FILE, WEIGHTS_FILE
from elmo_jax.errors import ElmoError, refuse_symlink_loop
from elmo_jax.train.checkpoints import Checkpoints, DamagedCheckpointError, check_vocabulary_size
from elmo_jax.train.config_loader import TrainConfig
from elmo_jax.train.step import init_train_state, make_optimizer
from elmo_jax.train.workdir import check_run_inputs
from elmo_jax.model.lstm import zero_state
from elmo_jax.formats.hdf5 import check_finite_weights, params_to_datasets, save_weights

SOFTMAX_FILE = "softmax.hdf5"
VOCAB_FILE = "vocab.txt"
EXPORT_FILES = (OPTIONS_FILE, WEIGHTS_FILE, VOCAB_FILE, SOFTMAX_FILE)
"""What :func:`export` writes; ``--overwrite`` replaces a folder holding nothing else."""


@dataclasses.dataclass
class LoadedCheckpoint:
    workdir: str
    step: int
    params: dict  # {"bilm": ..., "softmax": ...}
    model_config: ElmoConfig
    train_config: TrainConfig
    vocab: Vocabulary
    heldout_spec: str | None
    eval_max_batches: int | None = None  # the setting of the start that wrote the checkpoint


def require_workdir(workdir: str) -> None:
    """Refuse a run folder that does not exist or is a file, naming what it is."""
    refuse_symlink_loop(workdir)
    if not os.path.exists(workdir):
        raise ElmoError(
            f"the workdir {workdir} does not exist: give the folder that `elmo-jax train "
            f"--workdir` wrote (it holds config.json and checkpoints/)"
        )
    if not os.path.isdir(workdir):
        raise ElmoError(
            f"{workdir} is a file, not a training workdir (the folder that `elmo-jax train --workdir` wrote)"
        )


RUN_OWNED = (
    "checkpoints",
    "checkpoints-damaged",
    "corpus",
    "tfds",
    "token_index",
    "tensorboard",
    "config.json",
    "options.json",
    "vocab.txt",
    "vocab_source.json",
    "metrics.jsonl",
    "run.lock",
)
"""What a training workdir holds and manages itself: no export goes there (an export under
``checkpoints/`` is taken for a damaged checkpoint and breaks ``export`` and ``eval``)."""


def refuse_output_in_a_run(out_dir: str | os.PathLike) -> None:
    """Refuse an output folder inside what a training workdir owns (:data:`RUN_OWNED`),
    through any spelling or symlink: e.g. ``RUN/checkpoints/999``."""
    out_dir = os.fspath(out_dir)
    path = os.path.realpath(out_dir)
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return
        if (
            os.path.basename(path) in RUN_OWNED
            and os.path.isfile(os.path.join(parent, "config.json"))
            and os.path.isdir(os.path.join(parent, "checkpoints"))
        ):
            raise ElmoError(
                f"the output folder {out_dir} is inside {path}, which the training run {parent} "
                f"manages (an export there breaks its checkpoints): choose a folder outside it, "
                f"e.g. {os.path.join(parent, 'export')}"
            )
        path = parent


def _remove_legacy_temp_dirs(parent: str, name: str) -> None:
    """Remove ``NAME.tmp-PID`` folders that exports of earlier versions, killed, left in
    ``parent`` (those of processes of this host that no longer run)."""
    prefix = f"{name}.tmp-"
    for entry in os.listdir(parent):
        pid = entry[len(prefix) :]
        if entry.startswith(prefix) and pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


def load_checkpoint_params(workdir: str | os.PathLike, step: int | None = None) -> LoadedCheckpoint:
    """The params of a run's checkpoint (latest by default), with its config and vocabulary."""
    workdir = os.path.abspath(os.fspath(workdir))
    require_workdir(workdir)
    for name in ("config.json", "vocab.txt"):
        if not os.path.exists(os.path.join(workdir, name)):
            raise ElmoError(f"{workdir} is not a training workdir: {name} is missing")
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
        train_config = TrainConfig(**json.load(f))
    model_config = train_config.elmo_config()
    vocab = Vocabulary.load(os.path.join(workdir, "vocab.txt"))
    ckpts = Checkpoints(workdir, create=False)
    try:
        meta = ckpts.read_meta(step)
        step = int(meta["step"]) if step is None else step
        check_vocabulary_size(meta, len(vocab), ckpts.path(step), os.path.join(workdir, "vocab.txt"))
        check_run_inputs(meta, ckpts.path(step), workdir, train_config.to_dict())  # vocab.txt, config.json
        optimizer = make_optimizer(
            train_config.optimizer, train_config.learning_rate, train_config.initial_accumulator, train_config.clip_norm
        )
        template = jax.eval_shape(
            lambda: (
                init_train_state(jax.random.key(0), model_config, len(vocab), optimizer),
                # The stored LSTM state holds the rows of all processes.
                zero_state(
                    model_config, int(meta.get("global_batch") or meta.get("local_batch") or train_config.batch_size)
                ),
            )
        )
        (train_state, _), meta = ckpts.restore(template, step)
    except DamagedCheckpointError as e:
        others = [s for s in ckpts.all_steps() if s != e.step]
        hint = (
            f"; the other checkpoints are steps {', '.join(map(str, others))}: pick one with --step"
            if others
            else "; it is the only checkpoint"
        )
        raise DamagedCheckpointError(e.step, e.path, e.reason, hint) from None
    finally:
        ckpts.close()
    params = train_state["params"]
    check_finite_weights(
        {
            **params_to_datasets(params["bilm"], model_config),
            **{f"softmax/{k}": np.asarray(v) for k, v in params["softmax"].items()},
        },
        f"checkpoint {ckpts.path(step)}",
    )
    eval_max_batches = meta.get("config", {}).get("eval_max_batches", train_config.eval_max_batches)
    return LoadedCheckpoint(
        workdir, step, train_state["params"], model_config, train_config, vocab, meta.get("heldout"), eval_max_batches
    )


def export(
    workdir: str | os.PathLike, out_dir: str | os.PathLike, step: int | None = None, overwrite: bool = False
) -> dict[str, Any]:
    """Write the frozen model of a checkpoint to ``out_dir`` (see the module docstring)."""
    out_dir = os.path.abspath(os.fspath(out_dir))
    run = os.path.realpath(os.fspath(workdir))
    require_workdir(os.path.abspath(os.fspath(workdir)))
    if os.path.commonpath([run, os.path.realpath(out_dir)]) == os.path.realpath(out_dir):
        raise ElmoError(
            f"the output folder {out_dir} is or contains the training workdir {run}; "
            f"replacing it would delete the run's checkpoints: choose another folder"
        )
    refuse_output_in_a_run(out_dir)
    if os.path.exists(out_dir) and os.listdir(out_dir):
        if not overwrite:
            raise FileExistsError(f"{out_dir} exists and is not empty; pass --overwrite to replace it")
        others = sorted(set(os.listdir(out_dir)) - set(EXPORT_FILES))
        if others:
            raise FileExistsError(
                f"{out_dir} holds files that are not part of an export ({', '.join(others)}); --overwrite "
                f"replaces the whole folder and would delete them: move them out or choose another folder"
            )
    loaded = load_checkpoint_params(workdir, step)
    parent, name = os.path.split(out_dir)
    os.makedirs(parent, exist_ok=True)
    _remove_legacy_temp_dirs(parent, name)
    # named by host and pid: what a killed export left is removed by the next export to out_dir
    tmp = owned_temp_dir(parent, f"{name}.tmp_")
    try:
        loaded.model_config.to_json_file(os.path.join(tmp, OPTIONS_FILE))
        save_weights(loaded.params["bilm"], loaded.model_config, os.path.join(tmp, WEIGHTS_FILE))
        loaded.vocab.save(os.path.join(tmp, VOCAB_FILE))
        with h5py.File(os.path.join(tmp, SOFTMAX_FILE), "w") as f:
            f.create_dataset("softmax/W", data=np.asarray(loaded.params["softmax"]["w"], np.float32))
            f.create_dataset("softmax/b", data=np.asarray(loaded.params["softmax"]["b"], np.float32))
        replace_dir(tmp, out_dir)  # the old export moved aside, not deleted file by file
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"step": loaded.step, "files": sorted(os.listdir(out_dir))}
