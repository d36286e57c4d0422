"""The package's own error type: a problem with the user's input or files, with a message
that says what is wrong and how to fix it (the CLI prints it without a traceback)."""

from __future__ import annotations

import errno
import os


class ElmoError(Exception):
    """Base class of errors caused by input, configuration or files."""


USER_ERRORS = (ElmoError, ValueError, TypeError, OSError)
"""What the command line reports as a one-line error instead of a traceback: the package's
own errors and the built-in ones raised for bad arguments and for files that cannot be
found, read or written (``OSError`` covers missing files, permissions and a full disk)."""


def exception_chain(e: BaseException | None) -> list[BaseException]:
    """``e`` and the exceptions it was raised from or during (``__cause__``/``__context__``)."""
    out, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def is_disk_full(e: BaseException) -> bool:
    """True when ``e`` (or an exception it was raised from) says the disk or quota is full:
    an ``OSError`` with ``ENOSPC``/``EDQUOT``, or a storage library's error that only says
    so in its text (tensorstore, ArrayRecord, a worker's re-raised error)."""
    for x in exception_chain(e):
        if isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(x)
        if "No space left on device" in text or "Disk quota exceeded" in text:
            return True
    return False


def symlink_loop(path: str | os.PathLike) -> str | None:
    """A sentence naming ``path`` as a symbolic link loop (a link that leads, directly or
    through other links, back to itself: neither a file nor a folder, and ``exists()`` is
    False for it), or None when it is not one."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return (
                f"{os.fspath(path)} is a symbolic link loop (following it leads back to it, so it is neither "
                f"a file nor a folder); remove the link (rm {os.fspath(path)}) or point it at a real path"
            )
    return None


def refuse_symlink_loop(path: str | os.PathLike) -> None:
    """Raise :class:`ElmoError` with :func:`symlink_loop`'s sentence if ``path`` is one."""
    message = symlink_loop(path)
    if message is not None:
        raise ElmoError(message)
