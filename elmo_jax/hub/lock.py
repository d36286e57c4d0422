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
    holds the lock of a removed file takes the lock again on the new one."""
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
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        f.close()


__all__ = ["exclusive_lock"]
