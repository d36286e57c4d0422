"""Fine-tune task heads on frozen ELMo: a word-class tagger on the embedded corpus.

    python examples/finetune_heads.py                 # pretrain a tiny ELMo briefly, then tag
    python examples/finetune_heads.py MODEL_DIR       # use an exported model instead
    python examples/finetune_heads.py --quick         # a first look: small everything, one learning rate

Steps: (1) without MODEL_DIR, pretrain the ``tiny`` preset for a few hundred steps on the
package's synthetic corpus and export it (``elmo-jax train`` + ``export`` in code);
(2) embed the corpus's sentences once with the frozen biLM; (3) train, on the gold word
classes (``load_corpus`` labels ``classes``), one tagger per head: ScalarMix (with the
paper's L2 penalty on its layer weights; once more with its optional layer norm), the 5-component linear head, and each single
layer, each at the Adam learning rate (of 3e-2, 1e-2, 3e-3) that does best on a dev split
of the training sentences (one rate for all would favour some heads: the 5-component
matrix underfits at rates that suit a ScalarMix); (4) print held-out token accuracy per
head.  The biLM never changes: only head
parameters are in the gradient (see ``elmo_jax.finetune``).

Default run: 86 s on an idle 2-core AMD EPYC Zen 5 (31 s given a trained model; ``--quick``
11-18 s).  Ctrl-C, SIGTERM (``kill``, ``timeout``) stop it
at once with exit status 130 / 143 and one line on stderr, also during pretraining (with
``--workdir``, the same command then resumes from its checkpoint); a temporary workdir is
removed however the script ends.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Callable, NamedTuple

if __name__ == "__main__":  # first: a signal while jax loads ends the script with one line, 130 / 143
    from elmo_jax.train.stop import stop_cleanly

    stop_cleanly(lambda name: f"finetune_heads: stopped by {name}")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from elmo_jax.data.synthetic_corpus import load_corpus, write_corpus  # noqa: E402
from elmo_jax.embedding.embedder import Elmo  # noqa: E402
from elmo_jax.errors import USER_ERRORS  # noqa: E402
from elmo_jax.finetune import accuracy, init_tagger, pad_labels, pad_layers, train_tagger  # noqa: E402
from elmo_jax.train.stop import Stopped, raise_on_signal  # noqa: E402

# Adam learning rates tried for each head; the best on the dev split is kept.
LEARNING_RATES = (3e-2, 1e-2, 3e-3)
# Tiny model for --quick: compiles and runs in seconds.
MICRO = {
    "dim": 32,
    "projection_dim": 16,
    "embedding_dim": 4,
    "filters": [[1, 8], [2, 8], [3, 16]],
    "n_highway": 1,
    "max_characters_per_token": 16,
}


def pretrain(workdir: str, corpus: str, quick: bool) -> Elmo:
    from elmo_jax.train.config_loader import TrainConfig
    from elmo_jax.formats.training_run import export
    from elmo_jax.train.loop import train

    cfg = TrainConfig(
        model="tiny",
        model_overrides=MICRO if quick else {},
        data=os.path.join(corpus, "train.txt"),
        heldout=os.path.join(corpus, "heldout.txt"),
        batch_size=8 if quick else 32,
        unroll_steps=10 if quick else 20,
        num_negatives=64 if quick else 8192,
        epochs=3,
        max_steps=5 if quick else 600,
        optimizer="adam",
        learning_rate=0.003,  # as configs/tiny.py
        log_every=5 if quick else 100,
        checkpoint_every=10_000,
        dropout=0.1,
        data_dir=os.path.join(workdir, "tfds"),
    )
    start = time.perf_counter()
    summary = train(cfg, os.path.join(workdir, "run"), progress=not quick)
    if summary.get("interrupted"):  # train() caught the signal and saved: the script stops too
        raise Stopped(summary["interrupted"])
    export(os.path.join(workdir, "run"), os.path.join(workdir, "model"), overwrite=True)
    print(f"pretrained {summary['step']} steps in {time.perf_counter() - start:.0f} s; exported to {workdir}/model")
    return Elmo.load(os.path.join(workdir, "model"), batch_size=256)


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument(
        "model_dir",
        nargs="?",
        help="a model folder, or a training workdir such as runs/tiny (default: pretrain a tiny model first)",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="small everything and one learning rate: a first look, and the tests (10-30 s on an "
        "idle 2-core CPU, most of it compiling)",
    )
    ap.add_argument("--workdir", help="where to pretrain and keep the corpus (default: a temp folder)")
    ap.add_argument("--steps", type=int, help="training steps (default 400; fewer with --quick)")
    ap.add_argument(
        "--plots",
        default=os.path.join("runs", "finetune_heads"),
        metavar="DIR",
        help="where finetune_heads.py writes scalar_mix.png, the trained mixes' layer weights "
        "(default runs/finetune_heads; needs matplotlib)",
    )
    return ap.parse_args(argv)


def run_stoppable(script: str, args: argparse.Namespace, body: Callable[[str], int]) -> int:
    """``body(workdir)``, where ``workdir`` is ``args.workdir`` or a temporary folder that is
    removed however the script ends.  Ctrl-C / SIGTERM stop it at once with one line on
    stderr and exit status 130 / 143 (128 + the signal); bad input (a missing or broken model
    folder, ...) is one line and exit status 2, as on the command line (``USER_ERRORS``)."""
    with raise_on_signal(lambda name: f"{script}: stopped by {name}"):
        temporary = None
        try:
            if not args.workdir:
                temporary = tempfile.mkdtemp(prefix=f"elmo-{script}-")
            return body(args.workdir or temporary)
        except USER_ERRORS as e:
            print(f"{script}: error: {e}", file=sys.stderr)
            return 2
        except (Stopped, KeyboardInterrupt) as e:
            name = e.args[0] if isinstance(e, Stopped) and e.args else "SIGINT"
            after = (
                f"its temporary folder {temporary} was removed"
                if temporary
                else f"{args.workdir} is kept: the same command continues from what it holds"
            )
            print(f"{script}: stopped by {name}; {after}", file=sys.stderr)
            return 128 + int(getattr(signal, name, signal.SIGTERM))
        finally:
            if temporary:
                shutil.rmtree(temporary, ignore_errors=True)


def model_and_corpus(args: argparse.Namespace, workdir: str) -> tuple[Elmo, str]:
    """The frozen ELMo (``args.model_dir``, or pretrained in ``workdir``) and the corpus folder."""
    corpus = os.path.join(workdir, "corpus")
    if not os.path.exists(os.path.join(corpus, "stats.json")):
        write_corpus(
            corpus, n_train=400 if args.quick else 20_000, n_heldout=100 if args.quick else 1000, overwrite=True
        )
    elmo = Elmo.load(args.model_dir, batch_size=256) if args.model_dir else pretrain(workdir, corpus, args.quick)
    return elmo, corpus


class TaggingData(NamedTuple):
    """The word-class task: sentences and gold classes of each split.  ``fit`` trains,
    ``dev`` (the last fifth of the training sentences) chooses learning rates, ``test``
    is the corpus's held-out text."""

    fit: tuple[list, list]
    dev: tuple[list, list]
    test: tuple[list, list]
    classes: dict[str, int]


def tagging_data(corpus: str, quick: bool) -> TaggingData:
    n_train, n_test = (120, 60) if quick else (2000, 500)
    train_s, train_lab = load_corpus(corpus, "train")
    test_s, test_lab = load_corpus(corpus, "heldout")
    train_s, train_lab = train_s[:n_train], [lab["classes"] for lab in train_lab[:n_train]]
    test_s, test_lab = test_s[:n_test], [lab["classes"] for lab in test_lab[:n_test]]
    classes = sorted({c for lab in train_lab + test_lab for c in lab})
    n_fit = len(train_s) * 4 // 5
    return TaggingData(
        (train_s[:n_fit], train_lab[:n_fit]),
        (train_s[n_fit:], train_lab[n_fit:]),
        (test_s, test_lab),
        {c: i for i, c in enumerate(classes)},
    )


def embedded(elmo: Elmo, data: TaggingData) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``{"fit" | "dev" | "test": (layers, labels, mask)}`` (one embed call for all: the
    splits share the compiled shapes)."""
    splits = {"fit": data.fit, "dev": data.dev, "test": data.test}
    vectors = elmo.embed([s for sents, _ in splits.values() for s in sents])
    out, start = {}, 0
    for name, (sents, labels) in splits.items():
        x, m = pad_layers(vectors[start : start + len(sents)])
        out[name] = (x, pad_labels(labels, data.classes, x.shape[2]), m)
        start += len(sents)
    return out


def train_head(
    elmo: Elmo,
    head: str,
    seed: int,
    n_classes: int,
    fit: tuple,
    dev: tuple,
    steps: int,
    rates: tuple[float, ...] = LEARNING_RATES,
):
    """A ``finetune`` tagger with ``head`` at the Adam rate of ``rates`` that does best on
    ``dev``: ``(dev accuracy, rate, TrainResult)``."""
    params = init_tagger(jax.random.key(seed), elmo.config, n_classes, head)
    tried = []
    for rate in rates:
        result = train_tagger(params, *fit, head, optax.adam(rate), steps=steps, batch_size=32)
        tried.append((accuracy(result.params, *dev, head), rate, result))
    return max(tried, key=lambda r: (r[0], r[1]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0])
    return run_stoppable("finetune_heads", args, lambda workdir: run(args, workdir))


def run(args: argparse.Namespace, workdir: str) -> int:
    """Steps (1)-(4) of the module docstring in ``workdir``."""
    elmo, corpus = model_and_corpus(args, workdir)
    data = tagging_data(corpus, args.quick)
    start = time.perf_counter()
    splits = embedded(elmo, data)
    print(
        f"embedded {len(data.fit[0]) + len(data.dev[0])} + {len(data.test[0])} sentences in "
        f"{time.perf_counter() - start:.1f} s; {len(data.classes)} word classes"
    )

    steps = args.steps or (150 if args.quick else 400)
    heads = ["mix", "mix:layer_norm", "components"] + [f"layer:{k}" for k in range(elmo.config.n_output_layers)]
    print(f"{'head':<15} {'rate':>6} {'train loss':>10} {'dev':>7} {'accuracy':>9}")
    mixes = {}
    for n, head in enumerate(heads):
        dev_acc, rate, result = train_head(
            elmo,
            head,
            n,
            len(data.classes),
            splits["fit"],
            splits["dev"],
            steps,
            rates=(1e-2,) if args.quick else LEARNING_RATES,
        )
        acc = accuracy(result.params, *splits["test"], head)
        extra = ""
        if head.startswith("mix"):
            w = jax.nn.softmax(result.params["mix"]["scalars"])
            extra = "  layer weights " + " ".join(f"{float(v):.2f}" for v in w)
            mixes[f"{head} (held-out {acc:.1%})"] = [float(v) for v in w]
        print(f"{head:<15} {rate:>6g} {np.mean(result.losses[-10:]):>10.3f} {dev_acc:>7.1%} {acc:>9.1%}{extra}")
    _, y_test, m_test = splits["test"]
    majority = np.bincount(y_test[m_test]).max() / m_test.sum()
    print(f"{'majority':<15} {'':>6} {'':>10} {'':>7} {majority:>9.1%}")
    mix_picture(mixes, args.plots)
    return 0


def mix_picture(mixes: dict[str, list[float]], folder: str) -> None:
    """``FOLDER/scalar_mix.png``: each trained ScalarMix's layer weights (needs matplotlib)."""
    from elmo_jax.plots import INSTALL_HINT, have_matplotlib, layer_weights_png

    if not have_matplotlib():
        print(f"a picture of the mixes' layer weights needs matplotlib: {INSTALL_HINT}")
        return
    path = layer_weights_png(
        mixes, os.path.join(folder, "scalar_mix.png"), title="word-class tagger: the trained ScalarMix's layer weights"
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    from elmo_jax.train.stop import exit_process

    exit_process(main())
