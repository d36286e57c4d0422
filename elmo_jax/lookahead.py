"""Items computed in a background thread, a bounded number ahead of their consumer.

The one look-ahead of the package: ``Elmo.embed`` prepares the next groups (char ids,
padding) while the devices run the current one, and the training input pipeline
(:class:`elmo_jax.data.prefetch.BatchPipeline`) assembles the next batches while the step
runs.  :func:`ahead` is a generator: the thread starts at the first item asked for, an
exception raised while computing an item is raised at the consumer in its place, and
closing the generator (``close()``, or dropping it) stops the thread: it finishes the item
in hand, at most, and drops what was computed ahead.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterable
from typing import Any

_END = object()


class LookAheadThreadDied(RuntimeError):
    """The thread ended without an item, an end or an error (it cannot, short of the
    interpreter killing it)."""


def ahead(items: Iterable, depth: int, name: str = "elmo-jax-ahead") -> Generator[Any, None, None]:
    """``items``, computed in a thread called ``name`` up to ``depth`` items ahead."""
    out: queue.Queue = queue.Queue(max(1, int(depth)))
    stop = threading.Event()

    def put(entry) -> bool:
        while not stop.is_set():
            try:
                out.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            put((_END, e))
            return
        put((_END, None))

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        while True:
            try:
                item, error = out.get(timeout=1.0)
            except queue.Empty:
                if not thread.is_alive() and out.empty():
                    raise LookAheadThreadDied(f"the {name} thread stopped without an item or an error") from None
                continue
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()
