"""Models by name or URL: downloaded once into a local cache, returned as a folder that
:meth:`elmo_jax.Elmo.load` reads (``options.json`` + ``weights.hdf5``).

    resolve_model("original")                            # a released English model
    resolve_model("https://host/models/elmo_x_")         # URL prefix: + options.json, + weights.hdf5
    resolve_model("https://host/models/x/")              # folder URL: x/options.json, x/weights.hdf5
    resolve_model("https://host/x/elmo_x_options.json")  # either file's URL: the other is beside it
    resolve_model("https://host/model.tar.gz")           # an archive (.zip, .tar.gz, .tgz) holding them
    resolve_model("path/to/folder")                      # an existing folder, returned as it is
    resolve_model("runs/tiny")                           # a training workdir: its newest checkpoint, exported

Names: ``small``, ``medium``, ``original``, ``original-5.5b``, the files AllenNLP points to,
under ``$ELMO_JAX_MODELS_URL`` (default ``https://allennlp.s3.amazonaws.com/models/elmo/``)
as ``<dir>/elmo_<dir>_options.json`` and ``<dir>/elmo_<dir>_weights.hdf5``.

Cache: ``$ELMO_JAX_HOME/models/<key>/`` (default ``$XDG_CACHE_HOME/elmo-jax``, else
``~/.cache/elmo-jax``); ``<key>`` is the name, or for a URL its last path part plus a hash
of the URL.  An entry holds ``options.json``, ``weights.hdf5`` (an archive's other files in
the model's folder too, e.g. an export's ``vocab.txt`` and ``softmax.hdf5``) and
``download.json``, the sha256 of every file recorded when it was downloaded and checked
on every later use.

A download goes into a temporary folder beside the entry; each file is resumed with an
HTTP ``Range`` request after a dropped connection; archives are extracted there; the
options and weights are checked against each other (:func:`elmo_jax.weights.load_weights`),
and only then is the folder renamed into place, so an entry is complete or absent.  An
exclusive file lock (``fcntl.flock``) per entry serialises processes fetching the same
model: the second one waits and then uses the first one's copy.

Offline (``offline=True`` or ``ELMO_JAX_OFFLINE=1``, or the network unreachable): a cached
entry is used; without one, :class:`OfflineError` says which files to put where.  Files put
there by hand are checked like a download and their sha256 recorded on first use.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import http.client
import json
import os
import re
import shutil
import ssl
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from elmo_jax import __version__
from elmo_jax.atomic import file_sha256, write_json
from elmo_jax.config import ElmoConfig
from elmo_jax.errors import ElmoError
from elmo_jax.weights import load_weights

try:
    import fcntl
except ImportError:  # Windows: no flock; concurrent downloads of one model are then not serialised
    fcntl = None

RELEASED_MODELS = MappingProxyType({
    "small": "2x1024_128_2048cnn_1xhighway",
    "medium": "2x2048_256_2048cnn_1xhighway",
    "original": "2x4096_512_2048cnn_2xhighway",
    "original-5.5b": "2x4096_512_2048cnn_2xhighway_5.5B",
})
"""Released English models: name -> folder under the models URL."""

DEFAULT_MODELS_URL = "https://allennlp.s3.amazonaws.com/models/elmo/"
HOME_ENV = "ELMO_JAX_HOME"
OFFLINE_ENV = "ELMO_JAX_OFFLINE"
MODELS_URL_ENV = "ELMO_JAX_MODELS_URL"
OPTIONS_FILE = "options.json"
WEIGHTS_FILE = "weights.hdf5"
MANIFEST_FILE = "download.json"
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz")
# Seconds to wait before each retry after a dropped connection; a retry that brings new bytes
# starts the count again, so only this many failures in a row give up.
RETRY_DELAYS_S = (0.0, 1.0, 2.0, 4.0, 8.0)
TIMEOUT_S = 60.0
_CHUNK_BYTES = 1 << 20
_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, ssl.SSLError)
_TRUE = ("1", "true", "yes", "on")


class DownloadError(ElmoError, OSError):
    """A model could not be fetched: an HTTP error, a connection that kept dropping, or
    files that do not form a model.  Nothing is left in the cache."""


class ChecksumError(ElmoError, ValueError):
    """A cached file whose sha256 differs from the one recorded when it was downloaded."""


class OfflineError(ElmoError, FileNotFoundError):
    """A model that is not cached, while offline or with the network unreachable."""


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: the two files' URLs, or one archive's URL."""

    spec: str  # what the user wrote
    key: str  # the cache entry's folder name
    file_urls: tuple[tuple[str, str], ...] = ()  # (name in the entry, URL): options, weights
    archive_url: str | None = None


def cache_home() -> Path:
    """``$ELMO_JAX_HOME``, else ``elmo-jax`` in the user's cache folder."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "elmo-jax"
    if os.name == "nt" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "elmo-jax"
    return Path.home() / ".cache" / "elmo-jax"


def is_url(spec: object) -> bool:
    return isinstance(spec, str) and spec.lower().startswith(("http://", "https://"))


def is_model_spec(spec: object) -> bool:
    """Whether ``spec`` names a model to download: a released name or an http(s) URL."""
    return isinstance(spec, str) and (spec in RELEASED_MODELS or is_url(spec))


def offline_from_env() -> bool:
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in _TRUE


def resolve_model(spec: str | os.PathLike, *, offline: bool | None = None, progress: bool = True) -> Path:
    """A local folder holding the model ``spec`` names, downloading it on first use.

    ``spec``: an existing folder (returned as it is, unchecked, even where its path is also
    a model's name), a released model's name (:data:`RELEASED_MODELS`) or an ``http(s)://``
    URL (see the module docstring).
    ``offline``: ``None`` reads ``ELMO_JAX_OFFLINE``.  ``progress``: a progress bar per file
    on stderr.  Raises :class:`OfflineError`, :class:`DownloadError`, :class:`ChecksumError`,
    or ``FileNotFoundError`` for a path that does not exist.
    """
    if not str(spec).strip():  # Path("") would be the current folder
        raise ValueError(f"no model given: name a model folder, a released model "
                         f"({', '.join(RELEASED_MODELS)}) or an http(s):// URL")
    path = None if is_url(spec) else Path(spec)
    if path is not None and path.is_dir():  # a folder wins over a name: ./small over "small"
        return _local_folder(path)
    if path is not None and not is_model_spec(spec):
        if path.exists():
            raise ElmoError(f"{path} is a file; a model is a folder holding {OPTIONS_FILE} and {WEIGHTS_FILE}")
        raise FileNotFoundError(
            f"model folder not found: {path}; a model is a folder, a released model's name "
            f"({', '.join(RELEASED_MODELS)}) or an http(s):// URL"
        )
    source = model_source(spec, os.environ.get(MODELS_URL_ENV) or DEFAULT_MODELS_URL)
    return fetch_model(source, cache_home() / "models",
                       offline=offline_from_env() if offline is None else offline,
                       offline_reason=(f"offline mode is on ({OFFLINE_ENV}={os.environ.get(OFFLINE_ENV)})"
                                       if offline is None else "offline mode is on"),
                       progress=progress)


def _local_folder(path: Path) -> Path:
    """An existing folder as a model folder: itself, or for a training workdir the export of
    its newest checkpoint (:mod:`elmo_jax.workdir_model`, cached under :func:`cache_home`)."""
    from elmo_jax.workdir_model import is_training_workdir, workdir_model

    if is_training_workdir(path):
        return workdir_model(path, cache_home())
    return path


def model_source(spec: str, models_url: str = DEFAULT_MODELS_URL) -> ModelSource:
    """Parse a released name or a URL (see the module docstring for the URL forms)."""
    if spec in RELEASED_MODELS:
        folder = RELEASED_MODELS[spec]
        return ModelSource(spec, spec, _file_urls(f"{models_url.rstrip('/')}/{folder}/elmo_{folder}_"))
    if not is_url(spec):
        raise ValueError(f"{spec!r} is neither a released model ({', '.join(RELEASED_MODELS)}) "
                         f"nor an http(s):// URL")
    parts = urllib.parse.urlsplit(spec)
    if not parts.hostname:
        raise ValueError(f"{spec!r} is not a usable URL: it names no host (e.g. https://host/path/)")
    if parts.path.lower().endswith(ARCHIVE_SUFFIXES):
        return ModelSource(spec, _url_key(spec, parts.path), archive_url=spec)
    path = parts.path
    for name in (OPTIONS_FILE, WEIGHTS_FILE):
        if path.endswith(name):
            path = path[: -len(name)]
            break
    prefix = urllib.parse.urlunsplit(parts._replace(path=path))
    return ModelSource(spec, _url_key(prefix, path), _file_urls(prefix))


def _file_urls(prefix: str) -> tuple[tuple[str, str], ...]:
    parts = urllib.parse.urlsplit(prefix)
    return tuple((name, urllib.parse.urlunsplit(parts._replace(path=parts.path + name)))
                 for name in (OPTIONS_FILE, WEIGHTS_FILE))


def _url_key(url: str, path: str) -> str:
    """A readable, collision-free folder name: the URL's last path part and a hash of it."""
    last = path.rstrip("/").rsplit("/", 1)[-1]
    for suffix in ARCHIVE_SUFFIXES:
        if last.lower().endswith(suffix):
            last = last[: -len(suffix)]
    slug = re.sub(r"[^A-Za-z0-9.-]+", "_", last).strip("._-")[:48] or "model"
    return f"{slug}-{hashlib.sha256(url.encode('utf-8')).hexdigest()[:12]}"


def fetch_model(
    source: ModelSource,
    models_dir: str | os.PathLike,
    *,
    offline: bool = False,
    offline_reason: str = "offline mode is on",
    progress: bool = True,
    retry_delays_s: Sequence[float] = RETRY_DELAYS_S,
    timeout_s: float = TIMEOUT_S,
) -> Path:
    """The cache entry ``models_dir/source.key``, checked, downloading it when absent.

    The parts of :func:`resolve_model` after parsing, with the network settings explicit:
    ``offline_reason`` ends the :class:`OfflineError` sentence when ``offline``;
    ``retry_delays_s`` are the waits before each retry without progress (so
    ``len(retry_delays_s) + 1`` such attempts in a row give up); ``timeout_s`` bounds each
    connect and read."""
    models_dir = Path(models_dir)
    entry = models_dir / source.key
    if (entry / MANIFEST_FILE).exists():  # complete: entries appear by one rename
        verify_entry(entry, source.spec)
        return entry
    models_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(models_dir / ".locks" / f"{source.key}.lock", source.spec, progress):
        if (entry / MANIFEST_FILE).exists():  # another process fetched it while this one waited
            verify_entry(entry, source.spec)
            return entry
        if entry.exists():
            return _adopt(entry, source)
        if offline:
            raise OfflineError(_offline_message(source, entry, offline_reason))
        for stale in models_dir.glob(f".{source.key}.tmp-*"):  # left by a killed process
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{source.key}.tmp-", dir=models_dir))
        try:
            model = staging / "model"
            model.mkdir()
            try:
                if source.archive_url:
                    _fetch_archive(source.archive_url, staging, model, progress, retry_delays_s, timeout_s)
                else:
                    for i, (name, url) in enumerate(source.file_urls):
                        _download(url, model / name, progress=progress, retry_delays_s=retry_delays_s,
                                  timeout_s=timeout_s, first=i == 0)
            except _Unreachable as e:
                raise OfflineError(_offline_message(source, entry, f"the network is unreachable ({e})")) from None
            _check_model(model, source)
            _write_manifest(model, source, downloaded=True)
            os.rename(model, entry)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return entry


def verify_entry(entry: str | os.PathLike, spec: str | None = None) -> dict:
    """Check every file of a cache entry against the sha256 recorded in its manifest;
    returns the manifest."""
    entry = Path(entry)
    with open(entry / MANIFEST_FILE, encoding="utf-8") as f:
        manifest = json.load(f)
    redo = (f"delete {entry} and run `elmo-jax download {spec}` to download it again"
            if spec else f"delete {entry} to download it again")
    for name, expected in manifest["sha256"].items():
        path = entry / name
        if not path.exists():
            raise ChecksumError(f"{path} is missing from the model cache; {redo}")
        found = file_sha256(path)
        if found != expected:
            raise ChecksumError(
                f"{path} has changed since it was downloaded (sha256 {found}, recorded {expected}): "
                f"it was modified or damaged; {redo}"
            )
    return manifest


# -- one file over HTTP -------------------------------------------------------------------
class _Unreachable(Exception):
    """The very first connection of a download failed: no network (or no such host)."""


def _download(url: str, dest: Path, *, progress: bool, retry_delays_s: Sequence[float], timeout_s: float,
              first: bool = False) -> None:
    """``url`` into ``dest``, resuming with ``Range`` (guarded by ``If-Range``) after a
    dropped connection; gives up after ``len(retry_delays_s) + 1`` attempts in a row that
    brought no new bytes."""
    done, total, validator, failures = 0, None, None, 0
    most = 0  # the most bytes held so far: a retry counts as progress only if it gets further
    bar = None
    try:
        with open(dest, "wb") as out:
            while True:
                headers = {"User-Agent": f"elmo-jax/{__version__}"}
                if done:
                    headers["Range"] = f"bytes={done}-"
                    if validator:
                        headers["If-Range"] = validator
                try:
                    with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                                timeout=timeout_s) as resp:
                        first = False
                        if done and not (resp.status == 206 and _range_start(resp) == done):
                            # The file changed (If-Range) or the server ignores Range: start over.
                            out.seek(0)
                            out.truncate()
                            done = 0
                            if bar is not None:
                                bar.reset()
                            if resp.status == 206:  # a part from elsewhere: ask for the whole file
                                continue
                        if total is None:
                            total = _total_size(resp, done)
                            validator = resp.headers.get("ETag") or resp.headers.get("Last-Modified")
                        if bar is None:
                            label = urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1] or dest.name
                            bar = _progress_bar(label, total, done, progress)
                        while chunk := resp.read(_CHUNK_BYTES):
                            out.write(chunk)
                            done += len(chunk)
                            bar.update(len(chunk))
                    if total is None or done == total:
                        return
                    if done > total:
                        raise DownloadError(f"{url}: received {done} bytes, more than the {total} announced")
                    problem = f"connection closed after {done} of {total} bytes"
                except urllib.error.HTTPError as e:
                    if e.code == 416 and total is not None and done == total:
                        return
                    if e.code < 500:
                        hint = (" (check the model name or URL; a folder URL ends with '/')"
                                if e.code in (403, 404) else "")
                        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}{hint}") from None
                    problem = f"HTTP {e.code} {e.reason}"
                except _NETWORK_ERRORS as e:  # not OSErrors of the local disk: those stop at once
                    if first:
                        raise _Unreachable(getattr(e, "reason", e)) from None
                    problem = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
                failures = 0 if done > most else failures + 1
                most = max(most, done)
                if failures > len(retry_delays_s):
                    got = f"{done} of {total} bytes" if total else f"{done} bytes"
                    raise DownloadError(f"{url}: gave up after {failures} attempts in a row without progress "
                                        f"({problem}; got {got}); try again later") from None
                time.sleep(retry_delays_s[failures - 1] if failures else 0.0)
    finally:
        if bar is not None:
            bar.close()


def _range_start(resp) -> int | None:
    match = re.match(r"bytes (\d+)-\d+/(\d+|\*)", resp.headers.get("Content-Range", ""))
    return int(match.group(1)) if match else None


def _total_size(resp, done: int) -> int | None:
    match = re.match(r"bytes \d+-\d+/(\d+)", resp.headers.get("Content-Range", ""))
    if match:
        return int(match.group(1))
    length = resp.headers.get("Content-Length")
    return done + int(length) if length and length.isdigit() else None


def _progress_bar(name: str, total: int | None, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=name, unit="B", unit_scale=True, unit_divisor=1024,
                disable=not enabled, file=sys.stderr)


# -- archives, checks, manifest -----------------------------------------------------------
def _fetch_archive(url: str, staging: Path, model: Path, progress: bool, retry_delays_s, timeout_s) -> None:
    suffix = next(s for s in ARCHIVE_SUFFIXES if urllib.parse.urlsplit(url).path.lower().endswith(s))
    archive = staging / f"archive{suffix}"
    _download(url, archive, progress=progress, retry_delays_s=retry_delays_s, timeout_s=timeout_s, first=True)
    extracted = staging / "extracted"
    try:
        if suffix == ".zip":
            with zipfile.ZipFile(archive) as z:
                z.extractall(extracted)  # member names are sanitised: nothing lands outside
        else:
            with tarfile.open(archive, "r:gz") as t:
                _extract_tar(t, extracted)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as e:
        raise DownloadError(f"{url} is not a readable {suffix} archive ({e}); nothing was cached") from None
    archive.unlink()
    folder, options, weights = _model_files_in(extracted, url)
    for f in folder.iterdir():
        if f.is_file():
            name = OPTIONS_FILE if f == options else WEIGHTS_FILE if f == weights else f.name
            os.rename(f, model / name)


def _extract_tar(t: tarfile.TarFile, dest: Path) -> None:
    """Extract regular files and folders only, none outside ``dest``."""
    if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
        t.extractall(dest, filter="data")
        return
    for m in t.getmembers():
        parts = Path(m.name).parts
        if not (m.isfile() or m.isdir()) or Path(m.name).is_absolute() or ".." in parts:
            raise tarfile.TarError(f"unsafe member {m.name!r}")
    t.extractall(dest)


def _model_files_in(root: Path, url: str) -> tuple[Path, Path, Path]:
    """The folder of an extracted archive that holds the model, its options and weight files.

    Options: ``options.json``, else the one ``*options*.json``.  Weights: ``weights.hdf5``,
    else the one ``*weights*.hdf5``, else the folder's only ``.hdf5`` file."""
    folders = sorted({p.parent for p in root.rglob("*options*.json")
                      if p.is_file() and not p.name.startswith("._")})
    if len(folders) != 1:
        found = "none" if not folders else ", ".join(str(f.relative_to(root)) or "." for f in folders)
        raise DownloadError(f"{url}: expected one folder with an options .json file in the archive, "
                            f"found {found}; nothing was cached")
    folder = folders[0]

    def pick(exact: str, pattern: str, fallback: str | None) -> Path:
        if (folder / exact).is_file():
            return folder / exact
        for glob in (pattern, fallback):
            hits = sorted(p for p in folder.glob(glob) if p.is_file()) if glob else []
            if len(hits) == 1:
                return hits[0]
        raise DownloadError(f"{url}: the archive's folder {folder.relative_to(root) or '.'} has no {exact} "
                            f"(nor one {pattern} file); nothing was cached")

    return folder, pick(OPTIONS_FILE, "*options*.json", None), pick(WEIGHTS_FILE, "*weights*.hdf5", "*.hdf5")


def _check_model(model: Path, source: ModelSource) -> None:
    """The weights checked against the options, as Elmo.load will read them; an error names
    the URL instead of the temporary file."""
    urls = dict(source.file_urls) or {OPTIONS_FILE: source.archive_url, WEIGHTS_FILE: source.archive_url}
    try:
        config = ElmoConfig.from_json_file(model / OPTIONS_FILE)
        load_weights(model / WEIGHTS_FILE, config)
    except ElmoError as e:
        message = str(e)
        for name in (OPTIONS_FILE, WEIGHTS_FILE):
            message = message.replace(str(model / name), urls[name] if source.archive_url is None
                                      else f"{name} of {source.archive_url}")
        raise DownloadError(f"the downloaded files are not a valid model: {message}; nothing was "
                            f"cached (a damaged or incomplete download: try again)") from None


def _write_manifest(model: Path, source: ModelSource, downloaded: bool) -> None:
    files = sorted(p.name for p in model.iterdir() if p.is_file() and p.name != MANIFEST_FILE)
    write_json(model / MANIFEST_FILE, {
        "spec": source.spec,
        "urls": dict(source.file_urls) if source.file_urls else {"archive": source.archive_url},
        "origin": "downloaded" if downloaded else "placed in the cache by hand",
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sha256": {name: file_sha256(model / name) for name in files},
    })


def _adopt(entry: Path, source: ModelSource) -> Path:
    """An entry put in place by hand (see :class:`OfflineError`): checked, then recorded."""
    missing = [n for n in (OPTIONS_FILE, WEIGHTS_FILE) if not (entry / n).is_file()]
    if missing:
        raise OfflineError(f"{entry} holds no {' and no '.join(missing)}; put the model's files there as "
                           f"{OPTIONS_FILE} and {WEIGHTS_FILE}, or delete the folder to download it again")
    load_weights(entry / WEIGHTS_FILE, ElmoConfig.from_json_file(entry / OPTIONS_FILE))
    _write_manifest(entry, source, downloaded=False)
    return entry


def _offline_message(source: ModelSource, entry: Path, reason: str) -> str:
    if source.archive_url:
        todo = (f"download {source.archive_url}, extract it, and put its options file at\n  "
                f"{entry / OPTIONS_FILE}\nand its weight file at\n  {entry / WEIGHTS_FILE}")
    else:
        todo = "put these files there:\n" + "\n".join(f"  {url}\n    -> {entry / name}"
                                                       for name, url in source.file_urls)
    return (f"model {source.spec!r} is not in the cache and {reason}; {todo}\n(on a machine with internet "
            f"access, `elmo-jax download {source.spec}` fetches them: copy the folder it prints to {entry})")


@contextlib.contextmanager
def _exclusive_lock(path: Path, spec: str, progress: bool) -> Iterator[None]:
    """Held while one process fetches one model; others wait here."""
    path.parent.mkdir(exist_ok=True)
    with open(path, "a+b") as f:
        if fcntl is not None:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if progress:
                    print(f"waiting for another process fetching {spec} ...", file=sys.stderr)
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


__all__ = [
    "RELEASED_MODELS", "ChecksumError", "DownloadError", "ModelSource", "OfflineError", "cache_home",
    "fetch_model", "is_model_spec", "model_source", "resolve_model", "verify_entry",
]
