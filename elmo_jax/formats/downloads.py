"""What the hub's downloads become: the formats' side of a fetch.

The hub (:mod:`elmo_jax.hub`) fetches files and keeps the cache; it does not read them.  The
resolver hands it a :class:`DownloadFormats`, through which the hub asks the four things
only the formats can answer:

* :meth:`~DownloadFormats.prepare`: the files fetched (an extracted archive, an
  ELMoForManyLangs folder's files, or a folder put in the cache by hand) made into a model
  folder in this package's layout (``options.json`` + ``weights.hdf5``, a converted
  vocabulary model's ``.dic`` files beside them);
* :meth:`~DownloadFormats.manylangs_files`: which files an ELMoForManyLangs folder's
  ``config.json`` needs beside it (to fetch a folder URL file by file);
* :meth:`~DownloadFormats.check`: that folder's weights read against its options, as
  :meth:`elmo_jax.Elmo.load` will read them;
* :meth:`~DownloadFormats.architecture_differences`: how a model's options differ from a
  released architecture (an English preset's name, or ``"manylangs"``).

Each raises :class:`~elmo_jax.errors.ElmoError` (with local paths in its message) for files
that are not a model; the hub puts the URL in their place and says what was (not) cached.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from elmo_jax.config import ElmoConfig
from elmo_jax.errors import ElmoError
from elmo_jax.formats import hdf5, manylangs


class DownloadFormats:
    """The formats as the hub sees them (see the module docstring); holds nothing."""

    manylangs_config_file = manylangs.CONFIG_FILE

    def prepare(self, fetched: Path, model: Path) -> None:
        """Make ``model`` a model folder in this package's layout from the files in ``fetched``.

        ``fetched`` is ``model`` itself for a folder put in place by hand (an
        ELMoForManyLangs folder is converted in place; an HDF5 one is left as it is), or
        another folder: an extracted archive, or an ELMoForManyLangs folder's files."""
        fetched, model = Path(fetched), Path(model)
        if fetched.resolve() == model.resolve():
            if not (model / hdf5.OPTIONS_FILE).is_file() and manylangs.is_manylangs_folder(model):
                manylangs.convert(model, model)
            return
        folder = _manylangs_folder_in(fetched)
        if folder is not None:
            try:
                manylangs.convert(folder, model)
            except (ElmoError, OSError) as e:
                raise ElmoError(f"it holds an ELMoForManyLangs model that cannot be converted: {e}") from None
            return
        folder, options, weights = _model_files_in(fetched)
        model.mkdir(parents=True, exist_ok=True)
        for f in folder.iterdir():
            if f.is_file():
                name = hdf5.OPTIONS_FILE if f == options else hdf5.WEIGHTS_FILE if f == weights else f.name
                os.rename(f, model / name)

    def check(self, model: Path) -> None:
        """Read ``model``'s weights against its options (raises what reading them raises)."""
        config = ElmoConfig.from_json_file(Path(model) / hdf5.OPTIONS_FILE)
        hdf5.load_weights(Path(model) / hdf5.WEIGHTS_FILE, config)

    def manylangs_files(self, config_file: Path) -> list[tuple[str, bool]]:
        """The files (name, required) an ELMoForManyLangs folder whose ``config.json`` is
        ``config_file`` holds beside it: the architecture JSON it names (optional when it is
        one the package ships), ``char.dic``, the two ``.pkl`` files, and ``word.dic``
        (optional: a model without a word table has none).  Raises ``ElmoError`` for a file
        that is not such a ``config.json``."""
        try:
            named = json.loads(Path(config_file).read_text(encoding="utf-8"))["config_path"]
            architecture = os.path.basename(str(named).replace("\\", "/"))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ElmoError(f"an ELMoForManyLangs config.json with a 'config_path' ({type(e).__name__}: {e})") from None
        files = []
        if architecture not in ("", ".", "..", manylangs.CONFIG_FILE):
            files.append((architecture, architecture not in manylangs.SHIPPED_ARCHITECTURES))
        files += [(name, True) for name in (manylangs.CHAR_DIC, manylangs.TOKEN_EMBEDDER_FILE, manylangs.ENCODER_FILE)]
        return files + [(manylangs.WORD_DIC, False)]

    def architecture_differences(self, options_file: Path, architecture: str) -> str:
        """How the options in ``options_file`` differ from the released ``architecture`` (an
        English preset's name or ``"manylangs"``), at most four fields; ``""`` when they do not."""
        config = ElmoConfig.from_json_file(options_file)
        if architecture == "manylangs":
            known = manylangs.released_config_fields()
            found = manylangs.config_fields(config)
        else:
            known = dataclasses.asdict(ElmoConfig.preset(architecture))
            found = dataclasses.asdict(config) if config.vocab is None else {"vocab": "a vocabulary model"}
        return _differences(known, found)


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


def _manylangs_folder_in(root: Path) -> Path | None:
    """The one folder under ``root`` in ELMoForManyLangs' layout, if there is one (and no
    options .json beside it)."""
    folders = sorted({p.parent for p in root.rglob(manylangs.ENCODER_FILE) if p.is_file()})
    folders = [f for f in folders if manylangs.is_manylangs_folder(f) and not any(f.glob("*options*.json"))]
    return folders[0] if len(folders) == 1 else None


def _model_files_in(root: Path) -> tuple[Path, Path, Path]:
    """The folder under ``root`` that holds the model, its options and its weight file.

    Options: ``options.json``, else the one ``*options*.json``.  Weights: ``weights.hdf5``,
    else the one ``*weights*.hdf5``, else the folder's only ``.hdf5`` file."""
    folders = sorted({p.parent for p in root.rglob("*options*.json") if p.is_file() and not p.name.startswith("._")})
    if len(folders) != 1:
        found = "none" if not folders else ", ".join(str(f.relative_to(root)) or "." for f in folders)
        raise ElmoError(f"expected one folder with an options .json file in the archive, found {found}")
    folder = folders[0]

    def pick(exact: str, pattern: str, fallback: str | None) -> Path:
        if (folder / exact).is_file():
            return folder / exact
        for glob in (pattern, fallback):
            hits = sorted(p for p in folder.glob(glob) if p.is_file()) if glob else []
            if len(hits) == 1:
                return hits[0]
        raise ElmoError(
            f"the archive's folder {folder.relative_to(root) or '.'} has no {exact} (nor one {pattern} file)"
        )

    return (
        folder,
        pick(hdf5.OPTIONS_FILE, "*options*.json", None),
        pick(hdf5.WEIGHTS_FILE, "*weights*.hdf5", "*.hdf5"),
    )


__all__ = ["DownloadFormats"]
