#!/usr/bin/env python
"""What the input checks of a run (stale or swapped inputs) cost at a run's start:

* the content key of local text (:func:`elmo_jax.data.text_source._corpus_key`: SHA-256 of
  every file's bytes, read at each start) on a ``--mb`` MB corpus file;
* opening a token index with and without checking its files' SHA-256 against ``meta.json``
  (:meth:`elmo_jax.data.token_index.TokenIndex.open`), for an index of ``--sentences``
  sentences of the lm1b-like corpus of ``benchmarks/data.py`` (built once, in memory, then
  written by :func:`~elmo_jax.data.token_index.build_token_index`).

    python benchmarks/digests.py --mb 100 --sentences 1000000 --repeats 3

Each time is the median of ``--repeats`` runs with the files in the page cache (a start
right after the preparation; a cold cache adds the disk's read time, which the batches
would pay anyway on first use).  Prints one line per measurement and the 1-minute load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def median_s(fn, repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of ``fn()`` (CPU time: what a loaded machine does not change)."""
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=100, help="size of the text file hashed for the content key")
    p.add_argument("--sentences", type=int, default=1_000_000, help="sentences of the token index")
    p.add_argument("--types", type=int, default=200_000, help="word forms of the generated corpus")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)

    from data import write_corpus
    from elmo_jax.data.text_source import InMemorySource, _corpus_key
    from elmo_jax.data.token_index import TokenIndex, build_token_index

    print(f"load1 {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "big.txt")
        line = ("the quick brown fox jumps over the lazy dog " * 3).strip() + "\n"
        with open(text, "w", encoding="utf-8") as f:
            for _ in range(args.mb * (1 << 20) // len(line)):
                f.write(line)
        size = os.path.getsize(text)
        _corpus_key([text])  # into the page cache
        s, cpu = median_s(lambda: _corpus_key([text]), args.repeats)
        print(
            f"content key of {size / 1e6:.0f} MB of text: {s:.3f} s wall ({size / 1e6 / s:.0f} MB/s), "
            f"{cpu:.3f} CPU-s ({size / 1e6 / cpu:.0f} MB per CPU-s)"
        )
        os.remove(text)

        corpus = os.path.join(tmp, "corpus.txt")
        write_corpus(corpus, args.sentences, args.types)
        with open(corpus, encoding="utf-8") as f:
            source = InMemorySource(f)
        folder = os.path.join(tmp, "index")
        t0 = time.perf_counter()
        build_token_index(source, folder)
        build_s = time.perf_counter() - t0
        del source
        files = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
        plain, _ = median_s(lambda: TokenIndex.open(folder, verify=False), args.repeats)
        checked, cpu = median_s(lambda: TokenIndex.open(folder), args.repeats)
        print(
            f"token index of {args.sentences:,} sentences ({files / 1e6:.0f} MB of files; built in {build_s:.1f} s): "
            f"open {plain * 1e3:.1f} ms unchecked, {checked * 1e3:.0f} ms wall / {cpu * 1e3:.0f} CPU-ms with the "
            f"SHA-256 check ({files / 1e6 / cpu:.0f} MB per CPU-s)"
        )
    print(f"load1 {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
