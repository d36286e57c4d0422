"""Embedding throughput and compilation cost (random weights; numbers depend on the machine).

    python examples/bench_embed.py [--presets small original] [--batches 3]
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from elmo_jax import Elmo

_compiles: list[float] = []


def _listen(event: str, duration: float, **_) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _compiles.append(duration)


def throughput(preset: str, batch: int, length: int, n_batches: int) -> float:
    elmo = Elmo.random(preset, batch_size=batch)
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(500)]
    sents = [list(rng.choice(words, size=length)) for _ in range(batch * n_batches)]
    elmo.embed(sents[:batch])  # compile
    start = time.perf_counter()
    elmo.embed(sents)
    return batch * n_batches * length / (time.perf_counter() - start)


def compile_cost(preset: str, n: int, max_len: int) -> tuple[int, float, float, int]:
    elmo = Elmo.random(preset)
    rng = np.random.default_rng(1)
    sents = [["w"] * int(k) for k in rng.integers(1, max_len + 1, size=n)]
    jax.block_until_ready(elmo.params)
    before, t0 = len(_compiles), time.perf_counter()
    elmo.embed(sents, progress=False)
    wall = time.perf_counter() - t0
    new = _compiles[before:]
    return len(elmo.compiled_shapes), sum(new), wall, elmo.max_compiled_shapes(max_len)


def _cpu() -> str:
    """The CPU model and vector extensions (benchmarks/machine.py, beside this folder)."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    try:
        from machine import cpu_summary, machine_info
    except ImportError:  # an installed copy of the example without the benchmarks folder
        return "unknown"
    return cpu_summary(machine_info())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", nargs="+", default=["small", "original"])
    ap.add_argument("--batches", type=int, default=3)
    args = ap.parse_args()
    jax.monitoring.register_event_duration_secs_listener(_listen)
    print(f"devices: {jax.devices()}; CPU: {_cpu()}")
    for preset in args.presets:
        tps = throughput(preset, 64, 20, args.batches if preset != "original" else 1)
        print(f"{preset}: {tps:,.0f} tokens/s (batch 64 x 20 tokens)")
    shapes, seconds, wall, bound = compile_cost(args.presets[0], 1000, 60)
    print(f"{args.presets[0]}, 1000 sentences of 1..60 tokens: {shapes} shapes compiled (bound {bound}), "
          f"backend compile time {seconds:.1f} s, total wall {wall:.1f} s")


if __name__ == "__main__":
    main()
