"""Model specs: a released name or an http(s) URL parsed into a :class:`ModelSource` (the
files' URLs, or one archive's), with the folder name of its cache entry.

Names: ``small``, ``medium``, ``original``, ``original-5.5b``, the files AllenNLP points to,
under ``$ELMO_JAX_MODELS_URL`` (default ``https://allennlp.s3.amazonaws.com/models/elmo/``)
as ``<dir>/elmo_<dir>_options.json`` and ``<dir>/elmo_<dir>_weights.hdf5``; and
``manylangs/<code>`` for the 44 ELMoForManyLangs models.  The URL forms: :mod:`elmo_jax.hub`.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import os
import re
import urllib.parse
from dataclasses import dataclass
from types import MappingProxyType

from elmo_jax.hub import manylangs_names as manylangs


RELEASED_MODELS = MappingProxyType(
    {
        "small": "2x1024_128_2048cnn_1xhighway",
        "medium": "2x2048_256_2048cnn_1xhighway",
        "original": "2x4096_512_2048cnn_2xhighway",
        "original-5.5b": "2x4096_512_2048cnn_2xhighway_5.5B",
    }
)
"""Released English models: name -> folder under the models URL."""


DEFAULT_MODELS_URL = "https://allennlp.s3.amazonaws.com/models/elmo/"
MODELS_URL_ENV = "ELMO_JAX_MODELS_URL"
OPTIONS_FILE = "options.json"
WEIGHTS_FILE = "weights.hdf5"
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tbz2")
# The preset each released English name must match (their options.json, checked on every use).
RELEASED_ARCHITECTURES = MappingProxyType(
    {
        "small": "small",
        "medium": "medium",
        "original": "original",
        "original-5.5b": "original",
    }
)
# sha256 of released files, recorded only where verified against the files themselves; none
# could be here (no access to the hosts from the machine that wrote this), so none is pinned:
# a released name is checked by its architecture, and downloads by the sha256 recorded then.
RELEASED_SHA256: MappingProxyType = MappingProxyType({})


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


def is_url(spec: object) -> bool:
    return isinstance(spec, str) and spec.lower().startswith(("http://", "https://"))


def released_names() -> list[str]:
    """Every released model's name: the English ones, then ``manylangs/<code>``."""
    return list(RELEASED_MODELS) + manylangs.released_names()


def is_model_spec(spec: object) -> bool:
    """Whether ``spec`` names a model to download: a released name or an http(s) URL."""
    return isinstance(spec, str) and (spec in released_names() or is_url(spec))


def unknown_name_message(spec: str) -> str:
    """``did you mean ...`` for a misspelt released name (difflib), with the list of names."""
    close = _close_names(spec)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return (
        f"{hint}released models: {', '.join(RELEASED_MODELS)}, and manylangs/<language code> for the 44 "
        f"ELMoForManyLangs models (`elmo-jax download --list` shows them)"
    )


def _close_names(spec: str) -> list[str]:
    """Released names close to ``spec``, case aside; ``<prefix>/<code>`` with a prefix close to
    ``manylangs`` is matched by its code (or language name) alone."""
    parts = spec.strip().rstrip("/").split("/")
    prefix = manylangs.NAME_PREFIX.rstrip("/")
    if len(parts) == 2 and difflib.SequenceMatcher(None, parts[0].lower(), prefix).ratio() >= 0.8:
        return [manylangs.NAME_PREFIX + code for code in manylangs.close_codes(parts[1])]
    lowered = {n.lower(): n for n in released_names()}
    return [lowered[c] for c in difflib.get_close_matches("/".join(parts).lower(), lowered, n=3, cutoff=0.6)]


def suggestion(spec: str) -> str:
    """For a spec that looks like a name: the close released names.  A name has no folder
    separator, or is ``<prefix>/<code>`` with a prefix close to ``manylangs`` (``manylang/fi``,
    ``ManyLangs/FI``); any other path gets none."""
    parts = spec.strip().rstrip("/" + os.sep).replace(os.sep, "/").split("/")
    if len(parts) > 2:
        return ""
    if len(parts) == 2:
        if difflib.SequenceMatcher(None, parts[0].lower(), manylangs.NAME_PREFIX.rstrip("/")).ratio() < 0.8:
            return ""
    return "; " + unknown_name_message("/".join(parts))


def model_source(spec: str, models_url: str = DEFAULT_MODELS_URL) -> ModelSource:
    """Parse a released name or a URL (see the module docstring for the URL forms)."""
    official = not os.environ.get(MODELS_URL_ENV)
    if spec in RELEASED_MODELS:
        folder = RELEASED_MODELS[spec]
        return ModelSource(
            spec,
            spec,
            _file_urls(f"{models_url.rstrip('/')}/{folder}/elmo_{folder}_"),
            sha256=RELEASED_SHA256.get(spec),
            architecture=RELEASED_ARCHITECTURES[spec] if official else None,
        )
    if spec in manylangs.released_names():
        return ModelSource(
            spec,
            spec.replace("/", "-"),
            archive_url=manylangs.released_url(spec),
            sha256=RELEASED_SHA256.get(spec),
            architecture=None if os.environ.get(manylangs.URL_ENV) else "manylangs",
        )
    if not is_url(spec):
        raise ValueError(f"{spec!r} is neither a released model nor an http(s):// URL; " + unknown_name_message(spec))
    parts = urllib.parse.urlsplit(spec)
    if not parts.hostname:
        raise ValueError(f"{spec!r} is not a usable URL: it names no host (e.g. https://host/path/)")
    pinned = None
    if parts.fragment:
        match = re.fullmatch(r"sha256=([0-9a-fA-F]{64})", parts.fragment)
        if not match:
            raise ValueError(
                f"{spec!r}: the only fragment understood is #sha256=<64 hex digits> (a pinned "
                f"digest), got #{parts.fragment}"
            )
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
                f"archive, either file's URL, or the folder's URL ending in '/' (also for an ELMoForManyLangs "
                f"folder: config.json, the .dic and .pkl files)"
            )
    prefix = urllib.parse.urlunsplit(parts._replace(path=path))
    folder_url = urllib.parse.urlunsplit(parts._replace(path=folder_path))
    files = _file_urls(prefix)
    # bilm-tf's folders hold options.json + lm_weights.hdf5: any folder Elmo.load reads from
    # disk must load from its URL too.
    for name, alt in ((OPTIONS_FILE, OPTIONS_FILE), (WEIGHTS_FILE, WEIGHTS_FILE), (WEIGHTS_FILE, "lm_weights.hdf5")):
        alt_url = join_url(folder_url, alt)
        if alt_url not in dict(files).values() and (name, alt_url) not in alternatives:
            alternatives.append((name, alt_url))
    return ModelSource(spec, _url_key(prefix, path), files, alternatives=tuple(alternatives), sha256=pinned)


def join_url(folder_url: str, name: str) -> str:
    parts = urllib.parse.urlsplit(folder_url)
    return urllib.parse.urlunsplit(parts._replace(path=parts.path + name))


def _file_urls(prefix: str) -> tuple[tuple[str, str], ...]:
    parts = urllib.parse.urlsplit(prefix)
    return tuple(
        (name, urllib.parse.urlunsplit(parts._replace(path=parts.path + name))) for name in (OPTIONS_FILE, WEIGHTS_FILE)
    )


def _url_key(url: str, path: str) -> str:
    """A readable, collision-free folder name: the URL's last path part and a hash of it."""
    last = path.rstrip("/").rsplit("/", 1)[-1]
    for suffix in ARCHIVE_SUFFIXES:
        if last.lower().endswith(suffix):
            last = last[: -len(suffix)]
    slug = re.sub(r"[^A-Za-z0-9.-]+", "_", last).strip("._-")[:48] or "model"
    return f"{slug}-{hashlib.sha256(url.encode('utf-8')).hexdigest()[:12]}"


__all__ = [
    "ARCHIVE_SUFFIXES",
    "DEFAULT_MODELS_URL",
    "MODELS_URL_ENV",
    "OPTIONS_FILE",
    "RELEASED_MODELS",
    "WEIGHTS_FILE",
    "ModelSource",
    "is_model_spec",
    "is_url",
    "model_source",
    "released_names",
    "suggestion",
    "unknown_name_message",
]
