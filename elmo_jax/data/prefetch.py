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

Workers and faults (:mod:`elmo_jax.data.workers`): workers ignore SIGINT (the training
process handles a Ctrl-C: it saves a checkpoint, which needs no worker, and closes them),
die on SIGTERM and die with their owner, even one killed by ``kill -9``.  A worker that dies
(killed, out of memory) is replaced: the pool is started again and every chunk not yet
received is requested again from the same sentence positions, so the batches stay exactly
those of an uninterrupted run; the log says so.  Workers that die again before any chunk
arrives (``MAX_REPLACEMENTS`` times in a row) end in :class:`DataWorkerError`.
:meth:`LMBatcher.close` stops the thread and the pool in bounded time (it never waits
on a dead or stuck worker).  An exception in a worker is raised in the consumer's
``next`` as :class:`DataWorkerError` with the worker's traceback.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

from elmo_jax.data.workers import (
    DataWorkerError,
    describe_dead,
    pool_failure,
    start_pool,
    stop_pool,
    worker_statuses,
)
from elmo_jax.errors import ElmoError
from elmo_jax.lookahead import LookAheadThreadDied, ahead

__all__ = ["BatchPipeline", "DataWorkerError", "MAX_REPLACEMENTS", "WorkerChunks"]

MAX_REPLACEMENTS = 3  # pools started again in a row, no chunk arriving in between, before giving up


# -- worker process side ------------------------------------------------------------------
# One encoder per worker process, set by the pool's initializer (a process-wide value by
# necessity: ProcessPoolExecutor calls module-level functions).
_WORKER_ENCODER: Callable[[np.ndarray, bool], Any] | None = None


def _worker_init(encoder) -> None:
    global _WORKER_ENCODER
    _WORKER_ENCODER = encoder


def _worker_encode(positions: np.ndarray, reverse: bool):
    assert _WORKER_ENCODER is not None  # the pool's initializer ran first
    return _WORKER_ENCODER(positions, reverse)


def _describe(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    remote = getattr(error.__cause__, "tb", None)  # concurrent.futures' _RemoteTraceback
    return f"{text}\n{remote.strip()}" if remote else text


# -- main process side --------------------------------------------------------------------
def _stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class WorkerChunks:
    """Chunk provider: encodes chunks in ``workers`` processes (started on first use).

    ``get(key, positions, reverse)`` returns the chunk (waiting for it);
    ``prefetch(...)`` requests one ahead.  ``lookahead`` is how many chunks a stream asks
    for ahead of the one it reads.  ``log`` gets the line saying a dead worker was
    replaced (default: stderr).
    """

    def __init__(self, encoder, workers: int, log: Callable[[str], None] | None = None):
        self._encoder = encoder
        self.workers = int(workers)
        self.lookahead = 2 * self.workers + 1
        self._log = log or _stderr_log
        self._pool: ProcessPoolExecutor | None = None
        self._pending: dict[tuple, tuple[Future | None, np.ndarray, bool]] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._failures = 0  # pools that broke since a chunk last arrived
        self.replacements = 0  # pools started again after a worker died, in all

    def _submit(self, positions: np.ndarray, reverse: bool) -> Future | None:
        """The chunk's future; None when the pool is broken (``get`` replaces it)."""
        with self._lock:
            if self._closed.is_set():
                raise DataWorkerError("the data workers were closed")
            if self._pool is None:
                self._pool = start_pool(self.workers, _worker_init, (self._encoder,))
            try:
                return self._pool.submit(_worker_encode, positions, reverse)
            except (BrokenProcessPool, OSError):  # a worker died (OSError: while it was being started)
                return None

    def prefetch(self, key, positions, reverse: bool) -> None:
        if key not in self._pending:
            positions = np.asarray(positions, dtype=np.int64)
            self._pending[key] = (self._submit(positions, bool(reverse)), positions, bool(reverse))

    def get(self, key, positions, reverse: bool):
        entry = self._pending.pop(key, None)
        if entry is None:
            positions, reverse = np.asarray(positions, dtype=np.int64), bool(reverse)
            entry = (self._submit(positions, reverse), positions, reverse)
        future, positions, reverse = entry
        while True:
            error: BaseException | None = None
            if future is not None:
                try:
                    chunk = self._result(future)
                    self._failures = 0
                    return chunk
                except (BrokenProcessPool, CancelledError) as e:
                    error = e
                except DataWorkerError:
                    raise
                except Exception as e:  # noqa: BLE001 - re-raised with the worker's traceback
                    raise DataWorkerError(
                        f"a data worker failed while reading/encoding sentences: {_describe(e)}"
                    ) from e
            self._replace_pool(error)
            future = self._submit(positions, reverse)

    def _result(self, future: Future):
        """``future.result()``, but a close from another thread ends the wait."""
        while True:
            if self._closed.is_set():
                raise DataWorkerError("the data workers were closed")
            try:
                return future.result(timeout=0.2)
            except TimeoutError:
                continue

    def _replace_pool(self, error: BaseException | None) -> None:
        """A worker died: start the pool again and ask again for every chunk not received,
        from the same positions (the batches do not change); or raise when that keeps failing."""
        with self._lock:
            if self._closed.is_set():
                raise DataWorkerError("the data workers were closed")
            pool, self._pool = self._pool, None
            statuses: list[tuple[int, int | None]] = worker_statuses(pool) if pool is not None else []
            failure = (
                pool_failure(pool, error or BrokenProcessPool("the pool is broken"), "data")
                if pool is not None
                else DataWorkerError("the data worker pool is gone")
            )
            stop_pool(pool, now=True)
        self._failures += 1
        if failure.reimported or self._failures > MAX_REPLACEMENTS:
            raise failure
        self.replacements += 1
        again = 1  # the chunk asked for, submitted by get
        for key, (future, positions, reverse) in list(self._pending.items()):
            if future is None or not future.done() or future.cancelled() or future.exception() is not None:
                if future is not None:
                    future.cancel()
                self._pending[key] = (self._submit(positions, reverse), positions, reverse)
                again += 1
        self._log(
            f"data {describe_dead(statuses)}: started {self.workers} new data worker processes, which "
            f"encode the {again} chunks not yet received again, from the same sentence positions "
            f"(the batches are unchanged)"
        )

    def reset(self) -> None:
        """Forget chunks requested ahead (the batcher jumped to another position)."""
        for future, _, _ in self._pending.values():
            if future is not None:
                future.cancel()
        self._pending.clear()

    def close(self) -> None:
        """Stop the workers (bounded: never waits on a dead or stuck one); a ``get`` waiting
        in another thread raises at once, so close this before joining that thread.  Idempotent."""
        self._closed.set()
        with self._lock:
            pool, self._pool = self._pool, None
        stop_pool(pool)


class BatchPipeline:
    """Builds ``batcher``'s batches in a background thread (:func:`elmo_jax.lookahead.ahead`),
    ``depth`` ahead of ``next``.

    The thread is the only user of the batcher's streams while it runs; ``set_state`` stops
    it first.  It starts on the first ``next``.
    """

    def __init__(self, batcher, depth: int):
        self._batcher = batcher
        self._depth = max(1, int(depth))
        self._state = None  # snapshot after the last batch handed out; None: ask the batcher
        self._built: Generator | None = None  # (batch, snapshot after it) pairs, from the thread
        self._ended = False

    # -- thread ------------------------------------------------------------------------
    def _batches(self) -> Iterator:
        """Runs in the thread: each batch with the batcher's state right after it, then
        ``(None, final state)`` at the end of the data."""
        b = self._batcher
        while True:
            try:
                batch = b._build_next()
            except StopIteration:
                yield None, b._snapshot()
                return
            yield batch, b._snapshot()

    def _stop_thread(self) -> None:
        if self._built is not None:
            self._built.close()  # the thread stops; what it built ahead is dropped
            self._built = None

    # -- consumer side -----------------------------------------------------------------
    def next(self) -> dict:
        if self._ended:
            raise StopIteration
        if self._built is None:
            if self._state is None:
                self._state = self._batcher._snapshot()
            self._built = ahead(self._batches(), self._depth, name="elmo-jax-batches")
        try:
            batch, state = next(self._built)
        except ElmoError:
            self._stop_thread()
            raise
        except LookAheadThreadDied as e:
            self._stop_thread()
            raise DataWorkerError("the batch-assembly thread stopped without a batch or an error") from e
        except Exception as e:  # the thread's error, named (a Ctrl-C / SIGTERM in this thread passes)
            self._stop_thread()
            raise DataWorkerError(f"building a batch failed: {_describe(e)}") from e
        self._state = state
        if batch is None:
            self._stop_thread()
            self._ended = True
            raise StopIteration
        return batch

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
