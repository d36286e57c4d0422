"""Batches built off the training thread: worker processes encode, a thread assembles.

:class:`~elmo_jax.data.batches.LMBatcher` with ``workers=N >= 1`` uses the two pieces here:

* :class:`WorkerChunks` reads and encodes chunks of the shuffled sentence order (the
  expensive part: reading the source, splitting, vocabulary and char-id lookups) in ``N``
  worker processes, requested ahead of need.  A chunk is a pure function of the sentence
  indices it holds, so which worker encodes it, and when, cannot change a batch.
* :class:`BatchPipeline` runs the batcher's own assembly (which row takes which sentence,
  decided from lengths; one gather per chunk) in a background thread, ``depth`` batches
  ahead of the consumer, each batch paired with the batcher state right after it.  The
  state :meth:`LMBatcher.get_state` returns is the one paired with the last batch handed
  out, i.e. the position of the next batch to be consumed, so a checkpoint resumes exactly
  whatever was built ahead, with any worker count (``0`` included).

Shutdown: :meth:`LMBatcher.close` stops the thread and the pool.  Workers ignore SIGINT and
SIGTERM (a Ctrl-C or a job scheduler's SIGTERM reaches the whole process group; the training
process then saves a checkpoint, which needs no worker, and closes them) and exit by
themselves within half a second when their parent process disappears (``kill -9``), so none
is left behind.  An exception in a worker is raised in the consumer's ``next`` as
:class:`DataWorkerError` with the worker's traceback.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from elmo_jax.atomic import process_alive
from elmo_jax.errors import ElmoError

__all__ = ["BatchPipeline", "DataWorkerError", "WorkerChunks"]

_PARENT_POLL_S = 0.5


class DataWorkerError(ElmoError):
    """A data worker process (or the batch-assembly thread) failed; the message holds its error."""


# -- worker process side ------------------------------------------------------------------
# One encoder per worker process, set by the pool's initializer (a process-wide value by
# necessity: ProcessPoolExecutor calls module-level functions).
_WORKER_ENCODER = None


def _exit_with(owner_pid: int) -> None:
    while True:
        time.sleep(_PARENT_POLL_S)
        if not process_alive(owner_pid):
            os._exit(1)


def _worker_init(encoder, owner_pid: int) -> None:
    global _WORKER_ENCODER
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Watch the process that owns the pool, not the parent: workers are children of the
    # fork server, which stays alive as long as they do.
    threading.Thread(target=_exit_with, args=(owner_pid,), daemon=True).start()
    _WORKER_ENCODER = encoder


def _worker_encode(positions: np.ndarray, reverse: bool):
    return _WORKER_ENCODER(positions, reverse)


def _describe(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    remote = getattr(error.__cause__, "tb", None)  # concurrent.futures' _RemoteTraceback
    return f"{text}\n{remote.strip()}" if remote else text


# -- main process side --------------------------------------------------------------------
def _context():
    """Workers are forked from multiprocessing's fork server, a clean process started once
    (never a fork of the training process, whose JAX threads make ``fork`` unsafe) that has
    imported the data modules but not the caller's ``__main__``: starting a worker then
    takes milliseconds instead of a fresh interpreter's imports."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["elmo_jax.data.batches", "elmo_jax.data.prefetch", "elmo_jax.data.text_source"])
    return ctx


class WorkerChunks:
    """Chunk provider: encodes chunks in ``workers`` processes (started on first use).

    ``get(key, positions, reverse)`` returns the chunk (waiting for it);
    ``prefetch(...)`` requests one ahead.  ``lookahead`` is how many chunks a stream asks
    for ahead of the one it reads.
    """

    def __init__(self, encoder, workers: int):
        self._encoder = encoder
        self.workers = int(workers)
        self.lookahead = 2 * self.workers + 1
        self._pool: ProcessPoolExecutor | None = None
        self._pending: dict[tuple, Future] = {}
        self._lock = threading.Lock()

    def _submit(self, positions, reverse: bool) -> Future:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.workers, mp_context=_context(),
                                                 initializer=_worker_init, initargs=(self._encoder, os.getpid()))
            try:
                return self._pool.submit(_worker_encode, np.asarray(positions, dtype=np.int64), bool(reverse))
            except (BrokenProcessPool, RuntimeError) as e:
                raise DataWorkerError(f"the data worker processes are gone ({_describe(e)})") from e

    def prefetch(self, key, positions, reverse: bool) -> None:
        if key not in self._pending:
            self._pending[key] = self._submit(positions, reverse)

    def get(self, key, positions, reverse: bool):
        future = self._pending.pop(key, None) or self._submit(positions, reverse)
        try:
            return future.result()
        except BrokenProcessPool as e:
            raise DataWorkerError(
                f"a data worker process died ({_describe(e)}); was it killed, or out of memory?"
            ) from e
        except Exception as e:  # noqa: BLE001 - re-raised with the worker's traceback
            raise DataWorkerError(f"a data worker failed while reading/encoding sentences: {_describe(e)}") from e

    def reset(self) -> None:
        """Forget chunks requested ahead (the batcher jumped to another position)."""
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()

    def close(self) -> None:
        self.reset()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class BatchPipeline:
    """Builds ``batcher``'s batches in a background thread, ``depth`` ahead of ``next``.

    The thread is the only user of the batcher's streams while it runs; ``set_state`` stops
    it first.  It starts on the first ``next``.
    """

    def __init__(self, batcher, depth: int):
        self._batcher = batcher
        self._depth = max(1, int(depth))
        self._state = None  # snapshot after the last batch handed out; None: ask the batcher
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue | None = None
        self._stop: threading.Event | None = None
        self._ended = False

    # -- thread ------------------------------------------------------------------------
    def _start(self) -> None:
        if self._state is None:
            self._state = self._batcher._snapshot()
        self._queue = queue.Queue(self._depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._queue, self._stop),
                                        name="elmo-jax-batches", daemon=True)
        self._thread.start()

    def _run(self, out: queue.Queue, stop: threading.Event) -> None:
        def put(item) -> bool:
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        b = self._batcher
        while not stop.is_set():
            try:
                batch = b._build_next()
            except StopIteration:
                put(("end", None, b._snapshot()))
                return
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                put(("error", e, None))
                return
            if not put(("batch", batch, b._snapshot())):
                return

    def _stop_thread(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        while self._thread.is_alive():
            try:  # unblock a put; drop what was built ahead
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.05)
        self._thread = None
        self._queue = None

    # -- consumer side -----------------------------------------------------------------
    def next(self) -> dict:
        if self._ended:
            raise StopIteration
        if self._thread is None:
            self._start()
        while True:
            try:
                kind, value, state = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    raise DataWorkerError("the batch-assembly thread stopped without a batch or an error") from None
        if kind == "batch":
            self._state = state
            return value
        self._stop_thread()
        if kind == "end":
            self._state = state
            self._ended = True
            raise StopIteration
        if isinstance(value, ElmoError):
            raise value
        raise DataWorkerError(f"building a batch failed: {_describe(value)}") from value

    def state(self) -> dict:
        if self._state is None:
            return self._batcher._build_state()
        return self._batcher._state_of(self._state)

    def set_state(self, state: dict) -> None:
        self._stop_thread()
        self._batcher._provider.reset()
        self._batcher._apply_state(state)
        self._state = None
        self._ended = bool(state.get("finished", False))

    def close(self) -> None:
        self._stop_thread()
