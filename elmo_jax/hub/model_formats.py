"""What the hub asks of the model formats, which it does not import: the resolver passes an
object with these methods (:class:`elmo_jax.formats.downloads.DownloadFormats`).  The
hub itself knows only the names ``options.json`` and ``weights.hdf5``; which other files
complete a model (an ELMoForManyLangs folder's, starting from ``manylangs_config_file``), and
what any of them hold, it asks."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class ModelFormats(Protocol):
    manylangs_config_file: str  # the file an ELMoForManyLangs folder is found by (config.json)

    def prepare(self, fetched: Path, model: Path) -> None:
        """Make ``model`` an ``options.json`` + ``weights.hdf5`` folder from the files in
        ``fetched`` (an extracted archive, an ELMoForManyLangs folder's files, or ``model``
        itself for a folder put in place by hand)."""

    def manylangs_files(self, config_file: Path) -> list[tuple[str, bool]]:
        """The files (name, required) that the ELMoForManyLangs ``config.json`` at
        ``config_file`` needs beside it; raise ``ElmoError`` if it is not such a file."""

    def check(self, model: Path) -> None:
        """Read ``model``'s weights against its options; raise ``ElmoError`` if they do not fit."""

    def architecture_differences(self, options_file: Path, architecture: str) -> str:
        """How the options in ``options_file`` differ from a released architecture; ``""`` if not."""


__all__ = ["ModelFormats"]
