"""Writing a file so that readers see the old file or the whole new one, never a part."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """A temporary name beside ``path`` to write to inside the ``with`` block.

    When the block ends without an error the file is renamed over ``path`` (one atomic
    step on POSIX and Windows); otherwise it is removed and ``path`` is left as it was.
    The name holds the process id, so concurrent writers never share a temporary file.
    """
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
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
