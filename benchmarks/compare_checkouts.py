"""Embedding and training speed of two checkouts of elmo_jax, measured in one run, per CPU-second.

A refactor should leave speed unchanged.  Wall time on a shared 2-core machine moves with
whatever else runs, so each measurement here is the work done per second of this process's own
CPU time (``time.process_time``, every thread of it), after compiling and one warm-up call.
The checkouts alternate, each measurement in a fresh process that imports the checkout given
(``PYTHONPATH``), and the medians over ``--rounds`` are compared.

    python benchmarks/compare_checkouts.py BEFORE_DIR AFTER_DIR [--rounds 3] [--out result.json]

Only public entry points that both checkouts have are used: ``elmo_jax.Elmo`` for embedding and
the training step of ``elmo_jax.train.step``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# One measurement, run as ``python -c`` in the checkout's own process.
_EMBED = r"""
import json, random, sys, time
import jax
from elmo_jax import Elmo
preset, batch, length, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(0)
letters = "abcdefghijklmnopqrstuvwxyz"
sents = [["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(length)]
         for _ in range(batch)]
elmo = Elmo.random(preset, seed=0, batch_size=batch)
elmo.embed(sents, batch_size=batch)  # compile and warm up
cpu0, wall0 = time.process_time(), time.perf_counter()
for _ in range(reps):
    elmo.embed(sents, batch_size=batch)
cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
print("RESULT " + json.dumps({"tokens_per_cpu_s": reps * batch * length / cpu,
                              "tokens_per_wall_s": reps * batch * length / wall}))
"""

_TRAIN = r"""
import functools, json, sys, time
import jax, jax.numpy as jnp, numpy as np
from elmo_jax import chars
from elmo_jax.config import ElmoConfig
from elmo_jax.model.lstm import zero_state
from elmo_jax.train.losses import make_loss_fn
from elmo_jax.train.step import init_train_state, make_optimizer, train_step
preset, b, t, steps, vocab, negatives = sys.argv[1], *map(int, sys.argv[2:7])
cfg = ElmoConfig.preset(preset)
optimizer = make_optimizer("adagrad", 0.2, 1.0, 10.0)
selection = make_loss_fn(vocab, negatives)
state = init_train_state(jax.random.key(0), cfg, vocab, optimizer)
lstm_state = zero_state(cfg, b)
rng = np.random.default_rng(1)
letters = list("abcdefghijklmnopqrstuvwxyz")
batch = {}
for d in ("fwd", "bwd"):
    toks = [["".join(rng.choice(letters, rng.integers(2, 10))) for _ in range(t)] for _ in range(b)]
    batch[f"{d}_char_ids"] = jnp.asarray(chars.batch_to_ids(toks, cfg.char_cnn.max_characters_per_token))
    batch[f"{d}_targets"] = jnp.asarray(rng.integers(0, vocab, (b, t)), jnp.int32)
    batch[f"{d}_mask"] = jnp.ones((b, t), jnp.float32)
step = jax.jit(functools.partial(train_step, config=cfg, optimizer=optimizer, loss_fn=selection.fn,
                                 dropout_rate=0.1), donate_argnums=(0, 1))
keys = [jax.random.split(jax.random.fold_in(jax.random.key(2), i)) for i in range(steps + 1)]
state, lstm_state, m = step(state, lstm_state, batch, keys[0][0], keys[0][1])
jax.block_until_ready(m)
cpu0, wall0 = time.process_time(), time.perf_counter()
for i in range(1, steps + 1):
    state, lstm_state, m = step(state, lstm_state, batch, keys[i][0], keys[i][1])
    jax.block_until_ready(m)
cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
print("RESULT " + json.dumps({"tokens_per_cpu_s": steps * b * t / cpu, "tokens_per_wall_s": steps * b * t / wall,
                              "loss": float(m["loss"])}))
"""


def measure(checkout: str, program: str, args: list[str]) -> dict:
    """Run one measurement in a fresh process importing ``checkout``; its RESULT line."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout), JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", program, *args], env=env, capture_output=True, text=True, cwd=os.path.abspath(checkout)
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise SystemExit(f"{checkout}: the measurement failed (exit {out.returncode}):\n{out.stderr[-3000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--embed", default="small:32x20:20", help="preset:BATCHxLENGTH:reps")
    p.add_argument("--train", default="tiny:32x20:20:20000:1024", help="preset:BATCHxUNROLL:steps:vocab:negatives")
    p.add_argument("--out")
    a = p.parse_args()
    sys.path.insert(0, HERE)
    from machine import cpu_summary, machine_info  # the CPU and its vector extensions, as every benchmark records

    preset, shape, reps = a.embed.split(":")
    eb, el = shape.split("x")
    tpreset, tshape, steps, vocab, negs = a.train.split(":")
    tb, tt = tshape.split("x")
    jobs = {"embed": (_EMBED, [preset, eb, el, reps]), "train": (_TRAIN, [tpreset, tb, tt, steps, vocab, negs])}
    results: dict = {name: {"before": [], "after": []} for name in jobs}
    for r in range(a.rounds):
        order = (("before", a.before), ("after", a.after))
        for side, path in order if r % 2 == 0 else order[::-1]:  # alternate who goes first
            for name, (program, args) in jobs.items():
                res = measure(path, program, args)
                results[name][side].append(res)
                print(
                    f"round {r + 1} {side:6s} {name:5s} {res['tokens_per_cpu_s']:10.0f} tokens/CPU-s "
                    f"{res['tokens_per_wall_s']:10.0f} tokens/s",
                    flush=True,
                )
    summary = {
        "machine": cpu_summary(machine_info()),
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "embed": a.embed,
        "train": a.train,
    }
    print(f"\n{summary['machine']}")
    for name in jobs:
        med = {
            side: statistics.median(x["tokens_per_cpu_s"] for x in results[name][side]) for side in ("before", "after")
        }
        summary[name] = {**med, "ratio_after_over_before": med["after"] / med["before"], "runs": results[name]}
        print(
            f"{name:5s}: before {med['before']:.0f}, after {med['after']:.0f} tokens per CPU-second "
            f"(after/before {med['after'] / med['before']:.3f}, medians of {a.rounds})"
        )
        if name == "train":
            losses = {side: [x["loss"] for x in results[name][side]] for side in ("before", "after")}
            print(f"       final losses before {losses['before'][0]:.6f}, after {losses['after'][0]:.6f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
