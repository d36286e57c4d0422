"""Pretraining end to end on tiny models: the reference smoke test, resume, interrupts, errors."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from elmo_jax.train.config_loader import TrainConfig
from elmo_jax.train.loop import TrainingError, train
from elmo_jax.train.stop import EXIT_STOPPED
from tests.conftest import train_steps_logged, wait_for

REPO = Path(__file__).resolve().parents[1]
MICRO = {
    "dim": 16,
    "projection_dim": 8,
    "embedding_dim": 4,
    "filters": [[1, 8], [2, 8], [3, 16]],
    "n_highway": 1,
    "max_characters_per_token": 12,
}


def _corpus(tmp_path, n=60, name="train.txt", seed=0):
    rng = np.random.default_rng(seed)
    words = ["the", "bank", "river", "money", "she", "went", "to", "a", "of", "银行", "取钱", "去"]
    lines = [" ".join(rng.choice(words, size=rng.integers(1, 9))) for _ in range(n)]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _cfg(tmp_path, **kw):
    base = dict(
        model="tiny",
        model_overrides=MICRO,
        data=_corpus(tmp_path),
        heldout=None,
        batch_size=4,
        unroll_steps=5,
        num_negatives=4,
        epochs=1,
        max_steps=6,
        log_every=1,
        checkpoint_every=3,
        dropout=0.1,
        data_dir=str(tmp_path / "tfds"),
    )
    base.update(kw)
    return TrainConfig(**base)


def _losses(workdir):
    rows = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8")]
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}


@pytest.mark.fidelity
def test_reference_smoke_test_perplexity_below_20(bilm_fixtures, tmp_path):
    """bilm-tf's own training test: its data, vocabulary and tiny config, held-out ppl < 20."""
    data = str(bilm_fixtures / "train" / "data.txt")
    workdir = tmp_path / "run"
    workdir.mkdir()
    # The trainer's test passes its own vocabulary file.
    (workdir / "vocab.txt").write_text(
        (bilm_fixtures / "train" / "vocab.txt").read_text(encoding="utf-8"), encoding="utf-8"
    )
    cfg = TrainConfig(
        model="tiny",
        model_overrides={
            "dim": 16,
            "projection_dim": 8,
            "embedding_dim": 4,
            "activation": "tanh",
            "filters": [[1, 8], [2, 8], [3, 16], [4, 32], [5, 64]],
            "n_highway": 1,
            "max_characters_per_token": 10,
            "n_layers": 2,
        },
        data=data,
        heldout=data,
        data_dir=str(tmp_path / "tfds"),
        batch_size=2,
        unroll_steps=10,
        num_negatives=16,
        epochs=50,
        clip_norm=1.0,
        dropout=0.1,
        log_every=50,
        checkpoint_every=10_000,
    )
    summary = train(cfg, str(workdir), progress=False)
    assert summary["eval"]["perplexity"] < 20, summary["eval"]


def test_train_writes_checkpoint_metrics_events_and_resumes_exactly(tmp_path):
    cfg = _cfg(tmp_path)
    full = tmp_path / "full"
    train(cfg, str(full), progress=False)
    assert (full / "checkpoints" / "6").is_dir() and (full / "checkpoints" / "3").is_dir()
    assert any(p.name.startswith("events.out.tfevents") for p in (full / "tensorboard").iterdir())
    assert (full / "vocab.txt").read_text(encoding="utf-8").split("\n")[:3] == ["<S>", "</S>", "<UNK>"]
    reference = _losses(full)
    assert sorted(reference) == [1, 2, 3, 4, 5, 6] and all(np.isfinite(list(reference.values())))

    part = tmp_path / "part"
    train(cfg.replace(max_steps=3), str(part), progress=False)
    summary = train(cfg, str(part), progress=False)  # resumes at step 3
    assert summary["start_step"] == 3
    resumed = _losses(part)
    for step in range(1, 7):
        assert resumed[step] == pytest.approx(reference[step], abs=1e-6), step


def test_resume_refuses_a_different_config(tmp_path):
    cfg = _cfg(tmp_path, max_steps=3)
    train(cfg, str(tmp_path / "run"), progress=False)
    with pytest.raises(TrainingError, match="unroll_steps: checkpoint has 5, this run has 6"):
        train(cfg.replace(unroll_steps=6), str(tmp_path / "run"), progress=False)


def test_nan_loss_stops_and_names_only_checkpoints_that_are_good(tmp_path):
    """The loss at step s comes from the parameters after step s - 1: a checkpoint written at
    that step already holds diverged parameters (here after one update at a huge rate, while
    the logged loss of step 1 was finite) and must not be called good."""
    cfg = _cfg(tmp_path, optimizer="adam", learning_rate=1e30, max_steps=12, checkpoint_every=1, log_every=1)
    with pytest.raises(
        TrainingError,
        match=r"the loss became nan at step 2; stopping without saving \(no good "
        r"checkpoint was written; \S+/checkpoints/1 already holds the diverged",
    ):
        train(cfg, str(tmp_path / "run"), progress=False)


def test_which_checkpoints_are_named_good_after_divergence():
    from elmo_jax.train.loop import _checkpoints_after_divergence

    def path(s):
        return f"ck/{s}"

    assert _checkpoints_after_divergence([2, 4, 6], 9, path) == "the last good checkpoint is ck/6"
    text = _checkpoints_after_divergence([4, 6, 7, 8], 8, path)
    assert text.startswith("the last good checkpoint is ck/6; ck/7, ck/8 already hold the diverged")
    assert _checkpoints_after_divergence([], 1, path) == "no good checkpoint was written"


def test_unwritable_workdir_and_empty_corpus(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(TrainingError, match="not writable"):
        train(_cfg(tmp_path), str(blocker / "run"), progress=False)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(Exception, match="empty"):
        train(_cfg(tmp_path, data=str(empty)), str(tmp_path / "run2"), progress=False)


@pytest.mark.parametrize("checkpoint_every", [100000, 1])  # 1: the signal lands on a checkpoint step
def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path, checkpoint_every):
    workdir = tmp_path / "run"
    corpus = _corpus(tmp_path, n=400)
    cmd = [
        sys.executable,
        str(REPO / "train.py"),
        "--workdir",
        str(workdir),
        "--no-progress",
        "--config.model_overrides.dim=16",
        "--config.model_overrides.projection_dim=8",
        "--config.model_overrides.filters=[[1,8],[2,8]]",
        f"--config.data={corpus}",
        f"--config.data_dir={tmp_path / 'tfds'}",
        "--config.batch_size=4",
        "--config.unroll_steps=5",
        "--config.epochs=1000",
        f"--config.checkpoint_every={checkpoint_every}",
        "--config.log_every=1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # The event: step 3 done (the run writes its train record; log_every=1), however long
    # start-up takes on a loaded machine.
    wait_for("step 3", lambda: max(train_steps_logged(workdir), default=0) >= 3, [proc])
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_STOPPED[signal.SIGTERM] == 143, out  # stopped, resumable: not 0
    assert "SIGTERM: saved" in out
    steps = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert steps and max(steps) >= 3


def test_signal_during_start_up_compilation_exits_130_with_one_line(tmp_path):
    """Ctrl-C while the run compiles its start-up programs (after the softmax line: the
    initialisation, then the step) ends it at once with status 130 and one line: no
    traceback, no 'Fatal Python error: Segmentation fault' (exit -11) as before."""
    workdir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-u",
        str(REPO / "train.py"),
        "--workdir",
        str(workdir),
        "--no-progress",
        "--config.model_overrides.dim=16",
        "--config.model_overrides.projection_dim=8",
        "--config.model_overrides.filters=[[1,8],[2,8]]",
        f"--config.data={_corpus(tmp_path, n=40)}",
        f"--config.data_dir={tmp_path / 'tfds'}",
        "--config.batch_size=4",
        "--config.unroll_steps=5",
        "--config.max_steps=50",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:  # the event: the loss is chosen, compilation starts next
            if "softmax" in line:
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_STOPPED[signal.SIGINT] == 130, err
    assert "Fatal Python error" not in err and "Traceback" not in err, err
    stop_lines = [l for l in err.splitlines() if "SIGINT" in l] + [l for l in out.splitlines() if "SIGINT" in l]
    assert len(stop_lines) == 1, (out, err)
    assert "the same command resumes" in stop_lines[0] or "saved" in stop_lines[0], (out, err)


def test_bf16_compute_trains_with_finite_loss_and_never_imports_tensorflow(tmp_path):
    summary = train(_cfg(tmp_path, compute_dtype="bfloat16", max_steps=3), str(tmp_path / "run"), progress=False)
    assert np.isfinite(summary["train"]["loss"])
    assert summary["params"]["bilm"]["lstm"][0]["w_x"].dtype == np.float32  # params stay f32
    assert "tensorflow" not in sys.modules


def test_global_batch_must_divide_over_devices(tmp_path):
    import jax

    if jax.device_count() != 1:
        pytest.skip("needs a single device: run it without XLA_FLAGS=--xla_force_host_platform_device_count")
    from elmo_jax.config import ConfigError

    cfg = _cfg(tmp_path)
    with pytest.raises(ConfigError, match="not divisible by the 3 devices"):
        cfg.global_batch_size(3)


def test_eval_command_reports_heldout_perplexity(tmp_path, capsys):
    from elmo_jax.cli import main

    cfg = _cfg(tmp_path, max_steps=3, heldout=_corpus(tmp_path, n=60, name="heldout.txt", seed=1))
    summary = train(cfg, str(tmp_path / "run"), progress=False)
    assert main(["eval", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "step 3: perplexity" in out
    reported = float(out.split("perplexity ")[1].split()[0])
    assert reported == pytest.approx(summary["eval"]["perplexity"], abs=0.006)  # printed rounded
    assert main(["eval", str(tmp_path / "nowhere")]) == 2
    # The held-out data was prepared in the run's data_dir, and eval reads it from there.
    assert not (tmp_path / "run" / "tfds").exists()
    # eval_max_batches caps each evaluation at its first batches (32 rows x unroll_steps), and
    # may change on resume.
    capped = train(cfg.replace(max_steps=4, eval_max_batches=1), str(tmp_path / "run"), progress=False)
    assert capped["start_step"] == 3
    assert 0 < capped["eval"]["tokens"] <= 32 * cfg.unroll_steps < summary["eval"]["tokens"]
    # The CLI caps the run's own held-out set as the latest start did (from the checkpoint,
    # config.json still holds the first start's None), in positions whatever --batch-size.
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--batch-size", "1"]) == 0
    scored = int(capsys.readouterr().out.split(" over ")[1].split()[0])
    assert cfg.unroll_steps < scored <= 32 * cfg.unroll_steps < summary["eval"]["tokens"]
    assert main(["eval", str(tmp_path / "run"), "--max-batches", "0"]) == 2  # not a perplexity of 1.0
    assert "max_batches must be >= 1" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    code = main(["eval", str(tmp_path / "run"), "--data", str(empty)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err


def test_derived_files_from_an_earlier_start_follow_the_config(tmp_path, capsys):
    """A start that stopped before its first checkpoint leaves vocab.txt (and the synthetic
    corpus); a new start with other data or sizes must rebuild them, while a vocab.txt the
    user put in the workdir is used as given."""
    import shutil

    from elmo_jax.data.vocab import Vocabulary

    run = tmp_path / "run"
    train(_cfg(tmp_path, max_steps=1, vocab_size=8), str(run), progress=False)
    shutil.rmtree(run / "checkpoints")  # as if stopped before the first checkpoint
    other = _corpus(tmp_path, n=40, name="other.txt", seed=3).replace(".txt", "")  # new words below
    Path(other + ".txt").write_text("zebra yak xylophone zebra yak\nyak zebra\n" * 20, encoding="utf-8")
    train(_cfg(tmp_path, max_steps=1, vocab_size=8, data=other + ".txt"), str(run), progress=False)
    assert "rebuilding:" in capsys.readouterr().out
    assert {"zebra", "yak", "xylophone"} <= set(Vocabulary.load(run / "vocab.txt").tokens)
    # The same path with other contents counts as other data too.
    shutil.rmtree(run / "checkpoints")
    Path(other + ".txt").write_text("walrus vole\nvole walrus walrus\n" * 20, encoding="utf-8")
    train(_cfg(tmp_path, max_steps=1, vocab_size=8, data=other + ".txt"), str(run), progress=False)
    assert {"walrus", "vole"} <= set(Vocabulary.load(run / "vocab.txt").tokens)
    # With a checkpoint, other data is refused by the config check before anything is rebuilt.
    with pytest.raises(TrainingError, match="data: checkpoint has"):
        train(_cfg(tmp_path, max_steps=1, vocab_size=8), str(run), progress=False)
    # The synthetic corpus likewise follows corpus_size.
    syn = tmp_path / "syn"
    small = dict(data="synthetic", heldout=None, vocab_size=50, max_steps=1)
    train(_cfg(tmp_path, corpus_size=120, **small), str(syn), progress=False)
    shutil.rmtree(syn / "checkpoints")
    train(_cfg(tmp_path, corpus_size=150, **small), str(syn), progress=False)
    assert json.loads((syn / "corpus" / "stats.json").read_text())["n_train_sentences"] == 150
    # A damaged vocab_source.json is named, with the two ways out.
    (run / "vocab_source.json").write_text("{trunc", encoding="utf-8")
    with pytest.raises(TrainingError, match="vocab_source.json is unreadable .*delete it to use"):
        train(_cfg(tmp_path, max_steps=1, vocab_size=8, data=other + ".txt"), str(tmp_path / "run"), progress=False)
    # A user's own vocabulary (no vocab_source.json) is kept as it is.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nthe\nbank\n", encoding="utf-8")
    capsys.readouterr()
    train(_cfg(tmp_path, max_steps=1), str(mine), progress=False)
    assert "as given" in capsys.readouterr().out
    assert (mine / "vocab.txt").read_text(encoding="utf-8") == "<S>\n</S>\n<UNK>\nthe\nbank\n"


def test_export_refuses_to_replace_the_workdir(tmp_path):
    from elmo_jax.errors import ElmoError
    from elmo_jax.formats.training_run import export

    run = tmp_path / "runs" / "a"
    train(_cfg(tmp_path, max_steps=3), str(run), progress=False)
    for out in (run, tmp_path / "runs"):
        with pytest.raises(ElmoError, match="is or contains the training workdir"):
            export(run, out, overwrite=True)
    assert (run / "checkpoints" / "3").is_dir()
    assert export(run, run / "exported")["step"] == 3  # a folder inside the run is fine


def test_resume_across_batch_spellings_data_changes_and_metrics_once(tmp_path):
    """batch_size_per_device -> batch_size with the same global batch resumes; training data
    that changed under the same path is named; steps lost with a checkpoint appear once in
    metrics.jsonl after the run is resumed from an earlier checkpoint."""
    import shutil

    cfg = _cfg(tmp_path, max_steps=3, batch_size_per_device=4)
    run = tmp_path / "run"
    train(cfg, str(run), progress=False)
    summary = train(cfg.replace(batch_size=4, batch_size_per_device=None, max_steps=6), str(run), progress=False)
    assert summary["start_step"] == 3 and summary["step"] == 6
    shutil.rmtree(run / "checkpoints" / "6")  # the last part of the run is lost
    train(cfg.replace(max_steps=6), str(run), progress=False)
    records = [json.loads(l) for l in open(run / "metrics.jsonl", encoding="utf-8")]
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]
    # Same number of sentences, other words: caught by the content, not the count.
    lines = Path(cfg.data).read_text(encoding="utf-8").splitlines()
    Path(cfg.data).write_text("\n".join(["zebra yak"] + lines[1:]) + "\n", encoding="utf-8")
    with pytest.raises(TrainingError, match="training data changed since .*checkpoints/6 was written"):
        train(cfg.replace(max_steps=9), str(run), progress=False)


def test_lm1b_is_read_from_the_tfds_folder_and_text_is_prepared_beside_the_run(tmp_path, monkeypatch):
    """Unless data_dir is set: TFDS lm1b where ``tfds build`` put it (TFDS's own folder,
    data_dir None), local text in WORKDIR/tfds; eval resolves it the same way."""
    from elmo_jax.train import loop

    seen = []

    class Stop(Exception):
        pass

    def fake_make_source(spec, split, data_dir, **kw):
        seen.append((spec, split, data_dir))
        raise Stop

    monkeypatch.setattr(loop, "make_source", fake_make_source)
    with pytest.raises(Stop):
        train(_cfg(tmp_path, data="lm1b", data_dir=None), str(tmp_path / "run"), progress=False)
    with pytest.raises(Stop):
        train(_cfg(tmp_path, data_dir=None), str(tmp_path / "run2"), progress=False)
    assert seen[0] == ("lm1b", "train", None)
    assert seen[1][2] == str(tmp_path / "run2" / "tfds")
    assert loop.data_dir_for("lm1b", str(tmp_path / "mine"), "w") == str(tmp_path / "mine")


def test_metrics_windows_survive_checkpoints_and_a_finished_run_can_start_again(tmp_path):
    """A checkpoint between two log lines used to drop the steps before it from the next
    train record; starting a finished run again crashed (pmap) or logged its eval twice."""
    heldout = _corpus(tmp_path, n=20, name="heldout.txt", seed=1)
    every = _cfg(tmp_path, max_steps=8, log_every=1, checkpoint_every=100, heldout=heldout)
    train(every, str(tmp_path / "every"), progress=False)
    per_step = _losses(tmp_path / "every")
    for ckpt in (100, 3):
        workdir = tmp_path / f"ckpt{ckpt}"
        cfg = every.replace(log_every=4, checkpoint_every=ckpt)
        train(cfg, str(workdir), progress=False)
        logged = _losses(workdir)
        assert sorted(logged) == [4, 8]
        for end in (4, 8):  # the mean over the 4 steps of each window
            assert logged[end] == pytest.approx(np.mean([per_step[s] for s in range(end - 3, end + 1)]), abs=1e-5)
    summary = train(cfg, str(workdir), progress=False)  # already complete: evaluates, trains nothing
    assert summary["start_step"] == summary["step"] == 8 and np.isfinite(summary["eval"]["perplexity"])
    kinds = [(r["step"], r["kind"]) for r in map(json.loads, open(workdir / "metrics.jsonl", encoding="utf-8"))]
    assert kinds.count((8, "eval")) == 1 and kinds.count((8, "train")) == 1


def test_a_stop_signal_during_the_final_evaluation_is_obeyed(tmp_path, monkeypatch):
    from elmo_jax.train import loop

    real = loop.evaluate

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # arrives while the held-out set is being scored
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", signalled)
    cfg = _cfg(tmp_path, max_steps=3, heldout=_corpus(tmp_path, n=20, name="heldout.txt", seed=1))
    summary = train(cfg, str(tmp_path / "run"), progress=False)
    assert summary["interrupted"] == "SIGINT" and "eval" in summary and summary["eval"] is None
    assert (tmp_path / "run" / "checkpoints" / "3").is_dir()


def test_report_uses_the_optimum_of_the_models_vocabulary(tmp_path):
    from elmo_jax import Elmo
    from elmo_jax.data import synthetic_corpus
    from elmo_jax.train.report import synthetic_report

    synthetic_corpus.write_corpus(tmp_path / "corpus", n_train=400)
    train_words = sorted({w for s in synthetic_corpus.load_corpus(tmp_path / "corpus", "train")[0] for w in s})
    elmo = Elmo.random("tiny", seed=0)
    ev = {"perplexity": 50.0, "fwd_perplexity": 50.0, "bwd_perplexity": 50.0}

    def report(vocab):
        return synthetic_report(
            str(tmp_path / "corpus"),
            elmo.params,
            elmo.config,
            ev,
            max_sentences=20,
            max_probe_train=20,
            vocab=vocab,
            progress=False,
        )

    full = report(["<S>", "</S>", "<UNK>", *train_words])
    cut = report(["<S>", "</S>", "<UNK>", *train_words[:10]])
    optimum = {text: float(text.split("generator's optimum")[1].split()[0]) for text in (full, cut)}
    assert "bigram baseline" in full and "not comparable" in cut and "bigram baseline" not in cut
    assert optimum[cut] < optimum[full]  # more targets are one <UNK> event: easier


def test_synthetic_data_refuses_another_heldout_set_for_a_new_run(tmp_path):
    cfg = TrainConfig(
        model="tiny",
        model_overrides=MICRO,
        corpus_size=50,
        heldout=_corpus(tmp_path),
        max_steps=1,
        batch_size=2,
        unroll_steps=5,
        num_negatives=4,
    )
    with pytest.raises(TrainingError, match="heldout cannot be set with it"):
        train(cfg, str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run" / "corpus").exists()  # refused before anything is written


def test_a_short_run_pays_only_short_probes(monkeypatch):
    """`--config.max_steps=5` on the embedded corpus: the report's probes embed about as many
    sentences as the run trained on (seconds), not the full 2,000 + 13,381 (minutes); a
    complete tiny run (2,670 steps x 32 rows) keeps the full probes."""
    import argparse

    from elmo_jax import cli
    from elmo_jax.train import loop, report

    assert report.probe_sizes(5 * 32) == {"max_sentences": 200, "max_probe_train": 200}
    assert report.probe_sizes(1000) == {"max_sentences": 1000, "max_probe_train": 1000}
    assert report.probe_sizes(2670 * 32) == {
        "max_sentences": report.PROBE_TEST_SENTENCES,
        "max_probe_train": report.PROBE_TRAIN_SENTENCES,
    }
    asked = {}
    monkeypatch.setattr(
        loop,
        "train",
        lambda cfg, workdir, **k: {
            "step": 5,
            "start_step": 0,
            "global_batch": 32,
            "interrupted": None,
            "corpus_dir": "corpus",
            "params": {"bilm": None},
            "model_config": None,
            "eval": None,
            "vocab": argparse.Namespace(tokens=[]),
        },
    )
    monkeypatch.setattr(report, "synthetic_report", lambda *a, **k: asked.update(k) or "report")
    args = argparse.Namespace(workdir="unused", no_progress=True)
    assert cli._train_run(args, TrainConfig(max_steps=5)) == 0
    assert asked["max_sentences"] == asked["max_probe_train"] == 200


def test_progress_bar_starts_after_the_compiling_step():
    """No ETA is computed from the first step, which compiles: the bar appears once it has run."""
    import io

    from elmo_jax.train.metrics import StepBar

    out = io.StringIO()
    bar = StepBar(2670, enabled=True, file=out)
    assert out.getvalue() == "" and bar.bar is None  # compiling: no bar, no ETA
    bar.update(1)
    first = out.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    assert "1/2670" in first and "<?" in first, first  # no rate yet, so no ETA
    bar.update(2)
    assert bar.bar.n == 2
    bar.close()
    silent = StepBar(10, enabled=False, file=out)
    silent.update(1)
    assert silent.bar is None
