"""The pretraining loop: build, restore or initialise, then ``for step: batch, step, log,
eval, save``.

``train(cfg, workdir)`` runs (or resumes) a run in ``workdir``; what the folder holds and
when a run may continue is :mod:`elmo_jax.train.workdir`'s, the data it prepares there
:mod:`elmo_jax.train.run_data`'s::

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
the workdir must be one shared folder.  Process 0 prepares the corpus and the vocabulary
(:func:`elmo_jax.train.run_data.prepare_data`).  Each process reads its own sentences
(``i % P == p``), the global batch is the concatenation of the local ones (process ``p``
holds global rows ``[p * B_local, (p + 1) * B_local)``), and the step reduces over all
devices, so every process applies the same update.  Checkpoints hold global arrays written
together by all processes, and every process's data position; resuming needs the same
process count and global batch.  Logs, progress bar, metrics and TensorBoard come from
process 0 only.  A stop signal on any process stops all of them at the next log step, with
a checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any, Callable

import jax
import numpy as np

from elmo_jax.config import ElmoConfig
from elmo_jax.data.batches import LMBatcher
from elmo_jax.data.text_source import make_source
from elmo_jax.data.workers import exit_if_starting_worker
from elmo_jax.model.lstm import zero_state
from elmo_jax.model.precision import compute_dtype
from elmo_jax.train import distributed, memory
from elmo_jax.train.checkpoints import Checkpoints
from elmo_jax.train.config_loader import TrainConfig
from elmo_jax.train.evaluation import evaluate
from elmo_jax.train.init_from import initial_train_state, start_config
from elmo_jax.train.losses import make_loss_fn
from elmo_jax.train.metrics import MetricsWriter, StepBar, TrainWindow, eval_message, progress_postfix
from elmo_jax.train.parallel import global_mesh, make_eval_fn, make_runner
from elmo_jax.train.run_data import RunData, data_dir_for, default_heldout, prepare_data, vocab_size_lower_bound
from elmo_jax.train.step import init_train_state, make_optimizer
from elmo_jax.train.stop import StopRequest
from elmo_jax.train.workdir import (
    RESUMABLE_FIELDS,
    TrainingError,
    check_finite,
    check_resumable,
    check_run_inputs,
    check_writable,
    checkpoints_after_divergence,
    hold_workdir,
    restore_newest,
    resume_data_position,
    run_inputs_record,
    tidy_failed_start,
    write_checkpoint,
    write_run_files,
)

# Names other code and earlier versions imported from here.
_checkpoints_after_divergence = checkpoints_after_divergence
__all__ = [
    "train",
    "evaluate",
    "TrainingError",
    "RunData",
    "prepare_data",
    "data_dir_for",
    "default_heldout",
    "MetricsWriter",
    "RESUMABLE_FIELDS",
]


def train(cfg: TrainConfig, workdir: str, *, progress: bool = True, log: Callable[[str], None] | None = None) -> dict:
    """Train (or resume) in ``workdir``; returns a summary dict (see the end of
    :func:`_train`).  The run holds the workdir's lock throughout (one run per workdir), and
    a start that fails leaves no empty folders behind."""
    exit_if_starting_worker()  # a data worker importing a script that trains without a __main__ guard
    workdir = os.path.abspath(workdir)
    is_main = jax.process_index() == 0
    with tidy_failed_start(workdir, is_main):
        check_writable(workdir)
        with hold_workdir(workdir, is_main), contextlib.ExitStack() as closing:
            return _train(cfg, workdir, progress, log, is_main, closing)


def _train(
    cfg: TrainConfig,
    workdir: str,
    progress: bool,
    log: Callable[[str], None] | None,
    is_main: bool,
    closing: contextlib.ExitStack,
) -> dict:
    """The run; ``closing`` stops what it starts (checkpoint writer, data workers) however it ends."""
    # -- build: folder, config, data, step function ----------------------------------------
    if log is None:
        log = (lambda msg: print(msg, flush=True)) if is_main else (lambda msg: None)
    n_devices = jax.device_count()
    global_batch = cfg.global_batch_size(n_devices)
    if global_batch % n_devices:
        raise TrainingError(
            f"global batch {global_batch} does not divide over {n_devices} devices; use a multiple of {n_devices}"
        )
    local_batch = global_batch // jax.process_count()
    ckpts = Checkpoints(workdir, keep=cfg.keep_checkpoints)
    closing.callback(ckpts.close)  # also when the start fails before the loop
    latest = ckpts.latest_step()  # a restart reads this checkpoint and nothing else
    cfg, pretrained = start_config(cfg, workdir, resuming=latest is not None, progress=progress and is_main, log=log)
    model_config = cfg.elmo_config()
    check_resumable(workdir, cfg, latest)
    optimizer = make_optimizer(cfg.optimizer, cfg.learning_rate, cfg.initial_accumulator, cfg.clip_norm)
    dtype = compute_dtype(cfg.compute_dtype)
    # Before the data is prepared, indexed and counted: with the fewest targets the
    # vocabulary can have, the estimate is still a lower bound of the step's.
    fewest = vocab_size_lower_bound(workdir, resuming=latest is not None)
    check_step_memory(
        cfg, model_config, fewest, optimizer, fewest > cfg.num_negatives, global_batch // n_devices, dtype
    )
    data = prepare_data(cfg, workdir, log, may_rebuild=latest is None, open_source=make_source)
    vocab = data.vocab
    data_content = data.train.content_id()

    selection = make_loss_fn(len(vocab), cfg.num_negatives)
    log(selection.message)
    if len(vocab) != fewest:  # the softmax's share, now known
        check_step_memory(cfg, model_config, len(vocab), optimizer, selection.sampled, global_batch // n_devices, dtype)
    runner = make_runner(cfg.parallel, step_kwargs(cfg, model_config, selection, optimizer, dtype, log))
    batcher = make_batcher(data, cfg, model_config, local_batch, log)
    closing.callback(getattr(batcher, "close", lambda: None))  # its data workers (a test's stand-in has none)
    steps_per_epoch = batcher.steps_per_epoch
    total_steps = steps_per_epoch * cfg.epochs
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    mesh = global_mesh()  # checkpoints hold global arrays over all devices of the job

    # -- restore or initialise -------------------------------------------------------------
    train_state = jax.tree.map(
        np.asarray, init_train_state(jax.random.key(cfg.seed), model_config, len(vocab), optimizer)
    )
    lstm_state = jax.tree.map(np.asarray, zero_state(model_config, local_batch))
    start_step = 0
    pretrained_start = latest is None and pretrained is not None
    if latest is not None:
        restored = restore_newest(
            ckpts,
            train_state,
            lstm_state,
            global_batch=global_batch,
            n_devices=n_devices,
            mesh=mesh,
            log=log,
            check_meta=lambda meta, path: check_run_inputs(meta, path, workdir, cfg.to_dict()),
        )
        assert restored is not None  # latest_step() saw a checkpoint: the newest good one restores, or it raised
        latest, train_state, lstm_state, meta = restored
        resume_data_position(batcher, meta, ckpts.path(latest), data_content)
        start_step = int(meta["step"])
        log(f"resuming from {ckpts.path(latest)} (step {start_step})")
    elif pretrained is not None:  # a new run from existing weights
        train_state = jax.tree.map(np.asarray, initial_train_state(train_state, pretrained, vocab, optimizer, log))
        del pretrained
    if is_main:  # after the resume's checks: a refused resume writes nothing
        write_run_files(workdir, cfg, model_config, new_run=latest is None)
    log(
        f"training {cfg.model if cfg.init_from is None else 'from ' + cfg.init_from} ({model_config.lstm.dim}/{model_config.projection_dim} x{model_config.lstm.n_layers}) "
        f"on {n_devices} device(s) in {jax.process_count()} process(es) [{runner.name}], global batch {global_batch} x {cfg.unroll_steps} tokens, "
        f"vocabulary {len(vocab)}, {steps_per_epoch} steps/epoch, {total_steps} steps"
    )
    d_train = runner.put_train_state(train_state)
    d_lstm = runner.put_rows(lstm_state, axis=2)
    del train_state, lstm_state

    # -- the loop: batch, step, log, eval, save ----------------------------------------------
    base_key = jax.random.key(cfg.seed)
    checkpoint_meta = {
        "config": cfg.to_dict(),
        "vocab_size": len(vocab),
        "process_count": jax.process_count(),
        "device_count": n_devices,
        "global_batch": global_batch,
        "local_batch": local_batch,
        "heldout": data.heldout_spec,
        "data_content": data_content,
        **run_inputs_record(workdir, cfg),
    }
    record_args = dict(
        tokens_per_step=global_batch * cfg.unroll_steps,
        steps_per_epoch=steps_per_epoch,
        with_perplexity=not selection.sampled,
        vocab_size=len(vocab),
    )
    eval_fn = make_eval_fn(model_config, dtype) if data.heldout is not None else None
    eval_args: dict[str, Any] = dict(data=data, model_config=model_config, cfg=cfg, dtype=dtype, eval_fn=eval_fn)
    summary: dict[str, Any] = {"workdir": workdir, "start_step": start_step}
    writer = MetricsWriter(workdir, is_main, start_step=start_step)
    window = TrainWindow(start_step)
    last_saved = latest
    stop = StopRequest()
    bar = StepBar(total_steps, enabled=progress and is_main, file=sys.stderr)
    if progress and start_step < total_steps:
        log("compiling the training step (the progress bar starts after the first step)")
    step = start_step
    try:
        with stop.installed():
            if pretrained_start and eval_fn is not None:  # where the new domain starts from
                run_eval(0, runner, d_train, writer, stop, log, **eval_args)
            while step < total_steps:
                asked = time.perf_counter()
                batch = next(batcher)
                waited = time.perf_counter() - asked
                d_train, d_lstm, metrics = train_step(runner, d_train, d_lstm, batch, base_key, step)
                step += 1
                window.add(step, metrics, waited)
                bar.update(step)
                if step % cfg.log_every == 0 or step == total_steps:
                    if record := log_train(step, window, runner, ckpts, writer, bar, **record_args):
                        summary["train"] = record
                if eval_fn is not None and cfg.eval_every and step % cfg.eval_every == 0 and step < total_steps:
                    run_eval(step, runner, d_train, writer, stop, log, **eval_args)
                if step % cfg.checkpoint_every == 0 and step < total_steps:
                    save(step, runner, d_train, d_lstm, batcher, window, ckpts, mesh, checkpoint_meta)
                    last_saved = step
                if should_stop(stop, step, cfg.log_every):
                    if record := log_train(step, window, runner, ckpts, writer, bar, **record_args):
                        summary["train"] = record  # the steps since the last record, not lost
                    if last_saved != step:  # a checkpoint step has just saved it
                        save(step, runner, d_train, d_lstm, batcher, window, ckpts, mesh, checkpoint_meta)
                    ckpts.wait()
                    reason = stop.signal or "stop requested by another process"
                    log(f"\n{reason}: saved {ckpts.path(step)}; resume with the same command")
                    summary.update(step=step, interrupted=reason, checkpoint=ckpts.path(step))
                    return summary
            if last_saved != step:
                save(step, runner, d_train, d_lstm, batcher, window, ckpts, mesh, checkpoint_meta)
            ckpts.wait()
            bar.close()
            if start_step >= total_steps:
                log(f"the run is already complete at step {step}: nothing left to train")
            if eval_fn is not None:
                summary["eval"] = run_eval(step, runner, d_train, writer, stop, log, **eval_args)
                if summary["eval"] is None:
                    log(f"saved {ckpts.path(step)}; score it with:  elmo-jax eval {workdir}")
                    summary.update(step=step, interrupted=stop.signal, checkpoint=ckpts.path(step))
                    return summary
    finally:
        bar.close()
        writer.close()
    summary.update(
        step=step,
        interrupted=None,
        checkpoint=ckpts.path(step),
        steps_per_epoch=steps_per_epoch,
        global_batch=global_batch,
    )
    summary["params"] = runner.get_train_state(d_train)["params"]
    summary["vocab"] = vocab
    summary["model_config"] = model_config
    summary["corpus_dir"] = data.corpus_dir
    log(f"final checkpoint: {ckpts.path(step)}")
    log(f"export it for embedding with:  elmo-jax export {workdir} OUT_DIR")
    return summary


def step_kwargs(
    cfg: TrainConfig,
    model_config: ElmoConfig,
    selection,
    optimizer,
    dtype,
    log: Callable[[str], None] = lambda msg: None,
) -> dict:
    """The keyword arguments of :func:`elmo_jax.train.step.train_step` for this run."""
    sparse = cfg.softmax_update == "sparse" and selection.sampled
    if sparse:
        log("softmax_update sparse: the softmax's gradient and Adagrad update on the rows each step touches")
    return dict(
        config=model_config,
        optimizer=optimizer,
        loss_fn=selection.fn,
        dropout_rate=cfg.dropout,
        dtype=dtype,
        remat_steps=cfg.remat_steps,
        sparse_negatives=cfg.num_negatives if sparse else 0,
    )


def check_step_memory(
    cfg: TrainConfig, model_config: ElmoConfig, vocab_size: int, optimizer, sampled: bool, rows_per_device: int, dtype
) -> None:
    """Refuse a step that cannot fit in the devices' memory, before anything is allocated
    (:mod:`elmo_jax.train.memory`)."""
    shapes = jax.eval_shape(lambda: init_train_state(jax.random.key(cfg.seed), model_config, vocab_size, optimizer))
    estimate = memory.step_memory(
        shapes,
        model_config,
        rows_per_device,
        cfg.unroll_steps,
        cfg.num_negatives + 1 if sampled else vocab_size,
        itemsize=np.dtype(dtype).itemsize,
        remat=bool(cfg.remat_steps),
    )
    memory.check_fits(estimate, rows_per_device=rows_per_device, unroll_steps=cfg.unroll_steps)


def make_batcher(
    data: RunData,
    cfg: TrainConfig,
    model_config: ElmoConfig,
    local_batch: int,
    log: Callable[[str], None] | None = None,
):
    """The training batches of this process: ``[B_local, T]`` windows of its sentences
    (``i % P == p``), shuffled by ``cfg.seed``, with a position that checkpoints record
    (``get_state`` / ``set_state``).  The one place the loop's batcher is made; ``log`` gets
    the line saying a dead data worker was replaced."""
    return LMBatcher(
        data.train,
        data.vocab,
        local_batch,
        cfg.unroll_steps,
        model_config.char_cnn.max_characters_per_token,
        seed=cfg.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        workers=cfg.data_workers,
        log=log,
    )


def train_step(runner, d_train, d_lstm, batch: dict, base_key: jax.Array, step: int):
    """One update from ``step``: the batch's rows to the devices, the step's dropout keys
    (from ``base_key`` and ``step``, so a resumed run draws the same ones)."""
    step_key = jax.random.fold_in(base_key, step)
    return runner.step(
        d_train,
        d_lstm,
        runner.put_rows(batch, axis=0),
        jax.random.fold_in(step_key, 0),
        runner.dropout_rngs(jax.random.fold_in(step_key, 1)),
    )


def log_train(
    step: int,
    window: TrainWindow,
    runner,
    ckpts: Checkpoints,
    writer: MetricsWriter,
    bar,
    *,
    tokens_per_step: int,
    steps_per_epoch: int,
    with_perplexity: bool,
    vocab_size: int,
) -> dict | None:
    """One train record for the steps since the last one (means over those steps)."""
    check_finite(window.fetch(runner.metrics), ckpts, vocab_size)
    record = window.record(
        step, tokens_per_step=tokens_per_step, steps_per_epoch=steps_per_epoch, with_perplexity=with_perplexity
    )
    if record is not None:
        writer.write(step, "train", record)
        bar.set_postfix(progress_postfix(record))
    return record


def run_eval(
    step: int,
    runner,
    d_train,
    writer: MetricsWriter,
    stop: StopRequest,
    log: Callable[[str], None],
    *,
    data: RunData,
    model_config: ElmoConfig,
    cfg: TrainConfig,
    dtype,
    eval_fn,
) -> dict | None:
    """Held-out perplexity at ``step``; None if a stop signal cut it short."""
    params = runner.get_train_state(d_train)["params"]
    result = evaluate(
        params,
        model_config,
        data.heldout,
        data.vocab,
        unroll_steps=cfg.unroll_steps,
        dtype=dtype,
        eval_fn=eval_fn,
        max_batches=cfg.eval_max_batches,
        should_stop=lambda: stop.signal is not None,
    )
    if result is None:
        log(f"\n{stop.signal}: the evaluation at step {step} was abandoned")
        return None
    writer.write(step, "eval", result)
    log(eval_message(step, result))
    return result


def save(
    step: int, runner, d_train, d_lstm, batcher, window: TrainWindow, ckpts: Checkpoints, mesh, meta: dict
) -> None:
    """Checkpoint ``step`` (all processes), never with diverged parameters: the pending
    metrics are checked first (they stay in ``window`` for the next train record)."""
    check_finite(window.fetch(runner.metrics), ckpts, meta["vocab_size"])
    write_checkpoint(
        ckpts, step, runner.get_train_state(d_train), runner.get_rows(d_lstm, axis=2), batcher.get_state(), mesh, meta
    )


def should_stop(stop: StopRequest, step: int, log_every: int) -> bool:
    """A stop signal arrived; in a multi-process job every process must stop (and save) at
    the same step, so they agree at log steps."""
    if not distributed.is_multiprocess():
        return stop.signal is not None
    return step % log_every == 0 and distributed.any_process(stop.signal is not None)
