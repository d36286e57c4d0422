"""The resume state of ``elmo-jax embed``: what a run is (its *run record*) and how far it got.

A run's record holds the input's fingerprint (path, size, mtime, SHA-256, lines), the model's
digest (:func:`model_digest`), the options that shape the output (layers, layout, batch size,
lines per group, dtype) and the line range of this process's shard.  Beside the partial
output, ``progress.json`` holds the record plus ``lines_done`` (the next line to embed),
``sentences`` and ``tokens`` written so far; it is written atomically, after the data it
counts has been flushed and fsynced, so it never counts data that is not on disk.
:func:`compare` says, in words, what differs between a saved record and this run's.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os

import numpy as np

from elmo_jax.atomic import write_json

PROGRESS_FILE = "progress.json"
VERSION = 1


def model_digest(elmo) -> str:
    """SHA-256 of a model's options and parameter values (any model: loaded, random, trained)."""
    import jax

    h = hashlib.sha256(json.dumps(elmo.config.to_options(), sort_keys=True).encode())
    for path, leaf in jax.tree_util.tree_leaves_with_path(elmo.params):
        a = np.asarray(leaf)
        h.update(f"{jax.tree_util.keystr(path)} {a.dtype} {a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def fsync_path(path: str) -> None:
    """Push a file's (or a folder's) written bytes to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def reserve_space(path: str, n_bytes: int) -> None:
    """Allocate ``n_bytes`` of disk past the end of ``path`` before HDF5 writes there.

    A disk that fills while HDF5 flushes its metadata leaves a file that no longer opens;
    with the space reserved first, a full disk is an ``OSError`` (ENOSPC) here, before
    anything is written, and the file stays as its last checkpoint left it.  HDF5 writes into
    the reserved blocks and cuts the file back to its own end on closing.
    """
    if not hasattr(os, "posix_fallocate"):  # not on macOS: no reservation
        return
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, os.fstat(fd).st_size, max(1, n_bytes))
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise
        # A file system that cannot reserve (EOPNOTSUPP, EINVAL): write without a reservation.
    finally:
        os.close(fd)


def read_progress(state_dir: str) -> dict | None:
    path = os.path.join(state_dir, PROGRESS_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # never written half (atomic), so only a foreign file gets here
        return None


def write_progress(state_dir: str, run: dict, lines_done: int, sentences: int, tokens: int) -> None:
    write_json(
        os.path.join(state_dir, PROGRESS_FILE),
        {"version": VERSION, "run": run, "lines_done": lines_done, "sentences": sentences, "tokens": tokens},
    )
    fsync_path(state_dir)


def compare(saved: dict, run: dict) -> str | None:
    """What makes ``saved`` (a run record) another run than ``run``, in words; None if the same."""
    s_in, r_in = saved.get("input", {}), run["input"]
    if s_in.get("sha256") != r_in["sha256"] or s_in.get("lines") != r_in["lines"]:
        return (
            f"the input file changed: {r_in['path']} now has {r_in['lines']} lines, sha256 "
            f"{r_in['sha256'][:12]}..., the partial run read {s_in.get('lines')} lines, sha256 "
            f"{str(s_in.get('sha256'))[:12]}..."
        )
    if saved.get("model") != run["model"]:
        return (
            f"the model changed: its parameters' digest is now {run['model'][:12]}..., the partial run "
            f"used {str(saved.get('model'))[:12]}..."
        )
    for key, value in run["options"].items():
        if saved.get("options", {}).get(key) != value:
            return f"the option {key} is now {value!r}, the partial run used {saved.get('options', {}).get(key)!r}"
    if saved.get("shard") != run["shard"]:
        return (
            f"the process layout changed: this process embeds lines {run['shard']['first_line']}-"
            f"{run['shard']['end_line'] - 1} as shard {run['shard']['index']} of {run['shard']['count']}, the "
            f"partial run's shard was {saved.get('shard')}"
        )
    return None
