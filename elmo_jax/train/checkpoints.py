"""Training checkpoints with orbax-checkpoint: arrays + a JSON record, written atomically.

A checkpoint at step ``n`` holds

* ``state``: ``{"train": {params, opt_state, step}, "lstm": carried LSTM state}`` (arrays),
* ``meta``: JSON — the data position (the batcher's state), the training config, the
  model's ``options.json`` dict, the vocabulary size and anything else the loop records.

orbax writes each step into a temporary folder and renames it when complete, so an
interrupted save never replaces the previous checkpoint.  Faults are named as such:

* a checkpoint whose files cannot be read (truncated, deleted, unreadable) raises
  :class:`DamagedCheckpointError` (told apart from a checkpoint of another layout by
  restoring it with its own recorded shapes); :meth:`Checkpoints.move_aside` puts it in
  ``WORKDIR/checkpoints-damaged/`` (never deleted) so that the previous one is the latest;
* a full disk while saving raises :class:`DiskFullError`, one sentence with the space a
  checkpoint needs and the intact previous checkpoint; the half-written temporary folder is
  removed, and the storage layers' own error logs about it are held back.

Multi-process runs pass *global* ``jax.Array``s (the train state replicated over a mesh of
all devices, the LSTM state sharded by rows): every process calls :meth:`Checkpoints.save`
with the same step, orbax writes each array shard once (replicated arrays by one replica
only) and the JSON ``meta`` from process 0 only, and finalizes the step after all
processes are done.  The loop therefore puts per-process information (data positions)
into ``meta`` as a list indexed by process.  Host numpy arrays are still accepted (a
single-process caller).  The vocabulary lives beside the
checkpoints as ``vocab.txt`` in the workdir (it never changes during a run).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import re
import shutil
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from elmo_jax.errors import ElmoError, exception_chain as _chain, is_disk_full, symlink_loop
from elmo_jax.storage_echoes import drop_closed_loop_echoes, drop_failed_read_echoes


DAMAGED_FOLDER = "checkpoints-damaged"
# Loggers through which orbax, tensorstore's asyncio futures and absl report a failed write.
_STORAGE_LOGGERS = ("absl", "asyncio")


class CheckpointError(ElmoError):
    """A checkpoint that cannot be restored into the requested run."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint whose files cannot be read back (truncated, missing, corrupted)."""

    def __init__(self, step: int, path: str, reason: str, hint: str = ""):
        self.step, self.path, self.reason = step, path, reason
        super().__init__(f"checkpoint {path} is damaged ({reason}); it cannot be restored{hint}")


class DiskFullError(CheckpointError):
    """No space left for a checkpoint; the previous checkpoints are intact."""


def _is_access_failure(e: BaseException) -> bool:
    """A read that failed for a reason outside the checkpoint (permissions, an I/O or
    network-filesystem error, memory): not damage, so nothing may be moved aside for it."""
    for x in _chain(e):
        if isinstance(x, MemoryError) or (isinstance(x, OSError) and x.errno not in (None, errno.ENOENT)):
            return True
    return False


def _reason(e: BaseException) -> str:
    """The first line of the innermost message that says something (orbax wraps errors)."""
    for x in reversed(_chain(e)):
        line = str(x).strip().splitlines()[0] if str(x).strip() else ""
        if line:
            return f"{type(x).__name__}: {line[:300]}"
    return type(e).__name__


def _folder_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


class _HeldLogs(logging.Filter):
    """Holds the storage loggers' records while a save is in flight: released as they were
    if the save fails for any reason but a full disk (whose one-line error says it all);
    after a full disk, their later echoes of it (asyncio futures collected late) are dropped."""

    def __init__(self):
        super().__init__()
        self.holding = False
        self.held: list[logging.LogRecord] = []
        self.disk_full = False

    def filter(self, record: logging.LogRecord) -> bool:
        if self.disk_full:
            text = record.getMessage() + (str(record.exc_info[1]) if record.exc_info else "")
            if "No space left" in text or "RESOURCE_EXHAUSTED" in text or "Disk quota" in text:
                return False
        if self.holding:
            self.held.append(record)
            return False
        return True

    def release(self, emit: bool) -> None:
        held, self.held, self.holding = self.held, [], False
        for record in held if emit else ():
            logging.getLogger(record.name).handle(record)


class Checkpoints:
    """The checkpoints of one workdir (``WORKDIR/checkpoints/<step>``)."""

    def __init__(self, workdir: str | os.PathLike, keep: int = 3, create: bool = True):
        """``create=False`` for readers (eval, export): a missing folder is not made."""
        self.workdir = os.path.abspath(os.fspath(workdir))
        self.directory = os.path.join(self.workdir, "checkpoints")
        loop = symlink_loop(self.directory)
        if loop is not None:
            raise CheckpointError(f"the folder of checkpoints {loop}, and run the same command again")
        if os.path.lexists(self.directory) and not os.path.isdir(self.directory):
            raise CheckpointError(
                f"{self.directory} is a file, not the folder of checkpoints; move it out of the way "
                f"(e.g. rename it) and run the same command again"
            )
        drop_closed_loop_echoes()  # a failed read's late echoes (see elmo_jax.storage_echoes)
        self._logs = _HeldLogs()
        for name in _STORAGE_LOGGERS:
            logging.getLogger(name).addFilter(self._logs)
        self._logs.holding = True
        try:
            self._manager = ocp.CheckpointManager(
                self.directory,
                # The writer (create=True, under the workdir lock) removes what a killed save left.
                options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=create, cleanup_tmp_directories=create),
            )
            # orbax removes those in a background thread and waits for it only at the first
            # save; a start that fails before (and tidies the workdir away under that thread)
            # ended in the thread's logged traceback.  It is a listing and a few rmtrees: wait.
            getattr(self._manager, "_maybe_await_cleanup_tmp_directory", lambda: None)()
        except Exception:
            self._logs.release(emit=False)  # the thread's log of the error raised here
            for name in _STORAGE_LOGGERS:
                logging.getLogger(name).removeFilter(self._logs)
            raise
        self._logs.release(emit=True)
        self._state_bytes = 0

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def save(self, step: int, state: Any, meta: dict) -> None:
        """Save ``state`` (host arrays, or global ``jax.Array``s from every process of a
        multi-process job) and the JSON ``meta`` (written by process 0) as step ``step``."""
        state = jax.tree.map(lambda x: x if isinstance(x, jax.Array) else np.asarray(x), state)
        self._state_bytes = sum(int(x.nbytes) for x in jax.tree.leaves(state))
        with self._storage_errors(step):
            self._manager.save(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                force=True,
            )

    def read_meta(self, step: int | None = None) -> dict:
        step = self._require(step)
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        except Exception as e:  # missing or unreadable record: nothing else to read it from
            if _is_access_failure(e):
                raise
            raise DamagedCheckpointError(step, self.path(step), f"its record cannot be read: {_reason(e)}") from None
        if not isinstance(out.get("meta"), dict):
            raise DamagedCheckpointError(step, self.path(step), "its record is empty")
        return out["meta"]

    def restore(self, template: Any, step: int | None = None) -> tuple[Any, dict]:
        """Arrays shaped like ``template`` and the JSON meta of ``step`` (default latest).

        ``template`` leaves: arrays or ``jax.ShapeDtypeStruct``s give host numpy arrays;
        ``jax.ShapeDtypeStruct``s with a ``sharding`` give global ``jax.Array``s laid out
        that way (every process of a multi-process job must call this).
        """
        step = self._require(step)

        def abstract_leaf(x):
            if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is not None:
                return x
            return np.zeros(x.shape, x.dtype)

        abstract = jax.tree.map(abstract_leaf, template)
        # Before the reads start: asyncio may log a failed read's siblings while the restore is
        # still unwinding, before the one error is raised (see storage_echoes).  A restore that
        # succeeds has no failed reads to drop.
        drop_failed_read_echoes(self.path(step))
        try:
            out = self._manager.restore(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
            )
        except Exception as e:
            if _is_access_failure(e):
                raise
            if jax.process_count() > 1:  # telling damage apart would take barriers a failed process misses
                raise CheckpointError(
                    f"checkpoint {self.path(step)} could not be restored by process {jax.process_index()}: "
                    f"{_reason(e)}. If it is damaged, move it out of {self.directory} (e.g. to "
                    f"{os.path.join(self.workdir, DAMAGED_FOLDER)}) and start the job again"
                ) from None
            damage = self._damage(step)
            if damage is not None:
                raise DamagedCheckpointError(step, self.path(step), damage) from None
            if not isinstance(e, (ValueError, KeyError, TypeError)):
                raise
            differences = self._shape_differences(step, abstract)
            if differences:
                raise self._another_model(step, differences) from None
            raise CheckpointError(
                f"checkpoint {self.path(step)} does not fit this run's model/optimizer/batch layout: {e}"
            ) from None
        state = jax.tree.map(lambda x: x if isinstance(x, jax.Array) else np.asarray(x), out["state"])
        for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(abstract)):
            if got.shape != want.shape:
                differences = self._shape_differences(step, abstract)
                if differences:
                    raise self._another_model(step, differences)
                raise CheckpointError(
                    f"checkpoint {self.path(step)} holds an array of shape {got.shape} where this "
                    f"run expects {want.shape}"
                )
        return state, out["meta"]

    def _another_model(self, step: int, differences: list[str]) -> CheckpointError:
        return CheckpointError(
            f"checkpoint {self.path(step)} was trained with another model: {len(differences)} of its arrays have "
            f"other shapes than this run's (first {differences[0]}). The run's model config (model, "
            f"model_overrides) differs from the checkpoint's: resume with the run's own config (its config.json; "
            f"the checkpoint's record holds it too), or start a new --workdir"
        )

    def _shape_differences(self, step: int, template: Any) -> list[str]:
        """``"ARRAY: checkpoint SHAPE, this run SHAPE"`` for each array of ``step`` whose
        recorded shape differs from ``template``'s (parameters first); empty if unknown."""
        self._logs.holding = True  # orbax's warning that the item has no checkpoint-level metadata
        try:
            with ocp.StandardCheckpointer() as reader:
                recorded = reader.metadata(os.path.join(self.path(step), "state"))
        except Exception:
            return []
        finally:
            self._logs.release(emit=False)
        has_shape = lambda x: hasattr(x, "shape") and hasattr(x, "dtype")  # noqa: E731

        def shapes(tree) -> dict[tuple[str, ...], tuple[int, ...]]:  # path as names: ['a'][0] and .a[0] alike
            leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=has_shape)[0]
            return {tuple(re.findall(r"\w+", jax.tree_util.keystr(k))): tuple(v.shape) for k, v in leaves}

        got, want = shapes(getattr(recorded, "item_metadata", recorded)), shapes(template)
        differ = [k for k in want if k in got and got[k] != want[k]]
        differ.sort(key=lambda k: "params" not in k[:2])  # a parameter before its optimizer state
        part = {"0": "train state", "1": "LSTM state"}
        return [f"{part.get(k[0], k[0])} {'/'.join(k[1:])}: checkpoint {got[k]}, this run {want[k]}" for k in differ]

    def _damage(self, step: int) -> str | None:
        """Why ``step`` cannot be read back with its own recorded shapes; None if it can (a
        failed restore is then a layout mismatch, not damage)."""
        state_dir = os.path.join(self.path(step), "state")
        # The probe reads one item of a composite checkpoint on its own, so orbax warns that the
        # item has no checkpoint-level metadata file; that (and its log of a failed read, which
        # the answer says) is about the probe, not for the user: held and dropped.
        self._logs.holding = True
        try:
            with ocp.StandardCheckpointer() as reader:
                recorded = reader.metadata(state_dir)
                tree = getattr(recorded, "item_metadata", recorded)
                has_shape = lambda x: hasattr(x, "shape") and hasattr(x, "dtype")  # noqa: E731
                reader.restore(state_dir, jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), tree, is_leaf=has_shape))
        except Exception as e:
            if _is_access_failure(e):
                raise
            return f"its arrays cannot be read: {_reason(e)}"
        finally:
            self._logs.release(emit=False)
        return None

    def move_aside(self, step: int) -> str:
        """Move a damaged checkpoint to ``WORKDIR/checkpoints-damaged/`` (kept, never
        deleted) so that it is no longer the latest; returns where it went."""
        target_dir = os.path.join(self.workdir, DAMAGED_FOLDER)
        os.makedirs(target_dir, exist_ok=True)
        target, n = os.path.join(target_dir, str(step)), 1
        while os.path.exists(target):
            n += 1
            target = os.path.join(target_dir, f"{step}.{n}")
        os.rename(self.path(step), target)
        self.reload()
        return target

    def reload(self) -> None:
        """Read the list of checkpoints from disk again (after one was moved aside)."""
        self._manager.reload()

    def wait(self) -> None:
        """Block until pending asynchronous saves are on disk."""
        with self._storage_errors(None):
            self._manager.wait_until_finished()

    def close(self) -> None:
        try:
            if not self._logs.disk_full:  # after a full disk the error has been raised once
                self.wait()
            self._manager.close()
        except Exception:
            if not self._logs.disk_full:  # after a full disk the error has been raised once
                raise
        finally:
            gc.collect()  # failed writes' futures report now, through the filter
            if self._logs.disk_full:  # a late write of the failed save may have made its folder again
                self._remove_partial_saves()
            self._logs.release(emit=True)
            if not self._logs.disk_full:  # else orbax's threads may still echo it: keep dropping those
                for name in _STORAGE_LOGGERS:
                    logging.getLogger(name).removeFilter(self._logs)

    @contextlib.contextmanager
    def _storage_errors(self, step: int | None):
        """Name a full disk (one line, the space needed, the intact checkpoint) and remove
        the failed save's temporary folder; other errors pass through with their logs.

        The storage loggers are held from the start of a save until a wait finds it done
        (the write goes on in a background thread after ``save`` returns)."""
        self._logs.holding = True
        try:
            yield
        except Exception as e:
            disk_full = is_disk_full(e)
            self._logs.disk_full |= disk_full
            self._logs.release(emit=not disk_full)
            if not disk_full:
                raise
            gc.collect()  # the storage layer's failed futures report now, while their echoes are filtered
            raise self._disk_full_error(step) from None
        else:
            if step is None:  # a wait: every save so far is on disk
                self._logs.release(emit=True)

    def _disk_full_error(self, step: int | None) -> DiskFullError:
        partial = self._remove_partial_saves()
        failed_step: int | str | None = step
        if partial:  # the save that failed (an asynchronous one reports at the next call)
            failed_step = partial[0].split(".")[0]
        done = sorted(int(n) for n in os.listdir(self.directory) if n.isdigit())
        needed = _folder_bytes(self.path(done[-1])) if done else self._state_bytes
        free = shutil.disk_usage(self.directory).free
        intact = f"the previous checkpoint {self.path(done[-1])} is intact" if done else "no earlier checkpoint exists"
        return DiskFullError(
            f"disk full: checkpoint {failed_step if failed_step is not None else ''} could not be written to "
            f"{self.directory} (a checkpoint needs about {needed / 2**20:.1f} MiB, "
            f"{free / 2**20:.1f} MiB are free); {intact}. Free some space and run the same command "
            f"to resume from it"
        )

    def _remove_partial_saves(self, quiet_s: float = 0.3, limit_s: float = 10.0) -> list[str]:
        """Remove the temporary folders of failed saves; return their names, sorted.

        When one write of a save fails, the storage layer's other writes of that save may
        still be in flight, and each makes the folders it writes into: a folder removed at
        once can come back a moment later.  So look again until none has come back for
        ``quiet_s`` (at most ``limit_s``)."""
        removed: set[str] = set()
        quiet_since = start = time.monotonic()
        while time.monotonic() - start < limit_s:
            try:
                partial = [n for n in os.listdir(self.directory) if n.endswith(".orbax-checkpoint-tmp")]
            except FileNotFoundError:
                break
            for name in partial:
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
            if partial:
                removed.update(partial)
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_s:
                break
            time.sleep(0.05)
        return sorted(removed, key=lambda n: (len(n), n))

    def _require(self, step: int | None) -> int:
        if step is None:
            step = self.latest_step()
        if step is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        steps = self.all_steps()
        if step not in steps:  # not written (or moved aside): not "damaged"
            there = (
                f"the steps there are {', '.join(map(str, sorted(steps)))}: pick one with --step"
                if steps
                else "there is none"
            )
            raise CheckpointError(f"there is no checkpoint of step {step} in {self.directory}; {there}")
        return step


def check_vocabulary_size(meta: dict, n_words: int, checkpoint: str, vocab_path: str) -> None:
    """Refuse a vocabulary file whose size differs from the one the checkpoint was trained
    with (``meta["vocab_size"]``): the file was cut or replaced, and its softmax rows would
    not fit (orbax's own error about the shapes blames the model layout)."""
    recorded = meta.get("vocab_size")
    if recorded is not None and int(recorded) != int(n_words):
        raise CheckpointError(
            f"{vocab_path} holds {n_words} words but checkpoint {checkpoint} was trained with {recorded}: "
            f"the vocabulary file was cut or replaced after the run started. Put the run's own vocab.txt "
            f"back (an export of this run holds a copy) and run the same command again"
        )
