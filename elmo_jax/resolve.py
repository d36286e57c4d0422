"""The one place that knows the order: a model spec (a folder, a released name, a URL, a
training run's folder) becomes a local folder (:mod:`elmo_jax.hub` downloads and caches),
then a model read from it (:mod:`elmo_jax.formats.folder`, which knows the formats).  The hub
reads no model file itself: what it fetched is prepared and checked by the formats the
resolver hands it (:class:`elmo_jax.formats.downloads.DownloadFormats`).

    resolve_model("original")                            # a released English model
    resolve_model("https://host/models/elmo_x_")         # URL prefix: + options.json, + weights.hdf5
    resolve_model("path/to/folder")                      # an existing folder, returned as it is
    resolve_model("runs/tiny")                           # a training workdir: its newest checkpoint, exported
    read_model("small")    # Elmo.load's one call: the folder, then the model in it (config, params, vocabulary)
"""

from __future__ import annotations

import os
from pathlib import Path

from elmo_jax.errors import ElmoError, refuse_symlink_loop
from elmo_jax.formats.downloads import DownloadFormats
from elmo_jax.formats.folder import ModelValues, read_folder
from elmo_jax.formats.run_exports import is_training_workdir, workdir_model
from elmo_jax.hub.cache import cache_home, fetch
from elmo_jax.hub.names import OPTIONS_FILE, RELEASED_MODELS, WEIGHTS_FILE, is_model_spec, is_url, suggestion


def resolve_model(
    spec: str | os.PathLike, *, offline: bool | None = None, progress: bool = True, force: bool = False
) -> Path:
    """A local folder holding the model ``spec`` names, downloading it on first use.

    ``spec``: an existing folder (returned as it is, unchecked, even where its path is also
    a model's name), a released model's name (:data:`RELEASED_MODELS`) or an ``http(s)://``
    URL (see the module docstring).
    ``offline``: ``None`` reads ``ELMO_JAX_OFFLINE``.  ``progress``: a progress bar per file
    on stderr.  ``force``: delete the cached entry (and any partial download) and fetch it
    again, e.g. after a :class:`ChecksumError`.  Raises :class:`OfflineError`,
    :class:`DownloadError`, :class:`ChecksumError`, or ``FileNotFoundError`` for a path that
    does not exist.
    """
    if not str(spec).strip():  # Path("") would be the current folder
        raise ValueError(
            f"no model given: name a model folder, a released model ({', '.join(RELEASED_MODELS)}) or an http(s):// URL"
        )
    path = None if is_url(spec) else Path(spec)
    if path is not None:
        refuse_symlink_loop(path)
    if path is not None and path.is_dir():  # a folder wins over a name: ./small over "small"
        return local_folder(path)
    if path is not None and not is_model_spec(spec):
        if path.exists():
            raise ElmoError(f"{path} is a file; a model is a folder holding {OPTIONS_FILE} and {WEIGHTS_FILE}")
        raise FileNotFoundError(
            f"model folder not found: {path}; a model is a folder, a released model's name "
            f"({', '.join(RELEASED_MODELS)}) or an http(s):// URL" + suggestion(str(spec))
        )
    return fetch(str(spec), formats=DownloadFormats(), offline=offline, progress=progress, force=force)


def local_folder(path: Path) -> Path:
    """An existing folder as a model folder: itself, or for a training workdir the export of
    its newest checkpoint (:mod:`elmo_jax.formats.run_exports`, cached under :func:`cache_home`)."""
    if is_training_workdir(path):
        return workdir_model(path, cache_home())
    return path


def read_model(spec: str | os.PathLike, *, progress: bool = True) -> ModelValues:
    """The model ``spec`` names, read, for :meth:`elmo_jax.Elmo.load`: a released name or URL
    becomes its cached copy (the hub), an existing folder stays itself; the folder, whatever its
    format, is then read by :func:`elmo_jax.formats.folder.read_folder` (a training run exported
    and an ELMoForManyLangs folder converted once, into the cache)."""
    model_dir = os.fspath(spec)
    if not os.path.exists(model_dir) and is_model_spec(model_dir):
        model_dir = os.fspath(
            fetch(model_dir, formats=DownloadFormats(), progress=progress)
        )  # a name or URL: the cached copy
    if os.path.isfile(model_dir):
        raise ElmoError(
            f"{model_dir} is a file; Elmo.load takes the model folder "
            f"({os.path.dirname(model_dir) or '.'}), or options_file= and weight_file="
        )
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"model folder not found: {model_dir}" + suggestion(model_dir))
    return read_folder(model_dir, cache_home())


__all__ = ["read_model", "resolve_model"]
