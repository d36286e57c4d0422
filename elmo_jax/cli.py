"""The ``elmo-jax`` command line: one sub-command per job."""

from __future__ import annotations

import argparse
import sys
import time


def _demo(args: argparse.Namespace) -> int:
    """Embed a few sentences with a model (random ``--preset`` or a ``--model`` folder)."""
    from elmo_jax.embedder import Elmo

    if args.model:
        elmo = Elmo.load(args.model)
        source = args.model
    else:
        elmo = Elmo.random(args.preset, seed=args.seed)
        source = f"random {args.preset} preset (seed {args.seed})"
    sentences = args.sentences or [
        "She went to the bank to deposit money .",
        "They sat on the bank of the river .",
        "她 去 银行 取钱",
    ]
    start = time.perf_counter()
    vectors = elmo.embed(sentences)
    seconds = time.perf_counter() - start
    print(f"model: {source}")
    for sentence, v in zip(sentences, vectors):
        print(f"  {v.shape}  {sentence}")
    print(f"embedded {len(sentences)} sentences in {seconds:.2f} s (including compilation)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elmo-jax", description="ELMo in JAX: pretrain, export and embed."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="embed a few sentences and print the shapes")
    demo.add_argument("sentences", nargs="*", help="sentences to embed (default: three examples)")
    demo.add_argument("--model", help="a model folder (options.json + weights.hdf5)")
    demo.add_argument("--preset", default="tiny", help="preset of the random model (default tiny)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, TypeError) as e:
        print(f"elmo-jax {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
