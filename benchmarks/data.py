#!/usr/bin/env python
"""Host-side input pipeline benchmark: preparation, vocabulary, batches per second
per worker count, time the training loop waits for data, peak memory per worker.

    python benchmarks/data.py                              # 100k sentences, workers 0,1,2
    python benchmarks/data.py --sentences 300000 --workers 0,2,4 --repeats 5 --out data.json

The corpus is generated: lm1b-like sentence lengths (mean ~28 words, gamma-distributed),
words drawn from a Zipf law (exponent 1.2) over ``--types`` word forms, written as one
tokenized sentence per line.  It is then prepared into ArrayRecord exactly as training does
(:class:`elmo_jax.data.text_source.LocalTextSource`, afresh per ``--prepare-workers`` count and
repeat: 0 is the TFDS builder in one process, N >= 1 byte ranges in N processes writing the
shards directly; wall and CPU seconds, the workers' included), its token index is built
(:func:`elmo_jax.data.token_index.build_token_index`, afresh per ``--index-workers`` count and
repeat), the vocabulary is built from the index's counts, and batches are drawn from the
index (what training reads) and, for comparison, from the prepared source itself.

positions/s per direction = batches x B x T / seconds (each batch holds B x T positions of
each direction).  ``--baseline COMMIT`` (default 7058beb, the per-row implementation) loads
that commit's ``elmo_jax/data/batches.py`` with ``git show`` and measures it in the same
run.  Each measurement is repeated ``--repeats`` times; the median is printed (the machine
may be shared: the load average is printed too).

Waiting: a loop of ``next(batcher)`` then a simulated step (``time.sleep``, which like a
device step leaves the CPU to the workers; 0 = no step); ``wait %`` is the time spent in
``next`` over the loop's total time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
from machine import cpu_summary, machine_info  # noqa: E402  (benchmarks/, this script's folder)


def write_corpus(path: str, n_sentences: int, n_types: int, seed: int = 0) -> dict:
    """An lm1b-like corpus: Zipf-distributed words over ``n_types`` forms, one sentence a line."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    forms = ["".join(rng.choice(letters, rng.integers(2, 10))) + str(i) for i in range(n_types)]
    lengths = np.clip(rng.gamma(3.0, 9.0, n_sentences).astype(np.int64) + 1, 1, 200)
    ranks = np.minimum(rng.zipf(1.2, int(lengths.sum())), n_types) - 1
    words = 0
    with open(path, "w", encoding="utf-8") as f:
        at = 0
        for n in lengths.tolist():
            f.write(" ".join(forms[r] for r in ranks[at : at + n].tolist()))
            f.write("\n")
            at += n
        words = at
    return {"sentences": n_sentences, "words": int(words), "types_used": int(len(np.unique(ranks)))}


def load_baseline(commit: str):
    """``elmo_jax/data/batches.py`` of ``commit`` as a module (None without git)."""
    try:
        code = subprocess.run(
            ["git", "-C", REPO, "show", f"{commit}:elmo_jax/data/batches.py"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = os.path.join(tempfile.mkdtemp(), f"batches_{commit}.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(code)
    spec = importlib.util.spec_from_file_location(f"batches_{commit}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def peak_rss_mib(pid: int) -> float | None:
    """Peak resident memory (VmHWM) of ``pid`` less its file-backed pages now (RssFile: the
    memory-mapped index, page cache shared by every process), in MiB."""
    fields = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "RssFile"):
                    fields[key] = int(value.split()[0]) / 1024
    except OSError:
        return None
    return fields["VmHWM"] - fields.get("RssFile", 0.0) if "VmHWM" in fields else None


def worker_pids(batcher) -> list[int]:
    pool = getattr(getattr(batcher, "_provider", None), "_pool", None)
    return sorted(getattr(pool, "_processes", {}) or {})


def batches_per_second(make, batch_size: int, unroll: int, seconds: float) -> tuple[float, float, list[float]]:
    """positions/s per direction after a warm-up batch (wall clock, and per CPU-second of
    this process, which for workers=0 is the per-core cost whatever else runs on the
    machine); peak RSS (MiB) of the workers."""
    batcher = make()
    try:
        next(batcher)  # starts workers, fills the first chunks
        n, t0, c0 = 0, time.perf_counter(), time.process_time()
        while True:
            next(batcher)
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds and n >= 3:
                break
        cpu = time.process_time() - c0
        rss = [peak_rss_mib(p) for p in worker_pids(batcher)]
    finally:
        close = getattr(batcher, "close", None)
        if close:
            close()
    positions = n * batch_size * unroll
    return positions / elapsed, positions / max(cpu, 1e-9), [r for r in rss if r is not None]


def waiting_fraction(make, step_s: float, steps: int) -> float:
    batcher = make()
    try:
        next(batcher)
        time.sleep(0.5)  # let the pipeline fill, as the first compiled step would
        waited, t0 = 0.0, time.perf_counter()
        for _ in range(steps):
            a = time.perf_counter()
            next(batcher)
            waited += time.perf_counter() - a
            if step_s:
                time.sleep(step_s)
        total = time.perf_counter() - t0
    finally:
        close = getattr(batcher, "close", None)
        if close:
            close()
    return waited / total


def measure_prepare(open_text, corpus: str, tmp: str, args) -> tuple:
    """Prepare ``corpus`` afresh ``args.repeats`` times per worker count of
    ``args.prepare_workers`` (interleaved, so that load changes hit every count alike);
    wall and CPU seconds (this process + the workers), medians.  Returns the source
    prepared with the first count and the rows."""
    counts = [int(w) for w in args.prepare_workers.split(",") if w]
    runs = {w: [] for w in counts}
    source = None
    for _ in range(args.repeats):
        for w in counts:
            data_dir = os.path.join(tmp, f"tfds_{time.time_ns()}")  # always a fresh preparation
            t, c = time.perf_counter(), time.process_time()
            src = open_text(corpus, data_dir, workers=w)
            wall = time.perf_counter() - t
            cpu = time.process_time() - c + src.info.get("worker_cpu_s", 0.0)
            runs[w].append((wall, cpu, os.getloadavg()[0]))
            if source is None and w == counts[0]:
                source = src
            print(
                f"prepare workers={w}: {wall:.2f} s wall, {cpu:.2f} CPU-s "
                f"({1e6 * wall / args.sentences:.1f} us/sentence), load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    rows = []
    base = statistics.median(r[0] for r in runs[counts[0]])
    base_cpu = statistics.median(r[1] for r in runs[counts[0]])
    for w in counts:
        wall = statistics.median(r[0] for r in runs[w])
        cpu = statistics.median(r[1] for r in runs[w])
        rows.append(
            {
                "workers": w,
                "wall_s": wall,
                "cpu_s": cpu,
                "all_wall_s": [r[0] for r in runs[w]],
                "us_per_sentence": 1e6 * wall / args.sentences,
                "cpu_us_per_sentence": 1e6 * cpu / args.sentences,
                "speedup": base / wall,
                "cpu_speedup": base_cpu / cpu,
                "loads": [r[2] for r in runs[w]],
            }
        )
        print(
            f"prepare workers={w}: median {wall:.2f} s ({rows[-1]['us_per_sentence']:.1f} us/sentence, "
            f"{base / wall:.2f}x workers={counts[0]}); {cpu:.2f} CPU-s "
            f"({rows[-1]['cpu_us_per_sentence']:.1f} CPU-us/sentence, {base_cpu / cpu:.2f}x less CPU); "
            f"runs {', '.join(f'{r[0]:.2f}' for r in runs[w])}",
            flush=True,
        )
    return source, rows


def measure_index(source, tmp: str, args) -> tuple:
    """Build the token index of ``source`` afresh ``args.repeats`` times per worker count of
    ``args.index_workers`` (interleaved); wall seconds (medians), and this process's CPU
    seconds for the in-process build.  Returns the index built last and the rows."""
    from elmo_jax.data.token_index import build_token_index

    counts = [int(w) for w in args.index_workers.split(",") if w]
    runs = {w: [] for w in counts}
    index = None
    for _ in range(args.repeats):
        for w in counts:
            folder = os.path.join(tmp, f"index_{time.time_ns()}")
            t, c = time.perf_counter(), time.process_time()
            index = build_token_index(source, folder, workers=w)
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            runs[w].append((wall, cpu))
            print(
                f"index workers={w}: {wall:.2f} s wall, {cpu:.2f} CPU-s in this process, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    rows = []
    for w in counts:
        wall = statistics.median(r[0] for r in runs[w])
        cpu = statistics.median(r[1] for r in runs[w])
        rows.append(
            {
                "workers": w,
                "wall_s": wall,
                "main_cpu_s": cpu,
                "all_wall_s": [r[0] for r in runs[w]],
                "us_per_sentence": 1e6 * wall / len(source),
                "speedup": statistics.median(r[0] for r in runs[counts[0]]) / wall,
            }
        )
        print(
            f"index workers={w}: median {wall:.2f} s ({rows[-1]['us_per_sentence']:.1f} us/sentence, "
            f"{rows[-1]['speedup']:.2f}x workers={counts[0]}), this process {cpu:.2f} CPU-s; "
            f"runs {', '.join(f'{r[0]:.2f}' for r in runs[w])}",
            flush=True,
        )
    return index, rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sentences", type=int, default=100_000)
    p.add_argument("--types", type=int, default=168_000)
    p.add_argument("--workers", default="0,1,2", help="worker counts to measure")
    p.add_argument("--batch-sizes", default="128,1024", help="'' skips the batches/s rows")
    p.add_argument("--unroll", type=int, default=20)
    p.add_argument("--seconds", type=float, default=3.0, help="per batches/s measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--prepare-workers",
        default="0,1,2",
        help="worker counts preparing the corpus (0: the TFDS builder in this process)",
    )
    p.add_argument("--index-workers", default="0,2", help="worker counts building the token index (0: in this process)")
    p.add_argument(
        "--source-batches",
        default="0,2",
        help="worker counts also measured reading the prepared source instead of the index ('' skips)",
    )
    p.add_argument("--step-ms", default="0,5,23", help="simulated step times for the waiting measurement")
    p.add_argument("--wait-batch", type=int, default=1024)
    p.add_argument("--baseline", default="7058beb", help="commit whose batcher is measured too ('' to skip)")
    p.add_argument("--tmp", default=None, help="folder for the corpus and prepared data (default: a temp dir)")
    p.add_argument("--out", default=None, help="JSON results")
    args = p.parse_args(argv)

    from elmo_jax.data.batches import LMBatcher
    from elmo_jax.data.text_source import LocalTextSource
    from elmo_jax.data.vocab import Vocabulary

    tmp = args.tmp or tempfile.mkdtemp(prefix="elmo_data_bench_")
    os.makedirs(tmp, exist_ok=True)
    results: dict = {
        "args": vars(args),
        "cpus": os.cpu_count(),
        "machine": machine_info(),
        "load_before": os.getloadavg(),
    }
    print(
        f"machine: {cpu_summary(results['machine'])}, {results['machine']['cpus_available']} CPUs available, "
        f"load {' '.join(f'{x:.1f}' for x in results['load_before'])}",
        flush=True,
    )
    corpus = os.path.join(tmp, f"corpus_{args.sentences}.txt")
    t = time.perf_counter()
    results["corpus"] = write_corpus(corpus, args.sentences, args.types)
    print(f"corpus: {results['corpus']} in {time.perf_counter() - t:.1f} s -> {corpus}", flush=True)

    source, results["prepare"] = measure_prepare(LocalTextSource, corpus, tmp, args)

    index, results["index"] = measure_index(source, tmp, args)
    t = time.perf_counter()
    vocab = Vocabulary.build(index.counts())
    vocab_s = time.perf_counter() - t
    results["vocab_s"] = vocab_s
    print(f"vocabulary from the index's counts: {vocab_s:.2f} s ({len(vocab)} tokens)", flush=True)

    baseline = load_baseline(args.baseline) if args.baseline else None
    rows = []
    kinds = (
        ([("baseline", None)] if baseline else [])
        + [("source", w) for w in map(int, filter(None, args.source_batches.split(",")))]
        + [("index", w) for w in map(int, args.workers.split(","))]
    )

    def label_of(kind, workers):
        if kind == "baseline":
            return f"{args.baseline} (before)"
        return f"{kind} workers={workers}"

    for B in [int(x) for x in args.batch_sizes.split(",") if x]:
        for kind, workers in kinds:

            def make(B=B, kind=kind, workers=workers):
                if kind == "baseline":
                    return baseline.LMBatcher(source, vocab, B, args.unroll)
                return LMBatcher(index if kind == "index" else source, vocab, B, args.unroll, workers=workers)

            speeds, cpu_speeds, rss = [], [], []
            for _ in range(args.repeats):
                s, c, r = batches_per_second(make, B, args.unroll, args.seconds)
                speeds.append(s)
                cpu_speeds.append(c)
                rss += r
            label = label_of(kind, workers)
            row = {
                "B": B,
                "impl": label,
                "positions_per_s_dir": statistics.median(speeds),
                "all": speeds,
                "positions_per_cpu_s_dir": statistics.median(cpu_speeds),
                "worker_peak_rss_mib": max(rss) if rss else None,
                "load": os.getloadavg(),
            }
            rows.append(row)
            print(
                f"B={B:5d} {label:20s} {row['positions_per_s_dir']:>12,.0f} positions/s per direction "
                f"(runs {', '.join(f'{x:,.0f}' for x in speeds)})"
                + (
                    f"; {row['positions_per_cpu_s_dir']:,.0f} per CPU-second of this process"
                    if workers in (None, 0)
                    else ""
                )
                + (f", worker peak RSS less mapped files {row['worker_peak_rss_mib']:.0f} MiB" if rss else "")
                + f", load {row['load'][0]:.1f}",
                flush=True,
            )
    results["batches"] = rows

    waits = []
    for kind, workers in kinds:
        for step_ms in [float(x) for x in args.step_ms.split(",") if x]:

            def make(kind=kind, workers=workers):
                if kind == "baseline":
                    return baseline.LMBatcher(source, vocab, args.wait_batch, args.unroll)
                return LMBatcher(
                    index if kind == "index" else source, vocab, args.wait_batch, args.unroll, workers=workers
                )

            steps = 30 if step_ms else 60
            fracs = [waiting_fraction(make, step_ms / 1000, steps) for _ in range(args.repeats)]
            label = label_of(kind, workers)
            waits.append(
                {
                    "impl": label,
                    "B": args.wait_batch,
                    "step_ms": step_ms,
                    "wait_fraction": statistics.median(fracs),
                    "all": fracs,
                }
            )
            print(
                f"wait B={args.wait_batch} step {step_ms:4.0f} ms {label:18s} "
                f"{100 * statistics.median(fracs):5.1f} % of the loop time in next()",
                flush=True,
            )
    results["waiting"] = waits
    results["main_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results["load_after"] = os.getloadavg()
    print(f"main process peak RSS {results['main_peak_rss_mib']:.0f} MiB; load {results['load_after']}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
