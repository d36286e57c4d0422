"""A run's folder: whether this config may start or continue it, the state a restart reads
back from its latest checkpoint, and the checkpoints the loop writes.

(Over 500 lines: each check a start or a resume makes names what is wrong and how to fix
it, and those messages are most of the module.)

``WORKDIR`` holds (see also :mod:`elmo_jax.train.run_data` for the data it prepares)::

    WORKDIR/
      config.json          the TrainConfig of the run (the first start's)
      options.json         the biLM architecture, released models' spelling
      checkpoints/<step>/  orbax checkpoints (params, optimizer, LSTM state, data position)

A restart reads the latest checkpoint that restores, never anything else: the config may
change only in :data:`RESUMABLE_FIELDS`, and the data, the process count and the global
batch must be the ones the checkpoint was written with.  A damaged checkpoint (truncated or
missing files) is skipped, said so, and moved to ``WORKDIR/checkpoints-damaged/``.

One run at a time: :func:`hold_workdir` keeps an exclusive ``flock`` on ``WORKDIR/run.lock``
for the life of a run (process 0 of a multi-process job takes it; the kernel releases it
when the process ends, kill -9 included).  Readers (``eval``, ``export``) do not take it.

Checkpoints hold global arrays over all devices of the job (train state replicated, LSTM
state as the global ``[.., B_global, ..]`` rows) written together by all processes, and
every process's data position (``meta["data_by_process"]``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from typing import Any, Callable

import jax
import numpy as np

from elmo_jax.atomic import file_sha256, write_json
from elmo_jax.config import ElmoConfig
from elmo_jax.errors import ElmoError, symlink_loop
from elmo_jax.train import distributed
from elmo_jax.train.checkpoints import Checkpoints, DamagedCheckpointError, check_vocabulary_size
from elmo_jax.train.config_loader import TrainConfig
from elmo_jax.train.losses import divergence_limit
from elmo_jax.train.parallel import local_replica, local_rows, rows_sharding, to_global_replicated, to_global_rows

# Fields that may change when a run is resumed; every other field must match.  The two
# batch fields may be spelled differently (e.g. batch_size_per_device on another device
# count replaced by batch_size): the global batch they give is checked against the
# checkpoint's instead (check_topology).
RESUMABLE_FIELDS = {
    "epochs",
    "max_steps",
    "checkpoint_every",
    "keep_checkpoints",
    "eval_every",
    "eval_max_batches",
    "log_every",
    "parallel",
    "data_dir",
    "remat_steps",
    "batch_size",
    "batch_size_per_device",
    "data_workers",
}


class TrainingError(ElmoError):
    """A run that cannot start or continue; the message says why and what to do."""


LOCK_FILE = "run.lock"


class WorkdirBusyError(TrainingError):
    """Another run holds the workdir."""


def check_writable(workdir: str) -> None:
    """Create ``workdir`` if needed; refuse one this process cannot write to."""
    loop = symlink_loop(workdir)
    if loop is not None:
        raise TrainingError(f"workdir {loop}; or choose another --workdir")
    if os.path.islink(workdir) and not os.path.exists(workdir):  # else makedirs says only "File exists"
        raise TrainingError(
            f"workdir {workdir} is a symbolic link to {os.readlink(workdir)}, which does not exist; "
            f"create that folder, remove the link, or choose another --workdir"
        )
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise TrainingError(f"workdir {workdir} is a file, not a folder; choose another --workdir")
    try:
        os.makedirs(workdir, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=workdir, prefix=".write-test-")  # unique across hosts too
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise TrainingError(f"workdir {workdir} is not writable: {e}; choose another --workdir") from None


@contextlib.contextmanager
def hold_workdir(workdir: str, is_main: bool) -> Iterator[None]:
    """The run lock of ``workdir`` for the block (see the module docstring).  Every process
    of a job calls this; process 0 takes the lock and tells the others whether it got it."""
    with contextlib.ExitStack() as held:
        error = None
        if is_main:
            try:
                held.enter_context(_run_lock(os.path.join(workdir, LOCK_FILE), workdir))
            except WorkdirBusyError as e:
                error = str(e)
        error = distributed.allgather_json("workdir-lock", error)[0]
        if error:
            raise WorkdirBusyError(error)
        yield


@contextlib.contextmanager
def _run_lock(path: str, workdir: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WorkdirBusyError(
                f"workdir {workdir} is in use by another training run: {_lock_holder(path)}. Wait for it to "
                f"finish or stop it (SIGTERM saves a checkpoint), or choose another --workdir; "
                f"`elmo-jax eval` and `elmo-jax export` can read the workdir meanwhile"
            ) from None
        who = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(who) + "\n").encode("utf-8"), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _lock_holder(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            who = json.load(f)
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(who["started"])))
        return f"pid {who['pid']} on host {who['host']}, started {started}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not yet written its pid"


@contextlib.contextmanager
def tidy_failed_start(workdir: str, is_main: bool) -> Iterator[None]:
    """If the block fails, remove the empty folders it made in ``workdir`` (``checkpoints/``,
    ``tfds/`` skeletons), and ``workdir`` itself when it made it and left nothing in it.
    Folders that were there before, and every file, stay."""
    existed = os.path.isdir(workdir)
    before = {root for root, _, _ in os.walk(workdir)} if existed else set()
    try:
        yield
    except WorkdirBusyError:
        raise  # the folder is another run's: touch nothing
    except BaseException:
        if is_main:
            try:
                for root, _, _ in sorted(os.walk(workdir, topdown=False), key=lambda w: -len(w[0])):
                    if root not in before and root != workdir and not os.listdir(root):
                        os.rmdir(root)
                if not existed and os.path.isdir(workdir) and set(os.listdir(workdir)) <= {LOCK_FILE}:
                    for name in os.listdir(workdir):
                        os.remove(os.path.join(workdir, name))
                    os.rmdir(workdir)
            except OSError:
                pass  # tidying is best effort: the error that ended the start is what the user needs
        raise


def check_resumable(workdir: str, cfg: TrainConfig, latest: int | None) -> None:
    """A workdir with a checkpoint continues only with its own config (but for
    :data:`RESUMABLE_FIELDS`)."""
    config_path = os.path.join(workdir, "config.json")
    if latest is None or not os.path.exists(config_path):
        return
    with open(config_path, encoding="utf-8") as f:
        saved = json.load(f)
    diffs = config_differences(saved, cfg.to_dict())
    if diffs:
        raise TrainingError(
            f"{workdir} holds a run with a different config; refusing to resume it:\n  "
            + "\n  ".join(diffs)
            + "\nuse another --workdir, or the checkpoint's values"
        )


def config_differences(saved: dict, current: dict) -> list[str]:
    """``"key: checkpoint has A, this run has B"`` for each field outside
    :data:`RESUMABLE_FIELDS` that differs; a dict field (``model_overrides``) by its keys."""
    out = []
    for k in sorted(set(saved) | set(current)):
        a, b = saved.get(k), current.get(k)
        if k in RESUMABLE_FIELDS or a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += [
                f"{k}.{sub}: checkpoint has {a.get(sub)!r}, this run has {b.get(sub)!r}"
                for sub in sorted(set(a) | set(b))
                if a.get(sub) != b.get(sub)
            ]
        else:
            out.append(f"{k}: checkpoint has {a!r}, this run has {b!r}")
    return out


def config_digest(config: dict) -> str:
    """SHA-256 of what a resume may not change: the config's fields outside
    :data:`RESUMABLE_FIELDS` (``config`` as :meth:`TrainConfig.to_dict` gives it)."""
    fixed = {k: v for k, v in config.items() if k not in RESUMABLE_FIELDS}
    return hashlib.sha256(json.dumps(fixed, sort_keys=True).encode("utf-8")).hexdigest()


def run_inputs_record(workdir: str, cfg: TrainConfig) -> dict:
    """What a checkpoint records of the files it was trained with: the vocabulary's SHA-256
    and the config's (:func:`config_digest`); :func:`check_run_inputs` checks them on resume."""
    return {
        "vocab_sha256": file_sha256(os.path.join(workdir, "vocab.txt")),
        "config_sha256": config_digest(cfg.to_dict()),
    }


def check_run_inputs(meta: dict, path: str, workdir: str, config: dict) -> None:
    """Refuse to continue (or read) checkpoint ``path`` with another vocabulary or config than
    the ones it recorded (:func:`run_inputs_record`; checkpoints of older versions recorded
    none, and are not checked): ``WORKDIR/vocab.txt`` reordered or replaced, ``config.json``
    edited, or, with ``config.json`` deleted, a config that would otherwise have been refused."""
    vocab_path = os.path.join(workdir, "vocab.txt")
    saved = meta.get("vocab_sha256")
    if saved is not None and file_sha256(vocab_path) != saved:
        layout = layout_difference(vocab_path, saved)
        if layout is not None:
            raise TrainingError(
                f"{vocab_path} differs from the vocabulary {path} was trained with only in {layout[0]} (the words "
                f"and their order are the same): {layout[1]}, and run the same command again"
            )
        raise TrainingError(
            f"{vocab_path} is not the vocabulary {path} was trained with (its SHA-256 differs from the one the "
            f"checkpoint recorded, and not only in a byte-order mark or line ends: words were changed, added, "
            f"removed or reordered, and the model's softmax rows follow the file's lines): restore the run's "
            f"vocab.txt (an export of the run holds a copy), or start a new --workdir"
        )
    saved = meta.get("config_sha256")
    if saved is None:
        return
    config_path = os.path.join(workdir, "config.json")
    recorded = meta.get("config", {})
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            in_file = json.load(f)
        diffs = [d.replace("this run has", "config.json has") for d in config_differences(recorded, in_file)]
        if config_digest(in_file) != saved and diffs:
            raise TrainingError(
                f"{config_path} was changed after {path} was written ({'; '.join(diffs)}): restore the values "
                f"the checkpoint records, or start a new --workdir"
            )
    diffs = config_differences(recorded, config)
    if config_digest(config) != saved and diffs:  # diffs empty: a field this version lets change
        missing = "" if os.path.exists(config_path) else f"; {config_path}, which holds the run's config, is missing"
        raise TrainingError(
            f"this run's config differs from the one {path} was trained with ({'; '.join(diffs)}){missing}: "
            f"resume with the checkpoint's values, or start a new --workdir"
        )


_BOM = b"\xef\xbb\xbf"


def layout_difference(path: str, sha256: str) -> tuple[str, str] | None:
    """``(what differs, the fix)`` when the file at ``path`` becomes the bytes of SHA-256
    ``sha256`` by adding or removing a UTF-8 byte-order mark, turning its line ends from
    CRLF to LF or back, or adding or removing the final newline; None otherwise."""
    with open(path, "rb") as f:
        data = f.read()
    boms = {"": data, "a byte-order mark": data.removeprefix(_BOM) if data.startswith(_BOM) else _BOM + data}
    lf = lambda b: b.replace(b"\r\n", b"\n")  # noqa: E731
    for bom_change, b in boms.items():
        for ends_change, e in (("", b), ("line ends", lf(b)), ("line ends", lf(b).replace(b"\n", b"\r\n"))):
            for final_change, c in (
                ("", e),
                ("the final newline", e.rstrip(b"\r\n")),
                ("the final newline", e + (b"\r\n" if b"\r\n" in e else b"\n")),
            ):
                if c == data or hashlib.sha256(c).hexdigest() != sha256:
                    continue
                what = [w for w in (bom_change, ends_change, final_change) if w]
                fixes = []
                if bom_change:
                    fixes.append(
                        "remove the byte-order mark (sed -i '1s/^\\xEF\\xBB\\xBF//' vocab.txt)"
                        if data.startswith(_BOM)
                        else "put back the byte-order mark it had"
                    )
                if ends_change:
                    fixes.append(
                        "turn its CRLF line ends back into LF (sed -i 's/\\r$//' vocab.txt)"
                        if b"\r\n" in data
                        else "turn its line ends back into CRLF (unix2dos vocab.txt)"
                    )
                if final_change:
                    fixes.append("put back the final newline as it was")
                return " and ".join(_describe(w, data) for w in what), "; ".join(fixes)
    return None


def _describe(change: str, data: bytes) -> str:
    if change == "a byte-order mark":
        return "a byte-order mark at its start" if data.startswith(_BOM) else "the byte-order mark it lost"
    if change == "line ends":
        return (
            "its line ends (CRLF where the run's file has LF)"
            if b"\r\n" in data
            else "its line ends (LF where the run's file has CRLF)"
        )
    return "the final newline"


def write_run_files(workdir: str, cfg: TrainConfig, model_config: ElmoConfig, new_run: bool) -> None:
    """``config.json`` and ``options.json``: written by a new run, kept by a resumed one."""
    for name, value in (("config.json", cfg.to_dict()), ("options.json", model_config.to_options())):
        path = os.path.join(workdir, name)
        if new_run or not os.path.exists(path):
            write_json(path, value)


def restore_newest(
    ckpts: Checkpoints,
    train_state: Any,
    lstm_state: Any,
    *,
    global_batch: int,
    n_devices: int,
    mesh: jax.sharding.Mesh,
    log: Callable[[str], None],
    check_meta: Callable[[dict, str], None] | None = None,
) -> tuple[int, Any, Any, dict] | None:
    """``(step, train_state, lstm_state, meta)`` of the newest checkpoint that restores, or
    None when there is none; ``check_meta(meta, path)`` may refuse a checkpoint from its
    record before its arrays are read (see :func:`restore`).  A damaged one is skipped with a log line saying why, and moved
    aside so that the next start does not try it again; if every checkpoint is damaged the
    run stops rather than silently starting over.

    Single-process runs only: in a multi-process job a process that cannot read a
    checkpoint fails before the restore's barrier that the others wait in, so the job stops
    with the message of :meth:`Checkpoints.restore` (move the checkpoint aside by hand)."""
    skipped = []
    for step in sorted(ckpts.all_steps(), reverse=True):
        try:
            return (
                step,
                *restore(
                    ckpts,
                    step,
                    train_state,
                    lstm_state,
                    global_batch=global_batch,
                    n_devices=n_devices,
                    mesh=mesh,
                    log=log,
                    check_meta=check_meta,
                ),
            )
        except DamagedCheckpointError as e:
            if distributed.is_multiprocess():
                raise TrainingError(f"{e}; move it out of {ckpts.directory} and start the job again") from None
            where = ckpts.move_aside(step)
            log(
                f"skipping checkpoint {ckpts.path(step)}: it is damaged ({e.reason}); moved it to {where}, "
                f"falling back to the one before"
            )
            skipped.append(step)
    if skipped:
        raise TrainingError(
            f"no checkpoint of {ckpts.workdir} restores: all {len(skipped)} were damaged and were moved to "
            f"{os.path.join(ckpts.workdir, 'checkpoints-damaged')}. Restore them from a backup, or run the "
            f"same command again to start this run over from step 0"
        )
    return None


def restore(
    ckpts: Checkpoints,
    step: int,
    train_state: Any,
    lstm_state: Any,
    *,
    global_batch: int,
    n_devices: int,
    mesh: jax.sharding.Mesh,
    log: Callable[[str], None],
    check_meta: Callable[[dict, str], None] | None = None,
) -> tuple[Any, Any, dict]:
    """The train state, this process's LSTM rows and the meta of checkpoint ``step``.

    ``train_state`` / ``lstm_state`` (this process's rows ``[.., B_local, ..]``) give the
    shapes; every process of a multi-process job must call this.  The record is checked
    first (topology, vocabulary size, ``check_meta``, e.g. :func:`check_run_inputs`): a
    config that changes the model's shapes is named by its field, not by the arrays'
    storage layer.
    """
    meta = ckpts.read_meta(step)
    check_topology(meta, ckpts.path(step), global_batch, n_devices, log)
    check_vocabulary_size(
        meta,
        np.shape(train_state["params"]["softmax"]["b"])[0],
        ckpts.path(step),
        os.path.join(ckpts.workdir, "vocab.txt"),
    )
    if check_meta is not None:
        check_meta(meta, ckpts.path(step))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    template = (
        jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), train_state),
        jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(
                x.shape[:2] + (global_batch,) + x.shape[3:], x.dtype, sharding=rows_sharding(mesh, x.ndim, 2)
            ),
            lstm_state,
        ),
    )
    (g_train, g_lstm), meta = ckpts.restore(template, step)
    return jax.tree.map(local_replica, g_train), jax.tree.map(lambda x: local_rows(x, 2), g_lstm), meta


def resume_data_position(batcher, meta: dict, path: str, data_content: str) -> None:
    """Put ``batcher`` where the checkpoint at ``path`` left this process's data, after
    checking that the training sentences are the ones it was trained on."""
    data_state = _data_state(meta, jax.process_index())
    saved_content = meta.get("data_content")  # absent in checkpoints of older versions
    if saved_content is not None and saved_content != data_content:
        raise TrainingError(
            f"the training data changed since {path} was written (its sentences "
            f"{saved_content}, now {data_content}; a relative --config.data path read "
            f"from another folder does this too). Restore the data the run started with, or start a "
            f"new --workdir (`elmo-jax export` writes this checkpoint's weights)"
        )
    if data_state.get("num_sentences") != batcher.num_sentences:
        raise TrainingError(
            f"the training data changed since {path} was written: it had "
            f"{data_state.get('num_sentences')} sentences, now {batcher.num_sentences}. "
            f"The data position cannot be carried over; restore the data the run started with, or "
            f"start a new --workdir (`elmo-jax export` writes this checkpoint's weights)"
        )
    try:
        batcher.set_state(data_state)
    except ValueError as e:
        raise TrainingError(f"cannot continue from {path}: {e}") from None


def write_checkpoint(
    ckpts: Checkpoints,
    step: int,
    train_state: Any,
    lstm_state: Any,
    data_position: dict,
    mesh: jax.sharding.Mesh,
    meta: dict,
) -> None:
    """Checkpoint ``step`` (all processes call this): the host train state (the same on
    every process), this process's LSTM rows and data position, and ``meta``."""
    data_states = distributed.allgather_json(f"checkpoint/{step}", data_position)
    state = (to_global_replicated(train_state, mesh), to_global_rows(lstm_state, mesh, axis=2))
    ckpts.save(step, state, {"step": step, "data_by_process": data_states, **meta})


def _data_state(meta: dict, process_index: int) -> dict:
    """This process's data position from a checkpoint's meta (older ones: one ``data``)."""
    states = meta.get("data_by_process")
    return meta["data"] if states is None else states[process_index]


def check_topology(meta: dict, path: str, global_batch: int, n_devices: int, log) -> None:
    """Refuse a checkpoint whose per-process data positions / LSTM rows cannot be mapped."""
    saved_processes = int(meta.get("process_count", 1))
    saved_batch = int(meta.get("global_batch", global_batch))
    saved_devices = meta.get("device_count")
    processes = jax.process_count()
    if saved_processes != processes or saved_batch != global_batch:
        devices = f" on {saved_devices} devices" if saved_devices else ""
        same_batch = (
            f"--config.batch_size={saved_batch} --config.batch_size_per_device=None"
            if saved_batch % n_devices == 0
            else f"a device count that divides {saved_batch} with --config.batch_size={saved_batch}"
        )
        raise TrainingError(
            f"checkpoint {path} was written by {saved_processes} process(es){devices} with a global batch of "
            f"{saved_batch} rows; this run has {processes} process(es) on {n_devices} devices and a global batch "
            f"of {global_batch}. Each process's position in its own share of the data (sentences i % P == p) and "
            f"its rows of the carried LSTM state cannot be mapped onto a different process count or global "
            f"batch. Resume with {saved_processes} process(es) and the same global batch ({same_batch}), "
            f"or start a new --workdir (`elmo-jax export` writes this checkpoint's weights)."
        )
    if saved_devices is not None and int(saved_devices) != n_devices:
        log(
            f"note: {path} was written on {saved_devices} devices, this run has {n_devices}; the global batch "
            f"and the data positions are unchanged, so the run continues (dropout masks differ)"
        )


def checkpoints_after_divergence(saved_steps: list[int], bad_step: int, path: Callable[[int], str]) -> str:
    """Which checkpoints to trust after a non-finite loss at ``bad_step``: that loss was
    computed from the parameters after step ``bad_step - 1``, so checkpoints from that step
    on hold diverged parameters (possibly still finite numbers)."""
    good = sorted(s for s in saved_steps if s < bad_step - 1)
    bad = sorted(s for s in saved_steps if s >= bad_step - 1)
    text = f"the last good checkpoint is {path(good[-1])}" if good else "no good checkpoint was written"
    if bad:
        one = len(bad) == 1
        text += (
            f"; {', '.join(path(s) for s in bad)} already {'holds' if one else 'hold'} the diverged "
            f"parameters: delete {'it' if one else 'them'} before resuming, or resuming starts from there"
        )
    return text


def check_finite(records: list[tuple[int, dict]], ckpts: Checkpoints, vocab_size: int) -> None:
    """Stop on a diverged loss among ``records`` (``(step, metrics)`` on the host), before
    anything else is saved, saying which checkpoints still hold good parameters.  Diverged:
    not finite, or finite but far above what a fresh model scores
    (:func:`elmo_jax.train.losses.divergence_limit`)."""
    limit = divergence_limit(vocab_size)
    for step, m in records:
        loss = m["loss"]
        if not np.isfinite(loss) or loss > limit:
            ckpts.wait()  # an asynchronous save in flight is listed too
            above = (
                ""
                if not np.isfinite(loss)
                else (f" (far above {limit:.1f} = 3 log V + 10, a loss no training reaches: the parameters blew up)")
            )
            raise TrainingError(
                f"the loss became {loss} at step {step}{above}; stopping without saving "
                f"({checkpoints_after_divergence(ckpts.all_steps(), step, ckpts.path)}). "
                f"Lower the learning rate or clip_norm, or check the data."
            )
