"""What elmo-jax survives: faults and misuse that must neither lose the user's data nor end
in a traceback.  One test per fault, grouped by kind; each
injects the fault itself (a path that names the input twice, a truncated file, a stop
signal, a restrictive umask, a bad argument) and checks what the user gets."""

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import pytest

from elmo_jax import Elmo
from elmo_jax.cli import main
from elmo_jax.config import ElmoConfig
from elmo_jax.embedding.embed_file import embed_file
from elmo_jax.errors import ElmoError
from elmo_jax.formats.hdf5 import WeightFileError, datasets_to_params, expected_shapes

from tests.conftest import REPO, unmount

# A model that compiles in a second or two; 16 chars per token, so at most 14 bytes of a word.
MICRO = {
    "dim": 16,
    "projection_dim": 8,
    "embedding_dim": 4,
    "filters": [[1, 8], [2, 8], [3, 16]],
    "n_highway": 1,
    "max_characters_per_token": 16,
}


@pytest.fixture(scope="module")
def elmo():
    """Random weights made with numpy (JAX's initialisers compile op by op: seconds)."""
    config = ElmoConfig.preset("tiny").replace(**MICRO)
    rng = np.random.default_rng(3)
    datasets = {name: rng.normal(0, 0.3, shape).astype(np.float32) for name, shape in expected_shapes(config).items()}
    return Elmo(config, datasets_to_params(datasets, config))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, elmo):
    d = tmp_path_factory.mktemp("model")
    elmo.save(d)
    return d


def _text(path, lines=("the bank of the river", "a b")):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# ==========================================================================================
# 1. Nothing is ever written over an input of the same command, whatever the flags.
# ==========================================================================================


@pytest.mark.parametrize("spelling", ["same path", "./x and x", "symlink", "hard link"])
def test_embed_never_writes_over_its_input(tmp_path, model_dir, capsys, monkeypatch, spelling):
    """`elmo-jax embed X X --overwrite` (however X is spelled) refuses and leaves X as it was."""
    src = _text(tmp_path / "in.txt")
    before = src.read_bytes()
    monkeypatch.chdir(tmp_path)
    out = {"same path": "in.txt", "./x and x": "./in.txt", "symlink": "link.txt", "hard link": "hard.txt"}[spelling]
    if spelling == "symlink":
        os.symlink(src, tmp_path / "link.txt")
    if spelling == "hard link":
        os.link(src, tmp_path / "hard.txt")
    assert main(["embed", "in.txt", out, "--all", "--overwrite", "--model", str(model_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "is the input" in err and "Traceback" not in err
    assert src.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("name", ["weights.hdf5", "options.json"])
def test_embed_never_writes_over_the_model_it_reads(tmp_path, model_dir, capsys, name):
    """`elmo-jax embed in.txt MODEL/weights.hdf5 --model MODEL --overwrite` refuses; the model still loads."""
    src = _text(tmp_path / "in.txt")
    before = _snapshot(model_dir)
    assert (
        main(
            [
                "embed",
                str(src),
                str(model_dir / name),
                "--top",
                "--overwrite",
                "--model",
                str(model_dir),
                "--no-progress",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"is the model's {'weight' if name.startswith('weights') else 'options'} file" in err
    assert _snapshot(model_dir) == before


def test_token_cache_never_replaces_the_model_files(model_dir):
    """`elmo.save_token_cache(MODEL/weights.hdf5)` on a model loaded from MODEL refuses."""
    loaded = Elmo.load(model_dir)
    loaded.cache_vocabulary(["the", "bank"])
    before = _snapshot(model_dir)
    with pytest.raises(ElmoError, match="weight file"):
        loaded.save_token_cache(model_dir / "weights.hdf5")
    assert _snapshot(model_dir) == before


# ==========================================================================================
# 2-5. Training under faults: a diverging loss, two runs on one workdir, a damaged newest
#      checkpoint, a full disk during a checkpoint; and failed starts leave nothing behind.
# ==========================================================================================


def _train_cfg(tmp_path, **kw):
    from tests.test_train import _cfg

    return _cfg(tmp_path, **kw)


def _train_losses(workdir):
    from tests.test_train import _losses

    return _losses(workdir)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """Six uninterrupted steps (checkpoints at 3 and 6): the losses every recovery must match."""
    from elmo_jax.train.loop import train

    tmp = tmp_path_factory.mktemp("reference")
    cfg = _train_cfg(tmp)
    train(cfg, str(tmp / "run"), progress=False)
    return cfg, tmp / "run", _train_losses(tmp / "run")


def _copy_run(reference_run, tmp_path, max_steps):
    """The reference run's checkpoints up to ``max_steps`` in a new workdir (same data)."""
    import shutil

    cfg, run, _ = reference_run
    work = tmp_path / "run"
    shutil.copytree(run, work)
    for p in (work / "checkpoints").iterdir():
        if p.name.isdigit() and int(p.name) > max_steps:
            shutil.rmtree(p)
    return cfg, work


def test_a_finite_loss_of_1e6_stops_the_run_and_names_the_step(tmp_path, monkeypatch):
    """2. A loss of 1e6 (finite, but exp overflows) is divergence: stop, name the step, save nothing."""
    import elmo_jax.train.loop as loop
    from elmo_jax.train.loop import TrainingError

    real = loop.make_loss_fn

    def exploded(vocab_size, num_negatives):
        selection = real(vocab_size, num_negatives)
        return selection._replace(fn=lambda *a, **k: selection.fn(*a, **k) + 1e6)

    monkeypatch.setattr(loop, "make_loss_fn", exploded)
    cfg = _train_cfg(tmp_path, num_negatives=64)  # the full softmax here: the log line has a perplexity
    with pytest.raises(
        TrainingError,
        match=r"the loss became 1000\d{3}(\.\d+)? at step 1 \(far above 18\.1 "
        r".*no good checkpoint was written",
    ):
        loop.train(cfg, str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing saved (and no empty folder left)


def test_a_heldout_loss_too_large_for_exp_is_an_infinite_perplexity():
    """2. evaluate() reports a perplexity of inf, not an OverflowError, for a held-out loss of 1e6."""
    from elmo_jax.data.text_source import InMemorySource
    from elmo_jax.data.vocab import Vocabulary
    from elmo_jax.train.evaluation import evaluate
    from elmo_jax.train.losses import perplexity

    def huge(params, state, batch):
        n = float(np.sum(batch["fwd_mask"]))
        return state, {"fwd_loss_sum": 1e6 * n, "fwd_count": n, "bwd_loss_sum": 2.0 * n, "bwd_count": n}

    config = ElmoConfig.preset("tiny").replace(**MICRO)
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", "a", "b", "c"])
    out = evaluate({}, config, InMemorySource(["a b c", "b c a a"]), vocab, batch_size=2, unroll_steps=4, eval_fn=huge)
    assert out["perplexity"] == out["fwd_perplexity"] == float("inf")
    assert out["bwd_perplexity"] == pytest.approx(np.exp(2.0))
    assert perplexity(1e6) == float("inf") and perplexity(1.0) == pytest.approx(np.e)


def test_a_second_run_on_a_busy_workdir_is_refused_naming_the_holder(reference_run, tmp_path):
    """3. While a training process runs in a workdir, a second start is refused with its pid and host;
    export can read meanwhile; once the first is killed (-9), the lock is gone and the run resumes."""
    import socket

    from elmo_jax.formats.training_run import export
    from elmo_jax.train.loop import train
    from elmo_jax.train.workdir import WorkdirBusyError

    cfg, work = _copy_run(reference_run, tmp_path, max_steps=3)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom elmo_jax.train.workdir import hold_workdir\n"
            "with hold_workdir(sys.argv[1], True):\n    print('held', flush=True); time.sleep(120)",
            str(work),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            WorkdirBusyError,
            match=rf"in use by another training run: pid {holder.pid} on host "
            rf"{socket.gethostname()}",
        ):
            train(cfg, str(work), progress=False)
        assert export(work, tmp_path / "exported")["step"] == 3  # readers are not blocked
    finally:
        holder.kill()  # SIGKILL: the kernel releases the lock
        holder.wait()
    summary = train(cfg, str(work), progress=False)
    assert summary["start_step"] == 3
    reference = reference_run[2]
    assert [_train_losses(work)[s] for s in (4, 5, 6)] == pytest.approx([reference[s] for s in (4, 5, 6)], abs=1e-6)


def test_two_real_training_processes_on_one_workdir(tmp_path):
    """3. Two `train` commands on one workdir: the second exits at once with one error line naming the first."""
    from tests.test_train import _corpus

    work = tmp_path / "run"
    args = [
        sys.executable,
        str(REPO / "train.py"),
        "--workdir",
        str(work),
        "--no-progress",
        "--config.model_overrides.dim=16",
        "--config.model_overrides.projection_dim=8",
        "--config.model_overrides.filters=[[1,8],[2,8]]",
        f"--config.data={_corpus(tmp_path, n=400)}",
        f"--config.data_dir={tmp_path / 'tfds'}",
        "--config.batch_size=4",
        "--config.unroll_steps=5",
        "--config.epochs=1000",
        "--config.log_every=1",
    ]
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in first.stdout:  # until it trains
            if line.startswith("training "):
                break
        second = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stderr
        errors = [l for l in second.stderr.splitlines() if "error" in l]
        assert len(errors) == 1 and f"pid {first.pid}" in errors[0] and "Traceback" not in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    import json

    steps = [json.loads(line)["step"] for line in (work / "metrics.jsonl").read_text().splitlines()]
    assert steps and len(steps) == len(set(steps))  # no step logged twice


def _truncate_data_files(checkpoint, keep):
    """Cut every array data file of ``checkpoint`` to ``keep`` of its size (at least 10 bytes
    go: which arrays a single file holds is orbax's business, so all of them are cut)."""
    files = [p for p in (checkpoint / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    assert files
    for data in files:
        os.truncate(data, max(0, min(int(data.stat().st_size * keep), data.stat().st_size - 10)))


@pytest.mark.parametrize("damage", ["truncated data file", "deleted metadata file"])
def test_a_damaged_newest_checkpoint_is_skipped_moved_aside_and_resume_is_exact(reference_run, tmp_path, damage):
    """4. A truncated / incomplete newest checkpoint: resume from the one before, say so, keep the damaged one."""
    from elmo_jax.train.loop import train

    cfg, work = _copy_run(reference_run, tmp_path, max_steps=6)
    newest = work / "checkpoints" / "6"
    if damage == "truncated data file":
        _truncate_data_files(newest, keep=0.5)
    else:
        (newest / "meta" / "metadata").unlink()
    lines = []
    summary = train(cfg.replace(max_steps=9), str(work), progress=False, log=lines.append)
    assert summary["start_step"] == 3
    skipped = [l for l in lines if l.startswith("skipping checkpoint")]
    assert len(skipped) == 1 and "checkpoints/6: it is damaged" in skipped[0] and "checkpoints-damaged/6" in skipped[0]
    assert (work / "checkpoints-damaged" / "6" / "state").is_dir()  # moved aside, never deleted
    assert [_train_losses(work)[s] for s in (4, 5, 6)] == pytest.approx(
        [reference_run[2][s] for s in (4, 5, 6)], abs=1e-6
    )


def test_export_and_eval_name_a_damaged_checkpoint_as_damaged(reference_run, tmp_path, capsys):
    """4. export / eval of a truncated checkpoint: "damaged", and the other steps to pick from."""
    cfg, work = _copy_run(reference_run, tmp_path, max_steps=6)
    _truncate_data_files(work / "checkpoints" / "6", keep=0.0)
    for argv in (["export", str(work), str(tmp_path / "out")], ["eval", str(work), "--data", cfg.data]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "checkpoints/6 is damaged" in err and "steps 3: pick one with --step" in err, err
        assert "does not fit" not in err and "Traceback" not in err
    assert main(["export", str(work), str(tmp_path / "out"), "--step", "3"]) == 0


def test_export_of_a_damaged_checkpoint_prints_its_one_line_and_nothing_else(reference_run, tmp_path):
    """No orbax warnings about the damage probe, no "Event loop is closed" echoes of the
    failed reads (tensorstore's reads that finish after orbax closed its loop) around the line."""
    cfg, work = _copy_run(reference_run, tmp_path, max_steps=6)
    _truncate_data_files(work / "checkpoints" / "6", keep=0.5)
    out = subprocess.run(
        [sys.executable, "-m", "elmo_jax.cli", "export", str(work), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert out.returncode == 2
    assert len(out.stderr.splitlines()) == 1 and "checkpoints/6 is damaged" in out.stderr, out.stderr


def test_a_step_that_does_not_exist_is_named_missing_with_the_steps_there(reference_run, tmp_path, capsys):
    """`--step 5` where only 3 and 6 exist: not "damaged", the steps to pick from."""
    cfg, work = _copy_run(reference_run, tmp_path, max_steps=6)
    for argv in (
        ["export", str(work), str(tmp_path / "out"), "--step", "5"],
        ["eval", str(work), "--data", cfg.data, "--step", "5"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "there is no checkpoint of step 5" in err and "the steps there are 3, 6" in err, err
        assert "damaged" not in err and len(err.splitlines()) == 1


def test_a_cut_vocabulary_is_named_not_blamed_on_the_layout(reference_run, tmp_path, capsys):
    """A vocab.txt cut after training: the file and the fix, not orbax's shapes and strict=False."""
    from elmo_jax.train.checkpoints import CheckpointError
    from elmo_jax.train.loop import train

    cfg, work = _copy_run(reference_run, tmp_path, max_steps=6)
    vocab = work / "vocab.txt"
    words = vocab.read_text(encoding="utf-8").splitlines(keepends=True)
    vocab.write_text("".join(words[: len(words) // 2]), encoding="utf-8")
    assert main(["export", str(work), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{vocab} holds {len(words) // 2} words but checkpoint" in err and f"trained with {len(words)}" in err
    assert "strict" not in err and "layout" not in err
    with pytest.raises(CheckpointError, match=r"vocab\.txt holds \d+ words but checkpoint .* was trained with"):
        train(cfg.replace(max_steps=9), str(work), progress=False, log=lambda msg: None)
    assert (work / "checkpoints" / "6").is_dir()  # not taken for damage: nothing moved aside


def test_a_checkpoint_holding_nan_is_refused_by_export_naming_the_weight(reference_run, tmp_path, capsys):
    """NaN weights embedded to NaN without a word; export names the weight and the way out."""
    import jax
    import orbax.checkpoint as ocp

    from elmo_jax.train.checkpoints import Checkpoints

    cfg, work = _copy_run(reference_run, tmp_path, max_steps=6)
    ckpts = Checkpoints(work)
    try:
        state_dir = ckpts.path(6) + "/state"
        with ocp.StandardCheckpointer() as reader:  # the arrays with their recorded shapes
            tree = reader.metadata(state_dir)
            tree = getattr(tree, "item_metadata", tree)
            state = reader.restore(
                state_dir,
                jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), tree, is_leaf=lambda x: hasattr(x, "shape")),
            )
        state = jax.tree.map(np.array, state)
        state[0]["params"]["bilm"]["lstm"][0]["b"][0, 1] = np.nan
        ckpts.save(7, state, {**ckpts.read_meta(6), "step": 7})
    finally:
        ckpts.close()
    assert main(["export", str(work), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert (
        f"checkpoint {work / 'checkpoints' / '7'}: weight 'RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/B' holds 1 NaN" in err
    )
    assert not (tmp_path / "out").exists()


def _read_only(folder):
    """Make ``folder`` read-only for this process (a read-only bind mount for root, whom
    permissions do not stop); returns the undo, or None where neither is possible."""
    if os.geteuid() != 0:
        os.chmod(folder, 0o555)
        return lambda: os.chmod(folder, 0o755)
    for args in (["mount", "--bind", str(folder), str(folder)], ["mount", "-o", "remount,ro,bind", str(folder)]):
        if subprocess.run(args, capture_output=True).returncode != 0:
            subprocess.run(["umount", str(folder)], capture_output=True)
            return None
    return lambda: subprocess.run(["umount", str(folder)], capture_output=True)


def test_eval_of_a_read_only_workdir_needs_no_write_there(reference_run, tmp_path, capsys):
    """`eval RUN --data X` prepared X in RUN/tfds and failed with a raw [Errno 30] on a
    read-only RUN: it prepares X in a temporary folder instead and says so; a read-only
    --data-dir is one line naming it."""
    import json

    cfg, work = _copy_run(reference_run, tmp_path, max_steps=6)
    config = json.loads((work / "config.json").read_text())
    (work / "config.json").write_text(json.dumps({**config, "data_dir": None}))  # text beside the run
    heldout = _text(tmp_path / "heldout.txt")
    undo = _read_only(work)
    if undo is None:
        pytest.skip("cannot make a folder read-only here")
    try:
        assert main(["eval", str(work), "--data", str(heldout)]) == 0
        captured = capsys.readouterr()
        assert "perplexity" in captured.out
        assert f"{work / 'tfds'} cannot be written" in captured.err and "temporary folder" in captured.err
        assert main(["eval", str(work), "--data", str(heldout), "--data-dir", str(work / "tfds")]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and f"--data-dir {work / 'tfds'} cannot be written" in err, err
    finally:
        undo()
    assert not (work / "tfds").exists()


def _fill_disk(monkeypatch):
    """orbax's writer fails as a full disk makes it fail: a half-written temporary folder,
    then an error wrapping ENOSPC."""
    import errno

    import orbax.checkpoint as ocp

    def full(self, step, *args, **kwargs):
        os.makedirs(os.path.join(str(self.directory), f"{step}.orbax-checkpoint-tmp", "state"))
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as cause:
            raise ValueError("RESOURCE_EXHAUSTED: Error writing local file") from cause

    monkeypatch.setattr(ocp.CheckpointManager, "save", full)


def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_previous_one_resumes(
    reference_run, tmp_path, monkeypatch, capfd
):
    """5. ENOSPC while saving: one line (disk full, the space a checkpoint needs, the intact previous
    checkpoint), no temporary folder left; after space is freed the run resumes exactly."""
    from elmo_jax.train.checkpoints import DiskFullError
    from elmo_jax.train.loop import train

    cfg, work = _copy_run(reference_run, tmp_path, max_steps=3)
    capfd.readouterr()
    with monkeypatch.context() as patch, pytest.raises(DiskFullError) as raised:
        _fill_disk(patch)
        train(cfg, str(work), progress=False, log=lambda msg: None)
    message = str(raised.value)
    assert "\n" not in message and "Traceback" not in capfd.readouterr().err
    assert message.startswith("disk full: checkpoint 6 could not be written") and "MiB" in message
    assert f"the previous checkpoint {work / 'checkpoints' / '3'} is intact" in message
    assert not [p for p in (work / "checkpoints").iterdir() if p.name.endswith("-tmp")]
    summary = train(cfg, str(work), progress=False)
    assert summary["start_step"] == 3
    assert [_train_losses(work)[s] for s in (4, 5, 6)] == pytest.approx(
        [reference_run[2][s] for s in (4, 5, 6)], abs=1e-6
    )


def test_a_killed_saves_temporary_folder_is_removed_at_the_next_start(reference_run, tmp_path):
    """5. What a save killed mid-write left (orbax's temporary folder) is gone after the next start."""
    from elmo_jax.train.loop import train

    cfg, work = _copy_run(reference_run, tmp_path, max_steps=3)
    (work / "checkpoints" / "5.orbax-checkpoint-tmp" / "state").mkdir(parents=True)
    assert train(cfg.replace(max_steps=4), str(work), progress=False)["start_step"] == 3
    assert sorted(p.name for p in (work / "checkpoints").iterdir()) == ["3", "4"]


def test_a_failed_saves_late_write_does_not_leave_its_temporary_folder(reference_run, tmp_path, monkeypatch):
    """5. When one write of a save fails, the storage layer's other writes of that save may still
    be in flight and make its folder again after the error removed it (seen once on a real full
    disk): the folder is looked for again until none comes back."""
    import errno
    import threading

    import orbax.checkpoint as ocp

    from elmo_jax.train.checkpoints import DiskFullError
    from elmo_jax.train.loop import train

    late_writes = []

    def full(self, step, *args, **kwargs):
        folder = os.path.join(str(self.directory), f"{step}.orbax-checkpoint-tmp")
        os.makedirs(os.path.join(folder, "state"))

        def late_write():  # another shard of the same save, landing after the error's tidying
            deadline = time.monotonic() + 30
            while os.path.exists(folder) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.05)
            os.makedirs(os.path.join(folder, "state", "d"), exist_ok=True)

        late_writes.append(threading.Thread(target=late_write))
        late_writes[-1].start()
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as cause:
            raise ValueError("RESOURCE_EXHAUSTED: Error writing local file") from cause

    cfg, work = _copy_run(reference_run, tmp_path, max_steps=3)
    with monkeypatch.context() as patch, pytest.raises(DiskFullError, match="disk full: checkpoint 6 "):
        patch.setattr(ocp.CheckpointManager, "save", full)
        train(cfg, str(work), progress=False, log=lambda msg: None)
    for thread in late_writes:
        thread.join()
    assert sorted(p.name for p in (work / "checkpoints").iterdir()) == ["3"]


def test_a_real_full_disk_on_a_small_tmpfs(reference_run, tmp_path):
    """5. The same on a real 1 MiB tmpfs (needs permission to mount one; skipped otherwise)."""
    import shutil

    from elmo_jax.train.checkpoints import DiskFullError
    from elmo_jax.train.loop import train

    mnt = tmp_path / "small"
    mnt.mkdir()
    if (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mnt)], capture_output=True).returncode
        != 0
    ):
        pytest.skip(
            "needs permission to mount a small tmpfs (root, in a container allowed to mount): run the "
            "tests as root to include it; the monkeypatched writer test covers the same logic"
        )
    try:
        cfg, run, _ = reference_run
        shutil.copytree(run, mnt / "run", ignore=shutil.ignore_patterns("tensorboard", "6"))
        with pytest.raises(
            DiskFullError,
            match=r"disk full: checkpoint \d+ could not be written .* the previous "
            r"checkpoint \S+/checkpoints/\d+ is intact",
        ):
            train(cfg.replace(max_steps=60, checkpoint_every=3), str(mnt / "run"), progress=False)
        assert not [p for p in (mnt / "run" / "checkpoints").iterdir() if p.name.endswith("-tmp")]
    finally:
        unmount(mnt)


def test_a_workdir_that_is_a_file_is_named_and_a_failed_start_leaves_no_skeleton(tmp_path):
    """7. A regular file as workdir is named as such; a start that fails leaves no empty folders."""
    from elmo_jax.train.loop import TrainingError, train

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(TrainingError, match="is a file, not a folder"):
        train(_train_cfg(tmp_path), str(blocker), progress=False)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(Exception, match="empty"):
        train(_train_cfg(tmp_path, data=str(empty), data_dir=None), str(tmp_path / "new"), progress=False)
    assert not (tmp_path / "new").exists()  # no checkpoints/ or tfds/ skeleton, no folder at all
    existing = tmp_path / "existing"
    (existing / "mine").mkdir(parents=True)
    with pytest.raises(Exception, match="empty"):
        train(_train_cfg(tmp_path, data=str(empty), data_dir=None), str(existing), progress=False)
    assert sorted(p.name for p in existing.iterdir()) == ["mine", "run.lock"]


# ==========================================================================================
# 6. The examples stop when the user stops them, and clean up after themselves.
# ==========================================================================================


def _finetune_example():
    spec = importlib.util.spec_from_file_location("finetune_heads_faults", REPO / "examples" / "finetune_heads.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Unhandled(Exception):
    """Raised by the test's own SIGTERM handler: the script under test did not handle it."""


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """tempfile's folder, for this test alone; SIGTERM raises _Unhandled unless the code
    under test installs its own handler (instead of killing the test process)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))

    def unhandled(signum, frame):
        raise _Unhandled(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, unhandled)
    yield folder
    signal.signal(signal.SIGTERM, previous)


def test_finetune_example_stops_when_its_pretraining_was_stopped(private_tmp, monkeypatch, capsys):
    """A SIGTERM that the training loop caught (it saved and returned) stops the script too."""
    import elmo_jax.train.loop as loop

    def stopped_train(cfg, workdir, **kwargs):  # what train() returns after a stop signal
        os.makedirs(os.path.join(workdir, "checkpoints", "3"))
        return {
            "workdir": workdir,
            "step": 3,
            "interrupted": "SIGTERM",
            "checkpoint": os.path.join(workdir, "checkpoints", "3"),
        }

    monkeypatch.setattr(loop, "train", stopped_train)
    assert _finetune_example().main(["--quick"]) == 128 + signal.SIGTERM
    captured = capsys.readouterr()
    assert "embedded" not in captured.out  # it did not go on with a half-trained model
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "stopped by SIGTERM" in lines[0]
    assert list(private_tmp.iterdir()) == []  # its temporary workdir is gone


def test_finetune_example_stops_on_sigterm_outside_training(private_tmp, model_dir, monkeypatch, capsys):
    """A SIGTERM while it prepares its data ends it at once, with its temporary folder removed."""
    mod = _finetune_example()

    def interrupted_load(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        raise AssertionError("the signal should have stopped the script")

    monkeypatch.setattr(mod, "load_corpus", interrupted_load)
    assert mod.main([str(model_dir), "--quick"]) == 128 + signal.SIGTERM
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "stopped by SIGTERM" in lines[0]
    assert list(private_tmp.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM).__name__ == "unhandled"  # the caller's handler is back


def test_finetune_example_keeps_a_workdir_the_user_named(private_tmp, tmp_path, monkeypatch, capsys):
    """With --workdir the stopped script removes nothing and says how to resume."""
    import elmo_jax.train.loop as loop

    monkeypatch.setattr(loop, "train", lambda cfg, workdir, **k: {"step": 1, "interrupted": "SIGINT"})
    work = tmp_path / "work"
    assert _finetune_example().main(["--quick", "--workdir", str(work)]) == 128 + signal.SIGINT
    err = capsys.readouterr().err
    assert "stopped by SIGINT" in err and "the same command" in err
    assert (work / "corpus" / "stats.json").exists()


def test_preparing_text_leaves_nothing_in_the_temporary_folder(private_tmp, tmp_path):
    """Preparing local text (TFDS) leaves no empty `tmp*tfds` folder behind in $TMPDIR."""
    from elmo_jax.data.text_source import prepare_local_text

    _text(tmp_path / "train.txt")
    prepare_local_text([str(tmp_path / "train.txt")], tmp_path / "tfds")
    assert list(private_tmp.iterdir()) == []


@pytest.mark.slow
def test_finetune_example_stopped_by_a_real_sigterm(tmp_path):
    """`timeout`/`kill` during pretraining: exit 143, one line, no temporary folder left."""
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-u", str(REPO / "examples" / "finetune_heads.py"), "--quick"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        for line in proc.stdout:
            if line.startswith("training "):  # train() has started its steps
                proc.send_signal(signal.SIGTERM)
                break
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in err.strip().splitlines()[-1]
    assert list(tmp_path.iterdir()) == []


# ==========================================================================================
# 7. Smaller faults: file modes, damaged files, missing folders, bad arguments.
# ==========================================================================================


@pytest.fixture
def umask():
    """Set the process umask for one test; the old one comes back after it."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_embed_output_follows_the_umask(tmp_path, elmo, umask, mask):
    """`elmo-jax embed` output gets the umask's mode (0644 under 022), as any new file does."""
    src = _text(tmp_path / "in.txt")
    umask(mask)
    embed_file(elmo, src, tmp_path / "out.hdf5", "top", progress=False)
    assert os.stat(tmp_path / "out.hdf5").st_mode & 0o777 == 0o666 & ~mask


def test_corpus_folder_follows_the_umask(tmp_path, umask):
    """`elmo-jax corpus DIR` makes DIR readable as the umask allows (0755 under 022), not 0700."""
    from elmo_jax.data.synthetic_corpus import write_corpus

    umask(0o022)
    write_corpus(tmp_path / "corpus", n_train=10, n_heldout=5)
    assert os.stat(tmp_path / "corpus").st_mode & 0o777 == 0o755


def test_truncated_weight_file_is_named_truncated(tmp_path, elmo):
    """A weight file cut short (an interrupted copy) is reported as truncated, not as swapped files."""
    elmo.save(tmp_path)
    weights = tmp_path / "weights.hdf5"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightFileError, match=r"truncated: it holds [\d,]+ of the [\d,]+ bytes") as e:
        Elmo.load(tmp_path)
    assert "JSON" not in str(e.value) and "swapped" not in str(e.value)
    weights.write_bytes(b"")
    with pytest.raises(WeightFileError, match="is empty"):
        Elmo.load(tmp_path)


def test_truncated_token_cache_is_named_truncated(tmp_path, elmo):
    """The same for a token-cache file."""
    vocab = ["the", "bank", "river"]
    elmo.cache_vocabulary(vocab)
    elmo.save_token_cache(tmp_path / "cache.hdf5")
    elmo.clear_token_cache()
    data = (tmp_path / "cache.hdf5").read_bytes()
    (tmp_path / "cache.hdf5").write_bytes(data[:-100])
    with pytest.raises(ElmoError, match="truncated") as e:
        elmo.load_token_cache(tmp_path / "cache.hdf5", vocab)
    assert "the vocabulary the text file" not in str(e.value)


@pytest.mark.parametrize("command", ["eval", "export"])
def test_a_missing_workdir_is_named_missing(tmp_path, capsys, command):
    """`elmo-jax eval/export NOPE` says the folder does not exist (not that config.json is missing)."""
    args = [command, str(tmp_path / "nope")] + ([str(tmp_path / "out")] if command == "export" else [])
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nope'} does not exist" in err and "config.json is missing" not in err
    assert sorted(os.listdir(tmp_path)) == []  # nothing created


def test_a_file_given_as_workdir_is_named(tmp_path, capsys):
    """`elmo-jax eval FILE` says it is a file, not a run folder."""
    (tmp_path / "run.txt").write_text("x")
    assert main(["eval", str(tmp_path / "run.txt")]) == 2
    assert "is a file, not a training workdir" in capsys.readouterr().err


@pytest.mark.parametrize(
    "bad, named",
    [
        (None, "got NoneType"),
        (7, "got int"),
        ("one sentence", "wrap a single sentence"),
        (["ok", ["a", 5]], "sentence 1: .*got int"),
        (["ok", None], "sentence 1: .*got NoneType"),
    ],
)
def test_embed_names_a_bad_argument(elmo, bad, named):
    """`Elmo.embed(None)`, a bare string, a non-string token: a TypeError that says what to pass."""
    with pytest.raises(TypeError, match=named):
        elmo.embed(bad)
    with pytest.raises(TypeError, match=named):
        list(elmo.embed_groups(bad))


def test_cache_vocabulary_names_a_bad_argument(elmo):
    """`cache_vocabulary(None)` says it takes a list of tokens."""
    with pytest.raises(TypeError, match="list of tokens, got NoneType"):
        elmo.cache_vocabulary(None)


def test_empty_token_is_refused(elmo):
    """An empty-string token is refused with its position (splitting a string never makes one)."""
    with pytest.raises(ValueError, match="sentence 1: token 2 is an empty string"):
        elmo.embed(["a b", ["a", "b", "", "c"]])


def test_overlong_token_is_cut_and_said_once(model_dir):
    """A 10,000-character token is cut to the char limit's bytes, with one warning per Elmo saying so."""
    from elmo_jax import TokenTruncatedWarning

    fresh = Elmo.load(model_dir)  # its own warning state
    long = "ü" * 10_000  # 2 UTF-8 bytes each: 7 characters fit the 14 bytes of 16 chars
    with pytest.warns(TokenTruncatedWarning, match=r"1 token longer than 14 UTF-8 bytes .* first 14 bytes") as w:
        cut = fresh.embed([["a", long]])
    assert sum(issubclass(r.category, TokenTruncatedWarning) for r in w) == 1
    np.testing.assert_array_equal(cut[0], fresh.embed([["a", "ü" * 7]])[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", TokenTruncatedWarning)
        fresh.embed([[long]])  # said once: no second warning


# ==========================================================================================
# Stale or swapped inputs of a resumed run.
# ==========================================================================================


def test_a_resume_refuses_a_swapped_vocabulary_or_a_changed_config(reference_run, tmp_path, capsys):
    """A checkpoint records the SHA-256 of vocab.txt and of the config's fixed fields: a
    reordered vocab.txt, an edited config.json, or (config.json deleted) a changed learning
    rate is one line naming the file, for train, export and eval alike; the same config
    with a new max_steps still resumes, and config.json is written again."""
    import json

    from elmo_jax.train.loop import train
    from elmo_jax.train.workdir import TrainingError

    cfg, work = _copy_run(reference_run, tmp_path, max_steps=3)
    quiet = lambda _: None  # noqa: E731
    vocab = work / "vocab.txt"
    original = vocab.read_bytes()
    words = original.decode("utf-8").splitlines()
    words[-1], words[-2] = words[-2], words[-1]  # two ordinary words swapped: same size, same set
    vocab.write_text("\n".join(words) + "\n", encoding="utf-8")
    assert vocab.read_bytes() != original and len(vocab.read_bytes()) == len(original)
    with pytest.raises(
        TrainingError,
        match=r"vocab.txt is not the vocabulary .*checkpoints/3 was trained with"
        r".*restore the run's vocab.txt",
    ):
        train(cfg, str(work), progress=False, log=quiet)
    for argv in (["export", str(work), str(tmp_path / "out")], ["eval", str(work), "--data", cfg.data]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "vocab.txt is not the vocabulary" in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    vocab.write_bytes(original)

    config_path = work / "config.json"
    recorded = json.loads(config_path.read_text(encoding="utf-8"))
    config_path.write_text(json.dumps({**recorded, "learning_rate": 0.5}), encoding="utf-8")
    with pytest.raises(
        TrainingError,
        match=r"config.json was changed after .*checkpoints/3 was written "
        r"\(learning_rate: checkpoint has 0.2, config.json has 0.5\)",
    ):
        train(cfg.replace(learning_rate=0.5), str(work), progress=False, log=quiet)
    config_path.unlink()
    with pytest.raises(
        TrainingError,
        match=r"learning_rate: checkpoint has 0.2, this run has 0.5\); .*config.json, "
        r"which holds the run's config, is missing",
    ):
        train(cfg.replace(learning_rate=0.5), str(work), progress=False, log=quiet)

    summary = train(cfg.replace(max_steps=4), str(work), progress=False, log=quiet)
    assert summary["start_step"] == 3 and summary["step"] == 4
    assert json.loads(config_path.read_text(encoding="utf-8"))["learning_rate"] == 0.2
    assert _train_losses(work)[4] == pytest.approx(reference_run[2][4], abs=1e-6)


_KILLED_EXPORT = """
import os, signal, sys
from elmo_jax.formats import training_run as ex
def dying(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)  # kill -9 while the weights are written
ex.save_weights = dying
ex.export(sys.argv[1], sys.argv[2])
"""


def test_a_killed_exports_leftover_is_removed_and_no_export_goes_into_a_run(reference_run, tmp_path, capsys):
    """kill -9 of `elmo-jax export` leaves its temporary folder: the next export to that
    folder removes it (and an earlier version's OUT.tmp-PID of a dead process). An export
    into what a run manages (RUN/checkpoints/999, through a symlink too) is one line and
    writes nothing there, so export and eval keep working."""
    import socket

    cfg, work = _copy_run(reference_run, tmp_path, max_steps=6)
    out = tmp_path / "out"
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_EXPORT, str(work), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith("out.tmp")]
    assert len(left) == 1 and not out.exists(), left
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    (tmp_path / f"out.tmp-{dead}").mkdir()  # an earlier version's name
    host = socket.gethostname().replace("_", "-")
    running = tmp_path / f"out.tmp_{host}_{os.getpid()}_abc"  # a running export's: kept
    running.mkdir()
    assert main(["export", str(work), str(out)]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == ["out", running.name]
    assert sorted(os.listdir(out)) == ["options.json", "softmax.hdf5", "vocab.txt", "weights.hdf5"]

    (tmp_path / "link").symlink_to(work / "checkpoints")
    for target in (work / "checkpoints" / "999", tmp_path / "link" / "999", work / "token_index" / "x"):
        assert main(["export", str(work), str(target)]) == 2
        err = capsys.readouterr().err
        assert "which the training run" in err and "choose a folder outside it" in err, err
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert not target.exists()
    assert sorted(os.listdir(work / "checkpoints")) == ["3", "6"]
    assert main(["export", str(work), str(work / "export")]) == 0  # a folder of its own beside the run's
    assert main(["eval", str(work), "--data", cfg.data]) == 0
