"""The ``elmo-jax`` command line: one sub-command per job.

(Over 500 lines: each verb's argparse definition and its thin runner live here, so the help
texts sit beside the code that reads them; the work itself is in the package's modules.)
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
import tempfile
import time
from collections.abc import Callable

from elmo_jax.errors import USER_ERRORS, ElmoError, refuse_symlink_loop
from elmo_jax.embedding.embed_input import GROUP_LINES, MAX_TOKENS


def _demo(args: argparse.Namespace) -> int:
    """Embed a few sentences with a model (random ``--preset`` or a ``--model`` folder)."""
    from elmo_jax.embedding.embedder import Elmo

    if args.model:
        elmo = Elmo.load(args.model)
        source = args.model
    else:
        elmo = Elmo.random(args.preset, seed=args.seed)
        source = f"random {args.preset} preset (seed {args.seed})"
    sentences = args.sentences or [
        "She went to the bank to deposit money .",
        "They sat on the bank of the river .",
        "她 去 银行 取钱",
    ]
    start = time.perf_counter()
    vectors = elmo.embed(sentences)
    seconds = time.perf_counter() - start
    print(f"model: {source}")
    for sentence, v in zip(sentences, vectors):
        print(f"  {v.shape}  {sentence}")
    print(f"embedded {len(sentences)} sentences in {seconds:.2f} s (including compilation)")
    return 0


def _train(args: argparse.Namespace) -> int:
    """Pretrain (or resume) in ``--workdir``; see ``configs/`` and ``--config.KEY=VALUE``."""
    from elmo_jax.train.config_loader import parse_config_args

    _quiet_data_preparation()
    cfg, rest = parse_config_args(args.config_args)
    if rest:
        raise ValueError(_unrecognised(rest, getattr(args, "known_options", ())))
    if not _maybe_init_distributed(args):
        if args.compile_check and not _compile_fits(cfg, args.compile_check):
            return 2
        return _train_run(args, cfg)
    return _run_in_process_group("train", lambda: _train_run(args, cfg))


def _compile_fits(cfg, topology: str, **kwargs) -> bool:
    """The compile-only check of ``cfg``'s step for ``topology``; False (with a line) when it
    does not fit (:mod:`elmo_jax.train.compile_check`)."""
    from elmo_jax.train.compile_check import run_check

    reports = run_check(cfg, topology, **kwargs)
    if not reports[0].fits:
        print(
            f"the training step does not fit {topology}: lower batch_size, set remat_steps, or pick a chip "
            f"with more memory",
            file=sys.stderr,
        )
        return False
    return True


def _compile(args: argparse.Namespace) -> int:
    """Compile-only TPU check of a config's training step and of Elmo.embed."""
    from elmo_jax.train.config_loader import parse_config_args

    cfg, rest = parse_config_args(args.config_args)
    if rest:
        raise ValueError(f"unrecognised arguments: {' '.join(rest)}")
    fits = _compile_fits(
        cfg,
        args.topology,
        rows_per_chip=args.rows_per_chip,
        vocab_size=args.vocab_size,
        search=args.max_compiles > 0,
        max_compiles=args.max_compiles,
        embed=not args.no_embed,
    )
    return 0 if fits else 1


def _run_in_process_group(command: str, run: Callable[[], int]) -> int:
    """``run()`` in one process of a multi-process job: an error in this process must end it
    at once; a normal exit would wait in the runtime's shutdown barrier for peers that may be
    blocked waiting for this one.  The peers are then stopped by the runtime (heartbeat
    timeout) or a failed collective."""
    import jax
    import traceback

    try:
        return run()
    except USER_ERRORS as e:
        print(f"elmo-jax {command} (process {jax.process_index()}): error: {e}", file=sys.stderr)
        _exit_now(2)
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM (Stopped): one line, 130 / 143
        from elmo_jax.train.stop import Stopped, exit_status, stopped_by

        detail = str(e) if isinstance(e, Stopped) and len(e.args) > 1 else f"stopped by {stopped_by(e)}"
        print(f"elmo-jax {command} (process {jax.process_index()}): {detail}", file=sys.stderr)
        _exit_now(exit_status(stopped_by(e)))
    except BaseException:
        print(f"elmo-jax {command} (process {jax.process_index()}): failed:", file=sys.stderr)
        traceback.print_exc()
        _exit_now(1)
    return 1  # not reached: _exit_now ends the process


def _exit_now(code: int) -> None:
    from elmo_jax.train.distributed import exit_now

    exit_now(code)


def _train_run(args: argparse.Namespace, cfg) -> int:
    from elmo_jax.train.loop import train
    from elmo_jax.train.report import probe_sizes, synthetic_report

    workdir = args.workdir or os.path.join("runs", cfg.model)
    summary = train(cfg, workdir, progress=not args.no_progress)
    if summary.get("interrupted"):  # saved and resumable, but not finished: never 0
        from elmo_jax.train.stop import exit_status

        return exit_status(summary["interrupted"])
    if summary.get("corpus_dir") and _is_main():
        print(
            synthetic_report(
                summary["corpus_dir"],
                summary["params"]["bilm"],
                summary["model_config"],
                summary.get("eval"),
                vocab=summary["vocab"].tokens,
                progress=False if args.no_progress else None,
                **probe_sizes(summary["step"] * summary["global_batch"]),
            )
        )
    if _is_main():
        _run_pictures(workdir, summary)
    return 0


def _run_pictures(workdir: str, summary: dict) -> None:
    """The finished run's pictures (elmo_jax.run_plots) when matplotlib is installed, else
    one line saying how to get them; a picture that cannot be drawn never fails the run."""
    from elmo_jax.plots import INSTALL_HINT, have_matplotlib

    if not have_matplotlib():
        print(f"pictures of this run: {INSTALL_HINT}, then  elmo-jax plot {workdir}")
        return
    from elmo_jax.run_plots import plot_run

    try:
        written = plot_run(
            workdir,
            params=summary["params"]["bilm"],
            model_config=summary["model_config"],
            vocab_tokens=summary["vocab"].tokens,
        )
    except Exception as e:  # noqa: BLE001 - the run is done and saved; a picture never fails it
        print(f"no pictures of this run ({type(e).__name__}: {e}); draw them later with  elmo-jax plot {workdir}")
        return
    print("pictures of this run: " + ", ".join(written))


def _plot(args: argparse.Namespace) -> int:
    """Draw a run's pictures from its metrics.jsonl and newest checkpoint (elmo_jax.run_plots)."""
    from elmo_jax.plots import require_matplotlib
    from elmo_jax.run_plots import plot_run

    require_matplotlib()
    plot_run(args.workdir, say=lambda message: print(message, flush=True))  # each picture as it is written
    return 0


def _quiet_data_preparation() -> None:
    """TFDS's per-split progress bars and absl notices would drown the training log."""
    import logging

    import tensorflow_datasets as tfds

    tfds.disable_progress_bar()
    logging.getLogger("absl").setLevel(logging.ERROR)


def _maybe_init_distributed(args: argparse.Namespace) -> bool:
    """Join a multi-process job when flags or the environment ask for it (see
    :mod:`elmo_jax.train.distributed`); False for a plain single-process run."""
    from elmo_jax.train import distributed

    settings = distributed.settings_from_args(args)
    if settings is None:
        return False
    distributed.initialize(settings)
    return True


def _is_main() -> bool:
    import jax

    return jax.process_index() == 0


def _eval(args: argparse.Namespace) -> int:
    """Held-out perplexity of a workdir's latest checkpoint (full softmax)."""
    from elmo_jax.formats.training_run import load_checkpoint_params
    from elmo_jax.train.loop import data_dir_for
    from elmo_jax.data.text_source import make_source

    _quiet_data_preparation()
    loaded = load_checkpoint_params(args.workdir, step=args.step)
    data = args.data or loaded.heldout_spec
    if not data:
        raise ValueError("no held-out data: pass --data PATH (one tokenized sentence per line)")
    data_dir = data_dir_for(data, args.data_dir or loaded.train_config.data_dir, loaded.workdir)
    with contextlib.ExitStack() as scratch:
        try:
            source = make_source(data, "test", data_dir)
        except OSError as e:  # a read-only workdir (or data_dir): evaluating needs no lasting copy
            if data_dir is None or e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            if args.data_dir:
                raise ElmoError(
                    f"--data-dir {data_dir} cannot be written ({e.strerror}): give a writable "
                    f"folder, or leave --data-dir out"
                ) from None
            tmp = scratch.enter_context(tempfile.TemporaryDirectory(prefix="elmo-jax-eval-"))
            print(
                f"elmo-jax eval: {data_dir} cannot be written ({e.strerror}); preparing {data} in a "
                f"temporary folder instead (pass --data-dir DIR to keep the prepared copy)",
                file=sys.stderr,
            )
            source = make_source(data, "test", tmp)
        return _eval_source(args, loaded, data, source)


def _eval_source(args: argparse.Namespace, loaded, data: str, source) -> int:
    from elmo_jax.train.loop import evaluate

    max_batches = args.max_batches
    if max_batches is None and not args.data:  # the run's own held-out set, capped as in training:
        cap = loaded.eval_max_batches  # of 32 rows (the latest start's setting, from the checkpoint)
        if cap is not None:  # the same number of positions whatever --batch-size
            max_batches = max(1, -(-cap * 32 // args.batch_size))
    result = evaluate(
        loaded.params,
        loaded.model_config,
        source,
        loaded.vocab,
        batch_size=args.batch_size,
        unroll_steps=loaded.train_config.unroll_steps,
        max_batches=max_batches,
    )
    assert result is not None  # None only when a should_stop (none here) asks it to stop
    print(
        f"step {loaded.step}: perplexity {result['perplexity']:.3f} (forward {result['fwd_perplexity']:.3f}, "
        f"backward {result['bwd_perplexity']:.3f}) over {result['tokens']} tokens of {data}"
    )
    return 0


def _export(args: argparse.Namespace) -> int:
    from elmo_jax.formats.training_run import export

    out = export(args.workdir, args.out_dir, step=args.step, overwrite=args.overwrite)
    print(f"exported step {out['step']} to {args.out_dir}: {', '.join(out['files'])}")
    print(f"load it with:  elmo_jax.Elmo.load({args.out_dir!r})")
    return 0


def _embed(args: argparse.Namespace) -> int:
    """Embed a text file (one sentence per line) into HDF5, streaming and resumable (elmo_jax.embedding.embed_file)."""
    if args.model and args.preset:
        raise ValueError("give --model DIR or --preset NAME, not both")
    if not args.model and not args.preset:
        raise ValueError(
            "no model: pass --model DIR (a folder with options.json + weights.hdf5, e.g. from "
            "`elmo-jax export`), a released model's name (small, medium, original, original-5.5b) or "
            "a URL; there is no downloadable default. For a trial run, "
            "--preset tiny embeds with a RANDOM model (meaningless vectors)"
        )
    for flag, value in (
        ("--batch-size", args.batch_size),
        ("--group-lines", args.group_lines),
        ("--max-tokens", args.max_tokens),
    ):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.sentence_vectors and args.format is not None:
        raise ValueError("--sentence-vectors writes its own layout (one row per sentence); drop --format")
    _embed_refusals_before_loading(args.input, args.output, args.overwrite)
    if not _maybe_init_distributed(args):
        return _embed_run(args)
    return _run_in_process_group("embed", lambda: _embed_run(args))


def _embed_refusals_before_loading(input_path: str, output_path: str, overwrite: bool) -> None:
    """What ``embed_file`` refuses whatever the model, said before the model and jax load
    (which takes from seconds to a minute): a missing input, an output that exists without
    --overwrite, a missing output folder.  The same messages as ``embed_file``'s."""
    input_path, output_path = os.path.abspath(input_path), os.path.abspath(output_path)
    refuse_symlink_loop(input_path)
    if not os.path.exists(input_path):
        raise FileNotFoundError(f"input file not found: {input_path}")
    if os.path.exists(output_path) and not overwrite:
        raise FileExistsError(f"{output_path} exists; pass --overwrite (overwrite=True) to replace it")
    if not os.path.isdir(os.path.dirname(output_path)):
        raise FileNotFoundError(f"output folder does not exist: {os.path.dirname(output_path)}")


def _embed_run(args: argparse.Namespace) -> int:
    from elmo_jax.embedding.embed_file import embed_file
    from elmo_jax.embedding.embedder import Elmo
    from elmo_jax.embedding.devices import parse_devices

    devices = parse_devices(args.devices)
    elmo = (
        Elmo.load(args.model, dtype=args.dtype, devices=devices)
        if args.model
        else Elmo.random(args.preset, seed=args.seed, dtype=args.dtype, devices=devices)
    )
    layout = "sentence_vectors" if args.sentence_vectors else (args.format or "allennlp")
    out = embed_file(
        elmo,
        args.input,
        args.output,
        args.layers,
        layout=layout,
        batch_size=args.batch_size,
        group_lines=args.group_lines,
        max_tokens=args.max_tokens,
        overwrite=args.overwrite,
        restart=args.restart,
        progress=not args.no_progress,
    )
    from elmo_jax.rates import rate_text

    seconds = out["seconds"]
    resumed = f", resumed at line {out['resumed_from'] + 1}" if out["resumed_from"] is not None else ""
    if out.get("resumed"):  # a multi-process job: each process that resumed its shard
        resumed = ", resumed " + ", ".join(f"at line {line + 1} (process {p})" for p, line in out["resumed"])
    if out["hosts"] == 1 or _is_main():  # a job's totals, said once
        print(
            f"wrote {out['sentences']} sentences ({out['tokens']} tokens, layers={args.layers}, {layout}) to "
            f"{out['output']} in {seconds:.1f} s: {rate_text(out['tokens'], seconds)} tokens/s on "
            f"{out['devices']} device(s) x {out['hosts']} host(s){resumed}"
        )
    return 0


def _download(args: argparse.Namespace) -> int:
    """Fetch a model into the cache (elmo_jax.hub) and say where its files are."""
    from elmo_jax.hub import manylangs_names as manylangs
    from elmo_jax.hub.cache import PARTIAL_DIR, cache_home
    from elmo_jax.hub.names import RELEASED_MODELS
    from elmo_jax.resolve import resolve_model

    if args.list:
        print("released English models (AllenNLP):")
        for name, released_folder in RELEASED_MODELS.items():
            print(f"  {name:16} {released_folder}")
        print("ELMoForManyLangs (HIT-SCIR; converted on download):")
        for code, (number, language) in manylangs.RELEASED.items():
            print(f"  {manylangs.NAME_PREFIX + code:16} {language} ({number}.zip)")
        return 0
    if not args.model:
        raise ValueError("name a model (or URL) to download, or --list to see the released names")
    try:
        folder = resolve_model(
            args.model, offline=True if args.offline else None, progress=not args.no_progress, force=args.force
        )
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Stopped): 130 / 143
        from elmo_jax.train.stop import exit_status, stopped_by

        print(
            f"elmo-jax download: interrupted; the part already downloaded is kept in "
            f"{cache_home() / PARTIAL_DIR} and `elmo-jax download {args.model}` resumes it",
            file=sys.stderr,
        )
        return exit_status(stopped_by(e))
    print(f"{args.model}: {folder}")
    for f in sorted(folder.iterdir()):
        if f.is_file():
            print(f"  {f.name}  ({f.stat().st_size:,} bytes)")
    print(f"load it with:  elmo_jax.Elmo.load({args.model!r})  or  elmo-jax embed IN OUT --model {args.model}")
    return 0


def _add_distributed_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--distributed",
        action="store_true",
        help="join a multi-process job: jax.distributed.initialize() with the flags below, "
        "JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID, or what jax detects "
        "from the launcher (SLURM, Open MPI, Cloud TPU); --coordinator, --num-processes or "
        "--process-id imply it",
    )
    p.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="address of process 0's coordination service (the same on every process)",
    )
    p.add_argument("--num-processes", type=int, metavar="N", help="processes in the job")
    p.add_argument("--process-id", type=int, metavar="I", help="this process's index, 0..N-1")
    p.add_argument(
        "--heartbeat-timeout",
        type=int,
        metavar="S",
        help="seconds after which a silent process counts as dead and the job stops (default 60; "
        "multi-process jobs only)",
    )


def build_parser() -> argparse.ArgumentParser:
    from elmo_jax.config import COMPUTE_DTYPES  # here: numpy's import comes after the stop handlers (entry)

    parser = argparse.ArgumentParser(prog="elmo-jax", description="ELMo in JAX: pretrain, export and embed.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="embed a few sentences and print the shapes")
    demo.add_argument("sentences", nargs="*", help="sentences to embed (default: three examples)")
    demo.add_argument(
        "--model", help="a model folder (options.json + weights.hdf5), a training workdir, or a released model's name"
    )
    demo.add_argument("--preset", default="tiny", help="preset of the random model (default tiny)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)

    tr = sub.add_parser(
        "train",
        help="pretrain a biLM (default: configs/tiny.py on the embedded corpus)",
        description="Pretrain a biLM. Config: --config configs/NAME.py, overrides --config.KEY=VALUE.",
        usage="%(prog)s [--config FILE] [--config.KEY=VALUE ...] [options]",
        epilog="config: --config FILE picks a config file (default configs/tiny.py); --config.KEY=VALUE "
        "(or --config.KEY VALUE) overrides one of its fields, e.g. --config.max_steps=1000 "
        "--config.model_overrides.dim=512; an unknown KEY is refused with the list of valid ones",
    )
    tr.add_argument("--workdir", help="run folder: checkpoints, metrics, vocab (default runs/<model>)")
    tr.add_argument("--no-progress", action="store_true", help="no progress bar")
    tr.add_argument(
        "--compile-check",
        metavar="TOPOLOGY",
        help="first compile the step for TOPOLOGY (e.g. v5e:2x4, or 'local': this job's devices) "
        "and stop if it does not fit (see elmo-jax compile)",
    )
    _add_distributed_flags(tr)
    tr.set_defaults(func=_train)

    co = sub.add_parser(
        "compile",
        help="compile the training step for TPU chips you do not have: fits? memory, FLOPs, time",
        description="Compile-only check (needs libtpu: pip install 'elmo-jax[tpu]'): compiles the training step "
        "of a config and Elmo.embed for a TPU topology on this host and prints, per chip, whether it "
        "fits, the HBM it needs, its FLOPs and bytes (loops counted per trip) and a roofline time. "
        "All figures are compile-time estimates.",
        usage="%(prog)s --topology TOPOLOGY [--config FILE] [--config.KEY=VALUE ...] [options]",
    )
    co.add_argument(
        "--topology",
        required=True,
        help="e.g. v5e:2x4 (a v5e-8), v5e:4x4 (4 hosts), v4:2x2x1, v5p:2x2x2, v6e:2x4; 'local': this job's own devices",
    )
    co.add_argument("--rows-per-chip", type=int, metavar="N", help="rows per chip (default: the config's batch)")
    co.add_argument(
        "--vocab-size",
        type=int,
        metavar="N",
        help="softmax rows (default: the config's vocab_size, lm1b's 793,471 for lm1b)",
    )
    co.add_argument(
        "--max-compiles",
        type=int,
        default=4,
        metavar="N",
        help="compiles spent searching the largest rows per chip that fit (0: no search; default 4)",
    )
    co.add_argument("--no-embed", action="store_true", help="skip the Elmo.embed program (batch 1,024)")
    co.set_defaults(func=_compile)

    ev = sub.add_parser("eval", help="held-out perplexity of a run's checkpoint (full softmax)")
    ev.add_argument("workdir")
    ev.add_argument("--data", help="held-out text (default: the run's own held-out split)")
    ev.add_argument(
        "--data-dir",
        help="where prepared data lives (default: the run's data_dir, else WORKDIR/tfds for text "
        "and TFDS's own folder for lm1b)",
    )
    ev.add_argument("--step", type=int, help="checkpoint step (default latest)")
    ev.add_argument("--batch-size", type=int, default=32, help="rows per batch (default 32)")
    ev.add_argument(
        "--max-batches",
        type=int,
        help="score only the first N batches (default: the run's eval_max_batches for its own held-out set, else all)",
    )
    ev.set_defaults(func=_eval)

    pl = sub.add_parser(
        "plot",
        help="draw a run's pictures (PNG, next to its results): perplexity against steps, word senses per layer",
        description="Write WORKDIR/perplexity.png (held-out perplexity against steps, from metrics.jsonl, with the "
        "generator's optimum for runs on the embedded corpus) and, for those runs, "
        "WORKDIR/word_senses.png (one ambiguous word's occurrences per layer, from the newest "
        "checkpoint). Needs matplotlib: pip install -e '.[plot]'.",
    )
    pl.add_argument("workdir", help="the run's folder (what `elmo-jax train --workdir` wrote)")
    pl.set_defaults(func=_plot)

    ex = sub.add_parser("export", help="write a run's checkpoint as options.json + weights.hdf5 (+ vocab, softmax)")
    ex.add_argument("workdir")
    ex.add_argument("out_dir")
    ex.add_argument("--step", type=int, help="checkpoint step (default latest)")
    ex.add_argument(
        "--overwrite", action="store_true", help="replace OUT_DIR if it holds an earlier export (and nothing else)"
    )
    ex.set_defaults(func=_export)

    em = sub.add_parser(
        "embed",
        help="embed a text file (one sentence per line) into HDF5",
        description="Write one dataset per input line ('0', '1', ...): [L+1, n_tokens, 2P] with --all, "
        "[n_tokens, 2P] with --top/--average, plus 'sentence_to_index' (JSON); or --format packed, "
        "or --sentence-vectors. Streams the input; an interrupted run (kill, SIGTERM, full disk) "
        "continues when run again. Read any output with elmo_jax.read_embeddings(OUTPUT).",
    )
    em.add_argument("input", help="UTF-8 text, one whitespace-tokenized sentence per line")
    em.add_argument("output", help="the HDF5 file to write")
    which = em.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", dest="layers", action="store_const", const="all", help="all layers")
    which.add_argument("--top", dest="layers", action="store_const", const="top", help="the top layer")
    which.add_argument("--average", dest="layers", action="store_const", const="average", help="the mean of the layers")
    em.add_argument(
        "--model",
        help="model folder (options.json + weights.hdf5, or an ELMoForManyLangs folder), "
        "a training workdir (its newest checkpoint, exported once into the cache), "
        "released model name (small, medium, original, original-5.5b, manylangs/<code>) "
        "or URL (see `elmo-jax download --list`)",
    )
    em.add_argument("--preset", help="instead of --model: a RANDOM model of this preset, for trials")
    em.add_argument("--seed", type=int, default=0, help="seed of the --preset model")
    em.add_argument("--batch-size", type=int, default=64)
    em.add_argument(
        "--dtype",
        default="float32",
        choices=COMPUTE_DTYPES,
        help="matmul operand dtype; bfloat16 keeps params, state and outputs float32 "
        "(faster on GPU/TPU, not on XLA:CPU)",
    )
    em.add_argument(
        "--format",
        choices=("allennlp", "packed"),
        help="allennlp (default): one dataset per line + sentence_to_index, what other tools read; "
        "packed: one token-major dataset + offsets + line numbers, for corpora",
    )
    em.add_argument(
        "--sentence-vectors",
        action="store_true",
        help="write one vector per sentence (the mean over its tokens of the chosen layers) instead "
        "of token vectors: dataset sentence_vectors [N, 2P]",
    )
    em.add_argument(
        "--devices",
        default="all",
        metavar="all|N|id:I,J",
        help="the local devices to embed on: all of them (default), the first N, or those ids; "
        "rows of each group are split over them",
    )
    em.add_argument(
        "--group-lines",
        type=int,
        default=GROUP_LINES,
        help=f"lines embedded, written and checkpointed at a time (default {GROUP_LINES}); memory "
        f"holds about one group",
    )
    em.add_argument(
        "--max-tokens",
        type=int,
        default=MAX_TOKENS,
        help=f"refuse a line of more tokens than this (default {MAX_TOKENS:,}): a line is one sentence",
    )
    em.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    em.add_argument(
        "--restart",
        action="store_true",
        help="discard the partial output of an interrupted run (OUTPUT.partial) and start over; "
        "without it a matching partial run is continued",
    )
    em.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_distributed_flags(em)
    em.set_defaults(func=_embed)

    dl = sub.add_parser(
        "download",
        help="fetch a released model (or a model URL) into the cache and print where it is",
        description="Fetch a model into the cache ($ELMO_JAX_HOME/models, default ~/.cache/elmo-jax/models) "
        "and print its folder. NAME: small, medium, original, original-5.5b, manylangs/<code> (the 44 "
        "ELMoForManyLangs models: --list), or an http(s) URL of a model folder (ending in /), of its "
        "files' common prefix, or of a .zip/.tar.gz holding them (#sha256=HEX pins its digest). "
        "A cached model's files are checked against the sha256 recorded when they were downloaded.",
    )
    dl.add_argument("model", metavar="NAME", nargs="?", help="released model name or URL")
    dl.add_argument("--list", action="store_true", help="list the released models' names and exit")
    dl.add_argument(
        "--force",
        action="store_true",
        help="delete the cached copy (and any partial download) and fetch it again, e.g. after a checksum error",
    )
    dl.add_argument(
        "--offline",
        action="store_true",
        help="never use the network: the cached copy, or an error saying which files to put where "
        "(also ELMO_JAX_OFFLINE=1)",
    )
    dl.add_argument("--no-progress", action="store_true", help="no progress bar")
    dl.set_defaults(func=_download)

    from elmo_jax.data.synthetic_corpus import add_corpus_command

    add_corpus_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.known_options = _options_of(parser, args.command)
    if args.command in ("train", "compile"):
        args.config_args = extra
    elif extra:
        parser.error(_unrecognised(extra, args.known_options))
    try:
        with _stop_at_once(args.command):
            return args.func(args)
    except USER_ERRORS as e:
        print(f"elmo-jax {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Stopped) outside `train`
        from elmo_jax.train.stop import Stopped, exit_status

        name = e.args[0] if isinstance(e, Stopped) and e.args else "SIGINT"
        detail = str(e) if isinstance(e, Stopped) and len(e.args) > 1 else f"stopped by {name}"  # where it stopped
        print(f"elmo-jax {args.command}: {detail}", file=sys.stderr)
        return exit_status(name)


def _options_of(parser: argparse.ArgumentParser, command: str | None) -> list[str]:
    """The option strings (``--workdir``, ...) of ``command``'s subparser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return [o for a in action.choices[command]._actions for o in a.option_strings if o.startswith("--")]
    return []


def _unrecognised(extra: list[str], options) -> str:
    """``unrecognised arguments: ...``, with the option meant by a mistyped one."""
    from elmo_jax.train.config_loader import did_you_mean

    hints = [did_you_mean(a.split("=", 1)[0], options, spell=str).strip() for a in extra if a.startswith("--")]
    hints = [h for h in hints if h]
    return f"unrecognised arguments: {' '.join(extra)}" + (" " + " ".join(hints) if hints else "")


def _stop_at_once(command: str):
    """``train``: a signal before the loop (data preparation, compilation), or a second one
    in it, ends the process at once with one line and status 130 / 143 (the loop saves on
    the first; see :mod:`elmo_jax.train.stop`).  Other commands: Ctrl-C as Python does, and
    SIGTERM likewise (their cleanup runs), then one line and 130 / 143."""
    from elmo_jax.train.stop import exit_on_signal, raise_on_signal

    if command != "train":
        return raise_on_signal(lambda name: f"elmo-jax {command}: stopped by {name}")

    return exit_on_signal(
        lambda name: (
            f"elmo-jax train: stopped by {name}; the checkpoints already written "
            f"are intact and the same command resumes from the latest"
        )
    )


def entry() -> None:
    """The ``elmo-jax`` program: :func:`main`'s status as the process's (a stopped run's
    130 / 143 without interpreter teardown, see :func:`elmo_jax.train.stop.exit_process`)."""
    from elmo_jax.train.stop import exit_process, stop_cleanly

    command = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    stop_cleanly(lambda name: f"elmo-jax{' ' + command if command else ''}: stopped by {name}")
    exit_process(main())


if __name__ == "__main__":
    entry()
