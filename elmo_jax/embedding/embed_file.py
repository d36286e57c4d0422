"""Embed a text file into HDF5, streaming and resumable: the ``elmo-jax embed`` command.

Input: one sentence per line (:mod:`elmo_jax.embedding.embed_input`; an empty line is an empty
sentence, ``[L+1, 0, 2P]``).  Output: one of the layouts of :mod:`elmo_jax.embedding.embed_layouts`
(``allennlp`` by default, ``packed``, ``sentence_vectors``), read back by
:func:`elmo_jax.read_embeddings`.

The input is checked in one pass before anything is embedded (a non-UTF-8 line, or one of
more than ``max_tokens`` tokens, is refused with its line number and nothing is written),
then embedded one group of ``group_lines`` lines at a time with ``Elmo.embed``: memory holds
a group, not the input.  Groups are a function of line numbers only.

Resuming: the partial output lives in ``OUTPUT.partial/`` (``data.hdf5`` + ``progress.json``,
:mod:`elmo_jax.embedding.embed_state`).  After each group the data is flushed and fsynced, then the
progress is written atomically.  Run the same command after a kill -9, a SIGTERM or Ctrl-C
(which stop within seconds: after the checkpoint being written, if one is) or a full disk and
it continues from the first line not counted, cutting off what was written after the last
checkpoint (each group's disk space is reserved before HDF5 writes it, so a full disk fails
before a write, never inside one); the result equals an uninterrupted run's, dataset by
dataset, bit for bit (the same groups through the same compiled programs).  A changed input,
model or output option is named and refused (``restart=True`` / ``--restart`` starts over).
Only the finished file is renamed to ``OUTPUT``; until then an existing ``OUTPUT`` (with
``overwrite``) is left as it was.

Several processes (``jax.distributed``, e.g. one per host): process ``p`` of ``n`` embeds a
contiguous range of whole groups into ``OUTPUT.partial/shard-0000p-of-0000n.hdf5`` (its own
resume state beside it); when all are done, process 0 writes ``manifest.json`` and renames
the folder to ``OUTPUT``: a folder that :func:`elmo_jax.read_embeddings` opens as one.
``OUTPUT.partial`` must be on a file system every process sees.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from typing import Any

from elmo_jax.train.stop import Stopped, stopped_by

from elmo_jax.atomic import OutputIsInputError, new_mode, refuse_output_over_inputs, replace_dir, write_json
from elmo_jax.embedding.embed_input import GROUP_LINES, MAX_TOKENS, InputScan, read_group, read_sentences, scan_input
from elmo_jax.embedding import embed_layouts, embed_state
from elmo_jax.errors import ElmoError

FILE_LAYERS = ("all", "top", "average")
DATA_FILE = "data.hdf5"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "elmo-jax sharded embeddings"
RESERVE_MARGIN = 2 << 20
PROGRESS_THRESHOLD = 1000  # progress=None shows a bar above this many lines, as Elmo.embed does
_FOREVER_S = 30 * 24 * 3600.0

__all__ = ["embed_file", "read_sentences", "EmbedStopped", "FILE_LAYERS", "GROUP_LINES", "MAX_TOKENS"]


class EmbedStopped(Stopped):
    """A run stopped by SIGTERM / Ctrl-C: its partial output resumes.  ``args``: the signal's
    name and the line that says so (``str()``); a stop, not an error (status 130 / 143)."""

    def __str__(self) -> str:
        return self.args[1] if len(self.args) > 1 else super().__str__()


class EmbedStateError(ElmoError):
    """A partial output that belongs to another run (input, model or options changed)."""


def partial_path(output_path: str) -> str:
    return f"{output_path}.partial"


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}.hdf5"


def _run_folders(elmo) -> dict[str, str]:
    """The model's folder, and the training run's workdir it sits in if any (its files are
    outputs of other commands: nothing here may replace them)."""
    folders = {}
    for path in getattr(elmo, "source_files", {}).values():
        folder = os.path.dirname(os.path.abspath(path))
        folders["model's folder"] = folder
        for candidate in (folder, os.path.dirname(folder)):
            if os.path.isdir(os.path.join(candidate, "checkpoints")):
                folders["training run's workdir"] = candidate
    return folders


def _refuse_protected(output_path: str, input_path, elmo) -> None:
    refuse_output_over_inputs(output_path, {"input file": input_path, **getattr(elmo, "source_files", {})})
    if not os.path.exists(output_path):
        return
    real = os.path.realpath(output_path)
    for role, folder in _run_folders(elmo).items():
        if os.path.commonpath([real, os.path.realpath(folder)]) == os.path.realpath(folder):
            raise OutputIsInputError(
                f"the output {output_path} is a file of the {role} {folder}; replacing it would damage that "
                f"folder, whatever --overwrite says: write the embeddings elsewhere"
            )


class _Stop:
    """SIGTERM and Ctrl-C stop the run where they land (within seconds: a batch), except while
    a group is being written and checkpointed (``writing``): then the signal is kept
    (``pending``: its name) and the loop stops once that group's checkpoint is written."""

    def __init__(self):
        self.writing = False
        self.pending: str | None = None
        self.previous: dict = {}

    def handler(self, signum, frame):
        name = signal.Signals(signum).name
        if self.writing:
            self.pending = self.pending or name
            return
        before = self.previous.get(signum)
        if before is signal.SIG_IGN:
            return
        if callable(before):  # the caller's: Python's KeyboardInterrupt, the command line's stop
            before(signum, frame)
        raise KeyboardInterrupt if signum == signal.SIGINT else Stopped(name)


@contextlib.contextmanager
def _stop_on_signals():
    """A :class:`_Stop` installed for SIGTERM and SIGINT (main thread only; elsewhere it never
    defers), the caller's handlers back afterwards."""
    stop = _Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    for s in (signal.SIGTERM, signal.SIGINT):
        stop.previous[s] = signal.signal(s, stop.handler)
    try:
        yield stop
    finally:
        for s, h in stop.previous.items():
            signal.signal(s, h)


def _say(message: str) -> None:
    import sys

    print(message, file=sys.stderr, flush=True)


def embed_file(
    elmo,
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    layers: str = "all",
    *,
    layout: str = "allennlp",
    batch_size: int | None = None,
    group_lines: int = GROUP_LINES,
    max_tokens: int = MAX_TOKENS,
    overwrite: bool = False,
    restart: bool = False,
    progress: bool | None = True,
    process_index: int | None = None,
    process_count: int | None = None,
    say=_say,
) -> dict:
    """Embed every line of ``input_path`` with ``elmo`` into ``output_path`` (module docstring).

    ``layout``: ``"allennlp"``, ``"packed"`` or ``"sentence_vectors"``.  ``progress``: a tqdm bar
    (sentences/s, time left); ``None`` shows it above 1000 lines.  ``process_index`` /
    ``process_count`` default to jax's.  ``say``: where notices (resuming, skipping) go.
    Returns ``{"sentences", "tokens", "seconds", "devices", "hosts", "resumed_from", "output"}``
    (the counts are this run's work, not what an earlier run had done; in a multi-process job
    the whole job's, every process's share added up, and ``"resumed"`` lists
    ``(process, resumed_from)`` for each process that resumed).
    """
    if layers not in FILE_LAYERS:
        raise ValueError(f"layers must be one of {', '.join(FILE_LAYERS)}, got {layers!r}")
    if layout not in embed_layouts.LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(embed_layouts.LAYOUTS)}, got {layout!r}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if process_index is None or process_count is None:
        import jax

        process_index, process_count = jax.process_index(), jax.process_count()
    start = time.perf_counter()
    output_path = os.path.abspath(os.fspath(output_path))
    work = partial_path(output_path)
    _refuse_protected(output_path, input_path, elmo)
    refuse_output_over_inputs(work, {"input file": input_path, **getattr(elmo, "source_files", {})})
    if process_count == 1 and os.path.isdir(output_path):
        raise ElmoError(f"output {output_path} is a folder; give a file name such as out.hdf5")
    if process_count > 1 and os.path.isfile(output_path):
        raise ElmoError(
            f"output {output_path} is a file; a {process_count}-process run writes a folder of shards: "
            f"give a new name such as out.shards"
        )
    if os.path.exists(output_path) and not overwrite:
        raise FileExistsError(f"{output_path} exists; pass --overwrite (overwrite=True) to replace it")
    folder = os.path.dirname(output_path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"output folder does not exist: {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ElmoError(
            f"cannot write in the output folder {folder} (Permission denied); choose an output "
            f"file in a folder you can write to"
        )

    scan = scan_input(input_path, group_lines, max_tokens)
    batch_size = elmo.batch_size if batch_size is None else batch_size
    first_group = process_index * scan.n_groups // process_count
    end_group = (process_index + 1) * scan.n_groups // process_count
    first_line = first_group * group_lines
    end_line = min(end_group * group_lines, scan.n_lines)
    run = {
        "input": scan.fingerprint(),
        "model": embed_state.model_digest(elmo),
        "options": {
            "layers": layers,
            "layout": layout,
            "batch_size": batch_size,
            "group_lines": group_lines,
            "dtype": str(getattr(elmo, "dtype", "float32")),
        },
        "shard": {"index": process_index, "count": process_count, "first_line": first_line, "end_line": end_line},
    }
    if process_count == 1:
        final, state_dir = output_path, work
    else:
        os.makedirs(work, mode=new_mode(folder=True), exist_ok=True)
        final = os.path.join(work, shard_name(process_index, process_count))
        state_dir = f"{final}.partial"
    if restart:
        shutil.rmtree(state_dir, ignore_errors=True)
        if final != output_path and os.path.exists(final):
            os.remove(final)
    with _stop_on_signals() as stop:
        done = _embed_range(
            elmo, scan, run, state_dir, final, first_group, end_group, batch_size, progress=progress, stop=stop, say=say
        )
    if process_count > 1:
        done = _finish_shards(run, scan, work, output_path, overwrite, done, say)
    seconds = time.perf_counter() - start
    devices = getattr(elmo, "devices", None)
    return {
        **done,
        "seconds": seconds,
        "devices": len(devices) if devices else 1,
        "hosts": process_count,
        "output": output_path,
        "lines": end_line - first_line,
    }


def _embed_range(
    elmo,
    scan: InputScan,
    run: dict,
    state_dir: str,
    final: str,
    first_group: int,
    end_group: int,
    batch_size: int,
    *,
    progress,
    stop,
    say,
) -> dict:
    """Embed groups ``[first_group, end_group)`` into ``final``, resuming from ``state_dir``."""
    shard = run["shard"]
    layout, layers = run["options"]["layout"], run["options"]["layers"]
    data = os.path.join(state_dir, DATA_FILE)
    result: dict[str, Any] = {"sentences": 0, "tokens": 0, "resumed_from": None}
    if shard["count"] > 1 and os.path.exists(final):
        with embed_layouts.open_h5(final, "r") as f:
            other = embed_state.compare(embed_layouts.run_of(f), run)
        if other:
            raise EmbedStateError(
                f"{final} is a finished shard of another run: {other}; to start over, delete "
                f"{os.path.dirname(final)} or pass --restart"
            )
        say(f"shard {shard['index']} of {shard['count']} is already complete: {final}")
        return result
    saved = embed_state.read_progress(state_dir)
    if saved is not None and os.path.exists(data):
        other = embed_state.compare(saved["run"], run)
        if other:
            raise EmbedStateError(
                f"{state_dir} holds a partial run that does not match this one: {other}; nothing "
                f"was mixed. To start over, delete {state_dir} or pass --restart"
            )
        lines_done = saved["lines_done"]
        try:
            with embed_layouts.open_h5(data, "r+") as f:
                embed_layouts.truncate(f, shard["first_line"], lines_done - shard["first_line"], scan.group_lines)
        except OSError as e:
            raise EmbedStateError(
                f"the partial output {data} cannot be opened ({e}); delete {state_dir} or pass --restart to start over"
            ) from None
        embed_state.fsync_path(data)
        if lines_done > shard["first_line"]:
            result["resumed_from"] = lines_done
            say(
                f"resuming from line {lines_done + 1} ({lines_done - shard['first_line']} of "
                f"{shard['end_line'] - shard['first_line']} lines were done; state in {state_dir})"
            )
        sentences, tokens = saved["sentences"], saved["tokens"]
    else:  # new, or killed before its first checkpoint
        lines_done, sentences, tokens = shard["first_line"], 0, 0
        shutil.rmtree(state_dir, ignore_errors=True)
        try:
            os.makedirs(state_dir, mode=new_mode(folder=True))
            with embed_layouts.open_h5(data, "w") as f:
                embed_layouts.create(f, layout, layers, elmo.config.n_output_layers, elmo.config.output_dim, run)
            embed_state.fsync_path(data)
            embed_state.write_progress(state_dir, run, lines_done, sentences, tokens)
        except OSError as e:
            shutil.rmtree(state_dir, ignore_errors=True)
            folder = os.path.dirname(state_dir)
            raise ElmoError(
                f"cannot write in the output folder {folder} ({e.strerror or e}); choose an output "
                f"file in a folder you can write to"
            ) from None

    bar = None
    if progress or (progress is None and shard["end_line"] - shard["first_line"] > PROGRESS_THRESHOLD):
        from tqdm.auto import tqdm

        desc = "embed" if shard["count"] == 1 else f"embed shard {shard['index']}"
        bar = tqdm(
            total=shard["end_line"] - shard["first_line"],
            initial=lines_done - shard["first_line"],
            unit="sent",
            desc=desc,
            smoothing=0.1,
        )
    try:
        for group in range(lines_done // scan.group_lines, end_group):
            texts = read_group(scan, group)
            if layout == "sentence_vectors":
                arrays = list(elmo.sentence_vectors(texts, layers, batch_size=batch_size, progress=False))
            else:
                arrays = elmo.embed(texts, layers, batch_size=batch_size, progress=False)
            n_tokens = sum(len(t.split()) for t in texts)
            stop.writing = True
            try:
                embed_state.reserve_space(data, _group_bytes(arrays, texts))
                with embed_layouts.open_h5(data, "r+") as f:
                    embed_layouts.append(f, lines_done, arrays, texts)
                embed_state.fsync_path(data)
                del arrays
                lines_done += len(texts)
                sentences += len(texts)
                tokens += n_tokens
                embed_state.write_progress(state_dir, run, lines_done, sentences, tokens)
            except OSError as e:
                raise ElmoError(
                    f"cannot write the partial output in {state_dir} ({e}); the lines before "
                    f"{lines_done + 1} are kept: free space (or fix the folder) and run the same "
                    f"command again to continue"
                ) from None
            finally:
                stop.writing = False
            result["sentences"] += len(texts)
            result["tokens"] += n_tokens
            if bar is not None:
                bar.update(len(texts))
            if stop.pending and group + 1 < end_group:
                raise Stopped(stop.pending)
    except KeyboardInterrupt as e:
        name = stopped_by(e)
        raise EmbedStopped(
            name,
            f"stopped by {name} after line {lines_done} of {shard['end_line']}; the partial "
            f"output is kept in {state_dir}: run the same command again to continue",
        ) from None
    finally:
        if bar is not None:
            bar.close()
    try:
        if layout == "allennlp":  # sentence_to_index: about the input's bytes
            embed_state.reserve_space(
                data, 2 * (scan.size if shard["count"] == 1 else scan.size // shard["count"] * 2) + RESERVE_MARGIN
            )
        with embed_layouts.open_h5(data, "r+") as f:
            embed_layouts.finish(f, _lines(scan, first_group, end_group))
        embed_state.fsync_path(data)
        os.replace(data, final)
    except OSError as e:
        raise ElmoError(
            f"cannot finish the output {final} ({e}); the partial output is kept in {state_dir}: free "
            f"space and run the same command again"
        ) from None
    shutil.rmtree(state_dir, ignore_errors=True)
    result["total_sentences"], result["total_tokens"] = sentences, tokens
    return result


def _group_bytes(arrays: list, texts: list[str]) -> int:
    """Disk a group may take: its arrays twice over (a chunk is allocated whole), its text,
    a few KiB of HDF5 objects per sentence, and a margin."""
    return 2 * sum(a.nbytes for a in arrays) + sum(len(t.encode()) for t in texts) + 4096 * len(texts) + RESERVE_MARGIN


def _lines(scan: InputScan, first_group: int, end_group: int):
    """``(line number, stripped text)`` of every line of the groups, streamed."""
    for group in range(first_group, end_group):
        for k, text in enumerate(read_group(scan, group)):
            yield group * scan.group_lines + k, text


def _finish_shards(run: dict, scan: InputScan, work: str, output_path: str, overwrite: bool, done: dict, say) -> dict:
    """Wait for every process's shard; process 0 writes the manifest and puts the folder in place.
    Returns ``done`` with the job's counts: every process's ``sentences`` and ``tokens`` added up."""
    import jax

    from elmo_jax.train import distributed

    shard = run["shard"]
    mine = {
        "file": shard_name(shard["index"], shard["count"]),
        "first_line": shard["first_line"],
        "end_line": shard["end_line"],
        "counts": {k: done[k] for k in ("sentences", "tokens", "resumed_from")},
    }
    shards = distributed.allgather_json("embed/shards", mine, timeout_s=_FOREVER_S)
    counts = [s.pop("counts") for s in shards]  # the rest is the manifest's list of shards
    job = {
        **done,
        "sentences": sum(c["sentences"] for c in counts),
        "tokens": sum(c["tokens"] for c in counts),
        "resumed": [(p, c["resumed_from"]) for p, c in enumerate(counts) if c["resumed_from"] is not None],
    }
    if jax.process_index() == 0:
        manifest = {
            "format": MANIFEST_FORMAT,
            "version": 1,
            "layout": run["options"]["layout"],
            "layers": run["options"]["layers"],
            "lines": scan.n_lines,
            "input": run["input"],
            "model": run["model"],
            "shards": shards,
        }
        write_json(os.path.join(work, MANIFEST_FILE), manifest)
        if os.path.exists(output_path) and not overwrite:
            raise FileExistsError(f"{output_path} appeared while embedding; the shards are kept in {work}")
        replace_dir(work, output_path)
        distributed.publish("embed/final", "done")
    else:
        distributed.wait_for_value("embed/final", _FOREVER_S, "process 0 to put the shards in place")
    return job
