"""A trained model as users get it: export -> Elmo.load -> embed, and weight-file interop."""

import json
import os
from unittest import mock

import h5py
import jax
import numpy as np
import pytest

from elmo_jax import Elmo, batch_to_ids
from elmo_jax.embedding.embedder import row_bucket, time_bucket
from elmo_jax.model.bilm import bilm
from elmo_jax.formats.hdf5 import WeightFileError
from tests.conftest import assert_close_across_programs

MICRO = {
    "dim": 16,
    "projection_dim": 8,
    "embedding_dim": 4,
    "filters": [[1, 8], [2, 8], [3, 16]],
    "n_highway": 1,
    "max_characters_per_token": 12,
}
SENTENCES = [
    "the bank of the river",
    "she went to the bank",
    "银行 取钱",
    "a",
    "money money money money to the river bank",
]


@pytest.mark.fidelity
def test_export_load_embed_equals_checkpoint_forward(tmp_path):
    from elmo_jax.train.config_loader import TrainConfig
    from elmo_jax.formats.training_run import export, load_checkpoint_params
    from elmo_jax.train.loop import train

    rng = np.random.default_rng(0)
    words = ["the", "bank", "river", "money", "she", "went", "to", "a", "of", "银行", "取钱"]
    (tmp_path / "train.txt").write_text(
        "\n".join(" ".join(rng.choice(words, size=rng.integers(1, 8))) for _ in range(40)) + "\n", encoding="utf-8"
    )
    cfg = TrainConfig(
        model="tiny",
        model_overrides=MICRO,
        data=str(tmp_path / "train.txt"),
        heldout=None,
        batch_size=4,
        unroll_steps=5,
        num_negatives=4,
        epochs=1,
        max_steps=3,
        log_every=1,
        checkpoint_every=3,
        dropout=0.1,
        data_dir=str(tmp_path / "tfds"),
    )
    train(cfg, str(tmp_path / "run"), progress=False)
    # Checkpoints written before the global batch was recorded still export.
    import json

    meta_file = tmp_path / "run" / "checkpoints" / "3" / "meta" / "metadata"  # orbax's JsonSave
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    del meta["global_batch"]
    meta_file.write_text(json.dumps(meta), encoding="utf-8")
    export(tmp_path / "run", tmp_path / "model")
    files = sorted(p.name for p in (tmp_path / "model").iterdir())
    assert {"options.json", "weights.hdf5"} < set(files) and len(files) > 2  # extra files are tolerated

    elmo = Elmo.load(tmp_path / "model", batch_size=8)
    ckpt = load_checkpoint_params(tmp_path / "run")
    assert elmo.config == ckpt.model_config
    # Same parameters, bit for bit.
    for a, b in zip(jax.tree.leaves(elmo.params), jax.tree.leaves(ckpt.params["bilm"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    got = elmo.embed(SENTENCES)
    # The checkpoint's own forward on the batches embed() builds (sentences sorted by
    # length, grouped by time bucket, rows padded to a power of two) agrees to rounding:
    # another jit of the same computation, so not bit for bit (on AVX2 some elements
    # differ by one ulp).
    tokens = [s.split() for s in SENTENCES]
    forward = jax.jit(bilm, static_argnums=1)
    groups = {}
    for i in sorted(range(len(tokens)), key=lambda i: len(tokens[i])):
        groups.setdefault(time_bucket(len(tokens[i])), []).append(i)
    assert len(groups) == 2
    for n_time, group in groups.items():
        n_rows = row_bucket(len(group), 8)
        ids = np.zeros((n_rows, n_time, 12), np.int32)
        ids[: len(group)] = batch_to_ids([tokens[i] for i in group], 12, max_length=n_time)
        lengths = np.array([len(tokens[i]) for i in group] + [-1] * (n_rows - len(group)), np.int32)
        ref = np.asarray(forward(ckpt.params["bilm"], ckpt.model_config, ids, None, lengths)[0])
        for row, i in enumerate(group):
            assert_close_across_programs(got[i], ref[:, row, : len(tokens[i])])
    # And the unpadded, un-jitted forward agrees to float rounding.
    plain, _ = bilm(ckpt.params["bilm"], ckpt.model_config, batch_to_ids(tokens, 12))
    for i, t in enumerate(tokens):
        assert_close_across_programs(got[i], np.asarray(plain)[:, i, : len(t)])

    # --overwrite replaces an earlier export, never a folder holding anything else.
    (tmp_path / "model" / "mine.txt").write_text("a user's file")
    with pytest.raises(FileExistsError, match=r"not part of an export \(mine.txt\).*would delete them"):
        export(tmp_path / "run", tmp_path / "model", overwrite=True)
    assert (tmp_path / "model" / "mine.txt").read_text() == "a user's file"
    (tmp_path / "model" / "mine.txt").unlink()
    # A failure while swapping the new folder in puts the old one back whole.
    with open(tmp_path / "model" / "vocab.txt", "a", encoding="utf-8") as f:
        f.write("old-export-marker\n")
    real_replace = os.replace

    def failing_replace(src, dst):
        if os.fspath(dst) == os.fspath(tmp_path / "model"):
            raise OSError("simulated failure")
        return real_replace(src, dst)

    with mock.patch("os.replace", failing_replace), pytest.raises(OSError, match="simulated"):
        export(tmp_path / "run", tmp_path / "model", overwrite=True)
    assert "old-export-marker" in (tmp_path / "model" / "vocab.txt").read_text(encoding="utf-8")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("model")) == ["model"]
    export(tmp_path / "run", tmp_path / "model", overwrite=True)
    assert "old-export-marker" not in (tmp_path / "model" / "vocab.txt").read_text(encoding="utf-8")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("model")) == ["model"]
    assert Elmo.load(tmp_path / "model").config == ckpt.model_config


def test_load_tolerates_released_file_names_and_extra_files(tmp_path):
    elmo = Elmo.random("tiny", seed=3)
    elmo.save(tmp_path / "m")
    (tmp_path / "m" / "options.json").rename(tmp_path / "m" / "elmo_tiny_options.json")
    (tmp_path / "m" / "weights.hdf5").rename(tmp_path / "m" / "elmo_tiny_weights.hdf5")
    (tmp_path / "m" / "vocab.txt").write_text("<S>\n</S>\n<UNK>\n", encoding="utf-8")
    with h5py.File(tmp_path / "m" / "softmax.hdf5", "w") as f:
        f.create_dataset("softmax/W", data=np.zeros((3, 32), np.float32))
    again = Elmo.load(tmp_path / "m")
    np.testing.assert_array_equal(again.embed(["a b"])[0], elmo.embed(["a b"])[0])


def test_load_names_the_missing_file_and_the_misfit_tensor(tmp_path):
    elmo = Elmo.random("tiny", seed=3)
    elmo.save(tmp_path / "m")
    (tmp_path / "m" / "weights.hdf5").unlink()
    with pytest.raises(FileNotFoundError, match="weights.hdf5"):
        Elmo.load(tmp_path / "m")
    elmo.save(tmp_path / "m2")
    options = json.loads((tmp_path / "m2" / "options.json").read_text())
    options["lstm"]["dim"] = 64  # the weights hold 128 cells
    (tmp_path / "m2" / "options.json").write_text(json.dumps(options))
    with pytest.raises(WeightFileError, match=r"RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0.*shape"):
        Elmo.load(tmp_path / "m2")
    options["lstm"]["dim"] = 128
    options["char_cnn"]["filters"] = options["char_cnn"]["filters"][:-1]
    (tmp_path / "m2" / "options.json").write_text(json.dumps(options))
    with pytest.raises(WeightFileError, match="CNN"):
        Elmo.load(tmp_path / "m2")


@pytest.mark.fidelity
def test_fixture_weights_load_embed_save_reload_bit_identical(bilm_fixtures, tmp_path):
    model = bilm_fixtures / "model"
    elmo = Elmo.load(options_file=model / "options.json", weight_file=model / "lm_weights.hdf5")
    sentences = [s for group in json.loads((model / "lm_embeddings_sentences.json").read_text()) for s in group][:12]
    before = elmo.embed(sentences)
    elmo.save(tmp_path / "out")
    again = Elmo.load(tmp_path / "out")
    for a, b in zip(before, again.embed(sentences)):
        np.testing.assert_array_equal(a, b)
    with h5py.File(model / "lm_weights.hdf5", "r") as f_in, h5py.File(tmp_path / "out" / "weights.hdf5", "r") as f_out:
        names_in, names_out = [], []
        f_in.visititems(lambda n, o: names_in.append(n) if isinstance(o, h5py.Dataset) else None)
        f_out.visititems(lambda n, o: names_out.append(n) if isinstance(o, h5py.Dataset) else None)
        assert sorted(names_out) == sorted(names_in)
        for n in names_in:
            # The fixture stores the char table with its padding row (262 rows); we write 261.
            a = f_in[n][...]
            if n == "char_embed" and a.shape[0] == 262:
                a = a[1:]
            np.testing.assert_array_equal(f_out[n][...], a, err_msg=n)
