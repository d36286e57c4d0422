"""A cache entry's checks: its files against the sha256 recorded in its manifest
(``download.json``), a pinned digest, a released name's known architecture, and the weights
against the options before an entry is recorded."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

from elmo_jax.atomic import file_sha256, write_json
from elmo_jax.config import ElmoConfig
from elmo_jax.errors import ElmoError
from elmo_jax.hub.errors import ChecksumError, DownloadError
from elmo_jax.hub.model_formats import ModelFormats
from elmo_jax.hub.names import OPTIONS_FILE, WEIGHTS_FILE, ModelSource


MANIFEST_FILE = "download.json"


def check_options(path: Path, source: ModelSource, url: str, formats: ModelFormats) -> None:
    """Options read (and matched to a released name's architecture) as soon as they arrive."""
    try:
        ElmoConfig.from_json_file(path)
        problem = architecture_problem(path, source, formats)
    except ElmoError as e:
        raise DownloadError(
            f"the downloaded files are not a valid model: {str(e).replace(str(path), url)}; "
            f"nothing was cached and the weight file was not fetched"
        ) from None
    if problem:
        raise DownloadError(f"{url}: {problem}; nothing was cached and the weight file was not fetched")


def architecture_problem(options_file: Path, source: ModelSource, formats: ModelFormats) -> str | None:
    """Why the options in ``options_file`` are not the known architecture of the released
    name ``source`` names (None for a source without one)."""
    if source.architecture is None:
        return None
    diffs = formats.architecture_differences(options_file, source.architecture)
    if not diffs:
        return None
    return f"these options are not those of the released model {source.spec!r} ({diffs}): another model under its name"


def verify_source(entry: Path, source: ModelSource, formats: ModelFormats) -> dict:
    """:func:`verify_entry`, then the pinned digest and a released name's architecture."""
    manifest = verify_entry(entry, source.spec)
    redo = f"run `elmo-jax download {source.spec} --force` to fetch it again"
    if source.sha256:
        recorded = manifest.get("archive_sha256") or manifest["sha256"].get(WEIGHTS_FILE)
        if recorded != source.sha256:
            raise ChecksumError(
                f"{entry}: the pinned sha256 {source.sha256} does not match the cached model's "
                f"{recorded} ({'the archive' if manifest.get('archive_sha256') else WEIGHTS_FILE}); "
                f"{redo}"
            )
    if source.architecture is not None:
        try:
            problem = architecture_problem(entry / OPTIONS_FILE, source, formats)
        except ElmoError as e:
            raise ChecksumError(f"{entry}: {e}; {redo}") from None
        if problem:
            raise ChecksumError(
                f"{entry} holds a model that is not the released {source.spec!r}: {problem}; delete {entry} or {redo}"
            )
    return manifest


def verify_entry(entry: str | os.PathLike, spec: str | None = None) -> dict:
    """Check every file of a cache entry against the sha256 recorded in its manifest;
    returns the manifest."""
    entry = Path(entry)
    with open(entry / MANIFEST_FILE, encoding="utf-8") as f:
        manifest = json.load(f)
    redo = (
        f"delete {entry} and run `elmo-jax download {spec}` to download it again (or `elmo-jax download "
        f"{spec} --force`)"
        if spec
        else f"delete {entry} to download it again"
    )
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
                    f"downloaded: put the right file back, or {redo}"
                )
            raise ChecksumError(
                f"{path} has changed since it was downloaded (sha256 {found}, recorded {expected}): "
                f"it was modified or damaged; {redo}"
            )
    return manifest


def check_model(model: Path, source: ModelSource, formats: ModelFormats) -> None:
    """The weights checked against the options, as Elmo.load will read them; an error names
    the URL instead of the temporary file."""
    archive = source.archive_url or ""
    urls = dict(source.file_urls) or {OPTIONS_FILE: archive, WEIGHTS_FILE: archive}
    try:
        formats.check(model)
        problem = architecture_problem(model / OPTIONS_FILE, source, formats)
        if problem:
            raise ElmoError(problem)
    except ElmoError as e:
        message = str(e)
        for name in (OPTIONS_FILE, WEIGHTS_FILE):
            message = message.replace(
                str(model / name), urls[name] if source.archive_url is None else f"{name} of {source.archive_url}"
            )
        raise DownloadError(
            f"the downloaded files are not a valid model: {message}; nothing was "
            f"cached (a damaged or incomplete download: try again)"
        ) from None


def write_manifest(model: Path, source: ModelSource, downloaded: bool) -> None:
    files = sorted(p.name for p in model.iterdir() if p.is_file() and p.name != MANIFEST_FILE)
    manifest: dict[str, Any] = {
        "spec": source.spec,
        "urls": dict(source.file_urls) if source.file_urls else {"archive": source.archive_url},
        "origin": "downloaded" if downloaded else "placed in the cache by hand",
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sha256": {name: file_sha256(model / name) for name in files},
    }
    archive_digest = model.parent / "archive.sha256"
    if downloaded and source.archive_url and archive_digest.exists():
        manifest["archive_sha256"] = archive_digest.read_text().strip()
    if (
        downloaded
        and source.sha256
        and not source.archive_url
        and manifest["sha256"].get(WEIGHTS_FILE) != source.sha256
    ):
        raise DownloadError(
            f"{dict(source.file_urls)[WEIGHTS_FILE]}: sha256 {manifest['sha256'].get(WEIGHTS_FILE)}, "
            f"not the pinned {source.sha256}; nothing was cached"
        )
    write_json(model / MANIFEST_FILE, manifest)


__all__ = [
    "MANIFEST_FILE",
    "architecture_problem",
    "check_model",
    "check_options",
    "verify_entry",
    "verify_source",
    "write_manifest",
]
