"""Embedding throughput, compilation cost, the host path alone, and ``Elmo.embed`` end to end
against the raw jitted model (random weights; numbers depend on the machine).

    python examples/bench_embed.py [--presets small original] [--batches 3]
    python examples/bench_embed.py --pipeline [--presets small] [--sentences 2048] [--devices N]

``--pipeline`` measures the two rows of benchmarks/README.md "Embedding a corpus":

* host tokens per CPU-second: tokenising, char ids and bucketing of ``--sentences`` lines
  (what the look-ahead thread does), with no model call, over ``time.process_time``;
* ``Elmo.embed`` tokens/s against the raw jitted model run on the very same padded groups
  (inputs already on the devices, no host copy back): ``embed / raw`` is the share of the
  device's speed that embedding text keeps.
"""

from __future__ import annotations

import argparse
import time

if __name__ == "__main__":  # first: Ctrl-C / SIGTERM end the benchmark with one line, 130 / 143, whenever they come
    from elmo_jax.train.stop import stop_cleanly

    stop_cleanly(lambda name: f"bench_embed: stopped by {name}", at_once=True)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from elmo_jax import Elmo  # noqa: E402

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


def corpus_lines(n: int, seed: int = 0, vocab: int = 50_000) -> list[str]:
    """``n`` lines of 5-40 words drawn from a Zipf-like vocabulary of made-up words (a
    corpus's shape: a few frequent words, a long tail)."""
    rng = np.random.default_rng(seed)
    words = np.asarray([f"w{i}{'abcdefgh'[i % 8] * (i % 7)}" for i in range(vocab)])
    p = 1.0 / np.arange(1, vocab + 1)
    p /= p.sum()
    lengths = rng.integers(5, 41, size=n)
    drawn = words[rng.choice(vocab, size=int(lengths.sum()), p=p)]  # one draw: choice(p=) is O(vocab) a call
    ends = np.cumsum(lengths)
    return [" ".join(drawn[e - k : e]) for k, e in zip(lengths, ends)]


def host_tokens_per_cpu_second(lines: list[str], batch_size: int, n_chars: int, n_devices: int) -> dict:
    """The host path of ``embed`` alone (no model): tokenise, number the call's tokens,
    plan the groups, build each group's char ids."""
    from elmo_jax.embedding.host import CallTokens, plan_groups, prepare_group, token_lists

    t0 = time.process_time()
    toks = token_lists(lines)
    tokens = CallTokens(toks, n_chars)
    plans = plan_groups(tokens.lengths, batch_size, stateful=False, n_devices=n_devices)
    groups = [prepare_group(tokens, p, None) for p in plans]
    cpu = time.process_time() - t0
    n_tokens = sum(tokens.lengths)
    return {"tokens": n_tokens, "groups": len(groups), "cpu_s": cpu, "tokens_per_cpu_s": n_tokens / cpu}


def embed_vs_raw(preset: str, lines: list[str], batch_size: int, devices, reps: int) -> dict:
    """``Elmo.embed`` end to end against the jitted model on the same groups."""
    from elmo_jax.embedding.host import CallTokens, plan_groups, prepare_group, token_lists

    elmo = Elmo.random(preset, batch_size=batch_size, devices=devices)
    elmo.embed(lines, progress=False)  # compiles every shape
    toks = token_lists(lines)
    tokens = CallTokens(toks, elmo.config.char_cnn.max_characters_per_token)
    plans = plan_groups(tokens.lengths, batch_size, stateful=False, n_devices=len(elmo.devices))
    put = elmo.put_rows
    inputs = [
        (put(g.char_ids_RTC), elmo._states.zeros(g.plan.n_rows), put(g.lengths_R))
        for g in (prepare_group(tokens, p, None) for p in plans)
    ]
    markers = elmo._marker_vectors()
    jax.block_until_ready(inputs)

    def raw() -> None:
        outs = [
            elmo._forward(elmo.params, elmo.config, ids, state, lengths, markers=markers)[0]
            for ids, state, lengths in inputs
        ]
        jax.block_until_ready(outs)

    def embed() -> None:
        elmo.embed(lines, progress=False)

    n_tokens = sum(tokens.lengths)
    out = {"preset": preset, "tokens": n_tokens, "groups": len(plans), "devices": len(elmo.devices)}
    for name, fn in (("raw", raw), ("embed", embed)):
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[name + "_tokens_per_s"] = n_tokens / float(np.median(times))
    out["embed_over_raw"] = out["embed_tokens_per_s"] / out["raw_tokens_per_s"]
    return out


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
    ap.add_argument("--pipeline", action="store_true", help="the host path and embed() against the raw model")
    ap.add_argument("--sentences", type=int, default=2048, help="--pipeline: lines embedded")
    ap.add_argument("--host-sentences", type=int, default=100_000, help="--pipeline: lines for the host path")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--devices", type=int, default=None, help="--pipeline: devices (default: all local)")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    jax.monitoring.register_event_duration_secs_listener(_listen)
    print(f"devices: {jax.devices()}; CPU: {_cpu()}")
    if args.pipeline:
        n_dev = args.devices or jax.local_device_count()
        host = host_tokens_per_cpu_second(corpus_lines(args.host_sentences, seed=1), args.batch_size, 50, n_dev)
        print(
            f"host path: {host['tokens']:,} tokens in {host['groups']} groups, {host['cpu_s']:.2f} CPU-s: "
            f"{host['tokens_per_cpu_s']:,.0f} tokens per CPU-second"
        )
        lines = corpus_lines(args.sentences)
        for preset in args.presets:
            r = embed_vs_raw(preset, lines, args.batch_size, args.devices, args.reps)
            print(
                f"{preset}: {r['tokens']:,} tokens, {r['groups']} groups, {r['devices']} device(s): embed() "
                f"{r['embed_tokens_per_s']:,.0f} tokens/s, raw jitted model {r['raw_tokens_per_s']:,.0f} tokens/s, "
                f"embed/raw {r['embed_over_raw']:.0%}"
            )
        return
    for preset in args.presets:
        tps = throughput(preset, 64, 20, args.batches if preset != "original" else 1)
        print(f"{preset}: {tps:,.0f} tokens/s (batch 64 x 20 tokens)")
    shapes, seconds, wall, bound = compile_cost(args.presets[0], 1000, 60)
    print(
        f"{args.presets[0]}, 1000 sentences of 1..60 tokens: {shapes} shapes compiled (bound {bound}), "
        f"backend compile time {seconds:.1f} s, total wall {wall:.1f} s"
    )


if __name__ == "__main__":
    main()
