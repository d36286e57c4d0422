"""The data pipeline's worker processes: started clean, dying with their owner, stopped in bounded time.

Every process pool of the data code (text preparation, the token index build, the training
batches' chunk encoders) is made by :func:`start_pool` and ended by :func:`stop_pool`:

* Workers come from multiprocessing's fork server (never a fork of the training process,
  whose JAX threads make ``fork`` unsafe; see :func:`context`).
* A worker ignores SIGINT (a Ctrl-C reaches the whole process group; the owner handles it
  and stops the workers, so the user sees the owner's one line, not a traceback per
  worker) and dies on SIGTERM, the default, so that terminating it always works.
* A worker dies with its owner, even one killed by ``kill -9``: on Linux the kernel sends it
  SIGKILL when its parent (the fork server, which exits when the owner does) goes
  (``prctl(PR_SET_PDEATHSIG)``), and on every OS a thread in the worker watches the owner
  (the end of a pipe only the owner holds, and its pid) and exits when it is gone.
* :func:`stop_pool` never waits for long: it cancels what has not started, gives running
  tasks a bounded time (none when stopping on an error) and kills what remains.
* A worker that dies is described by :func:`pool_failure` (its pid and how it ended).

Scripts: the fork server, like ``spawn``, imports the caller's main script in each new worker
(as ``__mp_main__``), so a script whose work is not under ``if __name__ == "__main__":``
runs again in every worker.  A worker that finds itself starting elmo-jax work while
being started (:func:`exit_if_starting_worker`) exits at once with
:data:`REIMPORTED_MAIN_EXIT`, and the owner turns that (or a start that failed in a script
without the guard) into a one-line error naming the fix.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from elmo_jax.atomic import process_alive
from elmo_jax.errors import ElmoError

__all__ = [
    "DataWorkerError",
    "REIMPORTED_MAIN_EXIT",
    "context",
    "exit_if_starting_worker",
    "pool_failure",
    "start_pool",
    "stop_pool",
    "worker_pool",
    "worker_statuses",
]

REIMPORTED_MAIN_EXIT = 97
"""Exit status of a worker that re-ran its owner's unguarded script up to elmo-jax work."""

_OWNER_POLL_S = 0.5  # how often a worker checks its owner's pid (beside the pipe, which wakes it at once)
_STOP_WAIT_S = 5.0  # how long stop_pool lets running tasks finish before killing their workers
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# A -W option for the interpreters multiprocessing starts (its resource tracker among them).
_QUIET_TRACKER = "ignore::UserWarning:multiprocessing.resource_tracker"


class DataWorkerError(ElmoError):
    """A data worker process (or the batch-assembly thread) failed; the message holds its error.
    ``reimported``: the workers ran the caller's unguarded script again (no use retrying)."""

    reimported = False


def context():
    """The multiprocessing context of the workers: ``forkserver``.  Workers are forked from
    multiprocessing's fork server, a clean process started once that has imported the data
    modules (so a worker starts in milliseconds).  Each new worker then imports the
    caller's main script, as ``spawn`` does (as ``__mp_main__``; a ``python -m pkg`` or an
    interactive session has none to import): that is why a script that starts workers
    needs ``if __name__ == "__main__":`` around its work (see :func:`exit_if_starting_worker`)."""
    _quiet_resource_tracker()
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["elmo_jax.data.batches", "elmo_jax.data.prefetch", "elmo_jax.data.text_source"])
    return ctx


def _quiet_resource_tracker() -> None:
    """multiprocessing's resource tracker (a process of its own) removes the pools' named
    semaphores that their owner could not, one killed by ``kill -9`` say, and then warns on
    the owner's terminal "resource_tracker: There appear to be N leaked semaphore objects":
    a line about nothing left to do.  The tracker (started with the owner's ``-W`` options,
    ``sys.warnoptions``, when the first pool starts) still removes them, without that line."""
    if _QUIET_TRACKER not in sys.warnoptions:
        sys.warnoptions.append(_QUIET_TRACKER)


def exit_if_starting_worker() -> None:
    """Called where elmo-jax work starts (training, a worker pool): in a process that is
    being started by multiprocessing (importing its owner's main script), exit at once
    with :data:`REIMPORTED_MAIN_EXIT` and no traceback.  Only a script that runs its work
    at import, without ``if __name__ == "__main__":``, gets here; its owner names the fix."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        os._exit(REIMPORTED_MAIN_EXIT)


# -- worker side ------------------------------------------------------------------------------
def _watch_owner(owner_pid: int) -> None:
    """Exit this worker when its owner is gone: the pipe end only the owner holds closes
    (multiprocessing's parent sentinel, at once), or the owner's pid is gone (a poll)."""
    from multiprocessing.connection import wait

    parent = multiprocessing.parent_process()
    sentinel = getattr(parent, "sentinel", None)
    while True:
        if sentinel is not None:
            if wait([sentinel], timeout=_OWNER_POLL_S):
                os._exit(1)
        else:
            threading.Event().wait(_OWNER_POLL_S)
        if not process_alive(owner_pid):
            os._exit(1)


def _die_with_parent() -> None:
    """On Linux, have the kernel SIGKILL this process when its parent thread exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the watching thread does it
        pass


def _worker_start(owner_pid: int, initializer, initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    if not process_alive(owner_pid):  # gone before the line above could take effect
        os._exit(1)
    threading.Thread(target=_watch_owner, args=(owner_pid,), name="elmo-jax-owner-watch", daemon=True).start()
    if initializer is not None:
        initializer(*initargs)


# -- owner side -------------------------------------------------------------------------------
class _Pool(ProcessPoolExecutor):
    """A ``ProcessPoolExecutor`` whose ``submit`` (which may start a worker) is not cut by a
    Ctrl-C / SIGTERM: the signal acts once the pool has recorded the worker it started, so
    that :func:`stop_pool` stops every worker (see :func:`elmo_jax.train.stop.signals_held`)."""

    def submit(self, *args, **kwargs):
        from elmo_jax.train.stop import signals_held

        with signals_held():
            return super().submit(*args, **kwargs)


def start_pool(workers: int, initializer=None, initargs: tuple = ()) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes (started as tasks arrive) set up as the module
    docstring says, then running ``initializer(*initargs)``."""
    exit_if_starting_worker()
    return _Pool(
        int(workers),
        mp_context=context(),
        initializer=_worker_start,
        initargs=(os.getpid(), initializer, tuple(initargs)),
    )


def _processes(pool: ProcessPoolExecutor) -> list:
    return list((getattr(pool, "_processes", None) or {}).values())


def worker_statuses(pool: ProcessPoolExecutor) -> list[tuple[int, int | None]]:
    """``(pid, exit status)`` of each worker the pool started (None: still running;
    ``-N``: killed by signal ``N``).

    A broken pool's manager thread is joining its workers at that moment; each worker's exit
    status is one message on a pipe that only one reader gets, and a second reader at the same
    moment would record 255 for it.  So this waits (bounded) for that thread to finish first."""
    manager = getattr(pool, "_executor_manager_thread", None)
    if getattr(pool, "_broken", False) and manager is not None and manager is not threading.current_thread():
        manager.join(timeout=_STOP_WAIT_S)
    return [(p.pid, p.exitcode) for p in _processes(pool)]


def stop_pool(pool: ProcessPoolExecutor | None, *, wait_s: float = _STOP_WAIT_S, now: bool = False) -> None:
    """End ``pool``: tasks not started are cancelled, running ones get ``wait_s`` seconds
    (none with ``now``), then what remains is killed.  Never waits longer than that on a
    dead, stuck or signal-ignoring worker."""
    if pool is None:
        return
    processes = _processes(pool)
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    if now:
        _kill(processes)
    elif manager is not None:
        manager.join(timeout=wait_s)  # it sends the workers their end, then joins them
    for p in processes:
        p.join(timeout=0 if now else max(0.0, wait_s / 10))
    _kill(processes)
    for p in processes:
        p.join(timeout=wait_s)
    if manager is not None:
        manager.join(timeout=wait_s)
        if manager.is_alive():  # never: its workers are gone; but never let it block the exit either
            from concurrent.futures import process as cf_process

            cf_process._threads_wakeups.pop(manager, None)


def _kill(processes) -> None:
    for p in processes:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if p.exitcode is None:
                p.kill()


def _how(status: int | None) -> str:
    if status is None:
        return "still running"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def describe_dead(statuses: list[tuple[int, int | None]]) -> str:
    """Which worker ended and how: the first one that did not end by the SIGTERM the pool
    sends the others once one died (or the first that ended at all)."""
    ended = [(pid, s) for pid, s in statuses if s is not None]
    if not ended:
        return "a worker process ended"
    pid, status = next(((pid, s) for pid, s in ended if s != -signal.SIGTERM), ended[0])
    return f"worker process {pid} ended ({_how(status)})"


def unguarded_main() -> str | None:
    """The path of the caller's main script when new workers import it (see
    :func:`context`) and it has no top-level ``if __name__ == ...`` test; else None."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None and (name == "__main__" or name.endswith(".__main__")):
        return None  # `python -m pkg`: multiprocessing does not import it again
    path = getattr(main, "__file__", None)
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.If) and any(
            isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(node.test)
        ):
            return None
    return path


def reimport_error(statuses: list[tuple[int, int | None]]) -> DataWorkerError | None:
    """The one-line error for workers that re-ran the caller's script, if that is what
    happened: one exited with :data:`REIMPORTED_MAIN_EXIT`, or the script has no
    ``__name__`` guard and no worker was killed by a signal (the script's code failed in
    the worker before reaching elmo-jax, or the worker died while being started)."""
    script = unguarded_main()
    signalled = any(s is not None and s < 0 and s != -signal.SIGTERM for _, s in statuses)
    if any(s == REIMPORTED_MAIN_EXIT for _, s in statuses) or (script and not signalled):
        where = f"{script}'s" if script else "the main script's"
        error = DataWorkerError(
            f"the data worker processes ran {where} top-level code again and stopped: Python starts each "
            f"worker by importing the main script (the 'forkserver' method), so a script that uses "
            f'data_workers must put its work under `if __name__ == "__main__":` (or use data_workers=0)'
        )
        error.reimported = True
        return error
    return None


def pool_failure(pool: ProcessPoolExecutor, error: BaseException, what: str) -> DataWorkerError:
    """The one-line error for a pool that broke (``error``: ``BrokenProcessPool``, or the
    ``OSError`` of a worker that died while it was being started) while doing ``what``."""
    statuses = worker_statuses(pool)
    return reimport_error(statuses) or DataWorkerError(
        f"a {what} worker process died ({describe_dead(statuses)}; {type(error).__name__}: {error}). "
        f"Was it killed, or out of memory? Try fewer data_workers"
    )


@contextlib.contextmanager
def worker_pool(workers: int, what: str, initializer=None, initargs: tuple = ()):
    """``start_pool`` for a block: a broken pool becomes :func:`pool_failure`'s error; on any
    error (Ctrl-C included) the workers are killed at once, else stopped normally."""
    pool = start_pool(workers, initializer, initargs)
    try:
        yield pool
    except (BrokenProcessPool, BrokenPipeError, ConnectionError) as e:
        error = pool_failure(pool, e, what)  # before stopping: the statuses of the workers that died
        stop_pool(pool, now=True)
        raise error from None
    except BaseException:
        stop_pool(pool, now=True)
        raise
    stop_pool(pool)
