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
options and weights are checked against each other (:func:`elmo_jax.formats.hdf5.load_weights`),
and only then is the folder renamed into place, so an entry is complete or absent.  An
exclusive file lock (``fcntl.flock``) per entry serialises processes fetching the same
model: the second one waits and then uses the first one's copy.

ELMoForManyLangs models (:mod:`elmo_jax.formats.manylangs`): ``manylangs/<code>`` names the 44
released ones (``manylangs/fr``; ``$ELMO_JAX_MANYLANGS_URL`` replaces their host), and any
archive holding such a folder (``config.json``, ``char.dic``, ``word.dic``, the two ``.pkl``
files) is converted once, in the staging folder, and cached in this package's layout.

Trust: a URL may pin its file's digest as ``...#sha256=<hex>`` (the archive, or the weight
file for the other URL forms), checked after the download and on every later use.  The
entry of a released name fetched from its official host (no ``$ELMO_JAX_MODELS_URL`` /
``$ELMO_JAX_MANYLANGS_URL`` mirror) is checked against that model's known architecture on
every use, so a different model copied into its folder is refused.  An interrupted download
(Ctrl-C, a killed process, a dropped connection) keeps its partial file under
``<cache>/.partial/<key>/`` and the next attempt resumes it with ``Range``; ``force=True`` (``elmo-jax
download NAME --force``) deletes an entry (and any partial file) and fetches it afresh.

Offline (``offline=True`` or ``ELMO_JAX_OFFLINE=1``, or the network unreachable): a cached
entry is used; without one, :class:`OfflineError` says which files to put where.  Files put
there by hand are checked like a download and their sha256 recorded on first use.
"""

from __future__ import annotations

import contextlib
import datetime
import difflib
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
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
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from elmo_jax import __version__
from elmo_jax.atomic import file_sha256, write_json
from elmo_jax.config import ElmoConfig
from elmo_jax.errors import ElmoError
from elmo_jax.formats.hdf5 import load_weights

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
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tbz2")
# The preset each released English name must match (their options.json, checked on every use).
RELEASED_ARCHITECTURES = MappingProxyType({
    "small": "small", "medium": "medium", "original": "original", "original-5.5b": "original",
})
# sha256 of released files, recorded only where verified against the files themselves; none
# could be here (no access to the hosts from the machine that wrote this), so none is pinned:
# a released name is checked by its architecture, and downloads by the sha256 recorded then.
RELEASED_SHA256: MappingProxyType = MappingProxyType({})
PARTIAL_DIR = ".partial"
# Seconds to wait before each retry after a dropped connection; a retry that brings new bytes
# starts the count again, so only this many failures in a row give up.
RETRY_DELAYS_S = (0.0, 1.0, 2.0, 4.0, 8.0)
TIMEOUT_S = 60.0
# Bytes per read of a response body: read1 returns what has arrived (up to this many), so the
# progress bar and the partial file move on a slow link too.
_CHUNK_BYTES = 1 << 16
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
    # (name, URL) tried when the file_urls one answers 404: a bilm-tf folder's lm_weights.hdf5,
    # the folder's options.json beside a prefixed weight file
    alternatives: tuple[tuple[str, str], ...] = dataclasses.field(default=(), compare=False)
    sha256: str | None = None  # a digest pinned with #sha256=: the archive's, else the weight file's
    architecture: str | None = None  # a released name's known architecture, checked on every use


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


def released_names() -> list[str]:
    """Every released model's name: the English ones, then ``manylangs/<code>``."""
    from elmo_jax.formats import manylangs

    return list(RELEASED_MODELS) + manylangs.released_names()


def is_model_spec(spec: object) -> bool:
    """Whether ``spec`` names a model to download: a released name or an http(s) URL."""
    return isinstance(spec, str) and (spec in released_names() or is_url(spec))


def unknown_name_message(spec: str) -> str:
    """``did you mean ...`` for a misspelt released name (difflib), with the list of names."""
    names = released_names()
    close = difflib.get_close_matches(spec, names, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return (f"{hint}released models: {', '.join(RELEASED_MODELS)}, and manylangs/<language code> for the 44 "
            f"ELMoForManyLangs models (`elmo-jax download --list` shows them)")


def offline_from_env() -> bool:
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in _TRUE


def resolve_model(spec: str | os.PathLike, *, offline: bool | None = None, progress: bool = True,
                  force: bool = False) -> Path:
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
            f"({', '.join(RELEASED_MODELS)}) or an http(s):// URL" + _suggestion(str(spec))
        )
    source = model_source(spec, os.environ.get(MODELS_URL_ENV) or DEFAULT_MODELS_URL)
    return fetch_model(source, cache_home() / "models",
                       offline=offline_from_env() if offline is None else offline,
                       offline_reason=(f"offline mode is on ({OFFLINE_ENV}={os.environ.get(OFFLINE_ENV)})"
                                       if offline is None else "offline mode is on"),
                       progress=progress, force=force)


def _suggestion(spec: str) -> str:
    """For a spec that looks like a name (no folder separator): the close released names."""
    if os.sep in spec or "/" in spec.rstrip("/").replace("manylangs/", "", 1):
        return ""
    return "; " + unknown_name_message(spec)


def _local_folder(path: Path) -> Path:
    """An existing folder as a model folder: itself, or for a training workdir the export of
    its newest checkpoint (:mod:`elmo_jax.formats.run_exports`, cached under :func:`cache_home`)."""
    from elmo_jax.formats.run_exports import is_training_workdir, workdir_model

    if is_training_workdir(path):
        return workdir_model(path, cache_home())
    return path


def model_source(spec: str, models_url: str = DEFAULT_MODELS_URL) -> ModelSource:
    """Parse a released name or a URL (see the module docstring for the URL forms)."""
    from elmo_jax.formats import manylangs

    official = not os.environ.get(MODELS_URL_ENV)
    if spec in RELEASED_MODELS:
        folder = RELEASED_MODELS[spec]
        return ModelSource(spec, spec, _file_urls(f"{models_url.rstrip('/')}/{folder}/elmo_{folder}_"),
                           sha256=RELEASED_SHA256.get(spec),
                           architecture=RELEASED_ARCHITECTURES[spec] if official else None)
    if spec in manylangs.released_names():
        return ModelSource(spec, spec.replace("/", "-"), archive_url=manylangs.released_url(spec),
                           sha256=RELEASED_SHA256.get(spec),
                           architecture=None if os.environ.get(manylangs.URL_ENV) else "manylangs")
    if not is_url(spec):
        raise ValueError(f"{spec!r} is neither a released model nor an http(s):// URL; "
                         + unknown_name_message(spec))
    parts = urllib.parse.urlsplit(spec)
    if not parts.hostname:
        raise ValueError(f"{spec!r} is not a usable URL: it names no host (e.g. https://host/path/)")
    pinned = None
    if parts.fragment:
        match = re.fullmatch(r"sha256=([0-9a-fA-F]{64})", parts.fragment)
        if not match:
            raise ValueError(f"{spec!r}: the only fragment understood is #sha256=<64 hex digits> (a pinned "
                             f"digest), got #{parts.fragment}")
        pinned = match.group(1).lower()
        parts = parts._replace(fragment="")
    url = urllib.parse.urlunsplit(parts)
    if parts.path.lower().endswith(ARCHIVE_SUFFIXES):
        return ModelSource(spec, _url_key(url, parts.path), archive_url=url, sha256=pinned)
    path = parts.path
    last = path.rsplit("/", 1)[-1]
    folder_path = path[: len(path) - len(last)]
    alternatives: list[tuple[str, str]] = []
    for name in (OPTIONS_FILE, WEIGHTS_FILE):
        if last == "lm_weights.hdf5":  # bilm-tf's name: the model is its folder (options.json beside it)
            path = folder_path
            break
        if last.endswith(name):
            path = path[: -len(name)]
            break
    else:
        if "." in last:  # a file that is neither of the model's files nor an archive
            raise ValueError(
                f"{spec!r} names the file {last!r}, which is neither a model archive "
                f"({', '.join(ARCHIVE_SUFFIXES)}) nor a model's {OPTIONS_FILE} / {WEIGHTS_FILE}; give the "
                f"archive, either file's URL, or the folder's URL ending in '/'")
    prefix = urllib.parse.urlunsplit(parts._replace(path=path))
    folder_url = urllib.parse.urlunsplit(parts._replace(path=folder_path))
    files = _file_urls(prefix)
    # bilm-tf's folders hold options.json + lm_weights.hdf5: any folder Elmo.load reads from
    # disk must load from its URL too.
    for name, alt in ((OPTIONS_FILE, OPTIONS_FILE), (WEIGHTS_FILE, WEIGHTS_FILE), (WEIGHTS_FILE, "lm_weights.hdf5")):
        alt_url = _join(folder_url, alt)
        if alt_url not in dict(files).values() and (name, alt_url) not in alternatives:
            alternatives.append((name, alt_url))
    return ModelSource(spec, _url_key(prefix, path), files, alternatives=tuple(alternatives), sha256=pinned)


def _join(folder_url: str, name: str) -> str:
    parts = urllib.parse.urlsplit(folder_url)
    return urllib.parse.urlunsplit(parts._replace(path=parts.path + name))


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
    force: bool = False,
) -> Path:
    """The cache entry ``models_dir/source.key``, checked, downloading it when absent.

    The parts of :func:`resolve_model` after parsing, with the network settings explicit:
    ``offline_reason`` ends the :class:`OfflineError` sentence when ``offline``;
    ``retry_delays_s`` are the waits before each retry without progress (so
    ``len(retry_delays_s) + 1`` such attempts in a row give up); ``timeout_s`` bounds each
    connect and read; ``force`` deletes the entry and its partial files first."""
    models_dir = Path(models_dir)
    entry = models_dir / source.key
    if not force and (entry / MANIFEST_FILE).exists():  # complete: entries appear by one rename
        _verify_source(entry, source)
        return entry
    models_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(models_dir / ".locks" / f"{source.key}.lock", source.spec, progress):
        if force:
            if offline:
                raise OfflineError(f"--force / force=True fetches {source.spec!r} again, which needs the network, "
                                   f"but {offline_reason}")
            shutil.rmtree(entry, ignore_errors=True)
            shutil.rmtree(partial_dir(models_dir, source.key), ignore_errors=True)
        if (entry / MANIFEST_FILE).exists():  # another process fetched it while this one waited
            _verify_source(entry, source)
            return entry
        if entry.exists():
            _adopt(entry, source)
            _verify_source(entry, source)
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
                    _fetch_archive(source, staging, model, partial, net)
                else:
                    _fetch_files(source, model, partial, net)
            except _Unreachable as e:
                raise OfflineError(_offline_message(source, entry, f"the network is unreachable ({e})")) from None
            _check_model(model, source)
            _write_manifest(model, source, downloaded=True)
            os.rename(model, entry)
            shutil.rmtree(partial, ignore_errors=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            for folder in (partial, partial.parent):  # nothing left to resume: no empty folders either
                with contextlib.suppress(OSError):
                    folder.rmdir()
    _verify_source(entry, source)
    return entry


def partial_dir(models_dir: str | os.PathLike, key: str) -> Path:
    """Where the partial files of ``key``'s download wait to be resumed: beside the models
    folder (``<cache>/.partial/<key>``), never mistaken for an entry."""
    return Path(models_dir).parent / PARTIAL_DIR / key


def _fetch_files(source: ModelSource, model: Path, partial: Path, net: dict) -> None:
    """The options file first, checked (and a released name's architecture with it) before
    the weight file is fetched; a 404 tries the bilm-tf names beside it."""
    for i, (name, url) in enumerate(source.file_urls):
        candidates = [url] + [u for n, u in source.alternatives if n == name]
        for n, candidate in enumerate(candidates):
            try:
                got = _download(candidate, partial / name, first=i == 0 and n == 0, **net)
                break
            except _NotFound as e:
                if n == len(candidates) - 1:
                    also = f"; also tried {', '.join(candidates[1:])}" if len(candidates) > 1 else ""
                    raise DownloadError(f"{url}: HTTP 404 {e.reason} (check the model name or URL; a folder URL "
                                        f"ends with '/'{also})") from None
        os.replace(got, model / name)
        if name == OPTIONS_FILE:
            _check_options(model / OPTIONS_FILE, source, candidate)


def _check_options(path: Path, source: ModelSource, url: str) -> None:
    """Options read (and matched to a released name's architecture) as soon as they arrive."""
    try:
        config = ElmoConfig.from_json_file(path)
    except ElmoError as e:
        raise DownloadError(f"the downloaded files are not a valid model: {str(e).replace(str(path), url)}; "
                            f"nothing was cached and the weight file was not fetched") from None
    problem = _architecture_problem(config, source)
    if problem:
        raise DownloadError(f"{url}: {problem}; nothing was cached and the weight file was not fetched")


def _architecture_problem(config: ElmoConfig, source: ModelSource) -> str | None:
    """Why ``config`` is not the known architecture of the released name ``source`` names."""
    if source.architecture is None:
        return None
    if source.architecture == "manylangs":
        from elmo_jax.formats import manylangs

        known = manylangs.released_config_fields()
        found = manylangs.config_fields(config)
    else:
        known = dataclasses.asdict(ElmoConfig.preset(source.architecture))
        found = dataclasses.asdict(config) if config.vocab is None else {"vocab": "a vocabulary model"}
    if found == known:
        return None
    diffs = _differences(known, found)
    return (f"these options are not those of the released model {source.spec!r} ({diffs}): another model "
            f"under its name")


def _differences(known: dict, found: dict, prefix: str = "") -> str:
    out = []
    for k in sorted(set(known) | set(found)):
        a, b = known.get(k), found.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            sub = _differences(a, b, f"{prefix}{k}.")
            if sub:
                out.append(sub)
        elif a != b:
            out.append(f"{prefix}{k} {b!r}, released {a!r}")
    return "; ".join(out[:4])


def _verify_source(entry: Path, source: ModelSource) -> dict:
    """:func:`verify_entry`, then the pinned digest and a released name's architecture."""
    manifest = verify_entry(entry, source.spec)
    redo = f"run `elmo-jax download {source.spec} --force` to fetch it again"
    if source.sha256:
        recorded = manifest.get("archive_sha256") or manifest["sha256"].get(WEIGHTS_FILE)
        if recorded != source.sha256:
            raise ChecksumError(f"{entry}: the pinned sha256 {source.sha256} does not match the cached model's "
                                f"{recorded} ({'the archive' if manifest.get('archive_sha256') else WEIGHTS_FILE}); "
                                f"{redo}")
    if source.architecture is not None:
        try:
            config = ElmoConfig.from_json_file(entry / OPTIONS_FILE)
        except ElmoError as e:
            raise ChecksumError(f"{entry}: {e}; {redo}") from None
        problem = _architecture_problem(config, source)
        if problem:
            raise ChecksumError(f"{entry} holds a model that is not the released {source.spec!r}: {problem}; "
                                f"delete {entry} or {redo}")
    return manifest


def verify_entry(entry: str | os.PathLike, spec: str | None = None) -> dict:
    """Check every file of a cache entry against the sha256 recorded in its manifest;
    returns the manifest."""
    entry = Path(entry)
    with open(entry / MANIFEST_FILE, encoding="utf-8") as f:
        manifest = json.load(f)
    redo = (f"delete {entry} and run `elmo-jax download {spec}` to download it again (or `elmo-jax download "
            f"{spec} --force`)" if spec else f"delete {entry} to download it again")
    by_hand = manifest.get("origin") == "placed in the cache by hand"
    for name, expected in manifest["sha256"].items():
        path = entry / name
        if not path.exists():
            raise ChecksumError(f"{path} is missing from the model cache; {redo}")
        found = file_sha256(path)
        if found != expected:
            if by_hand:
                raise ChecksumError(
                    f"{path} has changed since its sha256 was recorded on first use (sha256 {found}, recorded "
                    f"{expected} on {manifest.get('recorded_at', '?')}); it was placed in the cache by hand, not "
                    f"downloaded: put the right file back, or {redo}")
            raise ChecksumError(
                f"{path} has changed since it was downloaded (sha256 {found}, recorded {expected}): "
                f"it was modified or damaged; {redo}"
            )
    return manifest


# -- one file over HTTP -------------------------------------------------------------------
class _Unreachable(Exception):
    """The very first connection of a download failed: no network (or no such host)."""


class _NotFound(Exception):
    """HTTP 404 (or 410): the caller may try another name for the file."""

    def __init__(self, url: str, reason: str):
        super().__init__(url)
        self.url, self.reason = url, reason


def _download(url: str, dest: Path, *, progress: bool, retry_delays_s: Sequence[float], timeout_s: float,
              first: bool = False) -> Path:
    """``url`` into ``dest.part`` (kept when interrupted), then renamed to ``dest``.  Resumes
    with ``Range`` (guarded by ``If-Range``) both after a dropped connection and from a
    ``.part`` file an earlier, interrupted attempt left for the same URL; gives up after
    ``len(retry_delays_s) + 1`` attempts in a row that brought no new bytes."""
    part, meta_path = dest.with_name(dest.name + ".part"), dest.with_name(dest.name + ".part.json")
    done, total, validator, failures = 0, None, None, 0
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("url") == url and part.exists():
            done, total, validator = part.stat().st_size, meta.get("total"), meta.get("validator")
    except (OSError, ValueError):
        pass
    if not done:
        part.unlink(missing_ok=True)
    most = 0  # the most bytes held so far: a retry counts as progress only if it gets further
    host = urllib.parse.urlsplit(url).hostname
    bar = None
    try:
        with open(part, "ab") as out:
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
                            done, total = 0, None
                            if bar is not None:
                                bar.reset()
                            if resp.status == 206:  # a part from elsewhere: ask for the whole file
                                continue
                        if total is None:
                            total = _total_size(resp, done)
                            validator = resp.headers.get("ETag") or resp.headers.get("Last-Modified")
                            write_json(meta_path, {"url": url, "total": total, "validator": validator})
                        if bar is None:
                            label = urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1] or dest.name
                            bar = _progress_bar(label, total, done, progress)
                        read = getattr(resp, "read1", resp.read)
                        while chunk := read(_CHUNK_BYTES):
                            out.write(chunk)
                            out.flush()
                            done += len(chunk)
                            bar.update(len(chunk))
                    if total is None or done == total:
                        break
                    if done > total:
                        _drop(part, meta_path)
                        raise DownloadError(f"{url}: received {done} bytes, more than the {total} announced")
                    problem = f"connection closed after {done} of {total} bytes"
                except urllib.error.HTTPError as e:
                    if e.code == 416 and total is not None and done == total:
                        break
                    if e.code == 416 and done:
                        _drop(part, meta_path)
                        raise DownloadError(
                            f"{url}: the server announced {total if total is not None else 'more'} bytes but holds "
                            f"only {done} (it refused the request for the rest: HTTP 416); the file on the server "
                            f"is shorter than its size says (an incomplete upload, or a proxy's cut copy). Nothing "
                            f"was cached; tell the host, or try another mirror") from None
                    if e.code in (404, 410):
                        raise _NotFound(url, e.reason) from None
                    if e.code < 500:
                        hint = " (check the model name or URL; a folder URL ends with '/')" if e.code == 403 else ""
                        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}{hint}") from None
                    problem = f"HTTP {e.code} {e.reason}"
                except _NETWORK_ERRORS as e:  # not OSErrors of the local disk: those stop at once
                    reason = getattr(e, "reason", e)
                    silent = isinstance(reason, (TimeoutError, socket.timeout)) or isinstance(e, TimeoutError)
                    if silent:
                        problem = (f"{host} accepted the connection but sent nothing for {timeout_s:g} s (the server "
                                   f"is not answering: overloaded or broken, not a missing network)")
                        if first:
                            raise DownloadError(f"{url}: {problem}; try again later") from None
                    elif first:
                        raise _Unreachable(reason) from None
                    else:
                        problem = f"{type(e).__name__}: {reason}"
                failures = 0 if done > most else failures + 1
                most = max(most, done)
                if failures > len(retry_delays_s):
                    got = f"{done} of {total} bytes" if total else f"{done} bytes"
                    raise DownloadError(f"{url}: gave up after {failures} attempts in a row without progress "
                                        f"({problem}; got {got}, kept to resume from); try again later") from None
                time.sleep(retry_delays_s[failures - 1] if failures else 0.0)
    finally:
        if bar is not None:
            bar.close()
    os.replace(part, dest)
    meta_path.unlink(missing_ok=True)
    return dest


def _drop(*paths: Path) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


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
def _fetch_archive(source: ModelSource, staging: Path, model: Path, partial: Path, net: dict) -> None:
    url = source.archive_url
    suffix = next(x for x in ARCHIVE_SUFFIXES if urllib.parse.urlsplit(url).path.lower().endswith(x))
    try:
        archive = _download(url, partial / f"archive{suffix}", first=True, **net)
    except _NotFound as e:
        raise DownloadError(f"{url}: HTTP 404 {e.reason} (check the model name or URL)") from None
    digest = file_sha256(archive)
    if source.sha256 and digest != source.sha256:
        archive.unlink()
        raise DownloadError(f"{url}: sha256 {digest}, not the pinned {source.sha256}; the file was deleted and "
                            f"nothing was cached (a damaged download, or the file changed on the server)")
    (staging / "archive.sha256").write_text(digest)
    extracted = staging / "extracted"
    try:
        if suffix == ".zip":
            with zipfile.ZipFile(archive) as z:
                z.extractall(extracted)  # member names are sanitised: nothing lands outside
        else:
            with tarfile.open(archive, "r:*") as t:
                _extract_tar(t, extracted)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as e:
        archive.unlink()
        raise DownloadError(f"{url} is not a readable {suffix} archive ({e}); nothing was cached") from None
    archive.unlink()
    try:
        manylangs_folder = _manylangs_folder_in(extracted)
    except ElmoError as e:
        raise DownloadError(f"{url}: {e}; nothing was cached").with_traceback(None) from None
    if manylangs_folder is not None:
        from elmo_jax.formats import manylangs

        try:
            manylangs.convert(manylangs_folder, model)
        except ElmoError as e:
            raise DownloadError(f"{url} holds an ELMoForManyLangs model that cannot be converted: {e}; nothing "
                                f"was cached") from None
        return
    folder, options, weights = _model_files_in(extracted, url)
    for f in folder.iterdir():
        if f.is_file():
            name = OPTIONS_FILE if f == options else WEIGHTS_FILE if f == weights else f.name
            os.rename(f, model / name)


def _manylangs_folder_in(root: Path) -> Path | None:
    """The one folder of an extracted archive in ELMoForManyLangs' layout, if there is one
    (and no options.json beside it)."""
    from elmo_jax.formats import manylangs

    folders = sorted({p.parent for p in root.rglob(manylangs.ENCODER_FILE) if p.is_file()})
    folders = [f for f in folders if manylangs.is_manylangs_folder(f) and not any(f.glob("*options*.json"))]
    return folders[0] if len(folders) == 1 else None


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
        problem = _architecture_problem(config, source)
        if problem:
            raise ElmoError(problem)
    except ElmoError as e:
        message = str(e)
        for name in (OPTIONS_FILE, WEIGHTS_FILE):
            message = message.replace(str(model / name), urls[name] if source.archive_url is None
                                      else f"{name} of {source.archive_url}")
        raise DownloadError(f"the downloaded files are not a valid model: {message}; nothing was "
                            f"cached (a damaged or incomplete download: try again)") from None


def _write_manifest(model: Path, source: ModelSource, downloaded: bool) -> None:
    files = sorted(p.name for p in model.iterdir() if p.is_file() and p.name != MANIFEST_FILE)
    manifest = {
        "spec": source.spec,
        "urls": dict(source.file_urls) if source.file_urls else {"archive": source.archive_url},
        "origin": "downloaded" if downloaded else "placed in the cache by hand",
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sha256": {name: file_sha256(model / name) for name in files},
    }
    archive_digest = model.parent / "archive.sha256"
    if downloaded and source.archive_url and archive_digest.exists():
        manifest["archive_sha256"] = archive_digest.read_text().strip()
    if downloaded and source.sha256 and not source.archive_url and manifest["sha256"].get(WEIGHTS_FILE) != source.sha256:
        raise DownloadError(f"{dict(source.file_urls)[WEIGHTS_FILE]}: sha256 {manifest['sha256'].get(WEIGHTS_FILE)}, "
                            f"not the pinned {source.sha256}; nothing was cached")
    write_json(model / MANIFEST_FILE, manifest)


def _adopt(entry: Path, source: ModelSource) -> Path:
    """An entry put in place by hand (see :class:`OfflineError`): checked, then recorded.
    An ELMoForManyLangs folder (the unzipped archive) is converted in place first."""
    from elmo_jax.formats import manylangs

    if not (entry / OPTIONS_FILE).is_file() and manylangs.is_manylangs_folder(entry):
        manylangs.convert(entry, entry)
    missing = [n for n in (OPTIONS_FILE, WEIGHTS_FILE) if not (entry / n).is_file()]
    if missing:
        raise OfflineError(f"{entry} holds no {' and no '.join(missing)}; put the model's files there as "
                           f"{OPTIONS_FILE} and {WEIGHTS_FILE}, or delete the folder to download it again")
    config = ElmoConfig.from_json_file(entry / OPTIONS_FILE)
    problem = _architecture_problem(config, source)
    if problem:  # checked before anything is recorded: a wrong model never gets a manifest
        raise ChecksumError(f"{entry} was put in the cache by hand, but {problem}; put the released model's "
                            f"files there, or delete the folder to download it")
    load_weights(entry / WEIGHTS_FILE, config)
    _write_manifest(entry, source, downloaded=False)
    return entry


def _offline_message(source: ModelSource, entry: Path, reason: str) -> str:
    if source.spec.startswith("manylangs/"):
        todo = (f"download {source.archive_url} and unzip it into\n  {entry}\n(the folder holding config.json, "
                f"char.dic, word.dic and the .pkl files; it is converted on first use)")
    elif source.archive_url:
        todo = (f"download {source.archive_url}, extract it, and put its options file at\n  "
                f"{entry / OPTIONS_FILE}\nand its weight file at\n  {entry / WEIGHTS_FILE}")
    else:
        todo = "put these files there:\n" + "\n".join(f"  {url}\n    -> {entry / name}"
                                                       for name, url in source.file_urls)
    return (f"model {source.spec!r} is not in the cache and {reason}; {todo}\n(on a machine with internet "
            f"access, `elmo-jax download {source.spec}` fetches them: copy the folder it prints to {entry})")


@contextlib.contextmanager
def _exclusive_lock(path: Path, spec: str, progress: bool) -> Iterator[None]:
    """Held while one process fetches one model; others wait here.  The lock file is removed
    when the holder is done (success or failure), so none is left behind; a waiter that then
    holds the lock of a removed file takes the lock again on the new one."""
    path.parent.mkdir(exist_ok=True)
    said = False
    while True:
        f = open(path, "a+b")
        if fcntl is None:
            break
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress and not said:
                print(f"waiting for another process fetching {spec} ...", file=sys.stderr)
                said = True
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            same = os.fstat(f.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()  # the holder removed this file when it finished: lock the current one
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        f.close()


__all__ = [
    "RELEASED_MODELS", "ChecksumError", "DownloadError", "ModelSource", "OfflineError", "cache_home",
    "fetch_model", "is_model_spec", "model_source", "resolve_model", "verify_entry",
]
