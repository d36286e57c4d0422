"""Embed a text file into HDF5: the ``elmo-jax embed`` command.

Input: one sentence per line, UTF-8, tokens separated by whitespace (a final newline is
optional; ``\\r\\n`` line ends are accepted).  Output, the layout of the PyTorch reader's
``elmo`` command (ELMO.md §2):

* one dataset per input line, named by its 0-based line index (``"0"``, ``"1"``, ...):
  ``[L+1, n_tokens, 2P]`` float32 for ``layers="all"`` (``[3, n, 1024]`` for the original
  model), ``[n_tokens, 2P]`` for ``"top"`` / ``"average"``; an empty line gives a dataset
  with ``n_tokens = 0``;
* ``sentence_to_index``: shape ``(1,)`` variable-length string dataset holding one JSON
  object that maps each (stripped) sentence to its index as a string (a repeated sentence
  maps to its last line, as the original writes it).

The file is written under a temporary name in the output's folder and renamed when
complete (:func:`elmo_jax.atomic.atomic_path`), so an interrupted run never leaves a
half-written output; it gets the mode the umask gives any new file.  An output that is the
input file or one of the files the model was read from is refused, with or without
``overwrite``.
"""

from __future__ import annotations

import contextlib
import json
import os

import h5py

from elmo_jax.atomic import atomic_path, refuse_output_over_inputs
from elmo_jax.errors import ElmoError
from elmo_jax.textio import decode_line

FILE_LAYERS = ("all", "top", "average")


def read_sentences(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 text file, stripped; errors name the offending line."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"input file not found: {path}")
    if os.path.isdir(path):
        raise ElmoError(f"input {path} is a folder, not a text file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ElmoError(f"cannot read input file {path} ({e.strerror})") from None
    if not data:
        raise ElmoError(f"input file {path} is empty: expected one sentence per line")
    raw_lines = data.split(b"\n")
    if raw_lines[-1] == b"":
        raw_lines.pop()
    sentences = []
    for number, raw in enumerate(raw_lines, start=1):
        sentences.append(decode_line(raw, path, number).strip())
    return sentences


def embed_file(
    elmo,
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    layers: str = "all",
    *,
    batch_size: int | None = None,
    overwrite: bool = False,
    progress: bool | None = True,
) -> dict:
    """Embed every line of ``input_path`` with ``elmo`` into ``output_path`` (module
    docstring for the layout).  Returns ``{"sentences", "tokens", "output"}``."""
    if layers not in FILE_LAYERS:
        raise ValueError(f"layers must be one of {', '.join(FILE_LAYERS)}, got {layers!r}")
    output_path = os.path.abspath(os.fspath(output_path))
    refuse_output_over_inputs(output_path, {"input file": input_path, **getattr(elmo, "source_files", {})})
    if os.path.isdir(output_path):
        raise ElmoError(f"output {output_path} is a folder; give a file name such as out.hdf5")
    if os.path.exists(output_path) and not overwrite:
        raise FileExistsError(f"{output_path} exists; pass --overwrite (overwrite=True) to replace it")
    folder = os.path.dirname(output_path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"output folder does not exist: {folder}")
    sentences = read_sentences(input_path)
    writing = contextlib.ExitStack()
    try:
        tmp = writing.enter_context(atomic_path(output_path))
    except OSError as e:
        raise ElmoError(f"cannot write in the output folder {folder} ({e.strerror}); "
                        f"choose an output file in a folder you can write to") from None
    n_tokens = 0
    with writing:  # renamed to output_path when the block completes, removed if it fails
        with h5py.File(tmp, "w") as f:
            for indices, arrays in elmo.embed_groups(sentences, layers, batch_size=batch_size,
                                                       progress=progress):
                for i, a in zip(indices, arrays):
                    f.create_dataset(str(i), data=a)
                    n_tokens += a.shape[-2]
            index = {s: str(i) for i, s in enumerate(sentences)}
            f.create_dataset("sentence_to_index", (1,), dtype=h5py.string_dtype(),
                             data=[json.dumps(index, ensure_ascii=False)])
    return {"sentences": len(sentences), "tokens": n_tokens, "output": output_path}
