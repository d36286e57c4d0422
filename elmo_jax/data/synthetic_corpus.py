"""The synthetic corpus's files (:mod:`elmo_jax.data.synthetic` describes them): written from a
seed, byte-identical for the same seed, read back with their labels; and ``elmo-jax corpus``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from elmo_jax.atomic import new_mode
from elmo_jax.data import synthetic_scores
from elmo_jax.data.synthetic import (
    DEFAULT_N_HELDOUT,
    DEFAULT_N_TRAIN,
    DEFAULT_SEED,
    DOMAINS,
    NO_SENSE,
    _check_domain,
    _check_positive,
    _check_seed,
    make_language,
)

__all__ = ["add_corpus_command", "load_corpus", "write_corpus"]


def _write_lines(path: Path, lines: Iterable[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line)
            f.write("\n")


def write_corpus(
    out_dir: str | os.PathLike,
    seed: int = DEFAULT_SEED,
    n_train: int = DEFAULT_N_TRAIN,
    n_heldout: int = DEFAULT_N_HELDOUT,
    overwrite: bool = False,
    domain: str = "a",
) -> dict[str, Any]:
    """Generates the corpus into ``out_dir`` and returns the summary written to ``stats.json``.

    Files: ``train.txt``, ``heldout.txt``, ``train.labels.jsonl``, ``heldout.labels.jsonl``,
    ``stats.json``.  Everything is built in a temporary sibling directory that is renamed to
    ``out_dir`` at the end, so a failure leaves nothing behind.  An existing non-empty
    ``out_dir`` is refused unless ``overwrite``.  The same arguments give byte-identical files.
    ``domain="b"``: the shifted second domain (module docstring, "Domains"); its
    ``stats.json`` says ``"domain": "b"``.

    Raises:
      TypeError / ValueError: a bad ``seed`` / ``n_train`` / ``n_heldout`` (the message names it).
      FileExistsError: ``out_dir`` is a non-empty directory and ``overwrite`` is false.
      NotADirectoryError: ``out_dir`` exists and is not a directory.
    """
    seed = _check_seed(seed)
    n_train = _check_positive("n_train", n_train)
    n_heldout = _check_positive("n_heldout", n_heldout)
    _check_domain(domain)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"out_dir {str(out)!r} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"out_dir {str(out)!r} is not empty; pass overwrite=True (--overwrite) to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)

    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        os.chmod(tmp, new_mode(folder=True))  # a folder's usual mode, not mkdtemp's 0o700
        stats = _build_corpus(tmp, seed, n_train, n_heldout, domain)
        if out.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.rmdir(trash)
            os.rename(out, trash)
            try:
                os.rename(tmp, out)
            except BaseException:
                os.rename(trash, out)
                raise
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return stats


def _build_corpus(d: Path, seed: int, n_train: int, n_heldout: int, domain: str = "a") -> dict[str, Any]:
    language = make_language(seed, domain=domain)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    train, train_labels = synthetic_scores.sample_corpus(language, n_train, rng)
    heldout, heldout_labels = synthetic_scores.sample_corpus(language, n_heldout, rng)
    for name, sents, labels in (("train", train, train_labels), ("heldout", heldout, heldout_labels)):
        _write_lines(d / f"{name}.txt", (" ".join(s) for s in sents))
        _write_lines(
            d / f"{name}.labels.jsonl", (json.dumps(lab, ensure_ascii=False, separators=(",", ":")) for lab in labels)
        )
    train_vocab = sorted({w for s in train for w in s})
    heldout_tokens = [w for s in heldout for w in s]
    train_set = set(train_vocab)
    train_stems = {language.lemmas[w] for w in train_vocab if w in language.lemmas}
    lens = [len(s) for s in train]
    base = synthetic_scores.ngram_baselines(train, heldout)
    sense_counts = Counter(x for lab in train_labels for x in lab["senses"] if x != NO_SENSE)
    stats = {
        "seed": seed,
        "n_train_sentences": n_train,
        "n_heldout_sentences": n_heldout,
        "n_train_tokens": sum(lens),
        "n_heldout_tokens": len(heldout_tokens),
        "language_vocab_size": len(language.vocab),
        "n_states": len(language.state_names),
        "train_vocab_size": len(train_vocab),
        "heldout_oov_tokens": sum(1 for w in heldout_tokens if w not in train_set),
        "heldout_unseen_forms_of_seen_stems": sum(
            1 for w in heldout_tokens if w not in train_set and language.lemmas.get(w) in train_stems
        ),
        "sentence_length": {"min": min(lens), "max": max(lens), "mean": sum(lens) / len(lens)},
        "perplexity_convention": "exp(-sum log p / sum(len+1)); the +1 is </S>",
        "optimum_heldout_perplexity": synthetic_scores.optimum_perplexity(language, heldout),
        "optimum_heldout_perplexity_train_vocab": synthetic_scores.optimum_perplexity(
            language, heldout, known=train_vocab
        ),
        "optimum_train_perplexity": synthetic_scores.optimum_perplexity(language, train),
        "unigram_heldout_perplexity": base["unigram"],
        "bigram_heldout_perplexity": base["bigram"],
        "polysemous": [
            {
                "word": w,
                "side": info["side"],
                "senses": info["senses"],
                "train_counts": {s: sense_counts[f"{w}#{s}"] for s in info["senses"]},
            }
            for w, info in language.polysemous.items()
        ],
        "classes": sorted(set(language.state_classes)),
    }
    if domain != "a":  # domain a's file stays as it always was
        stats["domain"] = domain
    with open(d / "stats.json", "w", encoding="utf-8", newline="\n") as f:
        json.dump(stats, f, ensure_ascii=False, indent=2, sort_keys=True)
        f.write("\n")
    return stats


def load_corpus(
    corpus_dir: str | os.PathLike, split: str = "heldout"
) -> tuple[list[list[str]], list[dict[str, list[str]]]]:
    """Reads ``{split}.txt`` and ``{split}.labels.jsonl`` back: ``(sentences, labels)``."""
    d = Path(corpus_dir)
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    with open(d / f"{split}.txt", encoding="utf-8") as f:
        sentences = [line.rstrip("\n").split(" ") for line in f if line.rstrip("\n")]
    with open(d / f"{split}.labels.jsonl", encoding="utf-8") as f:
        labels = [json.loads(line) for line in f if line.strip()]
    if len(labels) != len(sentences):
        raise ValueError(f"{d}: {len(sentences)} sentences but {len(labels)} label lines")
    for i, (s, lab) in enumerate(zip(sentences, labels)):
        if len(lab["classes"]) != len(s) or len(lab["senses"]) != len(s):
            raise ValueError(f"{d}/{split}: labels of sentence {i} do not match its tokens")
    return sentences, labels


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def _format_summary(stats: dict[str, Any], out_dir: str) -> str:
    lines = [
        f"wrote {out_dir}: {stats['n_train_sentences']} train sentences "
        f"({stats['n_train_tokens']} tokens), {stats['n_heldout_sentences']} held-out "
        f"({stats['n_heldout_tokens']} tokens), seed {stats['seed']}",
        f"vocabulary: {stats['train_vocab_size']} forms in train; "
        f"{stats['heldout_oov_tokens']} held-out tokens unseen in train "
        f"({stats['heldout_unseen_forms_of_seen_stems']} of them new forms of stems seen in train)",
        "held-out perplexity (per token incl. </S>):",
        f"  optimum (true distribution)       {stats['optimum_heldout_perplexity']:8.2f}",
        f"  optimum, train vocab + <UNK>      {stats['optimum_heldout_perplexity_train_vocab']:8.2f}",
        f"  bigram baseline (train vocab+UNK) {stats['bigram_heldout_perplexity']:8.2f}",
        f"  unigram baseline (train vocab+UNK){stats['unigram_heldout_perplexity']:8.2f}",
        "polysemous words: " + ", ".join(f"{p['word']} ({p['side']})" for p in stats["polysemous"]),
    ]
    return "\n".join(lines)


def _run_corpus_command(args: argparse.Namespace) -> int:
    import sys

    try:
        stats = write_corpus(
            args.out_dir,
            seed=args.seed,
            n_train=args.n_train,
            n_heldout=args.n_heldout,
            overwrite=args.overwrite,
            domain=args.domain,
        )
    except (TypeError, ValueError, FileExistsError, NotADirectoryError) as e:
        print(f"elmo-jax corpus: error: {e}", file=sys.stderr)
        return 2
    print(_format_summary(stats, str(args.out_dir)))
    return 0


def add_corpus_command(subparsers) -> argparse.ArgumentParser:
    """Registers ``corpus OUT_DIR [--seed N] [--n-train N] [--n-heldout N] [--overwrite]``.

    ``subparsers`` is what ``ArgumentParser.add_subparsers()`` returns; the handler is set as
    ``func`` (call ``args.func(args)``; it returns the exit status).
    """
    p = subparsers.add_parser(
        "corpus",
        help="write the built-in synthetic corpus (with its known optimum)",
        description="Generate the seeded synthetic English/Chinese corpus with gold word "
        "classes and senses, and print its optimum and n-gram perplexities.",
    )
    p.add_argument("out_dir", metavar="OUT_DIR", help="folder to create (must be empty or new)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="generator seed (default 0)")
    p.add_argument(
        "--n-train", type=int, default=DEFAULT_N_TRAIN, help=f"training sentences (default {DEFAULT_N_TRAIN})"
    )
    p.add_argument(
        "--n-heldout", type=int, default=DEFAULT_N_HELDOUT, help=f"held-out sentences (default {DEFAULT_N_HELDOUT})"
    )
    p.add_argument(
        "--domain",
        choices=DOMAINS,
        default="a",
        help="a: the default language; b: a second domain with shifted vocabulary and "
        "word senses, for continued pretraining (default a)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    p.set_defaults(func=_run_corpus_command)
    return p
