"""What a run on the embedded synthetic corpus learned: perplexity against the generator's
optimum and the n-gram baselines, and the per-layer probes."""

from __future__ import annotations

import json
import os

from elmo_jax.config import ElmoConfig


def synthetic_report(corpus_dir: str, params: dict, model_config: ElmoConfig, eval_result: dict | None,
                     max_sentences: int = 2000) -> str:
    """A printable report; ``params`` are the biLM's (no softmax)."""
    from elmo_jax.data.synthetic import load_corpus
    from elmo_jax.embedder import Elmo
    from elmo_jax.probes import format_probe_table, probe_table

    with open(os.path.join(corpus_dir, "stats.json"), encoding="utf-8") as f:
        stats = json.load(f)
    lines = ["", "held-out perplexity (lower is better):"]
    if eval_result is not None:
        lines.append(f"  this model            {eval_result['perplexity']:8.2f}  "
                     f"(forward {eval_result['fwd_perplexity']:.2f}, backward {eval_result['bwd_perplexity']:.2f})")
    # Targets outside the training vocabulary are <UNK> for the model; this optimum scores
    # them the same way, so the two numbers are comparable.
    optimum = stats["optimum_heldout_perplexity_train_vocab"]
    lines += [
        f"  generator's optimum   {optimum:8.2f}  (words unseen in training merged into <UNK>, as the model sees them)",
        f"  bigram baseline       {stats['bigram_heldout_perplexity']:8.2f}",
        f"  unigram baseline      {stats['unigram_heldout_perplexity']:8.2f}",
    ]
    if eval_result is not None:
        lines.append(f"  gap to the optimum    {100 * (eval_result['perplexity'] / optimum - 1):7.1f} %")
    sentences, labels = load_corpus(corpus_dir, "heldout")
    sentences, labels = sentences[:max_sentences], labels[:max_sentences]
    vectors = Elmo(model_config, params).embed(sentences)
    rows = probe_table(vectors, labels, sentences=sentences)
    lines += ["", f"probes on {len(sentences)} held-out sentences:", format_probe_table(rows)]
    return "\n".join(lines)
