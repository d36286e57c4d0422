"""One process at a time per cache entry: an exclusive ``fcntl.flock`` on a lock file."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path


try:
    import fcntl
except ImportError:  # Windows: no flock; concurrent downloads of one model are then not serialised
    fcntl = None  # type: ignore[assignment]


@contextlib.contextmanager
def exclusive_lock(path: Path, spec: str, progress: bool) -> Iterator[None]:
    """Held while one process fetches one model; others wait here.  The lock file is removed
    when the holder is done (success or failure), so none is left behind; a waiter that then
    holds the lock of a removed file takes the lock again on the new one.  The file names its
    holder (pid and model); one left by a holder that was killed (``kill -9``) is removed by
    the next process that takes any lock here (:func:`remove_stale_locks`)."""
    path.parent.mkdir(exist_ok=True)
    said = False
    while True:
        f = open(path, "a+b")
        if fcntl is None:
            break
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress and not said:
                print(f"waiting for another process fetching {spec} ...", file=sys.stderr)
                said = True
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            same = os.fstat(f.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()  # the holder removed this file when it finished: lock the current one
    if fcntl is not None:
        with contextlib.suppress(OSError):
            f.truncate(0)
            f.write(f"pid {os.getpid()} fetching {spec}\n".encode("utf-8", "replace"))
            f.flush()
        remove_stale_locks(path.parent, keep=path)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        f.close()


def remove_stale_locks(folder: Path, keep: Path) -> None:
    """Remove the lock files in ``folder`` that no process holds (their holders were killed
    before they could remove them).  A process that opened one and waits for it then finds
    its file gone and locks a new one (see :func:`exclusive_lock`)."""
    assert fcntl is not None
    for other in folder.glob("*.lock"):
        if other == keep:
            continue
        try:
            g = open(other, "rb")
        except OSError:
            continue
        with g:
            try:
                fcntl.flock(g.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: a fetch under way
                continue
            with contextlib.suppress(OSError):
                if os.fstat(g.fileno()).st_ino == os.stat(other).st_ino:
                    other.unlink()


__all__ = ["exclusive_lock", "remove_stale_locks"]
