"""The HDF5 layouts ``elmo-jax embed`` writes, one writer each, appending one group at a time.

* ``allennlp`` (default): one dataset per input line named by its 0-based line number
  (``"0"``, ``"1"``, ...), ``[L+1, n, 2P]`` for ``layers="all"`` and ``[n, 2P]`` otherwise,
  plus ``sentence_to_index`` (a ``(1,)`` string dataset holding one JSON object mapping each
  stripped sentence to its line as a string; a repeated sentence maps to its last line) --
  the layout of the PyTorch reader's ``elmo`` command (ELMO.md §2), which other tools read.
* ``packed``: ``embeddings`` ``[total_tokens, 2P]`` (``[total_tokens, L+1, 2P]`` for
  ``"all"``: token-major), sentence ``i`` being ``embeddings[offsets[i]:offsets[i + 1]]``;
  ``offsets`` ``[N + 1]`` int64, ``line_numbers`` ``[N]`` int64 (0-based input lines),
  ``sentences`` ``[N]`` UTF-8 strings.  Chunked and resizable (chunks of about 256 KiB).
* ``sentence_vectors``: ``sentence_vectors`` ``[N, 2P]`` (``[N, L+1, 2P]`` for ``"all"``): the
  mean over each sentence's tokens, zeros for an empty line (``Elmo.sentence_vectors``),
  plus ``line_numbers`` and ``sentences`` as in ``packed``.

Every file carries ``attrs["elmo_jax_layout"]`` and the run's provenance (``attrs["elmo_jax_run"]``:
JSON with the input's and the model's SHA-256, the options and the line range), so
:func:`elmo_jax.read_embeddings` knows the layout and a finished shard can be checked.

Writers keep no state of their own: the counts live in the file.  :func:`open_h5` opens
with the metadata cache's evictions off, so nothing reaches the file between the flushes the
caller makes at its checkpoints (the file on disk is the last checkpoint's, plus raw data past
its end); :func:`truncate` cuts a reopened file back to a checkpoint.
"""

from __future__ import annotations

import json

import h5py
import numpy as np

LAYOUTS = ("allennlp", "packed", "sentence_vectors")
LAYOUT_ATTR = "elmo_jax_layout"
RUN_ATTR = "elmo_jax_run"
CHUNK_BYTES = 256 << 10
INDEX_CHUNK = 4096
_TEXT = h5py.string_dtype("utf-8")


def open_h5(path: str, mode: str) -> h5py.File:
    """An HDF5 file whose metadata is written only when flushed or closed."""
    f = h5py.File(path, mode)
    config = f.id.get_mdc_config()
    config.evictions_enabled = False
    config.incr_mode = config.flash_incr_mode = config.decr_mode = 0  # off: required without evictions
    f.id.set_mdc_config(config)
    return f


def _row_shape(layers: str, n_layers: int, dim: int) -> tuple[int, ...]:
    return (n_layers, dim) if layers == "all" else (dim,)


def create(f: h5py.File, layout: str, layers: str, n_layers: int, dim: int, run: dict) -> None:
    """Start an empty file of ``layout`` (``run``: the provenance stored in its attributes)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    f.attrs[LAYOUT_ATTR] = layout
    f.attrs[RUN_ATTR] = json.dumps(run, sort_keys=True)
    if layout == "allennlp":
        return
    row = _row_shape(layers, n_layers, dim)
    name = "embeddings" if layout == "packed" else "sentence_vectors"
    rows_per_chunk = max(1, CHUNK_BYTES // (4 * int(np.prod(row))))
    f.create_dataset(name, (0, *row), np.float32, maxshape=(None, *row), chunks=(rows_per_chunk, *row))
    if layout == "packed":
        f.create_dataset("offsets", data=np.zeros(1, np.int64), maxshape=(None,), chunks=(INDEX_CHUNK,))
    f.create_dataset("line_numbers", (0,), np.int64, maxshape=(None,), chunks=(INDEX_CHUNK,))
    f.create_dataset("sentences", (0,), _TEXT, maxshape=(None,), chunks=(INDEX_CHUNK,))


def layout_of(f: h5py.File) -> str:
    return f.attrs[LAYOUT_ATTR]


def run_of(f: h5py.File) -> dict:
    return json.loads(f.attrs[RUN_ATTR])


def _append(d: h5py.Dataset, values) -> None:
    n = d.shape[0]
    d.resize(n + len(values), axis=0)
    d[n:] = values


def append(f: h5py.File, first_line: int, arrays: list[np.ndarray], texts: list[str]) -> int:
    """Add sentences ``first_line, first_line + 1, ...`` (``arrays``: one per sentence, token
    arrays or, in ``sentence_vectors``, one row each); returns the tokens written."""
    layout = layout_of(f)
    lines = np.arange(first_line, first_line + len(texts), dtype=np.int64)
    if layout == "allennlp":
        for line, a in zip(lines, arrays):
            f.create_dataset(str(line), data=a)
        return sum(a.shape[-2] for a in arrays)
    if layout == "packed":
        offsets = f["offsets"]
        lengths = np.array([a.shape[-2] for a in arrays], np.int64)
        _append(offsets, offsets[-1] + np.cumsum(lengths))
        if lengths.sum():  # token-major: [n, L+1, D] rows for "all"
            _append(f["embeddings"], np.concatenate([np.moveaxis(a, -2, 0) for a in arrays]))
        n_tokens = int(lengths.sum())
    else:
        _append(f["sentence_vectors"], np.stack(arrays).astype(np.float32, copy=False))
        n_tokens = 0
    _append(f["line_numbers"], lines)
    _append(f["sentences"], np.array(texts, dtype=object))
    return n_tokens


def truncate(f: h5py.File, first_line: int, n_sentences: int, max_extra: int) -> None:
    """Cut a file back to its first ``n_sentences`` sentences (lines from ``first_line``):
    what a killed run wrote after its last checkpoint (at most ``max_extra`` sentences) goes."""
    layout = layout_of(f)
    if layout == "allennlp":
        for line in range(first_line + n_sentences, first_line + n_sentences + max_extra):
            if str(line) in f:
                del f[str(line)]
        if "sentence_to_index" in f:
            del f["sentence_to_index"]
        return
    if layout == "packed":
        f["offsets"].resize(n_sentences + 1, axis=0)
        f["embeddings"].resize(int(f["offsets"][n_sentences]), axis=0)
    else:
        f["sentence_vectors"].resize(n_sentences, axis=0)
    f["line_numbers"].resize(n_sentences, axis=0)
    f["sentences"].resize(n_sentences, axis=0)


def finish(f: h5py.File, texts) -> None:
    """Complete a file once every sentence is in (``texts``: every stripped line, in order;
    used by ``allennlp``'s ``sentence_to_index``, which holds each distinct sentence)."""
    if layout_of(f) != "allennlp":
        return
    index = {}
    for line, text in texts:
        index[text] = str(line)
    f.create_dataset("sentence_to_index", (1,), dtype=h5py.string_dtype(), data=[json.dumps(index, ensure_ascii=False)])
