"""Stopping a run cleanly: SIGTERM / Ctrl-C ask the loop to checkpoint and return.

Exit status of a stopped run (``elmo-jax train``, ``python train.py``, the examples): not 0,
so that ``train && export`` never exports an unfinished model, and a scheduler can tell a
run to requeue from one that finished or failed:

    0    the run finished (max_steps / epochs reached)
    130  stopped by SIGINT (Ctrl-C), resumable: the same command continues
    143  stopped by SIGTERM (or, in a multi-process job, by a peer's stop), resumable
    1/2  failed (2: bad input, one line saying what to fix)

130 and 143 are the shells' 128 + signal number.

A signal handler never raises into the code it interrupts here: the first signal only sets
a flag that the loop reads between steps (never inside jit tracing or XLA compilation), and
where a process must end at once (a second signal, or a signal before training started under
:func:`exit_on_signal`) it writes one line and ends with :func:`os._exit`, as a ``kill -9``
would but with the right status: every file the project writes is written atomically, the
workdir lock is released by the system, and data workers end with their parent.  Raising
``KeyboardInterrupt`` at an arbitrary point of start-up, and then tearing the interpreter
down while XLA's threads still compiled, ended in ``Segmentation fault`` (exit -11).

Every entry point calls :func:`stop_cleanly` before numpy and jax load, so that a signal
during imports, XLA's initialisation or the first compilation is one line and 130 / 143
too: an exception raised there would be swallowed (jax's garbage-collector callback),
turned into an ImportError, or printed as a traceback.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
from typing import Callable, Iterator

# The exit status of a run stopped by each signal: resumable, and not 0.
EXIT_STOPPED = {signal.SIGINT: 130, signal.SIGTERM: 143}
STOP_SIGNALS = tuple(EXIT_STOPPED)


def exit_status(reason: str | None) -> int:
    """The exit status of a run stopped for ``reason`` (a signal's name, or another
    process's stop in a multi-process job: 143, as a scheduler's SIGTERM)."""
    return EXIT_STOPPED[signal.SIGINT] if reason == "SIGINT" else EXIT_STOPPED[signal.SIGTERM]


def exit_now(code: int, line: str) -> None:
    """Write ``line`` to stderr and end the process at once with ``code`` (flushing what was
    written; no interpreter teardown, no exception through half-done work)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        os.write(2, (line + "\n").encode("utf-8", "replace"))
    os._exit(code)


def exit_process(code: int) -> None:
    """The end of a command-line program with status ``code``: a stopped run (130 / 143)
    ends with :func:`os._exit` after flushing, as nothing is left to do and tearing the
    interpreter down with XLA's threads still busy can crash; any other status normally."""
    if code in EXIT_STOPPED.values():
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)


@contextlib.contextmanager
def exit_on_signal(message: Callable[[str], str]) -> Iterator[None]:
    """For a command's whole run (the CLI's ``train``, a script's ``main``): SIGINT / SIGTERM
    end the process at once with one line (``message(signal name)``) and status 130 / 143,
    whenever they come (imports, data preparation, compilation).  Inside the training loop
    :class:`StopRequest` takes over (checkpoint, then return); a second signal there comes
    back here.  Outside the main thread nothing changes."""

    def handler(signum, frame):
        name = signal.Signals(signum).name
        exit_now(EXIT_STOPPED[signum], message(name))

    previous = {}
    try:
        for s in STOP_SIGNALS:
            previous[s] = signal.signal(s, handler)
    except ValueError:  # not the main thread
        previous = {}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class Stopped(KeyboardInterrupt):
    """SIGTERM, raised as Ctrl-C raises KeyboardInterrupt (``args[0]``: the signal's name),
    so that a command's cleanup runs and it ends with 143 (:func:`raise_on_signal`)."""


def stopped_by(error: KeyboardInterrupt) -> str:
    """The name of the signal behind ``error`` (a :class:`Stopped`, or Ctrl-C's KeyboardInterrupt)."""
    return error.args[0] if isinstance(error, Stopped) and error.args else "SIGINT"


def _code(callback):
    return getattr(callback, "__code__", None) or getattr(getattr(callback, "__func__", None), "__code__", None)


def raising_is_lost(frame) -> bool:
    """Whether an exception raised in ``frame`` (where a signal handler runs) would be lost or
    changed on its way out: inside a garbage-collector callback (jax installs one; Python
    prints "Exception ignored in ..." and carries on), a finaliser (``__del__``), or an import
    (an extension module being initialised turns it into an ``ImportError``)."""
    callbacks = {_code(cb) for cb in gc.callbacks} - {None}
    while frame is not None:
        code = frame.f_code
        if code in callbacks or code.co_name == "__del__" or code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _raise_or_exit(message: Callable[[str], str]):
    """A handler for SIGINT / SIGTERM: raise KeyboardInterrupt / :class:`Stopped` where that
    reaches the caller's cleanup, else (:func:`raising_is_lost`) end at once with one line."""

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if raising_is_lost(frame):
            exit_now(EXIT_STOPPED[signum], message(name))
        raise KeyboardInterrupt if signum == signal.SIGINT else Stopped(name)

    handler.stops_cleanly = True  # type: ignore[attr-defined]  # marks our own handlers
    return handler


def _exit_when_swallowed(message: Callable[[str], str], previous):
    """A ``sys.unraisablehook``: a KeyboardInterrupt / :class:`Stopped` that Python could not
    raise (a callback's or finaliser's, printed as "Exception ignored" and then forgotten)
    ends the process with one line and 130 / 143 instead; anything else goes to ``previous``."""

    def hook(unraisable):
        if hook.active and isinstance(unraisable.exc_value, KeyboardInterrupt):
            name = stopped_by(unraisable.exc_value)
            exit_now(exit_status(name), message(name))
        previous(unraisable)

    hook.active = True  # type: ignore[attr-defined]  # False once undone while another hook sits in front
    return hook


def _install(handler, message: Callable[[str], str], signals=STOP_SIGNALS) -> Callable[[], None] | None:
    """Install ``handler`` for ``signals`` and the unraisable hook; returns what undoes it
    (None outside the main thread, where nothing changes)."""
    previous = {}
    try:
        for s in signals:
            previous[s] = signal.signal(s, handler)
    except ValueError:  # not the main thread
        return None
    hook = sys.unraisablehook
    ours = _exit_when_swallowed(message, hook)
    sys.unraisablehook = ours

    def undo():
        # A hook installed after ours (storage_echoes' filter of orbax's late echoes) chains to
        # ours and must stay: then ours only stops acting, it is not taken out of the chain.
        if sys.unraisablehook is ours:
            sys.unraisablehook = hook
        else:
            ours.active = False
        for s, h in previous.items():
            signal.signal(s, h)

    return undo


def stop_cleanly(message: Callable[[str], str], *, at_once: bool = False) -> None:
    """For a program's entry point, before it imports jax (``train.py``, ``elmo-jax``, the
    examples; never a library): from now on SIGINT / SIGTERM end the process with status
    130 / 143 and one line, ``message(signal name)``, whenever they come.  A signal raises
    KeyboardInterrupt / :class:`Stopped` where the program can catch it and clean up; during
    an import, jax's garbage-collector callback or a finaliser (where Python would swallow it
    or turn it into an ImportError) it ends the process at once.  ``at_once``: always at once
    (a program with nothing to clean up).  Stop handlers already installed are kept."""
    if getattr(signal.getsignal(signal.SIGINT), "stops_cleanly", False):
        return
    if at_once:

        def handler(signum, frame):
            exit_now(EXIT_STOPPED[signum], message(signal.Signals(signum).name))

        handler.stops_cleanly = True  # type: ignore[attr-defined]  # marks our own handlers
    else:
        handler = _raise_or_exit(message)
    _install(handler, message)


@contextlib.contextmanager
def raise_on_signal(message: Callable[[str], str], signals=STOP_SIGNALS) -> Iterator[None]:
    """:func:`stop_cleanly`'s handlers (raising) for a block, then the caller's again: for a
    command that cleans up after a stop (embed, export, eval, demo); outside the main thread
    nothing changes."""
    undo = _install(_raise_or_exit(message), message, signals)
    try:
        yield
    finally:
        if undo is not None:
            undo()


def raise_on_sigterm(message: Callable[[str], str] | None = None) -> contextlib.AbstractContextManager:
    """SIGTERM raises :class:`Stopped` for a block where the default would kill the process
    without a word (see :func:`raise_on_signal`; ``message`` names the program in the line
    written where it cannot be raised)."""
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return raise_on_signal(message or (lambda name: f"{program}: stopped by {name}"), (signal.SIGTERM,))


@contextlib.contextmanager
def signals_held(signals=STOP_SIGNALS) -> Iterator[None]:
    """SIGINT / SIGTERM wait for the end of a block that must not be cut in two (a process
    pool starting a worker and recording it: cut between the two, the worker is one the pool
    never stops and the interpreter's exit waits for it for ever).  A signal that comes in
    the block is sent again when it ends, to the handlers that were there before.  Outside
    the main thread (where no handler runs) nothing changes."""
    received: list[int] = []

    def hold(signum, frame):
        if signum not in received:
            received.append(signum)

    try:
        previous = {s: signal.signal(s, hold) for s in signals}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for s in received:
            signal.raise_signal(s)


class StopRequest:
    """SIGTERM / Ctrl-C set a flag; the loop checkpoints at the next step and returns.

    A second signal stops at once: through the handler that was there before (the CLI's
    :func:`exit_on_signal`: one line, status 130 / 143), or, where there was none (a
    script or notebook calling ``train()``), as Ctrl-C does (``KeyboardInterrupt``)."""

    def __init__(self):
        self.signal: str | None = None

    @contextlib.contextmanager
    def installed(self):
        previous = {}

        def handler(signum, frame):
            if self.signal is None:
                self.signal = signal.Signals(signum).name
                return
            before = previous.get(signum, signal.SIG_DFL)  # a second signal: stop now
            signal.signal(signum, before)
            if callable(before) and before is not signal.default_int_handler:
                before(signum, frame)
            raise KeyboardInterrupt

        try:
            for s in STOP_SIGNALS:
                previous[s] = signal.signal(s, handler)
        except ValueError:  # not the main thread: no handlers, nothing to restore
            previous = {}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
