"""What a run on the embedded synthetic corpus learned: perplexity against the generator's
optimum and the n-gram baselines, and the per-layer probes."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from elmo_jax.config import ElmoConfig


# The probes' full size (what a complete run of configs/tiny.py is scored on) ...
PROBE_TEST_SENTENCES = 2000
PROBE_TRAIN_SENTENCES = 20000
# ... and the least a short run is scored on (seconds on 2 cores).
MIN_PROBE_SENTENCES = 200


def probe_sizes(rows_trained: int) -> dict:
    """``synthetic_report``'s ``max_sentences`` / ``max_probe_train`` for a run that trained
    on ``rows_trained`` rows (all its steps, resumed ones included, x the global batch):
    the probes never embed
    more sentences than the run trained on (at least :data:`MIN_PROBE_SENTENCES`, at most
    the full size), so a 5-step trial is scored in seconds instead of minutes, and a
    complete tiny run (2,670 steps x 32 rows) gets the full probes."""
    n = max(MIN_PROBE_SENTENCES, int(rows_trained))
    return {"max_sentences": min(PROBE_TEST_SENTENCES, n), "max_probe_train": min(PROBE_TRAIN_SENTENCES, n)}


def synthetic_report(
    corpus_dir: str,
    params: dict,
    model_config: ElmoConfig,
    eval_result: dict | None,
    max_sentences: int = PROBE_TEST_SENTENCES,
    max_probe_train: int = PROBE_TRAIN_SENTENCES,
    *,
    vocab: Sequence[str] | None = None,
    progress: bool | None = None,
) -> str:
    """A printable report; ``params`` are the biLM's (no softmax).

    ``vocab``: the model's softmax vocabulary.  When it is not the training text's (a
    ``vocab_size`` cut, ``vocab_min_count``, a supplied ``vocab.txt``), more targets are
    ``<UNK>`` for the model than the stored optimum assumes, so the optimum is recomputed
    for this vocabulary and the n-gram baselines (built on the training words) are left out.
    ``progress``: the probes' embedding progress bar (``Elmo.embed``'s default when None).

    Probes are fitted on up to ``max_probe_train`` training-corpus sentences that hold a
    polysemous word (the 1-NN neighbours, as the paper's §5.3 uses a whole sense-annotated
    corpus; with the default corpus that is all 13,381 of them: 1-NN accuracy grows with
    the number of neighbours, 94.2 -> 97.5 % on the tiny model's top layer from 3,000 to
    all) and evaluated on up to ``max_sentences`` held-out sentences; the class probe is also
    scored on the held-out tokens whose form never occurs in the training text.
    """
    from elmo_jax.data.synthetic import NO_SENSE
    from elmo_jax.data.synthetic_corpus import load_corpus
    from elmo_jax.data.vocab import SPECIALS
    from elmo_jax.embedding.embedder import Elmo
    from elmo_jax.probes import format_probe_table, probe_table

    with open(os.path.join(corpus_dir, "stats.json"), encoding="utf-8") as f:
        stats = json.load(f)
    lines = ["", "held-out perplexity (lower is better):"]
    if eval_result is not None:
        lines.append(
            f"  this model            {eval_result['perplexity']:8.2f}  "
            f"(forward {eval_result['fwd_perplexity']:.2f}, backward {eval_result['bwd_perplexity']:.2f})"
        )
    all_heldout, heldout_labels = load_corpus(corpus_dir, "heldout")
    train, train_labels = load_corpus(corpus_dir, "train")
    seen = {w for s in train for w in s}
    words = None if vocab is None else set(vocab) - set(SPECIALS)
    optimum = heldout_optimum(stats, all_heldout, seen, words)
    if words is None or words == seen:
        lines += [
            f"  generator's optimum   {optimum:8.2f}  (words unseen in training merged into <UNK>, as the model sees them)",
            f"  bigram baseline       {stats['bigram_heldout_perplexity']:8.2f}",
            f"  unigram baseline      {stats['unigram_heldout_perplexity']:8.2f}",
        ]
    else:
        lines += [
            f"  generator's optimum   {optimum:8.2f}  (words outside the model's {len(words)}-word vocabulary "
            f"merged into <UNK>, as the model sees them)",
            f"  (the n-gram baselines use all {len(seen)} training words, so they are not comparable here)",
        ]
    if eval_result is not None:
        lines.append(f"  gap to the optimum    {100 * (eval_result['perplexity'] / optimum - 1):7.1f} %")
    heldout, heldout_labels = all_heldout[:max_sentences], heldout_labels[:max_sentences]
    pick = [i for i, lab in enumerate(train_labels) if any(x != NO_SENSE for x in lab["senses"])]
    pick = pick[:max_probe_train]
    sentences = heldout + [train[i] for i in pick]
    labels = heldout_labels + [train_labels[i] for i in pick]
    vectors = Elmo(model_config, params).embed(sentences, progress=progress)
    unseen = [w not in seen for s in sentences for w in s]
    rows = probe_table(
        vectors,
        labels,
        sentences=sentences,
        is_test=[True] * len(heldout) + [False] * len(pick),
        token_subsets={"unseen": unseen},
    )
    lines += [
        "",
        f"probes fitted on {len(pick)} training sentences with a polysemous word, "
        f"tested on {len(heldout)} held-out sentences:",
        format_probe_table(rows),
    ]
    return "\n".join(lines)


def heldout_optimum(stats: dict, heldout: Sequence[Sequence[str]], seen: set[str], words: set[str] | None) -> float:
    """The generator's held-out perplexity for a model whose vocabulary is ``words`` (None:
    the training text's words, ``seen``).  Targets outside the model's vocabulary are
    ``<UNK>`` for it; the optimum scores them the same way, so the two are comparable."""
    if words is None or words == seen:
        return stats["optimum_heldout_perplexity_train_vocab"]
    from elmo_jax.data.synthetic import make_language
    from elmo_jax.data.synthetic_scores import optimum_perplexity

    return optimum_perplexity(make_language(stats["seed"]), heldout, known=sorted(words))
