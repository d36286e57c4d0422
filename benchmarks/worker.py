"""One measurement of elmo_jax, run by ``run.py`` in its own process.

A fresh process per configuration keeps compile caches apart and makes ``ru_maxrss`` the peak
resident memory of that configuration alone.  The result is printed as one JSON line prefixed
with ``RESULT `` (anything else on stdout/stderr is log).

Tasks: ``info``, ``save``, ``matmul``, ``membw`` (weight-streaming bandwidth), ``embed`` (jitted ``bilm`` on fixed-shape arrays, or the
``Elmo.embed`` API), ``parts`` (token encoder and LSTM stack jitted and timed separately),
``train`` (jitted ``train_step``), ``agree`` (outputs for the peer comparison).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # kB on Linux


def timed_reps(fn, min_reps: int, min_time: float, max_reps: int) -> list[float]:
    """Call ``fn`` (which must block) until min_reps and min_time are met, or max_reps."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - start < min_time):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def device_info() -> dict:
    d = jax.devices()[0]
    stats = d.memory_stats() or {}  # None on CPU; on GPU/TPU the device memory counters
    return {
        "device_peak_mb": stats["peak_bytes_in_use"] / 2**20 if "peak_bytes_in_use" in stats else None,
        "platform": d.platform,
        "device_kind": d.device_kind,
        "n_devices": jax.device_count(),
        "jax": jax.__version__,
        "jaxlib": __import__("jaxlib").__version__,
    }


def load_sentences(path: str, length: int, batch: int) -> list[list[str]]:
    with open(path) as f:
        data = json.load(f)
    sents = data["by_length"][str(length)]
    if batch > len(sents):
        raise SystemExit(f"sentences file holds {len(sents)} sentences of length {length}, need {batch}")
    return sents[:batch]


# -- tasks ---------------------------------------------------------------------------------


def task_info(args) -> dict:
    return device_info()


def task_save(args) -> dict:
    from elmo_jax.embedding.embedder import Elmo

    elmo = Elmo.random(args.preset, seed=args.seed)
    elmo.save(args.model_dir, overwrite=True)
    return {"model_dir": args.model_dir}


def task_matmul(args) -> dict:
    n = args.n
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), jnp.float32)
    b = jax.random.normal(kb, (n, n), jnp.float32)
    f = jax.jit(lambda x, y: x @ y).lower(a, b).compile()
    jax.block_until_ready(f(a, b))
    times = timed_reps(lambda: jax.block_until_ready(f(a, b)), args.min_reps, args.min_time, args.max_reps)
    med = statistics.median(times)
    return {
        "n": n,
        "times": times,
        "median_s": med,
        "gflops": 2 * n**3 / med / 1e9,
        "best_gflops": 2 * n**3 / min(times) / 1e9,
        **device_info(),
    }


def task_membw(args) -> dict:
    """Weight-streaming bandwidth: ``x @ W`` with one row ``x`` and a float32 ``W`` of ``--n`` MiB.

    This is the access pattern of a single-sentence LSTM step (every weight read once, two
    FLOPs per weight), so its rate is the ceiling for that case; ``W`` is far larger than
    any cache.
    """
    k = 4096
    n = args.n * 2**20 // 4 // k
    w = jnp.ones((k, n), jnp.float32)
    x = jnp.ones((1, k), jnp.float32)
    f = jax.jit(lambda a, b: a @ b).lower(x, w).compile()
    jax.block_until_ready(f(x, w))
    times = timed_reps(lambda: jax.block_until_ready(f(x, w)), args.min_reps, args.min_time, args.max_reps)
    med = statistics.median(times)
    # Device -> host: what Elmo.embed pays to hand back each group's outputs as numpy
    # (48 MiB, about the `original` layers of 64 sentences of 60 tokens).  A fresh array
    # each time: a jax array keeps its host copy once made.
    make = jax.jit(lambda s: jnp.full((48 * 2**20 // 4,), s, jnp.float32))
    d2h = []
    for i in range(10):
        y = jax.block_until_ready(make(jnp.float32(i)))
        t0 = time.perf_counter()
        np.asarray(y)
        d2h.append(time.perf_counter() - t0)
    return {
        "mib": args.n,
        "times": times,
        "median_s": med,
        "gb_per_s": k * n * 4 / med / 1e9,
        "best_gb_per_s": k * n * 4 / min(times) / 1e9,
        "to_host_gb_per_s": 48 * 2**20 / statistics.median(d2h) / 1e9,
        **device_info(),
    }


def _dtype(name: str):
    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[name]


def _load_elmo(model_dir: str, batch_size: int):
    from elmo_jax.embedding.embedder import Elmo

    return Elmo.load(model_dir, batch_size=batch_size)


def task_embed(args) -> dict:
    from elmo_jax import chars
    from elmo_jax.model.bilm import bilm, marker_vectors

    sents = load_sentences(args.sentences, args.length, args.batch)
    elmo = _load_elmo(args.model_dir, max(args.batch, 1))
    cfg = elmo.config
    rss_loaded = peak_rss_mb()
    n_tokens = sum(len(s) for s in sents)
    out: dict = {"mode": args.mode, "batch": args.batch, "length": args.length, "tokens": n_tokens}
    if args.mode == "bilm":
        ids = jnp.asarray(chars.batch_to_ids(sents, cfg.char_cnn.max_characters_per_token, max_length=args.length))
        lengths = jnp.asarray([len(s) for s in sents], jnp.int32)
        dtype = _dtype(args.dtype)
        fn = jax.jit(functools.partial(bilm, dtype=dtype), static_argnums=1)
        with jax.default_matmul_precision(args.precision):  # fixed at trace time
            # As Elmo.embed: <S> / </S> depend on the parameters alone, encoded once.
            markers = jax.jit(marker_vectors, static_argnums=(1, 2))(elmo.params, cfg, dtype)
            t0 = time.perf_counter()
            lowered = fn.lower(elmo.params, cfg, ids, None, lengths, markers=markers)
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()

        def call():
            layers, state = compiled(elmo.params, ids, None, lengths, markers=markers)
            jax.block_until_ready((layers, state))

        t3 = time.perf_counter()
        call()  # first execution (allocations, thread pool warm-up)
        first = time.perf_counter() - t3
        out.update(lower_s=t1 - t0, compile_s=t2 - t1, first_call_s=first, dtype=args.dtype, precision=args.precision)
        if dtype != jnp.float32:  # accuracy cost against float32 on the same input
            ref = np.asarray(jax.jit(bilm, static_argnums=1)(elmo.params, cfg, ids, None, lengths)[0])
            low = np.asarray(compiled(elmo.params, ids, None, lengths, markers=markers)[0])
            out["max_abs_err_vs_f32_per_layer"] = np.abs(low - ref).max(axis=(1, 2, 3)).tolist()
            out["max_abs_f32_per_layer"] = np.abs(ref).max(axis=(1, 2, 3)).tolist()
            out["max_rel_err_vs_f32"] = float(np.abs(low - ref).max() / np.abs(ref).max())
    elif args.mode == "embed":

        def call():
            elmo.embed(sents, batch_size=args.batch)  # returns host numpy arrays

        t0 = time.perf_counter()
        call()  # compiles the (rows, time bucket) shape
        out["first_call_s"] = time.perf_counter() - t0
        call()
        out["compiled_shapes"] = sorted(elmo.compiled_shapes)
    else:
        raise SystemExit(f"unknown mode {args.mode}")
    load_before = os.getloadavg()[0]
    times = timed_reps(call, args.min_reps, args.min_time, args.max_reps)
    if args.mode == "embed":
        # More than one executable for one input shape would mean a recompile per call.
        out["jit_cache_entries"] = elmo._forward._cache_size()
    med = statistics.median(times)
    out.update(
        times=times,
        median_s=med,
        tokens_per_s=n_tokens / med,
        peak_rss_mb=peak_rss_mb(),
        rss_after_load_mb=rss_loaded,
        load1_before=load_before,
        load1_after=os.getloadavg()[0],
        **device_info(),
    )
    return out


def task_parts(args) -> dict:
    """Encoder and LSTM stack timed on their own, as ``bilm`` runs them: the encoder on the
    ``B*T`` tokens (the markers' vectors are computed once per weights), the LSTMs on
    ``T+2`` steps."""
    from elmo_jax import chars
    from elmo_jax.model.bilm import add_boundary_vectors, marker_vectors, reverse_within_length
    from elmo_jax.model.encoder import encode_tokens
    from elmo_jax.model.lstm import lstm_stack

    sents = load_sentences(args.sentences, args.length, args.batch)
    elmo = _load_elmo(args.model_dir, args.batch)
    cfg, params = elmo.config, elmo.params
    ids = jnp.asarray(chars.batch_to_ids(sents, cfg.char_cnn.max_characters_per_token, max_length=args.length))
    lengths = jnp.asarray([len(s) for s in sents], jnp.int32)
    full = lengths + 2
    mask = jnp.arange(args.length + 2)[None, :] < full[:, None]

    enc = jax.jit(encode_tokens, static_argnums=1).lower(params, cfg, ids).compile()
    e = add_boundary_vectors(enc(params, ids), lengths, *marker_vectors(params, cfg))
    x = jnp.stack([e, reverse_within_length(e, full)])
    m = jnp.stack([mask, mask])
    lstm = jax.jit(lstm_stack, static_argnums=1).lower(params["lstm"], cfg, x, m).compile()
    res = {"batch": args.batch, "length": args.length, "tokens": int(sum(len(s) for s in sents))}
    for name, fn in (
        ("encoder", lambda: jax.block_until_ready(enc(params, ids))),
        ("lstm", lambda: jax.block_until_ready(lstm(params["lstm"], x, m))),
    ):
        fn()
        times = timed_reps(fn, args.min_reps, args.min_time, args.max_reps)
        res[f"{name}_median_s"] = statistics.median(times)
    res["peak_rss_mb"] = peak_rss_mb()
    return res


def task_train(args) -> dict:
    from elmo_jax import chars
    from elmo_jax.config import ElmoConfig
    from elmo_jax.model.lstm import zero_state
    from elmo_jax.train.losses import make_loss_fn
    from elmo_jax.train.step import init_train_state, make_optimizer, train_step

    cfg = ElmoConfig.preset(args.preset)
    b, t = args.batch, args.length
    optimizer = make_optimizer("adagrad", 0.2, 1.0, 10.0)
    selection = make_loss_fn(args.vocab, args.negatives)
    state = init_train_state(jax.random.key(0), cfg, args.vocab, optimizer)
    lstm_state = zero_state(cfg, b)
    with open(args.sentences) as f:
        words = json.load(f)["words"]
    rng = np.random.default_rng(1)
    batch = {}
    for d in ("fwd", "bwd"):
        toks = [[words[i] for i in rng.integers(0, len(words), t)] for _ in range(b)]
        batch[f"{d}_char_ids"] = jnp.asarray(chars.batch_to_ids(toks, cfg.char_cnn.max_characters_per_token))
        batch[f"{d}_targets"] = jnp.asarray(rng.integers(0, args.vocab, (b, t)), jnp.int32)
        batch[f"{d}_mask"] = jnp.ones((b, t), jnp.float32)
    rss_init = peak_rss_mb()
    step = jax.jit(
        functools.partial(
            train_step,
            config=cfg,
            optimizer=optimizer,
            loss_fn=selection.fn,
            dropout_rate=0.1,
            dtype=_dtype(args.dtype),
            remat_steps=args.remat,
        ),
        donate_argnums=(0, 1),
    )
    keys = [jax.random.split(jax.random.fold_in(jax.random.key(2), i)) for i in range(args.steps + 1)]
    t0 = time.perf_counter()
    lowered = step.lower(state, lstm_state, batch, keys[0][0], keys[0][1])
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    mem = compiled.memory_analysis()  # XLA's own accounting of the step's buffers
    sizes = (
        {
            "temp_mb": mem.temp_size_in_bytes / 2**20,
            "argument_mb": mem.argument_size_in_bytes / 2**20,
            "output_mb": mem.output_size_in_bytes / 2**20,
        }
        if mem is not None
        else {}
    )
    if args.compile_only:
        return {
            "preset": args.preset,
            "batch": b,
            "unroll": t,
            "dtype": args.dtype,
            "remat": args.remat,
            "lower_s": t1 - t0,
            "compile_s": t2 - t1,
            **sizes,
            "peak_rss_mb": peak_rss_mb(),
            **device_info(),
        }
    times, losses = [], []
    load_before = os.getloadavg()[0]
    for i in range(args.steps + 1):  # step 0 is the warm-up, not timed
        ts = time.perf_counter()
        state, lstm_state, metrics = compiled(state, lstm_state, batch, keys[i][0], keys[i][1])
        jax.block_until_ready((state, lstm_state, metrics))
        if i > 0:
            times.append(time.perf_counter() - ts)
        losses.append(float(metrics["loss"]))
    med = statistics.median(times)
    return {
        "preset": args.preset,
        "batch": b,
        "unroll": t,
        "tokens": b * t,
        "vocab": args.vocab,
        "negatives": args.negatives,
        "dtype": args.dtype,
        "remat": args.remat,
        "lower_s": t1 - t0,
        "compile_s": t2 - t1,
        "times": times,
        "median_s": med,
        "tokens_per_s": b * t / med,
        "losses": losses,
        "peak_rss_mb": peak_rss_mb(),
        "rss_after_init_mb": rss_init,
        "load1_before": load_before,
        "load1_after": os.getloadavg()[0],
        "loss_selection": selection.message,
        **sizes,
        **device_info(),
    }


def task_agree(args) -> dict:
    with open(args.sentences) as f:
        sents = json.load(f)["agreement"]
    elmo = _load_elmo(args.model_dir, 64)
    with jax.default_matmul_precision(args.precision):
        outs = elmo.embed(sents)
    np.savez(args.out, **{str(i): o for i, o in enumerate(outs)})
    return {"n": len(outs), "out": args.out, "precision": args.precision, **device_info()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("task", choices=["info", "save", "matmul", "membw", "embed", "parts", "train", "agree"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument(
        "--precision",
        default="default",
        choices=["default", "highest"],
        help="embed/agree: jax.default_matmul_precision while tracing (on NVIDIA GPUs the "
        "default computes float32 matmuls with TF32; 'highest' is full float32)",
    )
    p.add_argument("--remat", type=int, default=0, help="train: remat_steps (0 = keep all activations)")
    p.add_argument("--compile-only", action="store_true", help="train: compile and report memory, do not run")
    p.add_argument("--preset")
    p.add_argument("--model-dir")
    p.add_argument("--sentences")
    p.add_argument("--mode", default="bilm")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--vocab", type=int, default=100_000)
    p.add_argument("--negatives", type=int, default=8192)
    p.add_argument("--min-reps", type=int, default=3)
    p.add_argument("--max-reps", type=int, default=20)
    p.add_argument("--min-time", type=float, default=2.0)
    p.add_argument("--out")
    args = p.parse_args()
    result = globals()[f"task_{args.task}"](args)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
