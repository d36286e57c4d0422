"""A training workdir wherever a model is expected: Elmo.load, --model, ElmoLayer."""

import os

import jax
import numpy as np
import pytest

from elmo_jax import Elmo
from elmo_jax.errors import ElmoError

MICRO = {
    "dim": 16,
    "projection_dim": 8,
    "embedding_dim": 4,
    "filters": [[1, 8], [2, 8], [3, 16]],
    "n_highway": 1,
    "max_characters_per_token": 12,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A micro run with checkpoints at steps 2 and 3 (trained once for this module)."""
    from elmo_jax.train.config_loader import TrainConfig
    from elmo_jax.train.loop import train

    root = tmp_path_factory.mktemp("workdir_model")
    rng = np.random.default_rng(0)
    words = ["the", "bank", "river", "money", "she", "went", "to", "a", "of"]
    text = root / "train.txt"
    text.write_text(
        "\n".join(" ".join(rng.choice(words, size=rng.integers(1, 8))) for _ in range(40)) + "\n", encoding="utf-8"
    )
    cfg = TrainConfig(
        model="tiny",
        model_overrides=MICRO,
        data=str(text),
        heldout=None,
        batch_size=4,
        unroll_steps=5,
        num_negatives=4,
        epochs=5,
        max_steps=3,
        log_every=1,
        checkpoint_every=2,
        dropout=0.1,
        data_dir=str(root / "tfds"),
    )
    train(cfg, str(root / "run"), progress=False)
    return root / "run"


def test_workdir_loads_as_its_newest_checkpoint_and_is_exported_once(run, tmp_path, monkeypatch, capsys):
    from elmo_jax.formats.training_run import load_checkpoint_params

    monkeypatch.setenv("ELMO_JAX_HOME", str(tmp_path / "cache"))
    before = sorted(os.listdir(run))
    os.rename(run / "checkpoints" / "3", tmp_path / "3")  # step 2 is the newest for now
    try:
        elmo = Elmo.load(run)
    finally:
        os.rename(tmp_path / "3", run / "checkpoints" / "3")
    assert "exporting its checkpoint of step 2" in capsys.readouterr().err
    ckpt = load_checkpoint_params(run, step=2)
    for a, b in zip(jax.tree.leaves(elmo.params), jax.tree.leaves(ckpt.params["bilm"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    folder = os.path.dirname(elmo.source_files["model's weight file"])
    assert folder.startswith(str(tmp_path / "cache" / "runs")) and os.path.basename(folder).startswith("step-2-")
    # A newer checkpoint: exported in turn, the older export removed.
    newer = Elmo.load(run)
    assert "exporting its checkpoint of step 3" in capsys.readouterr().err
    new_folder = os.path.dirname(newer.source_files["model's weight file"])
    assert os.path.basename(new_folder).startswith("step-3-") and not os.path.exists(folder)
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(elmo.params), jax.tree.leaves(newer.params)))
    Elmo.load(str(run) + os.sep)  # the same checkpoint again: the cached export, no new one
    assert "exporting" not in capsys.readouterr().err
    assert sorted(os.listdir(run)) == before  # the workdir is only read


def test_workdir_on_the_command_line_and_without_checkpoint(run, tmp_path, monkeypatch):
    from elmo_jax.cli import main

    monkeypatch.setenv("ELMO_JAX_HOME", str(tmp_path / "cache"))
    (tmp_path / "in.txt").write_text("the bank of the river\nshe went\n", encoding="utf-8")
    assert (
        main(
            [
                "embed",
                str(tmp_path / "in.txt"),
                str(tmp_path / "out.hdf5"),
                "--top",
                "--model",
                str(run),
                "--no-progress",
            ]
        )
        == 0
    )
    assert os.path.exists(tmp_path / "out.hdf5")
    # A workdir whose start wrote no checkpoint yet: the error says what to do.
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ElmoError, match="without a checkpoint yet: train it first"):
        Elmo.load(empty)
    # A folder that is neither a model nor a run names `elmo-jax export`.
    (tmp_path / "other").mkdir()
    with pytest.raises(FileNotFoundError, match="elmo-jax export WORKDIR DIR"):
        Elmo.load(tmp_path / "other")
