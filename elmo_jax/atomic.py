"""Writing files safely: readers see the old file or the whole new one, never a part; new
files get the mode the umask gives any new file; an output never replaces an input."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

from elmo_jax.errors import ElmoError


class OutputIsInputError(ElmoError, ValueError):
    """An output path that names a file the same command reads (same file, any spelling)."""


def umask() -> int:
    """The process's umask.  Linux shows it in ``/proc/self/status``; elsewhere it is read by
    setting and restoring it, which a file created by another thread in that instant would see."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def new_mode(folder: bool = False) -> int:
    """The permission bits ``open()`` / ``mkdir()`` give a new file / folder: 0o666 / 0o777
    less the umask (``tempfile`` makes its files 0o600 and its folders 0o700 instead)."""
    return (0o777 if folder else 0o666) & ~umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """A temporary file beside ``path`` to write to inside the ``with`` block.

    When the block ends without an error the file is renamed over ``path`` (one atomic
    step on POSIX and Windows); otherwise it is removed and ``path`` is left as it was.
    The temporary file (``.NAME.XXXXXXXX.tmp``, hidden) is created, empty, before the block
    runs, so a folder that cannot be written fails at once (an ``OSError``), before any
    work; its name is unique, so concurrent writers never share one.  It gets the mode of
    any new file (:func:`new_mode`), not ``tempfile``'s 0o600.
    """
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        os.close(fd)
        os.chmod(tmp, new_mode())
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path: str | os.PathLike, value: Any, indent: int = 2) -> None:
    """``value`` as UTF-8 JSON at ``path``, atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=indent)
        f.write("\n")


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file: through symlinks, ``./x`` vs ``x``, hard links
    (``os.path.samefile``); paths that do not both exist are compared as real paths."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def refuse_output_over_inputs(output: str | os.PathLike, inputs: Mapping[str, str | os.PathLike]) -> None:
    """Raise :class:`OutputIsInputError` if ``output`` is one of ``inputs`` (``{role: path}``,
    e.g. ``{"input file": "in.txt"}``): an output written there would destroy what the
    command reads, whatever overwrite flag was given."""
    for role, path in inputs.items():
        if path is not None and same_file(output, path):
            spelled = "" if os.path.abspath(output) == os.path.abspath(path) else f" ({os.fspath(path)})"
            raise OutputIsInputError(
                f"the output {os.fspath(output)} is the {role}{spelled}; writing there would destroy it, "
                f"whatever --overwrite says: choose another output path"
            )


def replace_dir(new: str | os.PathLike, target: str | os.PathLike) -> None:
    """Put the complete folder ``new`` at ``target``: an existing ``target`` is moved aside
    (one rename), ``new`` renamed into place, then the old one deleted.  An interruption
    leaves a whole folder at ``target`` or beside it, never a mix of the two."""
    import shutil

    new, target = os.fspath(new), os.fspath(target)
    old = f"{target}.old-{os.getpid()}"
    if os.path.exists(target):
        os.rename(target, old)
    try:
        os.replace(new, target)
    except BaseException:
        if os.path.exists(old) and not os.path.exists(target):
            os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def file_sha256(path: str | os.PathLike) -> str:
    """The hex SHA-256 of a file's bytes (read in blocks)."""
    import hashlib

    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):  # no /proc (not Linux): os.kill's answer
        return True


def owned_temp_dir(parent: str | os.PathLike, prefix: str, suffix: str = "") -> str:
    """A new folder ``PREFIX{host}_{pid}_XXXXXXXX{suffix}`` in ``parent`` (the mode of any
    new folder) to build something in before renaming it into place.

    A process killed by a signal cannot remove its temporary folder: the folders with this
    prefix that a process of this host left, and that no longer runs, are removed first.
    """
    parent = os.fspath(parent)
    host = socket.gethostname().replace("_", "-")
    mine = f"{prefix}{host}_"
    for stale in glob.glob(os.path.join(glob.escape(parent), glob.escape(mine) + "*")):
        pid = os.path.basename(stale)[len(mine) :].split("_")[0]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix=f"{mine}{os.getpid()}_", suffix=suffix, dir=parent)
    os.chmod(tmp, new_mode(folder=True))  # a new folder's mode, not mkdtemp's 0o700
    return tmp


@contextlib.contextmanager
def held_lock(path: str | os.PathLike) -> Iterator[None]:
    """An exclusive ``flock`` on the file ``path`` for the block, waiting for another holder.

    The file exists only while held: the holder removes it before letting go, and a waiter
    that then gets the lock of the removed file tries again on the new one.  The kernel
    lets go of a killed holder's lock (kill -9 included); its file stays, and the next
    holder takes it over.
    """
    import fcntl

    path = os.fspath(path)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            if current is not None and os.path.samestat(current, os.fstat(fd)):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the file was removed by the holder before us: lock the new one
    try:
        yield
    finally:
        try:
            os.remove(path)
        finally:
            os.close(fd)
