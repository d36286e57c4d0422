"""The run's data: the embedded corpus, the training and held-out sources, the vocabulary.

:func:`prepare_data` makes what a run reads, once, in its workdir::

    WORKDIR/
      vocab.txt            the target vocabulary (the original's format)
      vocab_source.json    what vocab.txt was built for (absent for a vocabulary you supply)
      corpus/              the embedded synthetic corpus, when data == "synthetic"
      tfds/                text this package prepares for TFDS (see data_dir_for)
      token_index/train/   the training sentences as token ids (elmo_jax.data.token_index):
      token_index/heldout/ what the batches are read from; made once, remade if the text changes

In a multi-process job process 0 prepares and then tells the others (through the runtime's
key-value store) that everything is complete, or that preparation failed, with its message.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable

import jax

from elmo_jax.atomic import atomic_path, file_sha256, write_json
from elmo_jax.data.text_source import lm1b_extracted_files, make_source
from elmo_jax.data.token_index import open_or_build
from elmo_jax.data.vocab import SPECIALS, Vocabulary, read_token_lines
from elmo_jax.train import distributed
from elmo_jax.train.config_loader import TrainConfig
from elmo_jax.train.workdir import TrainingError


@dataclasses.dataclass
class RunData:
    """What the loop reads: sources, vocabulary and (for the synthetic corpus) its folder;
    ``heldout_spec`` is the held-out source's spec (recorded in checkpoints for eval)."""

    train: Any
    heldout: Any | None
    vocab: Vocabulary
    corpus_dir: str | None = None
    heldout_spec: str | None = None


# How long processes > 0 wait for process 0 to prepare the corpus and the vocabulary
# (seconds), unless the environment variable ELMO_JAX_PREPARE_TIMEOUT_S says otherwise.
DEFAULT_PREPARE_TIMEOUT_S = 6 * 3600.0
# After a failed preparation, how long process 0 waits for the others to read its error,
# and how long it then lets them exit before it (and the coordinator) goes.
PREPARE_ACK_TIMEOUT_S = 30.0
PREPARE_ACK_GRACE_S = 2.0


def prepare_data(
    cfg: TrainConfig,
    workdir: str,
    log: Callable[[str], None],
    may_rebuild: bool = True,
    open_source: Callable[..., Any] = make_source,
) -> RunData:
    """Sources and vocabulary; the corpus and the vocabulary are made once (process 0).

    A corpus or vocabulary this package wrote for other settings or other sentences (an
    earlier start that stopped before its first checkpoint) is rebuilt when ``may_rebuild``
    (no checkpoint depends on it); with a checkpoint, the config check and :func:`train`'s
    data check refuse the run instead.  A ``vocab.txt`` the user put in the workdir (no
    ``vocab_source.json`` describing it) is used as given.

    In a multi-process job the other processes wait until process 0 reports that everything
    is written (then they read complete files), or fail with process 0's error message; the
    wait is bounded by ``ELMO_JAX_PREPARE_TIMEOUT_S`` (default 6 h) and ends at once if
    process 0 dies (the runtime's coordinator lives in process 0).

    ``open_source(spec, split, data_dir, process_index=..., workers=...)`` opens a source
    (:func:`elmo_jax.data.text_source.make_source`).
    """
    if not distributed.is_multiprocess():
        return _prepare_data(cfg, workdir, log, may_rebuild, open_source)
    if jax.process_index() == 0:
        try:
            data = _prepare_data(cfg, workdir, log, may_rebuild, open_source)
        except Exception as e:
            distributed.publish("prepare", f"error: {type(e).__name__}: {e}")
            # The runtime's coordinator lives in this process: leaving before the others have
            # read the error and left too makes their runtime abort (SIGABRT) instead of
            # exiting with the error.  Wait for their acknowledgements, then a moment more.
            for p in range(1, jax.process_count()):
                try:
                    distributed.wait_for_value(f"prepare_ack/{p}", PREPARE_ACK_TIMEOUT_S, f"process {p}")
                except distributed.DistributedError:
                    pass
            time.sleep(PREPARE_ACK_GRACE_S)
            raise
        distributed.publish("prepare", "ok")
        return data
    timeout_s = float(os.environ.get("ELMO_JAX_PREPARE_TIMEOUT_S", DEFAULT_PREPARE_TIMEOUT_S))  # read at call time
    status = distributed.wait_for_value("prepare", timeout_s, "process 0 to prepare the corpus and vocabulary")
    if status != "ok":
        distributed.publish(f"prepare_ack/{jax.process_index()}", "seen")
        raise TrainingError(f"process 0 failed to prepare the data: {status.removeprefix('error: ')}")
    return _prepare_data(cfg, workdir, log, may_rebuild, open_source)


def _prepare_data(
    cfg: TrainConfig, workdir: str, log: Callable[[str], None], may_rebuild: bool, open_source: Callable[..., Any]
) -> RunData:
    process_index = jax.process_index()
    corpus_dir = None
    if cfg.data == "synthetic":
        from elmo_jax.data import synthetic, synthetic_corpus

        if cfg.heldout is not None:
            message = (
                "data='synthetic' evaluates on the corpus's own held-out sentences (their optimum is "
                "known); heldout cannot be set with it: train on a text file to use your own"
            )
            if may_rebuild:  # a new run; an earlier version's run that set it resumes as before
                raise TrainingError(message)
            log(f"heldout {cfg.heldout!r} is ignored: {message}")

        corpus_dir = os.path.join(workdir, "corpus")
        stats_path = os.path.join(corpus_dir, "stats.json")
        n_train = cfg.corpus_size or synthetic.DEFAULT_N_TRAIN
        if process_index == 0 and os.path.exists(stats_path):
            with open(stats_path, encoding="utf-8") as f:
                stats = json.load(f)
            found = {"seed": stats.get("seed"), "corpus_size": stats.get("n_train_sentences")}
            wanted = {"seed": cfg.seed, "corpus_size": n_train}
            if found != wanted:
                _stale(f"{corpus_dir} was generated with {found}, this run asks for {wanted}", may_rebuild, log)
                os.remove(stats_path)  # write_corpus replaces the folder
        if not os.path.exists(stats_path):
            if process_index == 0:
                log(f"writing the embedded synthetic corpus to {corpus_dir}")
                synthetic_corpus.write_corpus(corpus_dir, seed=cfg.seed, overwrite=True, n_train=n_train)
            else:
                _wait_for(stats_path)
        train_spec = os.path.join(corpus_dir, "train.txt")
        heldout_spec: str | None = os.path.join(corpus_dir, "heldout.txt")
    else:
        train_spec, heldout_spec = cfg.data, cfg.heldout
        if heldout_spec is None:
            heldout_spec = default_heldout(cfg.data)
    # Local text is prepared in data_workers processes (0: in this one).
    train = open_source(
        train_spec,
        "train",
        data_dir_for(train_spec, cfg.data_dir, workdir),
        process_index=process_index,
        workers=cfg.data_workers,
    )
    heldout = None
    if heldout_spec:
        heldout = open_source(
            heldout_spec,
            "test",
            data_dir_for(heldout_spec, cfg.data_dir, workdir),
            process_index=process_index,
            workers=cfg.data_workers,
        )
    else:
        log("no held-out set: no evaluation (set --config.heldout to a text file to evaluate)")
    # The batches are read from token indexes of the sources (one pass each, data_workers
    # processes; process 0 makes them, the others open them).
    index_dir = os.path.join(workdir, "token_index")
    train = open_or_build(train, os.path.join(index_dir, "train"), cfg.data_workers, log, may_build=process_index == 0)
    if heldout is not None:
        heldout = open_or_build(
            heldout, os.path.join(index_dir, "heldout"), cfg.data_workers, log, may_build=process_index == 0
        )
    vocab_path = os.path.join(workdir, "vocab.txt")
    source_path = os.path.join(workdir, VOCAB_SOURCE_FILE)
    wanted = _vocab_source(cfg, train)
    if process_index == 0 and os.path.exists(vocab_path):
        built = _read_vocab_source(source_path, vocab_path)
        if built is None and may_rebuild:  # resuming, it is the run's own: its checkpoint's record checks it
            why = (
                f"it was changed after this package built it: its SHA-256 differs from the one in {VOCAB_SOURCE_FILE}"
                if os.path.exists(source_path)
                else "it was not built by this package"
            )
            log(f"using the vocabulary in {vocab_path} as given ({why})")
        elif built != wanted and may_rebuild:  # with a checkpoint, train() names what changed
            _stale(f"{vocab_path} was built for {built}, this run asks for {wanted}", may_rebuild, log)
            os.remove(vocab_path)
    if not os.path.exists(vocab_path):
        if process_index == 0:
            log(f"building the vocabulary from {len(train)} training sentences")
            vocab = Vocabulary.build(train.counts(), max_size=cfg.vocab_size, min_count=cfg.vocab_min_count)
            with atomic_path(vocab_path) as tmp:  # vocab.txt appears only with its record
                vocab.save(tmp)
                write_json(source_path, {"built_for": wanted, "sha256": file_sha256(tmp)})
        else:
            _wait_for(vocab_path)
    vocab = Vocabulary.load(vocab_path)
    return RunData(train, heldout, vocab, corpus_dir, heldout_spec)


def vocab_size_lower_bound(workdir: str, resuming: bool) -> int:
    """The fewest targets the run's vocabulary can have, known before any data is read:
    the tokens of the ``vocab.txt`` it will use when that is the user's own or a resumed
    run's, else the special tokens alone (a vocabulary still to be built, or to be rebuilt
    for other settings, may be any size).  What the vocabulary's size bounds from below
    (the softmax's parameters and logits) is then bounded too."""
    vocab_path = os.path.join(workdir, "vocab.txt")
    if os.path.isfile(vocab_path) and (resuming or not os.path.exists(os.path.join(workdir, VOCAB_SOURCE_FILE))):
        return max(len(SPECIALS), len(read_token_lines(vocab_path)))
    return len(SPECIALS)


def data_dir_for(spec: str, data_dir: str | None, workdir: str) -> str | None:
    """Where the data of ``spec`` lives when ``data_dir`` is not set: TFDS ``lm1b`` in TFDS's
    own folder (``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``, where ``tfds build`` puts
    it; None here) unless a ``WORKDIR/tfds/lm1b`` exists, text this package prepares in
    ``WORKDIR/tfds``, beside the run."""
    if data_dir:
        return data_dir
    beside_run = os.path.join(workdir, "tfds")
    if spec.strip() in ("lm1b", "tfds:lm1b"):  # runs of earlier versions kept lm1b beside the run
        return beside_run if os.path.isdir(os.path.join(beside_run, "lm1b")) else None
    return beside_run


def default_heldout(data: str) -> str | None:
    """The held-out spec used when ``heldout`` is not set: TFDS ``lm1b``'s test split, or for
    the extracted benchmark its usual test file (held-out shard 0, about 6k sentences)."""
    if data == "lm1b":
        return "lm1b"
    if data.startswith("lm1b-extracted:"):
        try:
            return lm1b_extracted_files(data[len("lm1b-extracted:") :], "heldout0")
        except FileNotFoundError:  # only the training files were extracted
            return None
    return None


VOCAB_SOURCE_FILE = "vocab_source.json"
"""Beside a ``vocab.txt`` this package built: the settings it was built for and the file's
SHA-256, so that a leftover from other settings is rebuilt and a user's own file is not."""


def _vocab_source(cfg: TrainConfig, train) -> dict:
    """What determines the built vocabulary: the training sentences and the two sizes."""
    return {
        "data": cfg.data,
        "content": train.content_id(),
        "vocab_size": cfg.vocab_size,
        "vocab_min_count": cfg.vocab_min_count,
    }


def _read_vocab_source(source_path: str, vocab_path: str) -> dict | None:
    """What ``vocab_path`` was built for, or None if this package did not write it as it is."""
    if not os.path.exists(source_path):
        return None
    try:
        with open(source_path, encoding="utf-8") as f:
            source = json.load(f)
        built_for, sha = source["built_for"], source.get("sha256")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TrainingError(
            f"{source_path} is unreadable ({e}): delete it to use {vocab_path} as given, "
            f"or delete both to rebuild the vocabulary"
        ) from None
    return built_for if sha == file_sha256(vocab_path) else None


def _stale(what: str, may_rebuild: bool, log: Callable[[str], None]) -> None:
    """A derived file made for other settings: rebuilt when no checkpoint needs it."""
    if not may_rebuild:
        raise TrainingError(
            f"{what}, and a checkpoint of this workdir was trained with it; use the run's settings or another --workdir"
        )
    log(f"rebuilding: {what} (an earlier start that wrote no checkpoint)")


def _wait_for(path: str, timeout_s: float = 3600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TrainingError(f"timed out waiting for process 0 to write {path}")
        time.sleep(0.5)
