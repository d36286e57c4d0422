"""A local model folder, whatever its format, read into the values a model is made of: the one
call the resolver makes into the formats.

* a training run's folder (``config.json`` + ``checkpoints/``): its newest checkpoint, exported
  once under ``cache_root/runs`` (:mod:`~elmo_jax.formats.run_exports`);
* an ELMoForManyLangs folder: converted once under ``cache_root/models``
  (:mod:`~elmo_jax.formats.manylangs`);
* and then, as every model in the end, ``options.json`` + ``weights.hdf5``
  (:mod:`~elmo_jax.formats.hdf5`), with a converted vocabulary model's ``.dic`` files beside them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from elmo_jax.config import ElmoConfig
from elmo_jax.formats import hdf5, manylangs
from elmo_jax.formats.run_exports import is_training_workdir, workdir_model


@dataclass(frozen=True)
class ModelValues:
    """What a model folder holds, read: :class:`elmo_jax.Elmo`'s arguments and where they came from."""

    config: ElmoConfig
    params: dict
    token_ids: manylangs.VocabIds | None  # a vocabulary model's char/word ids; None: UTF-8 bytes
    options_file: str  # absolute paths
    weight_file: str


def read_folder(folder: str | os.PathLike, cache_root: str | os.PathLike) -> ModelValues:
    """The model in the existing folder ``folder``, in any of the formats above; conversions and
    exports are kept under ``cache_root``."""
    folder = os.fspath(folder)
    if is_training_workdir(folder):
        folder = os.fspath(workdir_model(folder, cache_root))
    if manylangs.is_manylangs_folder(folder) and not os.path.exists(os.path.join(folder, hdf5.OPTIONS_FILE)):
        folder = os.fspath(manylangs.cached_conversion(folder, Path(cache_root) / "models"))  # then HDF5
    return read_files(*hdf5.model_files(folder))


def read_files(options_file: str | os.PathLike, weight_file: str | os.PathLike) -> ModelValues:
    """The model in ``options_file`` + ``weight_file`` (and, for a vocabulary model, the ``.dic``
    files beside them).  Raises ``FileNotFoundError`` for a missing options file and
    :class:`~elmo_jax.formats.hdf5.WeightFileError` for weights that do not fit the options."""
    if not os.path.exists(options_file):
        raise FileNotFoundError(f"options file not found: {os.fspath(options_file)}")
    config = ElmoConfig.from_json_file(options_file)
    token_ids = None
    if config.vocab is not None:  # a converted ELMoForManyLangs model: its .dic files lie beside
        folder = os.path.dirname(os.path.abspath(options_file))
        manylangs.check_vocab_files(folder, config)
        token_ids = manylangs.VocabIds.from_folder(folder, config)
    params = hdf5.load_weights(weight_file, config)
    return ModelValues(config, params, token_ids, os.path.abspath(options_file), os.path.abspath(weight_file))


__all__ = ["ModelValues", "read_files", "read_folder"]
