"""What a run reports: ``metrics.jsonl`` and TensorBoard records, and the train record of
the steps since the last one (their metrics stay on the device until a record needs them)."""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable

import numpy as np

from elmo_jax.atomic import atomic_path
from elmo_jax.train.losses import perplexity


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

            self._tb = SummaryWriter(
                os.path.join(workdir, "tensorboard"), purge_step=start_step + 1 if earlier else None
            )

    def write(self, step: int, kind: str, values: dict) -> None:
        if not self.enabled or (step, kind) in self._written:  # e.g. a finished run started again
            return
        self._written.add((step, kind))
        record = {"step": step, "kind": kind, "time": time.time(), **values}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        assert self._tb is not None  # made in __init__ when enabled
        for k, v in values.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                self._tb.add_scalar(f"{kind}/{k}", v, step)
        self._tb.flush()

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            assert self._tb is not None  # made in __init__ when enabled
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


class TrainWindow:
    """The steps since the last train record: each step's metrics (device arrays until a
    record or a checkpoint needs them, so that the loop never waits for the device), and
    when the window began."""

    def __init__(self, step: int):
        self.pending: list[tuple[int, Any]] = []  # steps' metrics still on the device
        self.fetched: list[tuple[int, dict]] = []  # on the host, checked, not yet recorded
        self.start_step = step
        self.start_time = time.perf_counter()
        self.data_s = 0.0  # time the loop spent waiting for batches in this window

    def add(self, step: int, device_metrics: Any, data_s: float = 0.0) -> None:
        """One step's metrics, and the seconds the loop waited for its batch."""
        self.pending.append((step, device_metrics))
        self.data_s += data_s

    def fetch(self, to_host: Callable[[Any], dict]) -> list[tuple[int, dict]]:
        """Bring the pending metrics to the host; returns them (the newly fetched)."""
        new = [(s, to_host(m)) for s, m in self.pending]
        self.pending.clear()
        self.fetched.extend(new)
        return new

    def record(self, step: int, *, tokens_per_step: int, steps_per_epoch: int, with_perplexity: bool) -> dict | None:
        """The train record of the fetched steps (means over them) ending at ``step``, and a
        new window from ``step``; None (window kept) when no step was fetched."""
        fetched = self.fetched
        if not fetched:
            return None
        fwd = sum(m["fwd_loss_sum"] for _, m in fetched) / max(sum(m["fwd_count"] for _, m in fetched), 1)
        bwd = sum(m["bwd_loss_sum"] for _, m in fetched) / max(sum(m["bwd_count"] for _, m in fetched), 1)
        m = {
            "loss": float(np.mean([m["loss"] for _, m in fetched])),
            "fwd_loss": float(fwd),
            "bwd_loss": float(bwd),
            "grad_norm": float(fetched[-1][1]["grad_norm"]),
        }
        elapsed = time.perf_counter() - self.start_time
        m["tokens_per_sec"] = tokens_per_step * (step - self.start_step) / max(elapsed, 1e-9)
        m["data_wait"] = min(1.0, self.data_s / max(elapsed, 1e-9))  # fraction of the time
        m["epoch"] = step / steps_per_epoch
        if with_perplexity:
            m["perplexity"] = perplexity(0.5 * (m["fwd_loss"] + m["bwd_loss"]))
        self.fetched = []
        self.start_step, self.start_time, self.data_s = step, time.perf_counter(), 0.0
        return m


class StepBar:
    """The training loop's progress bar (tqdm, on stderr).  It appears only after the first
    step of this start has returned: that step compiles (seconds to minutes), and a bar timing
    it would show an ETA of hours.  Its rate and ETA then time compiled steps only; until the
    first train record, no ETA is shown ("?")."""

    def __init__(self, total: int, enabled: bool, file=None):
        self.total, self.enabled, self.file = total, enabled, file
        self.bar = None

    def update(self, step: int) -> None:
        """``step`` has just been run."""
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, initial=step, unit="step", dynamic_ncols=True, file=self.file)
        else:
            self.bar.update(1)

    def set_postfix(self, postfix: dict) -> None:
        if self.bar is not None:
            self.bar.set_postfix(postfix)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def progress_postfix(record: dict) -> dict:
    """What the progress bar shows of a train record."""
    from elmo_jax.rates import rate_text

    postfix = {
        "epoch": f"{record['epoch']:.2f}",
        "tok/s": rate_text(record["tokens_per_sec"], 1.0),
        "loss": f"{record['loss']:.3f}",
    }
    if "perplexity" in record:
        postfix["ppl"] = f"{record['perplexity']:.1f}"
    return postfix


def eval_message(step: int, result: dict) -> str:
    """The log line of an evaluation."""
    return (
        f"eval @ step {step}: perplexity {result['perplexity']:.2f} (forward {result['fwd_perplexity']:.2f}, "
        f"backward {result['bwd_perplexity']:.2f}) on {result['tokens']} held-out tokens"
    )
