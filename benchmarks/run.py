#!/usr/bin/env python
"""elmo_jax benchmark suite: embedding and training throughput, compile time, peak memory,
FLOP utilisation against a measured matmul peak, and AllenNLP's PyTorch ELMo as the peer on
the same weights and sentences.  See benchmarks/README.md.

    python benchmarks/run.py                # full: small, medium, original (~18 min on 2 cores: run 1 took 1,069 s)
    python benchmarks/run.py --quick        # smoke test: small only, fewer repetitions
    python benchmarks/run.py --presets small,original --out results.json

Every measurement runs in its own subprocess (``worker.py`` for elmo_jax,
``peer_allennlp.py`` in the peer's virtual environment), so compile caches and peak resident
memory belong to one configuration.  The peer environment is built by
``bash ../shared/peers/allennlp-env.sh DIR``; pass ``--peer-env DIR`` (default ``$ELMO_PEER_ENV``
or /work/peer-env).  Without it the suite still runs and says the peer is unavailable.
"""

from __future__ import annotations

import argparse
import glob
import datetime
import json
import shutil
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import flops  # noqa: E402
from machine import cpu_summary, machine_info  # noqa: E402
from elmo_jax.config import ConfigError, ElmoConfig  # noqa: E402  (pure Python, no jax)

EMBED_SHAPES = [(16, 20), (16, 60), (64, 20), (64, 60), (1, 20)]  # (batch, sentence length)
SUBPROCESS_TIMEOUT_S = 1200
# Cap on the repetitions of the matmul-peak and weight-streaming measurements: both run for
# at least 2 s, and on a GPU one repetition takes well under a millisecond (50, the old cap,
# stopped the bandwidth measurement after 12-25 ms on the H200).
MAX_REPS = "5000"
# What each round of a multi-round row keeps (``--rounds``).
ROUND_FIELDS = ("tokens_per_s", "median_s", "times", "load1_before", "load1_after")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_json(cmd: list[str], env: dict | None = None, timeout: float = SUBPROCESS_TIMEOUT_S) -> dict:
    """Run one measurement process; its result is the line starting with ``RESULT ``."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s: {' '.join(cmd[-8:])}"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("RESULT "):
            out = json.loads(line[len("RESULT ") :])
            out["process_wall_s"] = time.perf_counter() - t0
            return out
    tail = (p.stderr or p.stdout)[-2000:]
    return {"error": f"exit {p.returncode}: {tail}"}


def git_describe() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "elmo_jax"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip()
        return head + (" (elmo_jax/ has uncommitted changes)" if dirty else "")
    except OSError:
        return "?"


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def make_sentences(path: str, lengths, n_sentences: int = 64, seed: int = 0) -> None:
    """Random lowercase words (2-9 letters); ``n_sentences`` sentences of each benchmark length.

    The first 64 of each length are the same whatever ``n_sentences`` is (the peer and
    earlier runs measured those).
    """
    rng = np.random.default_rng(seed)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    words = ["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(5000)]
    by_length = {
        str(n): [[words[i] for i in rng.integers(0, len(words), n)] for _ in range(64)] for n in sorted(set(lengths))
    }
    agreement = [[words[i] for i in rng.integers(0, len(words), n)] for n in (1, 7, 20, 13, 33, 2)]
    agreement.append("The bank raised interest rates , so she went to the river bank .".split())
    more = np.random.default_rng(seed + 1)  # a separate stream: the sentences above stay as they were
    for n, sents in by_length.items():
        sents.extend([words[i] for i in more.integers(0, len(words), int(n))] for _ in range(n_sentences - len(sents)))
    with open(path, "w") as f:
        json.dump({"words": words, "by_length": by_length, "agreement": agreement}, f)


def last_level_cache_bytes() -> int | None:
    """Size of CPU 0's largest cache from Linux sysfs (None elsewhere)."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        with open(path) as f:
            text = f.read().strip()
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * mult)
    return max(sizes) if sizes else None


class Suite:
    def __init__(self, args):
        self.args = args
        self.py = sys.executable
        self.worker = os.path.join(HERE, "worker.py")
        self.peer_script = os.path.join(HERE, "peer_allennlp.py")
        self.tmp = tempfile.mkdtemp(prefix="elmo_bench_")
        self.sentences = os.path.join(self.tmp, "sentences.json")
        self.threads = len(os.sched_getaffinity(0))
        if args.quick:
            self.reps = ["--min-reps", "2", "--min-time", "0.3", "--max-reps", "3"]
        else:
            self.reps = ["--min-reps", "3", "--min-time", "3", "--max-reps", "15"]
        self.results: dict = {"notes": []}

    # -- helpers -------------------------------------------------------------------------
    def ours(self, *a: str) -> dict:
        return run_json([self.py, "-W", "ignore", self.worker, *a])

    def peer(self, *a: str) -> dict:
        env = dict(os.environ, PYTHONPATH=os.path.join(self.peer_env, "stub"))
        env.pop("JAX_PLATFORMS", None)
        return run_json(
            [
                os.path.join(self.peer_env, "bin", "python"),
                "-W",
                "ignore",
                self.peer_script,
                *a,
                "--threads",
                str(self.threads),
            ],
            env=env,
        )

    def model_dir(self, preset: str) -> str:
        return os.path.join(self.tmp, preset)

    # -- stages --------------------------------------------------------------------------
    def setup(self) -> None:
        a = self.args
        r = self.results
        r["date"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        r["command"] = " ".join([os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]])
        r["machine"] = machine_info()
        r["git"] = git_describe()
        make_sentences(
            self.sentences, [n for _, n in self.shapes] + [20], n_sentences=max([64] + [b for b, _ in self.shapes])
        )
        r["uptime_start"] = uptime()
        info = self.ours("info")
        if "error" in info:
            raise SystemExit(f"elmo_jax worker failed: {info['error']}")
        r["device"] = info
        log(f"device: {info['platform']} / {info['device_kind']} x{info['n_devices']}; {r['uptime_start']}")
        if self.highest_shapes is None:
            self.highest_shapes = self.bf16_shapes if info["platform"] != "cpu" else []
        # The peer.
        self.peer_env = a.peer_env
        self.peer_ok, self.peer_device = False, "cpu"
        if a.no_peer:
            r["peer"] = {"available": False, "reason": "--no-peer"}
        elif not os.path.exists(os.path.join(self.peer_env, "bin", "python")):
            r["peer"] = {
                "available": False,
                "reason": f"no peer environment at {self.peer_env} "
                f"(build it: bash ../shared/peers/allennlp-env.sh {self.peer_env})",
            }
        else:
            pinfo = self.peer("info")
            if "error" in pinfo:
                r["peer"] = {"available": False, "reason": pinfo["error"][-500:]}
            else:
                self.peer_ok = True
                r["peer"] = {"available": True, **pinfo}
                if info["platform"] != "cpu":
                    if pinfo.get("cuda") and info["platform"] == "gpu":
                        self.peer_device = "cuda"
                    else:
                        self.peer_device = None
                        r["notes"].append(
                            f"peer timing skipped: elmo_jax runs on {info['platform']} "
                            f"and the peer's torch has no matching device (agreement "
                            f"is still checked on CPU)"
                        )
                r["peer"]["device"] = self.peer_device
        if not r["peer"]["available"]:
            log(f"peer unavailable: {r['peer']['reason']}")
            r["notes"].append(f"peer unavailable: {r['peer']['reason']}")
        # Analytic FLOPs.
        r["flops"] = {
            p: flops.breakdown(ElmoConfig.preset(p), a.negatives)
            for p in sorted(set(self.presets) | set(self.train_presets))
        }

    def matmul(self) -> None:
        n = 2048 if self.results["device"]["platform"] == "cpu" else 8192
        log(f"fp32 matmul {n}x{n} @ {n}x{n} ...")
        m = self.ours("matmul", "--n", str(n), "--min-reps", "10", "--min-time", "2", "--max-reps", MAX_REPS)
        self.results["matmul"] = m
        if "error" in m:
            raise SystemExit(f"matmul failed: {m['error']}")
        log(f"  {m['gflops']:.1f} GFLOP/s (median), best {m['best_gflops']:.1f}")
        bw = self.ours("membw", "--n", "512", "--min-reps", "10", "--min-time", "2", "--max-reps", MAX_REPS)
        self.results["membw"] = bw
        if "gb_per_s" in bw:
            log(
                f"  weight-streaming bandwidth (1-row x @ W, W 512 MiB f32): {bw['gb_per_s']:.1f} GB/s; "
                f"device -> host copy (48 MiB): {bw['to_host_gb_per_s']:.1f} GB/s"
                + (" (no copy on the CPU: the host shares the buffer)" if bw.get("platform") == "cpu" else "")
            )

    def save_partial(self) -> None:
        """Write what is measured so far (``OUT.partial``), so a run cut short keeps its rows."""
        tmp = self.args.out + ".partial.tmp"
        with open(tmp, "w") as f:
            json.dump(self.results, f, indent=1)
        os.replace(tmp, self.args.out + ".partial")

    def embed(self) -> None:
        rows = self.results["embed"] = []
        shapes = self.shapes
        peak = self.results["matmul"]["gflops"] * 1e9
        for preset in self.presets:
            cfg = ElmoConfig.preset(preset)
            fpt = flops.embed_flops_per_token(cfg)
            log(f"{preset}: writing random weights (elmo_jax.formats.hdf5.save_weights) ...")
            s = self.ours("save", "--preset", preset, "--model-dir", self.model_dir(preset))
            if "error" in s:
                raise SystemExit(f"save failed: {s['error']}")
            common = ["--model-dir", self.model_dir(preset), "--sentences", self.sentences]
            for batch, length in shapes:
                row = {"preset": preset, "batch": batch, "length": length, "tokens": batch * length}
                shape = ["--batch", str(batch), "--length", str(length)]
                b = self._ours_and_peer(row, common, shape)
                if "tokens_per_s" in b:
                    row["gflops"] = b["tokens_per_s"] * fpt / 1e9
                    row["util"] = b["tokens_per_s"] * fpt / peak
                rows.append(row)
                log("  " + self._embed_line(row))
                variants = []
                if (batch, length) in self.bf16_shapes:
                    variants.append(("bfloat16", "bf16", ["--dtype", "bfloat16"]))
                if (batch, length) in self.highest_shapes:
                    # On NVIDIA GPUs a float32 matmul at the default precision runs in TF32;
                    # this row is full float32 (what the CPU computes anyway).
                    variants.append(("f32hi", "f32 highest", ["--precision", "highest"]))
                for label, name, flags in variants:
                    v = self.ours("embed", "--mode", "bilm", *flags, *common, *shape, *self.reps)
                    rv = {
                        "preset": preset,
                        "batch": batch,
                        "length": length,
                        "tokens": batch * length,
                        "dtype": label,
                        "ours": v,
                    }
                    if "tokens_per_s" in v:
                        rv["gflops"] = v["tokens_per_s"] * fpt / 1e9
                        rv["util"] = v["tokens_per_s"] * fpt / peak
                        rv["speedup_vs_f32"] = v["tokens_per_s"] / b["tokens_per_s"] if "tokens_per_s" in b else None
                        if "tokens_per_s" in row.get("peer", {}):
                            rv["ratio"] = v["tokens_per_s"] / row["peer"]["tokens_per_s"]
                    rows.append(rv)
                    log(f"  {name} " + self._embed_line(rv))
                self.save_partial()
            if not self.args.no_parts:
                p = self.ours("parts", *common, "--batch", "16", "--length", "20", *self.reps)
                self.results.setdefault("parts", {})[preset] = p
                if "error" not in p:
                    log(
                        f"  parts (16x20): encoder {p['encoder_median_s'] * 1e3:.0f} ms, "
                        f"LSTMs {p['lstm_median_s'] * 1e3:.0f} ms"
                    )
            if self.peer_ok:
                self.agree(preset)
            if self.results["device"]["platform"] != "cpu":
                self.agree_device(preset)
        self.results["embed"] = rows

    def _ours_and_peer(self, row: dict, common: list, shape: list) -> dict:
        """Fill ``row`` with ours / embed() / peer for one shape, over ``--rounds`` rounds.

        Each round runs ours and the peer back to back, the order alternating between
        rounds, so that a slow phase of this shared machine falls on both sides.  Reported:
        each side's median tokens/s over the rounds (every round's value is kept), and the
        median of the per-round ratios.
        """
        rounds = []
        for k in range(self.args.rounds):
            got = {}

            def run_ours():
                got["ours"] = self.ours("embed", "--mode", "bilm", *common, *shape, *self.reps)  # noqa: B023 - called below

            def run_peer():
                if self.peer_ok and self.peer_device:
                    got["peer"] = self.peer("embed", *common, *shape, *self.reps, "--device", self.peer_device)  # noqa: B023

            for run in (run_ours, run_peer) if k % 2 == 0 else (run_peer, run_ours):
                run()
            if k == 0 and not self.args.no_e2e:
                got["ours_embed"] = self.ours("embed", "--mode", "embed", *common, *shape, *self.reps)
            rounds.append(got)
        for side in ("ours", "ours_embed", "peer"):
            runs = [g[side] for g in rounds if side in g]
            if not runs:
                continue
            ok = [g for g in runs if "tokens_per_s" in g]
            row[side] = dict(ok[0] if ok else runs[0])  # a failed round 1 must not hide the others
            if ok and len(ok) < len(runs):
                row[side]["failed_rounds"] = [g.get("error") for g in runs if "tokens_per_s" not in g]
            if len(ok) > 1:
                # Every round's timings are kept; the top-level figures are medians over the
                # rounds (tokens / median_s == tokens_per_s for an odd number of rounds).
                row[side]["rounds"] = [{k: g.get(k) for k in ROUND_FIELDS} for g in ok]
                row[side]["round_tokens_per_s"] = [g["tokens_per_s"] for g in ok]
                row[side]["tokens_per_s"] = statistics.median(row[side]["round_tokens_per_s"])
                row[side]["median_s"] = statistics.median(g["median_s"] for g in ok)
                row[side].pop("times", None)  # one round's only; each round's are under "rounds"
        ratios = [
            g["ours"]["tokens_per_s"] / g["peer"]["tokens_per_s"]
            for g in rounds
            if "tokens_per_s" in g.get("ours", {}) and "tokens_per_s" in g.get("peer", {})
        ]
        if ratios:
            row["ratio"] = statistics.median(ratios)
            row["round_ratios"] = ratios
        return row["ours"]

    def agree(self, preset: str) -> None:
        ours = os.path.join(self.tmp, f"agree_ours_{preset}.npz")
        theirs = os.path.join(self.tmp, f"agree_peer_{preset}.npz")
        common = ["--model-dir", self.model_dir(preset), "--sentences", self.sentences]
        a = self.ours("agree", *common, "--out", ours)
        b = self.peer("agree", *common, "--out", theirs)
        if "error" in a or "error" in b:
            res = {"error": a.get("error") or b.get("error")}
        else:
            x, y = np.load(ours), np.load(theirs)
            diffs = np.array(
                [[float(np.max(np.abs(x[k][l] - y[k][l]))) for l in range(x[k].shape[0])] for k in x.files]
            )
            scale = max(float(np.max(np.abs(y[k]))) for k in y.files)
            res = {
                "sentences": len(x.files),
                "max_abs_diff_per_layer": diffs.max(axis=0).tolist(),
                "max_abs_diff_top": float(diffs[:, -1].max()),
                "max_abs_value": scale,
                "shapes_equal": all(x[k].shape == y[k].shape for k in x.files),
            }
        self.results.setdefault("agreement", {})[preset] = res
        log(f"  agreement with the peer ({preset}): {res}")

    def agree_device(self, preset: str) -> None:
        """The accelerator's embeddings against this package's own on the host CPU.

        Same weights and sentences; at the default matmul precision and at 'highest'.  The
        CPU computes float32 matmuls in full float32, so the first difference is what the
        device's default (TF32 on NVIDIA GPUs, bf16 passes on TPUs) costs.
        """
        common = ["--model-dir", self.model_dir(preset), "--sentences", self.sentences]
        paths = {k: os.path.join(self.tmp, f"agree_{k}_{preset}.npz") for k in ("cpu", "default", "highest")}
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        got = {
            "cpu": run_json([self.py, "-W", "ignore", self.worker, "agree", *common, "--out", paths["cpu"]], env=env)
        }
        for k in ("default", "highest"):
            got[k] = self.ours("agree", *common, "--precision", k, "--out", paths[k])
        res: dict = {}
        if any("error" in g for g in got.values()):
            res["error"] = next(g["error"] for g in got.values() if "error" in g)
        else:
            ref = np.load(paths["cpu"])
            scale = max(float(np.max(np.abs(ref[k]))) for k in ref.files)
            for k in ("default", "highest"):
                x = np.load(paths[k])
                diff = np.array(
                    [[float(np.max(np.abs(x[s][l] - ref[s][l]))) for l in range(ref[s].shape[0])] for s in ref.files]
                )
                res[k] = {
                    "max_abs_diff_per_layer": diff.max(axis=0).tolist(),
                    "max_rel_diff": float(diff.max()) / scale,
                }
            res["max_abs_value"] = scale
        self.results.setdefault("agreement_device_vs_cpu", {})[preset] = res
        log(f"  {self.results['device']['platform']} vs CPU ({preset}): {res}")

    def train(self) -> None:
        rows = self.results["train"] = []
        peak = self.results["matmul"]["gflops"] * 1e9
        b, t = (16, 20) if self.args.quick else (self.args.train_batch, 20)
        steps = "2" if self.args.quick else "3"
        dtypes = ["float32"] if self.args.no_bf16_train else ["float32", "bfloat16"]
        for preset in self.train_presets:
            cfg = ElmoConfig.preset(preset)
            fpt = flops.train_flops_per_token(cfg, self.args.negatives)
            for dtype in dtypes:
                log(f"{preset}: training step ({dtype}), batch {b} x unroll {t} ...")
                r = self.ours(
                    "train",
                    "--preset",
                    preset,
                    "--sentences",
                    self.sentences,
                    "--batch",
                    str(b),
                    "--length",
                    str(t),
                    "--steps",
                    steps,
                    "--vocab",
                    str(self.args.vocab),
                    "--negatives",
                    str(self.args.negatives),
                    "--dtype",
                    dtype,
                )
                if "tokens_per_s" in r:
                    r["gflops"] = r["tokens_per_s"] * fpt / 1e9
                    r["util"] = r["tokens_per_s"] * fpt / peak
                    log(
                        f"  {r['tokens_per_s']:.0f} tokens/s, {r['gflops']:.1f} GFLOP/s, "
                        f"compile {r['lower_s'] + r['compile_s']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB"
                    )
                    f32 = next(
                        (
                            x
                            for x in rows
                            if x.get("preset") == preset and x.get("dtype") == "float32" and "losses" in x
                        ),
                        None,
                    )
                    if dtype != "float32" and f32 is not None:
                        # same init, batch and keys: the loss after each step, bf16 against f32
                        r["loss_abs_diff_vs_f32"] = [abs(u - v) for u, v in zip(r["losses"], f32["losses"])]
                        r["speedup_vs_f32"] = r["tokens_per_s"] / f32["tokens_per_s"]
                else:
                    log(f"  failed: {r.get('error', '')[-500:]}")
                rows.append(r)
                self.save_partial()
        self.results["train"] = rows

    def memory(self) -> None:
        rows = self.results["memory"] = []
        preset, remat = self.args.memory_preset, self.args.memory_remat
        for length in self.memory_lengths:
            for k in (0, remat):
                log(f"{preset}: training memory, batch 32 x unroll {length}, remat_steps {k} ...")
                r = self.ours(
                    "train",
                    "--preset",
                    preset,
                    "--sentences",
                    self.sentences,
                    "--batch",
                    "32",
                    "--length",
                    str(length),
                    "--vocab",
                    str(self.args.vocab),
                    "--negatives",
                    str(self.args.negatives),
                    "--remat",
                    str(k),
                    "--compile-only",
                )
                if "error" in r:
                    log(f"  failed: {r['error'][-300:]}")
                else:
                    log(f"  step buffers {r.get('temp_mb', float('nan')):.0f} MiB, compile {r['compile_s']:.1f} s")
                rows.append(r)
                self.save_partial()
        self.results["memory"] = rows

    # -- report ------------------------------------------------------------------------
    @staticmethod
    def _embed_line(row: dict) -> str:
        o = row.get("ours", {})
        if "error" in o:
            return f"{row['preset']} {row['batch']}x{row['length']}: FAILED {o['error'][-300:]}"
        p = row.get("peer", {})
        e = row.get("ours_embed", {})
        return (
            f"{row['preset']} {row['batch']}x{row['length']}: ours {o['tokens_per_s']:.0f} tok/s"
            + (f", embed() {e['tokens_per_s']:.0f}" if "tokens_per_s" in e else "")
            + (f", peer {p['tokens_per_s']:.0f} (x{row['ratio']:.2f})" if "tokens_per_s" in p else "")
            + f", {row['gflops']:.1f} GFLOP/s"
        )

    def report(self) -> str:
        r = self.results
        m = r["machine"]
        d = r["device"]
        lines = []
        lines.append(
            f"date {r['date']} | {cpu_summary(m)}, {m['cpus_available']} CPUs available, "
            f"{m.get('mem_total_gb', '?')} GB | device {d['platform']}/{d['device_kind']} "
            f"x{d['n_devices']} | jax {d['jax']}, jaxlib {d['jaxlib']} | elmo_jax {r['git']}"
            + (
                f" | peer torch {r['peer']['torch']}, allennlp {r['peer']['allennlp']}, "
                f"{r['peer']['torch_threads']} threads on {r['peer'].get('device')}"
                if r["peer"].get("available")
                else " | peer unavailable"
            )
        )
        lines.append(f"load: start [{r['uptime_start']}]  end [{r.get('uptime_end', '')}]")
        mm = r["matmul"]
        lines.append(
            f"fp32 matmul peak (jax, {mm['n']}^3, median of {len(mm['times'])}): "
            f"{mm['gflops']:.1f} GFLOP/s (best {mm['best_gflops']:.1f})"
        )
        lines.append("")
        lines.append("Analytic FLOPs per token (forward; ELMO.md section 4 layout):")
        for p in r["flops"]:
            lines.append("  " + flops.format_breakdown(p, ElmoConfig.preset(p), self.args.negatives))
        lines.append("")
        lines.append(
            "Embedding (tokens/s = real tokens, no markers/padding; 'ours' = jitted bilm on fixed-shape "
            "char ids, 'embed()' = Elmo.embed end to end incl. tokenisation, bucketing and host copy):"
        )
        if self.args.rounds > 1:
            lines.append(
                f"  ({self.args.rounds} rounds of ours and the peer in alternating order: tok/s are medians "
                "over rounds, ours/peer the median of the per-round ratios, shown after the table)"
            )
        hdr = (
            f"{'preset':9s} {'dtype':5s} {'batch':>5s} {'len':>4s} {'ours tok/s':>10s} {'embed()':>8s} {'peer tok/s':>10s} "
            f"{'ours/peer':>9s} {'GFLOP/s':>8s} {'%peak':>6s} {'compile s':>9s} {'1st embed()':>11s} "
            f"{'RSS MB':>7s} {'peer RSS':>8s} {'load1':>5s}"
        )
        lines.append(hdr)
        for row in r.get("embed", []):
            o, e, p = row.get("ours", {}), row.get("ours_embed", {}), row.get("peer", {})
            if "error" in o:
                lines.append(f"{row['preset']:9s} {row['batch']:5d} {row['length']:4d} FAILED: {o['error'][-200:]}")
                continue
            f = lambda x, k, fmt: format(x[k], fmt) if k in x else "-"  # noqa: E731
            lines.append(
                f"{row['preset']:9s} {row.get('dtype', 'f32')[:5]:5s} {row['batch']:5d} {row['length']:4d} {o['tokens_per_s']:10.0f} "
                f"{f(e, 'tokens_per_s', '8.0f'):>8s} {f(p, 'tokens_per_s', '10.0f'):>10s} "
                f"{f(row, 'ratio', '9.2f'):>9s} {row['gflops']:8.1f} {100 * row['util']:6.1f} "
                f"{o['lower_s'] + o['compile_s']:9.2f} {f(e, 'first_call_s', '11.2f'):>11s} "
                f"{o['peak_rss_mb']:7.0f} {f(p, 'peak_rss_mb', '8.0f'):>8s} {o['load1_before']:5.2f}"
            )
        per_round = [row for row in r.get("embed", []) if len(row.get("round_ratios", [])) > 1]
        if per_round:
            lines.append("")
            lines.append("Per round (ours tok/s / peer tok/s = ratio):")
            for row in per_round:
                cells = [
                    f"{o:.0f}/{p:.0f}={q:.2f}"
                    for o, p, q in zip(
                        row["ours"]["round_tokens_per_s"], row["peer"]["round_tokens_per_s"], row["round_ratios"]
                    )
                ]
                lines.append(f"  {row['preset']:9s} {row['batch']:3d}x{row['length']:<3d} " + "  ".join(cells))
        b16 = [row for row in r.get("embed", []) if row.get("dtype") == "bfloat16" and "tokens_per_s" in row["ours"]]
        if b16:
            lines.append("")
            lines.append("bfloat16 compute (f32 params, cell state and accumulation) against float32, same input:")
            for row in b16:
                o = row["ours"]
                lines.append(
                    f"  {row['preset']:9s} {row['batch']:3d}x{row['length']:<3d} speed x{row['speedup_vs_f32']:.2f}, "
                    f"max |bf16 - f32| / max |f32| = {o['max_rel_err_vs_f32']:.2e} (per layer "
                    + ", ".join(f"{e:.3f}" for e in o["max_abs_err_vs_f32_per_layer"])
                    + " of max "
                    + ", ".join(f"{v:.2f}" for v in o["max_abs_f32_per_layer"])
                    + ")"
                )
        bw = r.get("membw", {}).get("gb_per_s")
        singles = [row for row in r.get("embed", []) if row["batch"] == 1 and "tokens_per_s" in row["ours"]]
        if bw and singles:
            lines.append("")
            llc = last_level_cache_bytes()
            lines.append(
                f"Single sentence vs the weight-traffic bound (weight-streaming bandwidth {bw:.1f} GB/s "
                f"measured above; each of the T+2 LSTM steps must read every recurrent weight, the rest "
                f"is read once; last-level cache {llc / 2**20:.0f} MiB):"
                if llc
                else f"Single sentence vs the weight-traffic bound (weight-streaming bandwidth {bw:.1f} GB/s "
                f"measured above; each of the T+2 LSTM steps must read every recurrent weight, the rest "
                f"is read once):"
            )
            for row in singles:
                cfg = ElmoConfig.preset(row["preset"])
                bound = flops.weight_traffic_bound(cfg, row["length"], bw * 1e9, row.get("dtype", "float32"))
                got = row["ours"]["tokens_per_s"]
                line = (
                    f"  {row['preset']:9s} {row.get('dtype', 'float32'):8s} 1x{row['length']}: "
                    f"{got:7.1f} tok/s, bound {bound:7.1f} tok/s ({100 * got / bound:5.1f} % of it)"
                )
                recurrent_mb = flops.recurrent_weight_bytes(cfg) / 2**20
                if llc and recurrent_mb * 2**20 < llc:
                    line += (
                        f"; its recurrent weights ({recurrent_mb:.0f} MiB) fit in the cache, "
                        f"so the memory bound does not apply"
                    )
                lines.append(line)
        if r.get("parts"):
            lines.append("")
            lines.append("Where the time goes (batch 16 x 20 tokens, each part jitted alone, median):")
            for preset, p in r["parts"].items():
                if "error" in p:
                    continue
                full = next(
                    (
                        row["ours"]["median_s"]
                        for row in r["embed"]
                        if row["preset"] == preset
                        and row["batch"] == 16
                        and row["length"] == 20
                        and "median_s" in row["ours"]
                    ),
                    None,
                )
                b = r["flops"][preset]
                n_tok, n_pos = 16 * 20, 16 * 22  # encoded tokens; LSTM positions incl. <S> and </S>
                lines.append(
                    f"  {preset:9s} encoder {p['encoder_median_s'] * 1e3:7.1f} ms "
                    f"({n_tok * b['encoder_total'] / p['encoder_median_s'] / 1e9:6.1f} GFLOP/s), "
                    f"LSTMs {p['lstm_median_s'] * 1e3:7.1f} ms "
                    f"({n_pos * b['lstm_total'] / p['lstm_median_s'] / 1e9:6.1f} GFLOP/s), "
                    f"sum {1e3 * (p['encoder_median_s'] + p['lstm_median_s']):7.1f} ms vs whole bilm "
                    + (f"{full * 1e3:7.1f} ms" if full else "-")
                )
        hi = [row for row in r.get("embed", []) if row.get("dtype") == "f32hi" and "tokens_per_s" in row["ours"]]
        if hi:
            lines.append("")
            lines.append("Full float32 matmuls (precision 'highest') against the default precision, same input:")
            for row in hi:
                lines.append(
                    f"  {row['preset']:9s} {row['batch']:4d}x{row['length']:<3d} "
                    f"{row['ours']['tokens_per_s']:10.0f} tok/s, speed x{row['speedup_vs_f32']:.2f}"
                )
        if r.get("agreement_device_vs_cpu"):
            lines.append("")
            lines.append(
                f"{d['platform']} against this package on the host CPU (same weights and sentences, "
                "all 3 layers; max |device - cpu| / max |cpu|):"
            )
            for preset, a in r["agreement_device_vs_cpu"].items():
                if "error" in a:
                    lines.append(f"  {preset}: FAILED {a['error'][-300:]}")
                else:
                    lines.append(
                        f"  {preset:9s} default precision {a['default']['max_rel_diff']:.1e}, "
                        f"highest {a['highest']['max_rel_diff']:.1e} (max |value| {a['max_abs_value']:.2f})"
                    )
        if r.get("agreement"):
            lines.append("")
            lines.append("Agreement with the peer (same weights, zero state, all 3 layers, markers removed):")
            for preset, a in r["agreement"].items():
                if "error" in a:
                    lines.append(f"  {preset}: FAILED {a['error'][-300:]}")
                else:
                    lines.append(
                        f"  {preset:9s} {a['sentences']} sentences: max |ours - peer| per layer "
                        + ", ".join(f"{v:.2e}" for v in a["max_abs_diff_per_layer"])
                        + f" (max |value| {a['max_abs_value']:.2f}), shapes equal: {a['shapes_equal']}"
                    )
        if r.get("train"):
            lines.append("")
            lines.append(
                f"Training (jitted train_step, adagrad 0.2, clip 10, dropout 0.1, sampled softmax "
                f"{self.args.negatives} of vocab {self.args.vocab}; tokens = batch x unroll per step):"
            )
            lines.append(
                f"{'preset':9s} {'dtype':5s} {'batch x T':>9s} {'step s':>7s} {'tok/s':>7s} {'GFLOP/s':>8s} "
                f"{'%peak':>6s} {'compile s':>9s} {'RSS MB':>7s} {'load1':>5s}"
            )
            for t in r["train"]:
                if "error" in t:
                    lines.append(f"FAILED: {t['error'][-300:]}")
                    continue
                lines.append(
                    f"{t['preset']:9s} {t.get('dtype', 'float32')[:5]:5s} {t['batch']:>4d} x {t['unroll']:<2d} {t['median_s']:7.2f} "
                    f"{t['tokens_per_s']:7.0f} {t['gflops']:8.1f} {100 * t['util']:6.1f} "
                    f"{t['lower_s'] + t['compile_s']:9.2f} {t['peak_rss_mb']:7.0f} {t['load1_before']:5.2f}"
                    + (
                        f"  x{t['speedup_vs_f32']:.2f} vs f32, |loss - f32 loss| per step "
                        + ", ".join(f"{d:.1e}" for d in t["loss_abs_diff_vs_f32"])
                        if "loss_abs_diff_vs_f32" in t
                        else ""
                    )
                )
        if r.get("memory"):
            lines.append("")
            lines.append(
                "Training memory vs unroll length (batch 32; XLA's compiled memory analysis of "
                "train_step: temporary buffers of one step, beyond params/optimizer state/batch):"
            )
            lines.append(
                f"{'preset':9s} {'unroll':>6s} {'remat':>5s} {'temp MiB':>9s} {'MiB/step':>9s} "
                f"{'args MiB':>9s} {'compile s':>9s}"
            )
            for t in r["memory"]:
                if "error" in t or "temp_mb" not in t:
                    lines.append(f"FAILED: {t.get('error', 'no memory analysis on this backend')[-300:]}")
                    continue
                lines.append(
                    f"{t['preset']:9s} {t['unroll']:6d} {t['remat']:5d} {t['temp_mb']:9.0f} "
                    f"{t['temp_mb'] / t['unroll']:9.1f} {t['argument_mb']:9.0f} {t['compile_s']:9.1f}"
                )
        if r["notes"]:
            lines.append("")
            lines.extend(f"note: {n}" for n in r["notes"])
        return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small preset only, fewer repetitions (a few minutes)")
    p.add_argument(
        "--presets", help="embedding presets (default: small,medium,original; --quick: small; 'none' to skip)"
    )
    p.add_argument("--train-presets", help="training presets (default: small,original; --quick: small; 'none' to skip)")
    p.add_argument(
        "--train-batch",
        type=int,
        default=128,
        help="training batch rows per step (unroll is 20); 128 is the recipe's per-GPU batch",
    )
    p.add_argument(
        "--bf16-shapes",
        default="64x20,1x20",
        help="embedding shapes also measured with bfloat16 compute ('none' to skip)",
    )
    p.add_argument(
        "--highest-shapes",
        default="auto",
        help="embedding shapes also measured with full-float32 matmuls (precision 'highest'; "
        "'auto': the --bf16-shapes on an accelerator, none on CPU, where it is the default)",
    )
    p.add_argument("--no-bf16-train", action="store_true", help="skip the bfloat16 training rows")
    p.add_argument("--memory-preset", default="small", help="preset of the memory-vs-length rows")
    p.add_argument(
        "--memory-lengths",
        default="20,80,320,1280",
        help="unroll lengths of the training memory rows, with and without remat ('none' to skip)",
    )
    p.add_argument("--memory-remat", type=int, default=20, help="remat_steps of the rematerialised rows")
    p.add_argument("--vocab", type=int, default=100_000)
    p.add_argument("--negatives", type=int, default=8192)
    p.add_argument("--peer-env", default=os.environ.get("ELMO_PEER_ENV", "/work/peer-env"))
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="embedding rows: repeat ours and the peer this many times, alternating "
        "their order; report medians (the peer's speed drifts by up to 30%% "
        "between runs on a shared machine)",
    )
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--no-e2e", action="store_true", help="skip the Elmo.embed end-to-end column")
    p.add_argument("--no-parts", action="store_true", help="skip timing encoder and LSTMs separately")
    p.add_argument("--shapes", help="embedding shapes as BATCHxLENGTH,... (default: 16x20,16x60,64x20,64x60,1x20)")
    p.add_argument("--keep-tmp", action="store_true", help="keep the temp dir (weights, sentences)")
    p.add_argument("--out", default="benchmark_results.json")
    args = p.parse_args()
    for option, value, low in (
        ("--rounds", args.rounds, 1),
        ("--train-batch", args.train_batch, 1),
        ("--negatives", args.negatives, 1),
        ("--vocab", args.vocab, 4),
        ("--memory-remat", args.memory_remat, 1),
    ):
        if value < low:
            p.error(f"{option} must be at least {low}, got {value}")

    if args.vocab <= args.negatives:
        p.error(
            f"--vocab {args.vocab} must exceed --negatives {args.negatives}: the training rows measure "
            f"(and count the FLOPs of) a sampled softmax, which the loss replaces by the full softmax "
            f"when the vocabulary is not larger than the negatives"
        )

    def parse_list(option: str, value: str | None, default: str) -> list[str]:
        value = default if value is None else value
        if value == "none":
            return []
        items = [v.strip() for v in value.split(",")]
        if not all(items):
            p.error(f"{option} {value!r} has an empty entry; name presets separated by commas, or 'none'")
        return items

    presets = parse_list("--presets", args.presets, "small" if args.quick else "small,medium,original")
    train_presets = parse_list("--train-presets", args.train_presets, "small" if args.quick else "small,original")

    def parse_shapes(option: str, value: str) -> list[tuple[int, int]]:
        if value == "none":
            return []
        shapes = []
        for item in value.split(","):
            parts = item.strip().split("x")
            if len(parts) != 2 or not all(u.isdigit() and int(u) > 0 for u in parts):
                p.error(f"{option}: {item!r} is not BATCHxLENGTH with two positive integers (e.g. 64x20), or 'none'")
            shapes.append((int(parts[0]), int(parts[1])))
        return shapes

    for name in {*presets, *train_presets, args.memory_preset}:
        try:
            ElmoConfig.preset(name)
        except ConfigError as e:
            p.error(str(e))
    shapes = parse_shapes("--shapes", args.shapes) if args.shapes else EMBED_SHAPES
    if not shapes and presets:
        p.error("--shapes none leaves the embedding presets nothing to measure; pass --presets none instead")
    bf16_shapes = parse_shapes("--bf16-shapes", args.bf16_shapes)
    highest_shapes = None if args.highest_shapes == "auto" else parse_shapes("--highest-shapes", args.highest_shapes)
    memory_lengths = []
    if args.memory_lengths != "none" and not args.quick:
        items = [x.strip() for x in args.memory_lengths.split(",")]
        if not all(x.isdigit() and int(x) > 0 for x in items):
            p.error(f"--memory-lengths {args.memory_lengths!r}: give positive integers separated by commas, or 'none'")
        memory_lengths = [int(x) for x in items]
    # Fail now, not after half an hour of measuring: the output folder is created and the
    # file opened for writing before anything runs.
    existed = os.path.exists(args.out)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "a"):
            pass
        if not existed:  # no empty results file left behind if the run stops early
            os.remove(args.out)
    except OSError as e:
        p.error(f"cannot write the results file {args.out}: {e}; pass a writable --out path")

    # `timeout` (accelerator.sh) stops a stage with SIGTERM: exit through the `finally`
    # below, so the temp dir (up to ~0.5 GB of weights) goes too; rows already measured
    # are in OUT.partial.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    suite = Suite(args)  # makes the temp dir: only after every option is checked
    suite.presets, suite.train_presets, suite.shapes = presets, train_presets, shapes
    suite.bf16_shapes, suite.highest_shapes, suite.memory_lengths = bf16_shapes, highest_shapes, memory_lengths
    t0 = time.perf_counter()
    try:
        suite.setup()
        suite.matmul()
        suite.embed()
        suite.train()
        if suite.memory_lengths:
            suite.memory()
    finally:
        if args.keep_tmp:
            log(f"temp dir kept: {suite.tmp}")
        else:
            shutil.rmtree(suite.tmp, ignore_errors=True)
    suite.results["uptime_end"] = uptime()
    suite.results["wall_s"] = time.perf_counter() - t0
    table = suite.report()
    suite.results["table"] = table
    print(table)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(suite.results, f, indent=1)
    os.replace(tmp, args.out)
    if os.path.exists(args.out + ".partial"):
        os.remove(args.out + ".partial")
    print(f"\nwall time {suite.results['wall_s']:.0f} s; results written to {args.out}")


if __name__ == "__main__":
    main()
