"""The model cache: ``$ELMO_JAX_HOME/models/<key>/`` entries, each complete or absent.

:func:`fetch_model` returns a checked entry, fetching it when absent: files downloaded into a
staging folder beside the entry (partial files kept under ``<cache>/.partial/<key>/`` to be
resumed), checked, recorded in ``download.json`` and renamed into place, one process at a time
per entry.  Entries put in place by hand are checked and recorded on first use; offline, a
missing entry raises :class:`~elmo_jax.hub.errors.OfflineError` saying which files to put where.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from elmo_jax.errors import ElmoError
from elmo_jax.hub.archives import fetch_archive
from elmo_jax.hub.download import RETRY_DELAYS_S, TIMEOUT_S, NotFound, Unreachable, download
from elmo_jax.hub.errors import ChecksumError, DownloadError, OfflineError
from elmo_jax.hub.lock import exclusive_lock
from elmo_jax.hub.model_formats import ModelFormats
from elmo_jax.hub.names import (
    DEFAULT_MODELS_URL,
    MODELS_URL_ENV,
    OPTIONS_FILE,
    WEIGHTS_FILE,
    ModelSource,
    join_url,
    model_source,
)
from elmo_jax.hub.verify import (
    MANIFEST_FILE,
    architecture_problem,
    check_model,
    check_options,
    verify_source,
    write_manifest,
)


HOME_ENV = "ELMO_JAX_HOME"
OFFLINE_ENV = "ELMO_JAX_OFFLINE"
PARTIAL_DIR = ".partial"
_TRUE = ("1", "true", "yes", "on")


def cache_home() -> Path:
    """``$ELMO_JAX_HOME``, else ``elmo-jax`` in the user's cache folder."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "elmo-jax"
    if os.name == "nt" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "elmo-jax"
    return Path.home() / ".cache" / "elmo-jax"


def offline_from_env() -> bool:
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in _TRUE


def fetch(
    spec: str,
    *,
    formats: ModelFormats,
    offline: bool | None = None,
    progress: bool = True,
    force: bool = False,
) -> Path:
    """The cache entry of the released name or URL ``spec`` (:mod:`~elmo_jax.hub.names`), checked,
    fetched on first use: the hub's answer to "where is this model?".  ``offline``: ``None``
    reads ``ELMO_JAX_OFFLINE``; the rest as for :func:`fetch_model`."""
    source = model_source(spec, os.environ.get(MODELS_URL_ENV) or DEFAULT_MODELS_URL)
    return fetch_model(
        source,
        cache_home() / "models",
        formats=formats,
        offline=offline_from_env() if offline is None else offline,
        offline_reason=(
            f"offline mode is on ({OFFLINE_ENV}={os.environ.get(OFFLINE_ENV)})"
            if offline is None
            else "offline mode is on"
        ),
        progress=progress,
        force=force,
    )


def fetch_model(
    source: ModelSource,
    models_dir: str | os.PathLike,
    *,
    formats: ModelFormats,
    offline: bool = False,
    offline_reason: str = "offline mode is on",
    progress: bool = True,
    retry_delays_s: Sequence[float] = RETRY_DELAYS_S,
    timeout_s: float = TIMEOUT_S,
    force: bool = False,
) -> Path:
    """The cache entry ``models_dir/source.key``, checked, downloading it when absent.

    The parts of :func:`resolve_model` after parsing, with the network settings explicit:
    ``formats`` prepares and checks what was fetched (:mod:`~elmo_jax.hub.model_formats`);
    ``offline_reason`` ends the :class:`OfflineError` sentence when ``offline``;
    ``retry_delays_s`` are the waits before each retry without progress (so
    ``len(retry_delays_s) + 1`` such attempts in a row give up); ``timeout_s`` bounds each
    connect and read; ``force`` deletes the entry and its partial files first."""
    models_dir = Path(models_dir)
    entry = models_dir / source.key
    if not force and (entry / MANIFEST_FILE).exists():  # complete: entries appear by one rename
        verify_source(entry, source, formats)
        return entry
    models_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(models_dir / ".locks" / f"{source.key}.lock", source.spec, progress):
        if force:
            if offline:
                raise OfflineError(
                    f"--force / force=True fetches {source.spec!r} again, which needs the network, but {offline_reason}"
                )
            shutil.rmtree(entry, ignore_errors=True)
            shutil.rmtree(partial_dir(models_dir, source.key), ignore_errors=True)
        if (entry / MANIFEST_FILE).exists():  # another process fetched it while this one waited
            verify_source(entry, source, formats)
            return entry
        if entry.exists():
            adopt(entry, source, formats)
            verify_source(entry, source, formats)
            return entry
        if offline:
            raise OfflineError(_offline_message(source, entry, offline_reason))
        for stale in models_dir.glob(f".{source.key}.tmp-*"):  # left by a killed process
            shutil.rmtree(stale, ignore_errors=True)
        partial = partial_dir(models_dir, source.key)  # kept across interruptions: resumed
        partial.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{source.key}.tmp-", dir=models_dir))
        try:
            model = staging / "model"
            model.mkdir()
            net = dict(progress=progress, retry_delays_s=retry_delays_s, timeout_s=timeout_s)
            try:
                if source.archive_url:
                    fetch_archive(source, staging, model, partial, net, formats)
                else:
                    _fetch_files(source, model, partial, net, formats)
            except Unreachable as e:
                raise OfflineError(_offline_message(source, entry, f"the network is unreachable ({e})")) from None
            check_model(model, source, formats)
            write_manifest(model, source, downloaded=True)
            os.rename(model, entry)
            shutil.rmtree(partial, ignore_errors=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            for folder in (partial, partial.parent):  # nothing left to resume: no empty folders either
                with contextlib.suppress(OSError):
                    folder.rmdir()
    verify_source(entry, source, formats)
    return entry


def partial_dir(models_dir: str | os.PathLike, key: str) -> Path:
    """Where the partial files of ``key``'s download wait to be resumed: beside the models
    folder (``<cache>/.partial/<key>``), never mistaken for an entry."""
    return Path(models_dir).parent / PARTIAL_DIR / key


def _fetch_files(source: ModelSource, model: Path, partial: Path, net: dict, formats: ModelFormats) -> None:
    """The options file first, checked (and a released name's architecture with it) before
    the weight file is fetched; a 404 tries the bilm-tf names beside it."""
    for i, (name, url) in enumerate(source.file_urls):
        candidates = [url] + [u for n, u in source.alternatives if n == name]
        for n, candidate in enumerate(candidates):
            try:
                got = download(candidate, partial / name, first=i == 0 and n == 0, **net)
                break
            except NotFound as e:
                if n == len(candidates) - 1:
                    folder_url = _folder_of_options_url(url) if name == OPTIONS_FILE else None
                    if folder_url and _fetch_manylangs_folder(folder_url, model, partial, net, formats):
                        return
                    also = f"; also tried {', '.join(candidates[1:])}" if len(candidates) > 1 else ""
                    if folder_url:
                        also += "; nor does the folder hold an ELMoForManyLangs config.json"
                    raise DownloadError(
                        f"{url}: HTTP 404 {e.reason} (check the model name or URL; a folder URL ends with '/'{also})"
                    ) from None
        os.replace(got, model / name)
        if name == OPTIONS_FILE:
            check_options(model / OPTIONS_FILE, source, candidate, formats)


def _folder_of_options_url(url: str) -> str | None:
    """The folder URL (ending in '/') whose ``options.json`` ``url`` is, else None."""
    parts = urllib.parse.urlsplit(url)
    if not parts.path.endswith("/" + OPTIONS_FILE):
        return None
    return urllib.parse.urlunsplit(parts._replace(path=parts.path[: -len(OPTIONS_FILE)]))


def _fetch_manylangs_folder(folder_url: str, model: Path, partial: Path, net: dict, formats: ModelFormats) -> bool:
    """An ELMoForManyLangs folder at ``folder_url`` (which has no options.json): its
    ``config.json``, then the files ``formats`` says that config needs beside it, fetched into
    ``partial`` (resumed like any file) and converted into ``model`` by ``formats``.  False
    where the folder holds no ``config.json``."""
    folder = partial / "manylangs"
    folder.mkdir(parents=True, exist_ok=True)
    config_file = formats.manylangs_config_file
    try:
        download(join_url(folder_url, config_file), folder / config_file, **net)
    except NotFound:
        return False
    try:
        needed = formats.manylangs_files(folder / config_file)
    except ElmoError as e:
        raise DownloadError(
            f"{join_url(folder_url, config_file)} is neither options.json's folder nor "
            f"{str(e).replace(str(folder / config_file), 'it')}; nothing was cached"
        ) from None
    for name, required in needed:
        url = join_url(folder_url, urllib.parse.quote(name))
        try:
            download(url, folder / name, **net)
        except NotFound as e:
            if required:
                raise DownloadError(
                    f"{url}: HTTP 404 {e.reason}; {folder_url} holds an ELMoForManyLangs "
                    f"config.json but not {name}, which such a model needs (its files: "
                    f"{config_file}, {', '.join(n for n, _ in needed)}); nothing was cached"
                ) from None
    try:
        formats.prepare(folder, model)
    except ElmoError as e:
        raise DownloadError(
            f"{folder_url}: {str(e).replace(str(folder), folder_url.rstrip('/'))}; nothing was cached"
        ) from None
    return True


def adopt(entry: Path, source: ModelSource, formats: ModelFormats) -> Path:
    """An entry put in place by hand (see :class:`OfflineError`): checked, then recorded.
    An ELMoForManyLangs folder (the unzipped archive) is converted in place first."""
    formats.prepare(entry, entry)
    missing = [n for n in (OPTIONS_FILE, WEIGHTS_FILE) if not (entry / n).is_file()]
    if missing:
        raise OfflineError(
            f"{entry} holds no {' and no '.join(missing)}; put the model's files there as "
            f"{OPTIONS_FILE} and {WEIGHTS_FILE}, or delete the folder to download it again"
        )
    problem = architecture_problem(entry / OPTIONS_FILE, source, formats)
    if problem:  # checked before anything is recorded: a wrong model never gets a manifest
        raise ChecksumError(
            f"{entry} was put in the cache by hand, but {problem}; put the released model's "
            f"files there, or delete the folder to download it"
        )
    formats.check(entry)
    write_manifest(entry, source, downloaded=False)
    return entry


def _offline_message(source: ModelSource, entry: Path, reason: str) -> str:
    if source.spec.startswith("manylangs/"):
        todo = (
            f"download {source.archive_url} and unzip it into\n  {entry}\n(the folder holding config.json, "
            f"char.dic, word.dic and the .pkl files; it is converted on first use)"
        )
    elif source.archive_url:
        todo = (
            f"download {source.archive_url}, extract it, and put its options file at\n  "
            f"{entry / OPTIONS_FILE}\nand its weight file at\n  {entry / WEIGHTS_FILE}"
        )
    else:
        todo = "put these files there:\n" + "\n".join(
            f"  {url}\n    -> {entry / name}" for name, url in source.file_urls
        )
    return (
        f"model {source.spec!r} is not in the cache and {reason}; {todo}\n(on a machine with internet "
        f"access, `elmo-jax download {source.spec}` fetches them: copy the folder it prints to {entry})"
    )


__all__ = [
    "HOME_ENV",
    "OFFLINE_ENV",
    "PARTIAL_DIR",
    "adopt",
    "cache_home",
    "fetch",
    "fetch_model",
    "offline_from_env",
    "partial_dir",
]
