"""Silence the known echoes of a failed orbax read: "Event loop is closed" from tensorstore,
and an unstarted metadata read's "never awaited" warning.

orbax runs a restore as one coroutine on a fresh asyncio loop that reads every array through
tensorstore.  When one read fails (a damaged checkpoint, a template that does not fit), the
coroutine raises at once and orbax closes its loop; the other reads are still running in
tensorstore's threads, and each one, on completing, calls ``loop.call_soon_threadsafe`` on
the closed loop from C++.  The resulting ``RuntimeError('Event loop is closed')`` has no
Python caller, so it goes to :data:`sys.unraisablehook`, whose default prints a bare
traceback: up to hundreds of them, around the one-line error the caller raises for the
failed read, some seconds later or at exit.  Nothing is lost by dropping them (the read had
already failed, and the failure was raised), and nothing can wait for those reads: they are
not reachable from Python.

:func:`drop_closed_loop_echoes` chains a hook in front of the current one that drops exactly
that exception (type, message, raised by asyncio's ``call_soon_threadsafe`` called from
native code) and passes everything else on unchanged.  It stays for the rest of the process
(the echoes come late), and installing it twice is a no-op.

The failed reads also end asyncio tasks whose exceptions nobody retrieves once the first
one was raised; asyncio logs each of them ("Task exception was never retrieved", or "Future
...", with a traceback) when it is collected, again at any later moment.
:func:`drop_failed_read_echoes` drops exactly those records for the checkpoint folders
being restored (a failed restore is reported by the one error it raises), and passes every
other record on.
"""

from __future__ import annotations

import asyncio.base_events
import logging
import os
import sys
import warnings

# The same failure can leave one of orbax's metadata reads never started; Python then warns, when
# the coroutine is collected (often in a later step, with no caller of ours in sight), that it
# "was never awaited".  Dropped too: exactly that coroutine, by its name in orbax.
_UNSTARTED_METADATA_READ = r"coroutine 'Store\._get_array_metadatas' was never awaited"


def is_closed_loop_echo(exc_type, exc_value, exc_traceback) -> bool:
    """True for the ``RuntimeError('Event loop is closed')`` of a native callback: its
    outermost frame is asyncio's ``call_soon_threadsafe`` (no Python code called it)."""
    if exc_type is not RuntimeError or str(exc_value) != "Event loop is closed" or exc_traceback is None:
        return False
    code = exc_traceback.tb_frame.f_code
    return code.co_name == "call_soon_threadsafe" and code.co_filename == asyncio.base_events.__file__


def drop_closed_loop_echoes() -> None:
    """Put the filter in front of :data:`sys.unraisablehook` (once per process), and ignore
    the warning for an unstarted orbax metadata read (a warnings filter: set again on every
    call, as code such as a test runner may have reset the filters since)."""
    warnings.filterwarnings("ignore", message=_UNSTARTED_METADATA_READ, category=RuntimeWarning)
    if getattr(sys.unraisablehook, "_elmo_jax_drops_closed_loop_echoes", False):
        return
    previous = sys.unraisablehook

    def hook(unraisable):
        if not is_closed_loop_echo(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback):
            previous(unraisable)

    # a marker on the function object, which mypy does not model
    hook._elmo_jax_drops_closed_loop_echoes = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


# asyncio's words for a task's or a future's exception that nobody retrieved
_UNRETRIEVED = ("Task exception was never retrieved", "Future exception was never retrieved")


class _FailedReadEchoes(logging.Filter):
    """Drops asyncio's "never retrieved" records of a task or future whose exception names one of
    ``folders`` (checkpoints being restored); lets everything else through."""

    def __init__(self):
        super().__init__()
        self.folders: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(_UNRETRIEVED):
            return True
        text = message + (str(record.exc_info[1]) if record.exc_info else "")
        return not any(folder in text for folder in self.folders)


def drop_failed_read_echoes(folder: str | os.PathLike) -> None:
    """From now on, drop asyncio's "Task/Future exception was never retrieved" records of reads
    under ``folder``, which the caller is about to restore and whose failure it reports by the
    error it raises (a restore that succeeds leaves none). One filter per process."""
    logger = logging.getLogger("asyncio")
    echoes = next((f for f in logger.filters if isinstance(f, _FailedReadEchoes)), None)
    if echoes is None:
        echoes = _FailedReadEchoes()
        logger.addFilter(echoes)
    echoes.folders.add(os.path.abspath(os.fspath(folder)).rstrip(os.sep) + os.sep)
