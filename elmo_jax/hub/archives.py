"""A model that comes as one archive (.zip, .tar.gz, ...): downloaded, checked against a pinned
digest, extracted safely, and its model files put in the entry being staged (an
ELMoForManyLangs folder inside is converted there)."""

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
from elmo_jax.hub.names import ARCHIVE_SUFFIXES, OPTIONS_FILE, WEIGHTS_FILE, ModelSource


def fetch_archive(source: ModelSource, staging: Path, model: Path, partial: Path, net: dict) -> None:
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
        manylangs_folder = _manylangs_folder_in(extracted)
    except ElmoError as e:
        raise DownloadError(f"{url}: {e}; nothing was cached").with_traceback(None) from None
    if manylangs_folder is not None:
        from elmo_jax.formats import manylangs

        try:
            manylangs.convert(manylangs_folder, model)
        except ElmoError as e:
            raise DownloadError(
                f"{url} holds an ELMoForManyLangs model that cannot be converted: {e}; nothing was cached"
            ) from None
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
    folders = sorted({p.parent for p in root.rglob("*options*.json") if p.is_file() and not p.name.startswith("._")})
    if len(folders) != 1:
        found = "none" if not folders else ", ".join(str(f.relative_to(root)) or "." for f in folders)
        raise DownloadError(
            f"{url}: expected one folder with an options .json file in the archive, found {found}; nothing was cached"
        )
    folder = folders[0]

    def pick(exact: str, pattern: str, fallback: str | None) -> Path:
        if (folder / exact).is_file():
            return folder / exact
        for glob in (pattern, fallback):
            hits = sorted(p for p in folder.glob(glob) if p.is_file()) if glob else []
            if len(hits) == 1:
                return hits[0]
        raise DownloadError(
            f"{url}: the archive's folder {folder.relative_to(root) or '.'} has no {exact} "
            f"(nor one {pattern} file); nothing was cached"
        )

    return folder, pick(OPTIONS_FILE, "*options*.json", None), pick(WEIGHTS_FILE, "*weights*.hdf5", "*.hdf5")


__all__ = ["fetch_archive"]
