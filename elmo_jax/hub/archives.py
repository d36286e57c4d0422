"""A model that comes as one archive (.zip, .tar.gz, ...): downloaded, checked against a pinned
digest, extracted safely, and made into the entry being staged by the formats (the hub's
:class:`~elmo_jax.hub.model_formats.ModelFormats`: they find the model's files in it, and
convert an ELMoForManyLangs folder)."""

from __future__ import annotations

import os
import tarfile
import urllib.parse
import zipfile
from pathlib import Path

from elmo_jax.atomic import file_sha256
from elmo_jax.errors import ElmoError
from elmo_jax.hub.download import NotFound, download
from elmo_jax.hub.errors import DownloadError
from elmo_jax.hub.model_formats import ModelFormats
from elmo_jax.hub.names import ARCHIVE_SUFFIXES, ModelSource


def fetch_archive(
    source: ModelSource, staging: Path, model: Path, partial: Path, net: dict, formats: ModelFormats
) -> None:
    url = source.archive_url
    assert url is not None, "fetch_archive is for a source with an archive_url"
    suffix = next(x for x in ARCHIVE_SUFFIXES if urllib.parse.urlsplit(url).path.lower().endswith(x))
    try:
        archive = download(url, partial / f"archive{suffix}", first=True, **net)
    except NotFound as e:
        raise DownloadError(f"{url}: HTTP 404 {e.reason} (check the model name or URL)") from None
    digest = file_sha256(archive)
    if source.sha256 and digest != source.sha256:
        archive.unlink()
        raise DownloadError(
            f"{url}: sha256 {digest}, not the pinned {source.sha256}; the file was deleted and "
            f"nothing was cached (a damaged download, or the file changed on the server)"
        )
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
        formats.prepare(extracted, model)
    except ElmoError as e:
        inside = str(e).replace(str(extracted) + os.sep, "").replace(str(extracted), ".")
        raise DownloadError(f"{url}: {inside}; nothing was cached") from None


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


__all__ = ["fetch_archive"]
