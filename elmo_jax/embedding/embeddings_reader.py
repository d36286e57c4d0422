"""``read_embeddings(path)``: the sentences of any ``elmo-jax embed`` output, read lazily.

    with elmo_jax.read_embeddings("out.hdf5") as emb:   # a file, or a folder of shards
        len(emb)            # sentences (= input lines)
        emb[i]              # np.ndarray: [L+1, n, 2P] / [n, 2P] token vectors, or the [2P] sentence vector
        emb.sentence(i)     # its text (None where the layout does not keep it)
        emb.line(i)         # its 0-based line in the input
        for v in emb: ...   # in order

Layouts (:mod:`elmo_jax.embedding.embed_layouts`): ``allennlp`` (also files written by other tools in
that layout), ``packed``, ``sentence_vectors``; a folder with ``manifest.json`` is a
multi-process run's shards, read as one.  Only what is asked for is read.  In the
``allennlp`` layout a sentence's text comes from ``sentence_to_index``, which keeps the last
line of a repeated sentence only: the earlier lines' text is ``None``.
"""

from __future__ import annotations

import bisect
import json
import os

import h5py
import numpy as np

from elmo_jax.embedding.embed_layouts import LAYOUT_ATTR, RUN_ATTR
from elmo_jax.errors import ElmoError


class EmbeddingsFileError(ElmoError, ValueError):
    """A path that is not an ``elmo-jax embed`` output."""


class _File:
    """One HDF5 file of any layout; sentence ``i`` is its ``i``-th (local) sentence."""

    def __init__(self, path: str):
        try:
            self.f = h5py.File(path, "r")
        except OSError as e:
            raise EmbeddingsFileError(f"cannot open {path} as HDF5 embeddings ({e})") from None
        self.layout = self.f.attrs.get(LAYOUT_ATTR)
        if self.layout is None:
            if "sentence_to_index" not in self.f:
                self.f.close()
                raise EmbeddingsFileError(
                    f"{path} is HDF5 but not an embeddings file (no sentence_to_index and no {LAYOUT_ATTR} attribute)"
                )
            self.layout = "allennlp"
        if self.layout == "allennlp":  # datasets "first", "first + 1", ...: nothing listed on opening
            run = json.loads(self.f.attrs[RUN_ATTR]) if RUN_ATTR in self.f.attrs else {}
            self.first = int(run.get("shard", {}).get("first_line", 0))
            self._texts: dict[int, str] | None = None
            self.n = len(self.f) - ("sentence_to_index" in self.f)
        else:
            self.n = self.f["line_numbers"].shape[0]

    def get(self, i: int) -> np.ndarray:
        if self.layout == "allennlp":
            name = str(self.first + i)
            if name not in self.f:
                raise EmbeddingsFileError(
                    f"{self.f.filename} has {self.n} sentence datasets but no dataset {name!r}: "
                    f"not a file with one dataset per line '0', '1', ..."
                )
            return self.f[name][...]
        if self.layout == "sentence_vectors":
            return self.f["sentence_vectors"][i]
        start, end = self.f["offsets"][i : i + 2]
        rows = self.f["embeddings"][start:end]
        return np.ascontiguousarray(np.moveaxis(rows, 0, -2)) if rows.ndim == 3 else rows

    def line(self, i: int) -> int:
        if self.layout == "allennlp":
            return self.first + i
        return int(self.f["line_numbers"][i])

    def sentence(self, i: int) -> str | None:
        if self.layout != "allennlp":
            return self.f["sentences"].asstr()[i]
        if self._texts is None:
            if "sentence_to_index" not in self.f:
                return None
            index = json.loads(self.f["sentence_to_index"].asstr()[0])
            self._texts = {int(v): k for k, v in index.items()}
        return self._texts.get(self.line(i))

    def close(self) -> None:
        self.f.close()


class Embeddings:
    """The sentences of one output (module docstring); a sequence of arrays."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            manifest_path = os.path.join(self.path, "manifest.json")
            if not os.path.exists(manifest_path):
                raise EmbeddingsFileError(
                    f"{self.path} is a folder without manifest.json: not the output of a "
                    f"multi-process `elmo-jax embed` (or an unfinished one)"
                )
            with open(manifest_path, encoding="utf-8") as f:
                self.manifest = json.load(f)
            self._files = [_File(os.path.join(self.path, s["file"])) for s in self.manifest["shards"]]
        elif os.path.exists(self.path):
            self.manifest = None
            self._files = [_File(self.path)]
        else:
            raise FileNotFoundError(f"embeddings not found: {self.path}")
        self.layout = self._files[0].layout
        self._starts = list(np.cumsum([0] + [f.n for f in self._files]))

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _locate(self, i: int) -> tuple[_File, int]:
        n = len(self)
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"sentence index must be an int, got {type(i).__name__}")
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sentence {i} out of range: {self.path} holds {n} sentences")
        k = bisect.bisect_right(self._starts, i) - 1
        return self._files[k], int(i - self._starts[k])

    def __getitem__(self, i: int) -> np.ndarray:
        f, j = self._locate(i)
        return f.get(j)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def sentence(self, i: int) -> str | None:
        f, j = self._locate(i)
        return f.sentence(j)

    def line(self, i: int) -> int:
        f, j = self._locate(i)
        return f.line(j)

    def close(self) -> None:
        for f in self._files:
            f.close()

    def __enter__(self) -> "Embeddings":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        shards = f", {len(self._files)} shards" if self.manifest else ""
        return f"Embeddings({self.path!r}, {len(self)} sentences, layout={self.layout}{shards})"


def read_embeddings(path: str | os.PathLike) -> Embeddings:
    """Open an ``elmo-jax embed`` output (file or folder of shards) for reading (module docstring)."""
    return Embeddings(path)
