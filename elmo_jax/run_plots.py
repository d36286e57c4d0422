"""A run's pictures, from its own files: ``elmo-jax plot WORKDIR`` (and the main job).

* ``WORKDIR/perplexity.png``: held-out perplexity (``eval`` records of ``metrics.jsonl``)
  against steps, with the training batches' perplexity where the full softmax gives one; for
  a run on the embedded corpus, the generator's optimum and the bigram baseline as lines
  (the legend says the optimum bounds held-out text only: the training curve may go below).
* ``WORKDIR/word_senses.png`` (runs on the embedded corpus): the held-out occurrences of the
  ambiguous word seen most often there, each layer's vectors (the newest checkpoint's, or
  the parameters given) projected to 2-D, coloured by sense.

Drawing is :mod:`elmo_jax.plots`; this module only reads the run.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import numpy as np

from elmo_jax.errors import ElmoError
from elmo_jax.plots import curves_png, sense_projection_png

# The optimum is the generator's perplexity on held-out text; the training batches are text
# the model has seen, so their curve may go below it.
OPTIMUM_LABEL = (
    "generator's optimum {value:.2f}: the floor for held-out text only\n"
    "(training batches, seen before, can go below it)"
)
PERPLEXITY_PNG = "perplexity.png"
SENSES_PNG = "word_senses.png"


def read_metrics(workdir: str | os.PathLike) -> dict[str, dict[int, dict]]:
    """``{kind: {step: record}}`` from ``WORKDIR/metrics.jsonl`` (lines that do not parse, such
    as one cut short by a crash, are skipped)."""
    path = os.path.join(os.fspath(workdir), "metrics.jsonl")
    if not os.path.exists(path):
        raise ElmoError(f"{workdir} has no metrics.jsonl: give the folder `elmo-jax train --workdir` wrote")
    out: dict[str, dict[int, dict]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
                out.setdefault(str(record["kind"]), {})[int(record["step"])] = record
            except (ValueError, KeyError, TypeError):
                continue
    return out


def corpus_references(corpus_dir: str, vocab_tokens) -> dict[str, float]:
    """The embedded corpus's reference perplexities for a model with ``vocab_tokens``."""
    from elmo_jax.data.synthetic_corpus import load_corpus
    from elmo_jax.data.vocab import SPECIALS
    from elmo_jax.train.report import heldout_optimum

    with open(os.path.join(corpus_dir, "stats.json"), encoding="utf-8") as f:
        stats = json.load(f)
    heldout, _ = load_corpus(corpus_dir, "heldout")
    train, _ = load_corpus(corpus_dir, "train")
    seen = {w for s in train for w in s}
    words = None if vocab_tokens is None else set(vocab_tokens) - set(SPECIALS)
    refs = {OPTIMUM_LABEL: heldout_optimum(stats, heldout, seen, words)}
    if words is None or words == seen:  # the baselines use the training words as vocabulary
        refs["bigram baseline"] = stats["bigram_heldout_perplexity"]
    return refs


def plot_perplexity(workdir: str, metrics: dict[str, dict[int, dict]], references: dict[str, float]) -> str:
    evals = {s: r["perplexity"] for s, r in metrics.get("eval", {}).items() if np.isfinite(r.get("perplexity", np.nan))}
    train = {
        s: r["perplexity"]
        for s, r in metrics.get("train", {}).items()
        if "perplexity" in r and np.isfinite(r["perplexity"])
    }
    if not evals and not train:
        raise ElmoError(
            f"{workdir}/metrics.jsonl holds no perplexity yet (no held-out evaluation, and a sampled "
            f"softmax gives none for training batches): score a checkpoint with `elmo-jax eval {workdir}`"
        )
    curves = {"held-out": evals, "training batches (dropout on)": train}
    name = os.path.basename(os.path.normpath(workdir))
    return curves_png(
        curves,
        os.path.join(workdir, PERPLEXITY_PNG),
        references=references,
        title=f"{name}: perplexity against training steps",
        styles={"held-out": "o-", "training batches (dropout on)": "-"},
    )


def _occurrences(corpus_dir: str, split: str, word: str | None, max_sentences: int):
    """``(word, sentences, rows)``: the ambiguous ``word`` (None: the most frequent one of the
    first ``max_sentences`` of ``split``) and its labelled occurrences ``(sentence, position,
    sense)`` there."""
    from elmo_jax.data.synthetic import NO_SENSE
    from elmo_jax.data.synthetic_corpus import load_corpus

    sentences, labels = load_corpus(corpus_dir, split)
    sentences, labels = sentences[:max_sentences], labels[:max_sentences]
    if word is None:
        counts = Counter(
            tok for s, lab in zip(sentences, labels) for tok, sense in zip(s, lab["senses"]) if sense != NO_SENSE
        )
        if not counts:
            raise ElmoError(f"{corpus_dir}: no ambiguous word in the {split} text")
        word = counts.most_common(1)[0][0]
    rows = [
        (i, j, lab["senses"][j].split("#", 1)[-1])
        for i, (s, lab) in enumerate(zip(sentences, labels))
        for j, tok in enumerate(s)
        if tok == word and lab["senses"][j] != NO_SENSE
    ]
    return word, sentences, rows


def _layer_vectors(elmo, sentences, rows, progress: bool = False) -> np.ndarray:
    """``[L+1, N, 2P]``: every layer's vector of each occurrence ``(sentence, position, _)``."""
    picked = sorted({i for i, _, _ in rows})
    index = {i: k for k, i in enumerate(picked)}
    vectors = elmo.embed([sentences[i] for i in picked], progress=progress)  # [L+1, n, 2P] each
    return np.stack([vectors[index[i]][:, j] for i, j, _ in rows], axis=1)


def plot_word_senses(
    workdir: str, corpus_dir: str, params: dict, model_config, max_sentences: int = 2000, max_fit: int = 300, say=None
) -> str:
    """The held-out occurrences of the most frequent ambiguous word, per layer, along a sense
    direction fitted on up to ``max_fit`` of its training occurrences (:func:`elmo_jax.plots.fisher_2d`).
    ``say``: where to tell what takes minutes (then the embedding shows a progress bar)."""
    from elmo_jax.embedding.embedder import Elmo
    from elmo_jax.plots import fisher_2d

    word, heldout, rows = _occurrences(corpus_dir, "heldout", None, max_sentences)
    _, train, fit_rows = _occurrences(corpus_dir, "train", word, 20 * max_fit)
    fit_rows = fit_rows[:max_fit]
    if len({sense for *_, sense in fit_rows}) < 2:
        raise ElmoError(f"{corpus_dir}: the training text lacks occurrences of both senses of {word!r}")
    elmo = Elmo(model_config, params)
    if say is not None:
        say(
            f"word senses: embedding the sentences of {len(rows)} held-out and {len(fit_rows)} training "
            f"occurrences of {word!r} (minutes on a CPU)"
        )
    progress = say is not None
    x, x_fit = _layer_vectors(elmo, heldout, rows, progress), _layer_vectors(elmo, train, fit_rows, progress)
    fit_senses = [sense for *_, sense in fit_rows]
    points = {
        ("layer 0 (char CNN)" if layer == 0 else f"layer {layer}"): fisher_2d(x_fit[layer], fit_senses, x[layer])
        for layer in range(len(x))
    }
    senses = [sense for *_, sense in rows]
    return sense_projection_png(
        points,
        senses,
        os.path.join(workdir, SENSES_PNG),
        word=word,
        title=f"'{word}' in {len(rows)} held-out sentences, per layer",
        xlabel=f"sense direction (fitted on {len(fit_rows)} training occurrences)",
        ylabel="first principal axis of the rest",
    )


def plot_run(
    workdir: str | os.PathLike, *, params: dict | None = None, model_config=None, vocab_tokens=None, say=None
) -> list[str]:
    """Write the run's pictures next to its results; returns their paths.  ``params`` (the
    biLM's), ``model_config`` and ``vocab_tokens``: the run's, when the caller has them;
    otherwise read from the newest checkpoint and ``vocab.txt``.  ``say``: told of each
    picture as it is written and of the work that takes minutes before one (a command's
    output; None: nothing is said)."""
    tell = say or (lambda message: None)
    from elmo_jax.formats.training_run import require_workdir

    workdir = os.fspath(workdir)
    require_workdir(workdir)
    metrics = read_metrics(workdir)
    corpus_dir = os.path.join(workdir, "corpus")
    synthetic = os.path.exists(os.path.join(corpus_dir, "stats.json"))
    if vocab_tokens is None and os.path.exists(os.path.join(workdir, "vocab.txt")):
        from elmo_jax.data.vocab import Vocabulary

        vocab_tokens = Vocabulary.load(os.path.join(workdir, "vocab.txt")).tokens
    references = corpus_references(corpus_dir, vocab_tokens) if synthetic else {}
    written = [plot_perplexity(workdir, metrics, references)]
    tell(f"wrote {written[-1]}")
    if synthetic:
        if params is None:
            tell("word senses: reading the newest checkpoint")
            loaded = _newest_params(workdir)
            if loaded is not None:
                params, model_config = loaded
        if params is not None:
            written.append(plot_word_senses(workdir, corpus_dir, params, model_config, say=say))
            tell(f"wrote {written[-1]}")
    return written


def _newest_params(workdir: str) -> tuple[Any, Any] | None:
    from elmo_jax.train.checkpoints import Checkpoints
    from elmo_jax.formats.training_run import load_checkpoint_params

    if not os.path.isdir(os.path.join(workdir, "checkpoints")):
        return None
    ckpts = Checkpoints(workdir, create=False)
    try:
        if ckpts.latest_step() is None:
            return None
    finally:
        ckpts.close()
    loaded = load_checkpoint_params(workdir)
    return loaded.params["bilm"], loaded.model_config


__all__ = ["PERPLEXITY_PNG", "SENSES_PNG", "corpus_references", "plot_run", "read_metrics"]
