"""Does continued pretraining pay?  Steps to a held-out perplexity on domain B, training from
scratch against continuing a model pretrained on domain A.

    python examples/domain_adaptation.py OUT_DIR [--steps-a 1500] [--steps-b 600] [--steps-scratch 1500]

Writes the synthetic corpus of domain A (the default language) and of domain B (the same
grammar with shifted vocabulary and word senses: ``elmo-jax corpus --domain b``), then runs
exactly these commands (``configs/tiny.py``; B's corpus is small, as a user's own domain
text usually is)::

    python train.py --workdir OUT/a --config.data=OUT/corpus-a/train.txt --config.heldout=... --config.max_steps=STEPS_A
    python train.py --workdir OUT/b-continued --config.init_from=OUT/a --config.data=OUT/corpus-b/train.txt \
        --config.heldout=... --config.max_steps=STEPS_B --config.epochs=1000 --config.eval_every=50
    python train.py --workdir OUT/b-scratch --config.data=OUT/corpus-b/train.txt ... --config.max_steps=STEPS_SCRATCH

and prints, from the runs' ``metrics.jsonl``, the held-out perplexity on B along the way and
how many steps each B run needed to reach the best perplexity the scratch run reached; with
matplotlib installed (``pip install -e '.[plot]'``) it draws the two curves into
``OUT/domain_adaptation.png``.  Run again, it reuses the finished runs (each resumes as complete).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from elmo_jax.train.stop import EXIT_STOPPED, exit_process, exit_status, stop_cleanly, stopped_by

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args: list[str]) -> float:
    """``python train.py ARGS``; returns its wall time in seconds."""
    command = [sys.executable, os.path.join(REPO, "train.py"), "--no-progress", *args]
    print("$ " + " ".join(command[1:]), flush=True)
    start = time.perf_counter()
    code = subprocess.run(command).returncode
    if code in EXIT_STOPPED.values():  # the run was stopped and saved: so is this script
        print(f"domain_adaptation: stopped (status {code}); the same command resumes the runs", file=sys.stderr)
        exit_process(code)
    if code:
        raise SystemExit(f"domain_adaptation: train.py failed (status {code})")
    return time.perf_counter() - start


def evals(workdir: str) -> dict[int, float]:
    """Held-out perplexity by step, from the run's metrics.jsonl."""
    out = {}
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if record["kind"] == "eval":
                out[record["step"]] = record["perplexity"]
    return out


def steps_to(curve: dict[int, float], target: float) -> int | None:
    return next((step for step in sorted(curve) if curve[step] <= target), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder for the corpora and the three runs")
    parser.add_argument("--steps-a", type=int, default=1500, help="pretraining steps on domain A")
    parser.add_argument("--steps-b", type=int, default=600, help="steps of the run continued on domain B")
    parser.add_argument("--steps-scratch", type=int, default=1500, help="steps of the run from scratch on B")
    parser.add_argument("--n-train-b", type=int, default=4000, help="training sentences of domain B")
    parser.add_argument("--eval-every", type=int, default=50)
    args = parser.parse_args()
    from elmo_jax.data import synthetic_corpus

    out = os.path.abspath(args.out)
    corpus_a, corpus_b = os.path.join(out, "corpus-a"), os.path.join(out, "corpus-b")
    if not os.path.exists(corpus_a):
        synthetic_corpus.write_corpus(corpus_a)
    if not os.path.exists(corpus_b):
        synthetic_corpus.write_corpus(corpus_b, n_train=args.n_train_b, domain="b")

    def data(corpus: str) -> list[str]:
        return [f"--config.data={corpus}/train.txt", f"--config.heldout={corpus}/heldout.txt"]

    b_common = [
        *data(corpus_b),
        "--config.epochs=1000",
        f"--config.eval_every={args.eval_every}",
        "--config.checkpoint_every=600",
    ]
    walls = {
        "a": run(["--workdir", f"{out}/a", *data(corpus_a), f"--config.max_steps={args.steps_a}"]),
        "b-continued": run(
            [
                "--workdir",
                f"{out}/b-continued",
                f"--config.init_from={out}/a",
                *b_common,
                f"--config.max_steps={args.steps_b}",
            ]
        ),
        "b-scratch": run(["--workdir", f"{out}/b-scratch", *b_common, f"--config.max_steps={args.steps_scratch}"]),
    }
    continued, scratch = evals(f"{out}/b-continued"), evals(f"{out}/b-scratch")
    with open(os.path.join(corpus_b, "stats.json"), encoding="utf-8") as f:
        optimum = json.load(f)["optimum_heldout_perplexity_train_vocab"]
    print(
        f"\nheld-out perplexity on domain B (optimum {optimum:.2f}); A pretrained {args.steps_a} steps "
        f"({walls['a']:.0f} s)"
    )
    print("| step | continued from A | from scratch |\n|---|---|---|")
    for step in sorted(set(continued) | set(scratch)):
        cells = [f"{curve[step]:.1f}" if step in curve else "" for curve in (continued, scratch)]
        print(f"| {step} | " + " | ".join(cells) + " |")
    for target in sorted({min(scratch.values()), min(continued.values())}, reverse=True):
        for name, curve in (("continued from A", continued), ("from scratch", scratch)):
            step = steps_to(curve, target)
            print(
                f"{name}: perplexity <= {target:.2f} at step {step}"
                if step is not None
                else f"{name}: perplexity <= {target:.2f} not reached in {max(curve)} steps"
            )
    print(
        f"wall time: continued {walls['b-continued']:.0f} s, from scratch {walls['b-scratch']:.0f} s "
        f"(timings only mean something on an idle machine)"
    )
    picture(out, continued, scratch, optimum)
    return 0


def picture(out: str, continued: dict[int, float], scratch: dict[int, float], optimum: float) -> None:
    """``OUT/domain_adaptation.png``: the two curves on B and B's optimum (needs matplotlib)."""
    from elmo_jax.plots import INSTALL_HINT, curves_png, have_matplotlib

    if not have_matplotlib():
        print(
            f"the picture of these curves needs matplotlib: {INSTALL_HINT}, then run this command again "
            f"(the finished runs are reused)"
        )
        return
    path = curves_png(
        {"continued from A (init_from)": continued, "from scratch": scratch},
        os.path.join(out, "domain_adaptation.png"),
        references={"generator's optimum on B": optimum},
        title="held-out perplexity on domain B: scratch against init_from",
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    stop_cleanly(lambda name: f"domain_adaptation: stopped by {name}; the same command resumes the runs")
    try:
        exit_process(main())
    except KeyboardInterrupt as e:  # Ctrl-C reaches the runs too; each saves before it ends
        print(f"domain_adaptation: stopped by {stopped_by(e)}; the same command resumes the runs", file=sys.stderr)
        exit_process(exit_status(stopped_by(e)))
