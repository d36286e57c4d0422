"""Token counts of a sentence source, in parallel processes, for :meth:`Vocabulary.build`.

The source is split into ``workers`` contiguous index ranges; each process counts its range
and the counts are merged in range order.  A ``Counter`` keeps first-insertion order, so the
merged mapping lists tokens in their order of first occurrence in the whole source, exactly
as one pass over it would: :meth:`Vocabulary.build` (descending count, ties by first
occurrence) then gives the same vocabulary.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

__all__ = ["count_tokens"]

_READ = 4096  # sentences per get_batch


def _count_range(source, start: int, stop: int) -> Counter:
    counts: Counter = Counter()
    for at in range(start, stop, _READ):
        for tokens in source.get_batch(range(at, min(at + _READ, stop))):
            counts.update(tokens)
    return counts


def count_tokens(source, workers: int = 0) -> Counter:
    """``token -> count`` over all sentences of ``source`` (first-occurrence order).

    ``workers=0`` counts in this process; ``N >= 1`` in ``N`` worker processes (the source
    must pickle, as the sources of :mod:`elmo_jax.data.text_source` do).
    """
    n = len(source)
    if workers <= 0 or n < 2 * _READ:
        return _count_range(source, 0, n)
    from elmo_jax.data.prefetch import DataWorkerError, _context

    parts = min(workers, -(-n // _READ))
    bounds = [n * i // parts for i in range(parts + 1)]
    with ProcessPoolExecutor(parts, mp_context=_context()) as pool:
        futures = [pool.submit(_count_range, source, a, b) for a, b in zip(bounds, bounds[1:])]
        total: Counter = Counter()
        for future in futures:  # in range order: first occurrences stay first
            try:
                total.update(future.result())
            except BrokenProcessPool as e:
                raise DataWorkerError(f"a token counting worker process died ({e}). Out of memory? Try fewer "
                                      f"data_workers") from None
    return total
