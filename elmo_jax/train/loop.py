"""The pretraining loop: composes data, model, step, parallelism, checkpoints and logs.

``train(cfg, workdir)`` runs (or resumes) a run in ``workdir``::

    WORKDIR/
      config.json          the TrainConfig of the run (the first start's)
      options.json         the biLM architecture, released models' spelling
      vocab.txt            the target vocabulary (the original's format)
      vocab_source.json    what vocab.txt was built for (absent for a vocabulary you supply)
      corpus/              the embedded synthetic corpus, when data == "synthetic"
      checkpoints/<step>/  orbax checkpoints (params, optimizer, LSTM state, data position)
      metrics.jsonl        one JSON object per log line and per evaluation
      tensorboard/         TensorBoard event files (tensorboardX, no TensorFlow)

The loop owns no model logic: it calls :func:`elmo_jax.train.step.train_step` through a
runner from :mod:`elmo_jax.train.parallel`.

Multi-process runs (``jax.distributed`` initialized, see :mod:`elmo_jax.train.distributed`):
the workdir must be one shared folder.  Process 0 prepares the corpus and the vocabulary and
then tells the others (through the runtime's key-value store) that they are complete, or
that preparation failed, with its message.  Each process reads its own sentences
(``i % P == p``), the global batch is the concatenation of the local ones (process ``p``
holds global rows ``[p * B_local, (p + 1) * B_local)``), and the step reduces over all
devices, so every process applies the same update.  Checkpoints hold global arrays (train
state replicated, LSTM state as the global ``[.., B_global, ..]`` rows) written together by
all processes, and every process's data position (``meta["data_by_process"]``); resuming
needs the same process count and global batch.  Logs, progress bar, metrics and TensorBoard
come from process 0 only.  A stop signal on any process stops all of them at the next log
step, with a checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import signal
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.atomic import atomic_path, write_json
from elmo_jax.config import ElmoConfig
from elmo_jax.data.batches import LMBatcher
from elmo_jax.data.text_source import lm1b_extracted_files, make_source
from elmo_jax.data.vocab import Vocabulary
from elmo_jax.errors import ElmoError
from elmo_jax.model.lstm import zero_state
from elmo_jax.model.precision import compute_dtype
from elmo_jax.train import distributed
from elmo_jax.train.checkpoints import Checkpoints
from elmo_jax.train.config_loader import TrainConfig
from elmo_jax.train.losses import make_loss_fn
from elmo_jax.train.parallel import (
    global_mesh, local_replica, local_rows, make_eval_fn, make_runner, rows_sharding, to_global_replicated,
    to_global_rows,
)
from elmo_jax.train.step import init_train_state, make_optimizer

# Fields that may change when a run is resumed; every other field must match.  The two
# batch fields may be spelled differently (e.g. batch_size_per_device on another device
# count replaced by batch_size): the global batch they give is checked against the
# checkpoint's instead (_check_topology).
RESUMABLE_FIELDS = {
    "epochs", "max_steps", "checkpoint_every", "keep_checkpoints", "eval_every", "eval_max_batches", "log_every",
    "parallel", "data_dir", "remat_steps", "batch_size", "batch_size_per_device", "data_workers",
}


class TrainingError(ElmoError):
    """A run that cannot start or continue; the message says why and what to do."""


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


def prepare_data(cfg: TrainConfig, workdir: str, log: Callable[[str], None], may_rebuild: bool = True) -> RunData:
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
    """
    if not distributed.is_multiprocess():
        return _prepare_data(cfg, workdir, log, may_rebuild)
    if jax.process_index() == 0:
        try:
            data = _prepare_data(cfg, workdir, log, may_rebuild)
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
    return _prepare_data(cfg, workdir, log, may_rebuild)


def _prepare_data(cfg: TrainConfig, workdir: str, log: Callable[[str], None], may_rebuild: bool) -> RunData:
    process_index = jax.process_index()
    corpus_dir = None
    if cfg.data == "synthetic":
        from elmo_jax.data import synthetic

        if cfg.heldout is not None:
            message = ("data='synthetic' evaluates on the corpus's own held-out sentences (their optimum is "
                       "known); heldout cannot be set with it: train on a text file to use your own")
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
                synthetic.write_corpus(corpus_dir, seed=cfg.seed, overwrite=True, n_train=n_train)
            else:
                _wait_for(stats_path)
        train_spec = os.path.join(corpus_dir, "train.txt")
        heldout_spec = os.path.join(corpus_dir, "heldout.txt")
    else:
        train_spec, heldout_spec = cfg.data, cfg.heldout
        if heldout_spec is None:
            heldout_spec = default_heldout(cfg.data)
    train = make_source(train_spec, "train", data_dir_for(train_spec, cfg.data_dir, workdir),
                        process_index=process_index)
    heldout = None
    if heldout_spec:
        heldout = make_source(heldout_spec, "test", data_dir_for(heldout_spec, cfg.data_dir, workdir),
                              process_index=process_index)
    else:
        log("no held-out set: no evaluation (set --config.heldout to a text file to evaluate)")
    vocab_path = os.path.join(workdir, "vocab.txt")
    source_path = os.path.join(workdir, VOCAB_SOURCE_FILE)
    wanted = _vocab_source(cfg, train)
    if process_index == 0 and os.path.exists(vocab_path):
        built = _read_vocab_source(source_path, vocab_path)
        if built is None:
            log(f"using the vocabulary in {vocab_path} as given (it was not built by this package)")
        elif built != wanted and may_rebuild:  # with a checkpoint, train() names what changed
            _stale(f"{vocab_path} was built for {built}, this run asks for {wanted}", may_rebuild, log)
            os.remove(vocab_path)
    if not os.path.exists(vocab_path):
        if process_index == 0:
            log(f"building the vocabulary from {len(train)} training sentences")
            vocab = Vocabulary.build(train, max_size=cfg.vocab_size, min_count=cfg.vocab_min_count)
            with atomic_path(vocab_path) as tmp:  # vocab.txt appears only with its record
                vocab.save(tmp)
                write_json(source_path, {"built_for": wanted, "sha256": _sha256(tmp)})
        else:
            _wait_for(vocab_path)
    vocab = Vocabulary.load(vocab_path)
    return RunData(train, heldout, vocab, corpus_dir, heldout_spec)


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
            return lm1b_extracted_files(data[len("lm1b-extracted:"):], "heldout0")
        except FileNotFoundError:  # only the training files were extracted
            return None
    return None


VOCAB_SOURCE_FILE = "vocab_source.json"
"""Beside a ``vocab.txt`` this package built: the settings it was built for and the file's
SHA-256, so that a leftover from other settings is rebuilt and a user's own file is not."""


def _vocab_source(cfg: TrainConfig, train) -> dict:
    """What determines the built vocabulary: the training sentences and the two sizes."""
    return {"data": cfg.data, "content": train.content_id(), "vocab_size": cfg.vocab_size,
            "vocab_min_count": cfg.vocab_min_count}


def _read_vocab_source(source_path: str, vocab_path: str) -> dict | None:
    """What ``vocab_path`` was built for, or None if this package did not write it as it is."""
    if not os.path.exists(source_path):
        return None
    try:
        with open(source_path, encoding="utf-8") as f:
            source = json.load(f)
        built_for, sha = source["built_for"], source.get("sha256")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TrainingError(f"{source_path} is unreadable ({e}): delete it to use {vocab_path} as given, "
                            f"or delete both to rebuild the vocabulary") from None
    return built_for if sha == _sha256(vocab_path) else None


def _stale(what: str, may_rebuild: bool, log: Callable[[str], None]) -> None:
    """A derived file made for other settings: rebuilt when no checkpoint needs it."""
    if not may_rebuild:
        raise TrainingError(f"{what}, and a checkpoint of this workdir was trained with it; "
                            f"use the run's settings or another --workdir")
    log(f"rebuilding: {what} (an earlier start that wrote no checkpoint)")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _wait_for(path: str, timeout_s: float = 3600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TrainingError(f"timed out waiting for process 0 to write {path}")
        time.sleep(0.5)


def _data_state(meta: dict, process_index: int) -> dict:
    """This process's data position from a checkpoint's meta (older ones: one ``data``)."""
    states = meta.get("data_by_process")
    return meta["data"] if states is None else states[process_index]


def _check_topology(meta: dict, path: str, global_batch: int, n_devices: int, log) -> None:
    """Refuse a checkpoint whose per-process data positions / LSTM rows cannot be mapped."""
    saved_processes = int(meta.get("process_count", 1))
    saved_batch = int(meta.get("global_batch", global_batch))
    saved_devices = meta.get("device_count")
    processes = jax.process_count()
    if saved_processes != processes or saved_batch != global_batch:
        devices = f" on {saved_devices} devices" if saved_devices else ""
        same_batch = (f"--config.batch_size={saved_batch} --config.batch_size_per_device=None"
                      if saved_batch % n_devices == 0 else
                      f"a device count that divides {saved_batch} with --config.batch_size={saved_batch}")
        raise TrainingError(
            f"checkpoint {path} was written by {saved_processes} process(es){devices} with a global batch of "
            f"{saved_batch} rows; this run has {processes} process(es) on {n_devices} devices and a global batch "
            f"of {global_batch}. Each process's position in its own share of the data (sentences i % P == p) and "
            f"its rows of the carried LSTM state cannot be mapped onto a different process count or global "
            f"batch. Resume with {saved_processes} process(es) and the same global batch ({same_batch}), "
            f"or start a new --workdir (`elmo-jax export` writes this checkpoint's weights)."
        )
    if saved_devices is not None and int(saved_devices) != n_devices:
        log(f"note: {path} was written on {saved_devices} devices, this run has {n_devices}; the global batch "
            f"and the data positions are unchanged, so the run continues (dropout masks differ)")


def _check_workdir(workdir: str) -> None:
    try:
        os.makedirs(workdir, exist_ok=True)
        probe = os.path.join(workdir, f".write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise TrainingError(f"workdir {workdir} is not writable: {e}; choose another --workdir") from None


def _config_differences(saved: dict, current: dict) -> list[str]:
    return [
        f"{k}: checkpoint has {saved.get(k)!r}, this run has {current.get(k)!r}"
        for k in sorted(set(saved) | set(current))
        if k not in RESUMABLE_FIELDS and saved.get(k) != current.get(k)
    ]


def _checkpoints_after_divergence(saved_steps: list[int], bad_step: int, path: Callable[[int], str]) -> str:
    """Which checkpoints to trust after a non-finite loss at ``bad_step``: that loss was
    computed from the parameters after step ``bad_step - 1``, so checkpoints from that step
    on hold diverged parameters (possibly still finite numbers)."""
    good = sorted(s for s in saved_steps if s < bad_step - 1)
    bad = sorted(s for s in saved_steps if s >= bad_step - 1)
    text = f"the last good checkpoint is {path(good[-1])}" if good else "no good checkpoint was written"
    if bad:
        one = len(bad) == 1
        text += (f"; {', '.join(path(s) for s in bad)} already {'holds' if one else 'hold'} the diverged "
                 f"parameters: delete {'it' if one else 'them'} before resuming, or resuming starts from there")
    return text


class _StopRequest:
    """SIGTERM / Ctrl-C set a flag; the loop checkpoints at the next step and returns."""

    def __init__(self):
        self.signal: str | None = None

    @contextlib.contextmanager
    def installed(self):
        previous = {}

        def handler(signum, frame):
            if self.signal is not None:  # a second signal: stop now
                signal.signal(signum, previous.get(signum, signal.SIG_DFL))
                raise KeyboardInterrupt
            self.signal = signal.Signals(signum).name

        try:
            for s in (signal.SIGTERM, signal.SIGINT):
                previous[s] = signal.signal(s, handler)
        except ValueError:  # not the main thread: no handlers, nothing to restore
            previous = {}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


class MetricsWriter:
    """metrics.jsonl + TensorBoard events, process 0 only.

    ``start_step``: the step this run starts from (a checkpoint's, or 0).  Records of later
    steps left by an earlier start were written by training that no checkpoint kept; they
    are dropped (from metrics.jsonl, and in TensorBoard with its ``purge_step``) so that
    every step appears once.
    """

    def __init__(self, workdir: str, enabled: bool, start_step: int = 0):
        self.enabled = enabled
        self._tb = None
        self._written: set[tuple[int, str]] = set()  # (step, kind) already in metrics.jsonl
        if enabled:
            path = os.path.join(workdir, "metrics.jsonl")
            earlier = os.path.exists(path)
            if earlier:
                _drop_records_after(path, start_step)
                self._written = _records_in(path)
            self._jsonl = open(path, "a", encoding="utf-8")
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"),
                                     purge_step=start_step + 1 if earlier else None)

    def write(self, step: int, kind: str, values: dict) -> None:
        if not self.enabled or (step, kind) in self._written:  # e.g. a finished run started again
            return
        self._written.add((step, kind))
        record = {"step": step, "kind": kind, "time": time.time(), **values}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        for k, v in values.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                self._tb.add_scalar(f"{kind}/{k}", v, step)
        self._tb.flush()

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tb.close()


def _records_in(path: str) -> set[tuple[int, str]]:
    """``(step, kind)`` of every readable record of a metrics.jsonl."""
    out = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
                out.add((int(record["step"]), str(record["kind"])))
            except (ValueError, KeyError, TypeError):
                continue
    return out


def _drop_records_after(path: str, step: int) -> None:
    """Rewrite the metrics file ``path`` (atomically) without the records after ``step``."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    kept = []
    for line in lines:
        try:
            record_step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):  # a line cut short by a crash: drop it
            continue
        if record_step <= step:
            kept.append(line if line.endswith("\n") else line + "\n")
    if len(kept) != len(lines):
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.writelines(kept)


def evaluate(params: dict, config: ElmoConfig, source, vocab: Vocabulary, *, batch_size: int = 32,
             unroll_steps: int = 20, dtype=jnp.float32, max_batches: int | None = None,
             eval_fn=None, should_stop: Callable[[], bool] | None = None) -> dict | None:
    """Held-out perplexity with the full softmax, no dropout, LSTM state carried.

    With one row (``batch_size=1``) the window length is irrelevant, so this equals the
    original's evaluation with unroll 1.  With several rows it is not quite: rows take
    their next sentence at window edges, so ``unroll_steps`` changes which sentences follow
    each other in a row and so the state carried into each sentence (measured on a tiny
    model: perplexity 261.1 at 4 rows x 20, 264.8 at 4 x 7, 263.1 with one row).

    Reported as the original does: ``exp`` of the mean over positions of
    ``0.5 * (loss_fwd + loss_bwd)``, plus each direction's own perplexity.  Returns None
    if ``should_stop()`` becomes true (it is asked between batches).

    Positions counted: each sentence's words and its end (``n + 1`` per sentence, the
    standard definition).  The streams also hold the marker that *starts* the next
    sentence (``<S>`` after ``</S>`` forward, ``</S>`` after ``<S>`` backward), which is
    certain given the previous token; the original counted it, which lowers the reported
    perplexity by a factor of about ``ppl ** (1 / (n + 2))``.  It is left out here.
    """
    if batch_size < 1 or (max_batches is not None and max_batches < 1):
        raise ValueError(f"batch_size and max_batches must be >= 1, got {batch_size} and {max_batches}")
    eval_fn = eval_fn or make_eval_fn(config, dtype)
    batcher = LMBatcher(source, vocab, batch_size, unroll_steps, config.char_cnn.max_characters_per_token,
                        shuffle=False, num_epochs=1)
    state = zero_state(config, batch_size)
    totals = np.zeros(4)
    for n, batch in enumerate(batcher):
        if max_batches is not None and n >= max_batches:
            break
        if should_stop is not None and should_stop():  # checked between batches
            return None
        batch = dict(batch)
        batch["fwd_mask"] = batch["fwd_mask"] * (batch["fwd_targets"] != vocab.bos_id)
        batch["bwd_mask"] = batch["bwd_mask"] * (batch["bwd_targets"] != vocab.eos_id)
        state, m = eval_fn(params, state, batch)
        totals += [float(m["fwd_loss_sum"]), float(m["fwd_count"]), float(m["bwd_loss_sum"]), float(m["bwd_count"])]
    if not totals[1] or not totals[3]:
        raise ValueError("the held-out data gave no positions to score (no sentences?): a perplexity "
                         "needs at least one held-out sentence")
    fwd = totals[0] / totals[1]
    bwd = totals[2] / totals[3]
    return {
        "perplexity": float(math.exp(0.5 * (fwd + bwd))),
        "fwd_perplexity": float(math.exp(fwd)),
        "bwd_perplexity": float(math.exp(bwd)),
        "tokens": int(totals[1]),
    }


def train(cfg: TrainConfig, workdir: str, *, progress: bool = True,
          log: Callable[[str], None] | None = None) -> dict:
    """Train (or resume) in ``workdir``; returns a summary dict (see the end of this function)."""
    workdir = os.path.abspath(workdir)
    is_main = jax.process_index() == 0
    if log is None:
        log = (lambda msg: print(msg, flush=True)) if is_main else (lambda msg: None)
    _check_workdir(workdir)
    model_config = cfg.elmo_config()
    n_devices = jax.device_count()
    global_batch = cfg.global_batch_size(n_devices)
    if global_batch % n_devices:
        raise TrainingError(
            f"global batch {global_batch} does not divide over {n_devices} devices; use a multiple of {n_devices}"
        )
    local_batch = global_batch // jax.process_count()

    # -- resume or start ------------------------------------------------------------------
    ckpts = Checkpoints(workdir, keep=cfg.keep_checkpoints)
    config_path = os.path.join(workdir, "config.json")
    latest = ckpts.latest_step()
    if latest is not None and os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            saved = json.load(f)
        diffs = _config_differences(saved, cfg.to_dict())
        if diffs:
            raise TrainingError(
                f"{workdir} holds a run with a different config; refusing to resume it:\n  "
                + "\n  ".join(diffs)
                + "\nuse another --workdir, or the checkpoint's values"
            )
    data = prepare_data(cfg, workdir, log, may_rebuild=latest is None)
    vocab = data.vocab
    data_content = data.train.content_id()
    if is_main:
        for path, value in ((config_path, cfg.to_dict()),
                            (os.path.join(workdir, "options.json"), model_config.to_options())):
            if not os.path.exists(path) or latest is None:
                write_json(path, value)

    selection = make_loss_fn(len(vocab), cfg.num_negatives)
    log(selection.message)
    optimizer = make_optimizer(cfg.optimizer, cfg.learning_rate, cfg.initial_accumulator, cfg.clip_norm)
    dtype = compute_dtype(cfg.compute_dtype)
    runner = make_runner(cfg.parallel, dict(
        config=model_config, optimizer=optimizer, loss_fn=selection.fn, dropout_rate=cfg.dropout, dtype=dtype,
        remat_steps=cfg.remat_steps,
    ))
    batcher = LMBatcher(
        data.train, vocab, local_batch, cfg.unroll_steps, model_config.char_cnn.max_characters_per_token,
        seed=cfg.seed, process_index=jax.process_index(), process_count=jax.process_count(),
        workers=cfg.data_workers,
    )
    steps_per_epoch = batcher.steps_per_epoch
    total_steps = steps_per_epoch * cfg.epochs
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)

    train_state = jax.tree.map(np.asarray, init_train_state(jax.random.key(cfg.seed), model_config, len(vocab), optimizer))
    lstm_state = jax.tree.map(np.asarray, zero_state(model_config, local_batch))
    # Checkpoints hold global arrays over all devices of the job (see the module docstring).
    mesh = global_mesh()
    start_step = 0
    if latest is not None:
        meta = ckpts.read_meta(latest)
        _check_topology(meta, ckpts.path(latest), global_batch, n_devices, log)
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        template = (
            jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), train_state),
            jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[:2] + (global_batch,) + x.shape[3:], x.dtype,
                                                        sharding=rows_sharding(mesh, x.ndim, 2)), lstm_state),
        )
        (g_train, g_lstm), meta = ckpts.restore(template, latest)
        train_state = jax.tree.map(local_replica, g_train)
        lstm_state = jax.tree.map(lambda x: local_rows(x, 2), g_lstm)
        del g_train, g_lstm
        data_state = _data_state(meta, jax.process_index())
        saved_content = meta.get("data_content")  # absent in checkpoints of older versions
        if saved_content is not None and saved_content != data_content:
            raise TrainingError(
                f"the training data changed since {ckpts.path(latest)} was written (its sentences "
                f"{saved_content}, now {data_content}; a relative --config.data path read "
                f"from another folder does this too). Restore the data the run started with, or start a "
                f"new --workdir (`elmo-jax export` writes this checkpoint's weights)"
            )
        if data_state.get("num_sentences") != batcher.num_sentences:
            raise TrainingError(
                f"the training data changed since {ckpts.path(latest)} was written: it had "
                f"{data_state.get('num_sentences')} sentences, now {batcher.num_sentences}. "
                f"The data position cannot be carried over; restore the data the run started with, or "
                f"start a new --workdir (`elmo-jax export` writes this checkpoint's weights)"
            )
        try:
            batcher.set_state(data_state)
        except ValueError as e:
            raise TrainingError(f"cannot continue from {ckpts.path(latest)}: {e}") from None
        start_step = int(meta["step"])
        log(f"resuming from {ckpts.path(latest)} (step {start_step})")
    log(
        f"training {cfg.model} ({model_config.lstm.dim}/{model_config.projection_dim} x{model_config.lstm.n_layers}) "
        f"on {n_devices} device(s) in {jax.process_count()} process(es) [{runner.name}], global batch {global_batch} x {cfg.unroll_steps} tokens, "
        f"vocabulary {len(vocab)}, {steps_per_epoch} steps/epoch, {total_steps} steps"
    )

    d_train = runner.put_train_state(train_state)
    d_lstm = runner.put_rows(lstm_state, axis=2)
    base_key = jax.random.key(cfg.seed)
    writer = MetricsWriter(workdir, is_main, start_step=start_step)
    tokens_per_step = global_batch * cfg.unroll_steps
    summary: dict[str, Any] = {"workdir": workdir, "start_step": start_step}
    pending: list[tuple[int, dict]] = []  # steps' metrics still on the device
    fetched: list[tuple[int, dict]] = []  # on the host, checked, not yet logged
    last_saved = latest
    eval_fn = make_eval_fn(model_config, dtype) if data.heldout is not None else None

    def host_state():
        return runner.get_train_state(d_train), runner.get_rows(d_lstm, axis=2)

    saves = 0

    def save(step: int) -> None:
        """All processes: global arrays + every process's data position (see the docstring)."""
        nonlocal last_saved, saves
        check_pending()  # never save diverged parameters; the metrics stay for the next log line
        train_host, lstm_host = host_state()
        saves += 1
        data_states = distributed.allgather_json(f"checkpoint/{saves}", batcher.get_state())
        state = (to_global_replicated(train_host, mesh), to_global_rows(lstm_host, mesh, axis=2))
        ckpts.save(step, state, {"step": step, "data_by_process": data_states, "config": cfg.to_dict(),
                                 "vocab_size": len(vocab), "process_count": jax.process_count(),
                                 "device_count": n_devices, "global_batch": global_batch,
                                 "local_batch": local_batch,
                                 "heldout": data.heldout_spec,
                                 "data_content": data_content})
        last_saved = step

    def check_pending() -> None:
        """Fetch pending metrics to the host; stop on a non-finite loss before anything is saved."""
        new = [(s, runner.metrics(m)) for s, m in pending]
        pending.clear()
        fetched.extend(new)
        for s, m in new:
            if not np.isfinite(m["loss"]):
                ckpts.wait()  # an asynchronous save in flight is listed too
                raise TrainingError(
                    f"the loss became {m['loss']} at step {s}; stopping without saving "
                    f"({_checkpoints_after_divergence(ckpts.all_steps(), s, ckpts.path)}). "
                    f"Lower the learning rate or clip_norm, or check the data."
                )

    def log_train(step: int) -> None:
        """One train record for the steps since the last one (means over those steps)."""
        nonlocal window_start, window_step
        check_pending()
        if not fetched:
            return
        fwd = sum(m["fwd_loss_sum"] for _, m in fetched) / max(sum(m["fwd_count"] for _, m in fetched), 1)
        bwd = sum(m["bwd_loss_sum"] for _, m in fetched) / max(sum(m["bwd_count"] for _, m in fetched), 1)
        m = {"loss": float(np.mean([m["loss"] for _, m in fetched])), "fwd_loss": float(fwd),
             "bwd_loss": float(bwd), "grad_norm": float(fetched[-1][1]["grad_norm"])}
        fetched.clear()
        elapsed = time.perf_counter() - window_start
        m["tokens_per_sec"] = tokens_per_step * (step - window_step) / max(elapsed, 1e-9)
        m["epoch"] = step / steps_per_epoch
        if not selection.sampled:
            m["perplexity"] = math.exp(0.5 * (m["fwd_loss"] + m["bwd_loss"]))
        writer.write(step, "train", m)
        postfix = {"epoch": f"{m['epoch']:.2f}", "tok/s": f"{m['tokens_per_sec']:.0f}", "loss": f"{m['loss']:.3f}"}
        if "perplexity" in m:
            postfix["ppl"] = f"{m['perplexity']:.1f}"
        bar.set_postfix(postfix)
        summary["train"] = m
        window_start, window_step = time.perf_counter(), step

    def run_eval(step: int) -> dict | None:
        """Held-out perplexity at ``step``; None if a stop signal cut it short."""
        params = runner.get_train_state(d_train)["params"]
        result = evaluate(params, model_config, data.heldout, vocab, unroll_steps=cfg.unroll_steps,
                          dtype=dtype, eval_fn=eval_fn, max_batches=cfg.eval_max_batches,
                          should_stop=lambda: stop.signal is not None)
        if result is None:
            log(f"\n{stop.signal}: the evaluation at step {step} was abandoned")
            return None
        writer.write(step, "eval", result)
        log(f"eval @ step {step}: perplexity {result['perplexity']:.2f} (forward {result['fwd_perplexity']:.2f}, "
            f"backward {result['bwd_perplexity']:.2f}) on {result['tokens']} held-out tokens")
        return result

    from tqdm.auto import tqdm

    bar = tqdm(total=total_steps, initial=start_step, disable=not (progress and is_main), unit="step",
               dynamic_ncols=True, file=sys.stderr)
    stop = _StopRequest()
    multiprocess = distributed.is_multiprocess()
    step = start_step
    window_start, window_step = time.perf_counter(), start_step
    try:
        with stop.installed():
            while step < total_steps:
                batch = next(batcher)
                step_key = jax.random.fold_in(base_key, step)
                d_batch = runner.put_rows(batch, axis=0)
                d_train, d_lstm, metrics = runner.step(
                    d_train, d_lstm, d_batch, jax.random.fold_in(step_key, 0),
                    runner.dropout_rngs(jax.random.fold_in(step_key, 1)),
                )
                step += 1
                pending.append((step, metrics))
                bar.update(1)
                if step % cfg.log_every == 0 or step == total_steps:
                    log_train(step)
                if cfg.eval_every and step % cfg.eval_every == 0 and eval_fn is not None and step < total_steps:
                    run_eval(step)
                if step % cfg.checkpoint_every == 0 and step < total_steps:
                    save(step)
                stopping = stop.signal is not None
                if multiprocess:  # every process must stop (and save) at the same step
                    stopping = step % cfg.log_every == 0 and distributed.any_process(stopping)
                if stopping:
                    log_train(step)  # the steps since the last log line, not lost
                    if last_saved != step:  # a checkpoint step has just saved it
                        save(step)
                    ckpts.wait()
                    reason = stop.signal or "stop requested by another process"
                    log(f"\n{reason}: saved {ckpts.path(step)}; resume with the same command")
                    summary.update(step=step, interrupted=reason, checkpoint=ckpts.path(step))
                    return summary
            if last_saved != step:
                save(step)
            ckpts.wait()
            bar.close()
            if start_step >= total_steps:
                log(f"the run is already complete at step {step}: nothing left to train")
            if eval_fn is not None:
                summary["eval"] = run_eval(step)
                if summary["eval"] is None:
                    log(f"saved {ckpts.path(step)}; score it with:  elmo-jax eval {workdir}")
                    summary.update(step=step, interrupted=stop.signal, checkpoint=ckpts.path(step))
                    return summary
    finally:
        getattr(batcher, "close", lambda: None)()  # stops the data workers
        bar.close()
        writer.close()
        ckpts.close()
    summary.update(step=step, interrupted=None, checkpoint=ckpts.path(step), steps_per_epoch=steps_per_epoch)
    summary["params"] = runner.get_train_state(d_train)["params"]
    summary["vocab"] = vocab
    summary["model_config"] = model_config
    summary["corpus_dir"] = data.corpus_dir
    log(f"final checkpoint: {ckpts.path(step)}")
    log(f"export it for embedding with:  elmo-jax export {workdir} OUT_DIR")
    return summary
