"""A Flax NNX tagger with ELMo inside: ELMo layer -> bidirectional LSTM -> linear.

    python examples/flax_tagger.py                 # pretrain a tiny ELMo briefly, then tag
    python examples/flax_tagger.py MODEL_DIR       # use a model folder or a run (runs/tiny) instead
    python examples/flax_tagger.py --quick         # a first look: small everything

The task is the one of ``examples/finetune_heads.py`` (whose corpus, pretraining and splits
this reuses): the gold word class of every token of the package's synthetic corpus.  The
model is the paper's recipe for a task RNN: ``elmo_jax.nnx.ElmoLayer`` gives two
ScalarMixes of the frozen biLM's layers, one feeds a bidirectional ``nnx.RNN`` of LSTM
cells, the other is concatenated with the RNN's output before the linear classifier.
``nnx.Optimizer(model, optax.adam(...), wrt=nnx.Param)`` trains the mixes, the RNN and
the classifier; the biLM's weights are ``ElmoWeight`` variables that get no gradient and
no optimizer state.  Batches run the biLM inside the jitted step (char ids in, padded to
``Elmo.embed``'s length buckets, so the step compiles once per bucket).

It prints the tagger's dev and held-out accuracy beside the ``elmo_jax.finetune`` heads
(ScalarMix and the 5-component head, each at its best learning rate on the same dev split)
and the number of trainable and frozen parameters.  Default run: 96 s on an idle 2-core
AMD EPYC Zen 5, half of it the pretraining (47 s given a trained model; ``--quick`` 18-25 s;
README, "Fine-tune a task head").
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if __name__ == "__main__":  # first: a signal while jax loads ends the script with one line, 130 / 143
    from elmo_jax.train.stop import stop_cleanly

    stop_cleanly(lambda name: f"flax_tagger: stopped by {name}")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from finetune_heads import (
    LEARNING_RATES,
    embedded,
    model_and_corpus,
    parse_args,
    run_stoppable,  # noqa: E402
    tagging_data,
    train_head,
)

from elmo_jax.finetune import accuracy  # noqa: E402
from elmo_jax.nnx import ElmoLayer, batch_inputs, parameter_counts  # noqa: E402

BATCH_ROWS = 32
MIX_PENALTY = 1e-3  # the paper's L2 penalty on the mixes' layer weights


class Tagger(nnx.Module):
    def __init__(self, elmo, n_classes: int, hidden: int, *, rngs: nnx.Rngs):
        self.elmo = ElmoLayer(elmo, num_output_representations=2, dropout=0.25, rngs=rngs)
        d = elmo.config.output_dim
        self.rnn = nnx.Bidirectional(
            nnx.RNN(nnx.LSTMCell(d, hidden, rngs=rngs)), nnx.RNN(nnx.LSTMCell(d, hidden, rngs=rngs)), rngs=rngs
        )
        self.out = nnx.Linear(2 * hidden + d, n_classes, rngs=rngs)

    def __call__(self, char_ids_BTC, mask_BT):
        x_BTD, y_BTD = self.elmo(char_ids_BTC, mask_BT)
        h_BTH = self.rnn(x_BTD, seq_lengths=jnp.sum(mask_BT, axis=1))
        return self.out(jnp.concatenate([h_BTH, y_BTD], axis=-1))


def loss_fn(model: Tagger, char_ids_BTC, mask_BT, labels_BT):
    logits = model(char_ids_BTC, mask_BT)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels_BT, 0))
    return jnp.sum(ce * mask_BT) / jnp.maximum(jnp.sum(mask_BT), 1) + MIX_PENALTY * model.elmo.penalty()


@nnx.jit
def train_step(model: Tagger, optimizer: nnx.Optimizer, char_ids_BTC, mask_BT, labels_BT):
    loss, grads = nnx.value_and_grad(loss_fn)(model, char_ids_BTC, mask_BT, labels_BT)
    optimizer.update(model, grads)
    return loss


@nnx.jit
def predict(model: Tagger, char_ids_BTC, mask_BT):
    return jnp.argmax(model(char_ids_BTC, mask_BT), axis=-1)


def batch(sentences, labels, classes, config, rows: int):
    """Char ids, mask and labels ``[rows, T]`` (-1 past each sentence)."""
    ids, mask = batch_inputs(sentences, config, rows=rows)
    y = np.full(mask.shape, -1, np.int32)
    for i, lab in enumerate(labels):
        y[i, : len(lab)] = [classes[c] for c in lab]
    return ids, mask, y


def tagger_accuracy(model: Tagger, split, classes, config) -> float:
    sentences, labels = split
    hits = total = 0
    for s in range(0, len(sentences), BATCH_ROWS):
        ids, mask, y = batch(sentences[s : s + BATCH_ROWS], labels[s : s + BATCH_ROWS], classes, config, BATCH_ROWS)
        pred = np.asarray(predict(model, ids, mask))
        hits += int(np.sum((pred == y) & mask))
        total += int(mask.sum())
    return hits / max(total, 1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0])
    return run_stoppable("flax_tagger", args, lambda workdir: run(args, workdir))


def run(args: argparse.Namespace, workdir: str) -> int:
    """The frozen ELMo and corpus (in ``workdir``), the NNX tagger's training, and the comparison."""
    elmo, corpus = model_and_corpus(args, workdir)
    data = tagging_data(corpus, args.quick)
    steps = args.steps or (40 if args.quick else 400)
    n_classes = len(data.classes)

    model = Tagger(elmo, n_classes, hidden=16 if args.quick else 64, rngs=nnx.Rngs(0))
    n_trainable, n_frozen = parameter_counts(model)
    print(
        f"nnx tagger: {n_trainable:,} trainable parameters (mixes, biLSTM, classifier), {n_frozen:,} frozen (the biLM)"
    )
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
    rng = np.random.default_rng(0)
    fit_s, fit_lab = data.fit
    start, losses, shapes = time.perf_counter(), [], set()
    model.train()
    for _ in range(steps):
        idx = rng.integers(0, len(fit_s), size=min(BATCH_ROWS, len(fit_s)))
        ids, mask, y = batch([fit_s[i] for i in idx], [fit_lab[i] for i in idx], data.classes, elmo.config, BATCH_ROWS)
        shapes.add(ids.shape)  # the step compiles once per shape
        losses.append(float(train_step(model, optimizer, ids, mask, y)))
    model.eval()
    print(
        f"trained {steps} steps in {time.perf_counter() - start:.0f} s ({len(shapes)} step shapes compiled: "
        f"time buckets {sorted(t for _, t, _ in shapes)})"
    )
    dev_acc = tagger_accuracy(model, data.dev, data.classes, elmo.config)
    test_acc = tagger_accuracy(model, data.test, data.classes, elmo.config)
    w = [" ".join(f"{float(v):.2f}" for v in jax.nn.softmax(m.scalars[...])) for m in model.elmo.mixes]

    splits = embedded(elmo, data)  # the finetune heads read precomputed layers
    print(f"\n{'model':<15} {'rate':>6} {'train loss':>10} {'dev':>7} {'accuracy':>9}")
    print(
        f"{'nnx tagger':<15} {3e-3:>6g} {np.mean(losses[-10:]):>10.3f} {dev_acc:>7.1%} {test_acc:>9.1%}"
        f"  layer weights {w[0]} | {w[1]}"
    )
    for n, head in enumerate(("mix", "components")):
        dev, rate, result = train_head(
            elmo,
            head,
            n,
            n_classes,
            splits["fit"],
            splits["dev"],
            args.steps or (40 if args.quick else 400),
            rates=(1e-2,) if args.quick else LEARNING_RATES,
        )
        acc = accuracy(result.params, *splits["test"], head)
        print(f"{head:<15} {rate:>6g} {np.mean(result.losses[-10:]):>10.3f} {dev:>7.1%} {acc:>9.1%}")
    _, y_test, m_test = splits["test"]
    print(f"{'majority':<15} {'':>6} {'':>10} {'':>7} {np.bincount(y_test[m_test]).max() / m_test.sum():>9.1%}")
    return 0


if __name__ == "__main__":
    from elmo_jax.train.stop import exit_process

    exit_process(main())
