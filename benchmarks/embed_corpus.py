"""``elmo-jax embed`` at corpus scale: peak memory while streaming, and the output layouts.

    python benchmarks/embed_corpus.py rss --lines 10000,1000000 [--model micro]   # the CLI, a random model
    python benchmarks/embed_corpus.py layouts --sentences 1000000       # synthetic arrays, same writers

``rss``: writes an input of N short sentences (3-12 random words), runs
``elmo-jax embed IN OUT --top --preset tiny --format F`` in a fresh process and reports its
peak resident memory (``ru_maxrss`` from ``wait4``), seconds and the command's own summary
line.  Memory should not grow with N (it holds a group of ``--group-lines`` lines).

``layouts``: embedding a million sentences with a model is slow on a small CPU, so this
writes synthetic float32 arrays of the tiny model's top-layer shape (``[n, 64]``, n = 3-12)
through the writer code ``elmo-jax embed`` uses (:mod:`elmo_jax.embedding.embed_layouts`: a group of
2048 sentences per open/append/close + fsync, as the command checkpoints), then reads 2000
random sentences back through :func:`elmo_jax.read_embeddings` (page cache warm: the file
was just written).  Reports write seconds, file size, opening time and the mean time per
random read, per layout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = [
    "the",
    "bank",
    "river",
    "money",
    "she",
    "went",
    "to",
    "a",
    "of",
    "deposit",
    "walked",
    "along",
    "water",
    "city",
    "north",
    "today",
    "said",
    "that",
    "was",
    "it",
]


def write_input(path: str, n: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    tokens = 0
    with open(path, "w", encoding="utf-8") as f:
        for start in range(0, n, 100_000):
            k = min(100_000, n - start)
            lengths = rng.integers(3, 13, size=k)
            words = rng.integers(0, len(WORDS), size=int(lengths.sum()))
            pos = 0
            for length in lengths:
                f.write(" ".join(WORDS[w] for w in words[pos : pos + length]) + "\n")
                pos += length
            tokens += int(lengths.sum())
    return tokens


def micro_model(folder: str) -> str:
    """A random model far smaller than ``tiny`` (LSTM 16 / projection 8, two small filters):
    the memory of streaming does not depend on the model, and it embeds a million lines in
    minutes rather than hours on a loaded 2-core machine."""
    from elmo_jax import Elmo, ElmoConfig

    path = os.path.join(folder, "micro-model")
    if not os.path.exists(path):
        config = ElmoConfig.preset("tiny").replace(
            dim=16,
            projection_dim=8,
            embedding_dim=4,
            filters=[[1, 8], [2, 8]],
            n_highway=1,
            max_characters_per_token=12,
        )
        Elmo.random(config, seed=0).save(path)
    return path


def rss(args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for n in [int(x) for x in args.lines.split(",")]:
            src = os.path.join(tmp, f"in{n}.txt")
            write_input(src, n)
            out = os.path.join(tmp, f"out{n}.hdf5")
            model = ["--preset", "tiny"] if args.model == "tiny" else ["--model", micro_model(tmp)]
            cmd = [
                sys.executable,
                "-m",
                "elmo_jax.cli",
                "embed",
                src,
                out,
                "--top",
                *model,
                "--format",
                args.format,
                "--no-progress",
                "--group-lines",
                str(args.group_lines),
            ]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
            start = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            output = proc.stdout.read()
            _, status, usage = os.wait4(proc.pid, 0)
            seconds = time.perf_counter() - start
            if status != 0:
                raise SystemExit(f"embed failed ({status}):\n{output}")
            row = {
                "lines": n,
                "format": args.format,
                "model": args.model,
                "peak_rss_mib": usage.ru_maxrss / 1024,
                "seconds": seconds,
                "output_mib": os.path.getsize(out) / 2**20,
                "summary": output.strip().splitlines()[-1],
                "load": os.getloadavg(),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
            os.remove(out)
            os.remove(src)
    return rows


def layouts(args) -> list[dict]:
    from elmo_jax import read_embeddings
    from elmo_jax.embedding import embed_layouts
    from elmo_jax.embedding.embed_state import fsync_path

    rng = np.random.default_rng(0)
    n, group, dim = args.sentences, 2048, 64
    lengths = rng.integers(3, 13, size=n)
    pool = rng.standard_normal((group * 12, dim)).astype(np.float32)  # the arrays' values: slices of one pool
    texts = ["w " * int(k) for k in lengths]
    rows = []
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for layout in args.layouts.split(","):
            path = os.path.join(tmp, f"{layout}.hdf5")
            run = {"benchmark": True, "shard": {"first_line": 0}}
            start = time.perf_counter()
            with embed_layouts.open_h5(path, "w") as f:
                embed_layouts.create(f, layout, "top", 3, dim, run)
            for first in range(0, n, group):
                ls = lengths[first : first + group]
                pos = np.concatenate([[0], np.cumsum(ls)])
                if layout == "sentence_vectors":
                    arrays = [pool[i] for i in range(len(ls))]
                else:
                    arrays = [pool[pos[i] : pos[i + 1]] for i in range(len(ls))]
                with embed_layouts.open_h5(path, "r+") as f:
                    embed_layouts.append(f, first, arrays, texts[first : first + group])
                fsync_path(path)
            with embed_layouts.open_h5(path, "r+") as f:
                embed_layouts.finish(f, enumerate(texts))
            fsync_path(path)
            write_s = time.perf_counter() - start
            start = time.perf_counter()
            emb = read_embeddings(path)
            open_s = time.perf_counter() - start
            picks = rng.integers(0, n, size=2000)
            start = time.perf_counter()
            for i in picks:
                emb[int(i)]
            read_ms = (time.perf_counter() - start) / len(picks) * 1e3
            emb.close()
            row = {
                "layout": layout,
                "sentences": n,
                "tokens": int(lengths.sum()),
                "write_s": write_s,
                "file_mib": os.path.getsize(path) / 2**20,
                "open_s": open_s,
                "random_read_ms": read_ms,
                "load": os.getloadavg(),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
            os.remove(path)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("rss")
    r.add_argument("--lines", default="10000,1000000")
    r.add_argument("--format", default="packed", choices=("allennlp", "packed"))
    r.add_argument("--group-lines", type=int, default=2048)
    r.add_argument(
        "--model",
        default="tiny",
        choices=("tiny", "micro"),
        help="the tiny preset, or a micro model (LSTM 16, projection 8) for 1M lines on a small CPU",
    )
    l = sub.add_parser("layouts")
    l.add_argument("--sentences", type=int, default=1_000_000)
    l.add_argument("--layouts", default="packed,sentence_vectors,allennlp")
    for s in (r, l):
        s.add_argument("--tmp", default=None, help="folder for the inputs and outputs (default: the system's)")
    args = p.parse_args()
    rss(args) if args.what == "rss" else layouts(args)


if __name__ == "__main__":
    main()
