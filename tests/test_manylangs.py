"""ELMoForManyLangs models: torch files read without torch, the conversion, outputs equal to the
package's own, and everything downstream.

tests/data/manylangs/ holds a tiny model with random weights made and saved by the package's own
classes (tests/peer_manylangs.py, in both torch layouts: zip/ and legacy/) and the package's
outputs for tests/data/manylangs/sentences.json (peer_outputs.npz), all written by that script in
the peer environment (``../shared/peers/elmoformanylangs-env.sh``); equal_projection/ (zip layout)
and peer_outputs_equal_projection.npz are a model whose word_dim + filters equal its
projection_dim (``make --equal-projection``).  The slow test re-runs the
package live when that environment is present (``$ELMO_EFML_ENV``, default /work/peers/efml).
"""

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from elmo_jax import Elmo, hub

from elmo_jax.formats import manylangs
from elmo_jax.formats.torch_pickle import TorchFileError, load_state_dict
from tests.conftest import assert_close_across_programs

DATA = Path(__file__).parent / "data" / "manylangs"
SENTENCES = json.loads((DATA / "sentences.json").read_text(encoding="utf-8"))
FORMATS = ("zip", "legacy")
PEER_ENV = Path(os.environ.get("ELMO_EFML_ENV", "/work/peers/efml"))
TOLERANCE = 1e-5


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(hub.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.delenv(hub.OFFLINE_ENV, raising=False)
    return tmp_path / "home"


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> dict[str, Elmo]:
    """Each layout converted (into a module cache) and loaded once."""
    os.environ[hub.HOME_ENV] = str(tmp_path_factory.mktemp("cache"))
    try:
        return {fmt: Elmo.load(DATA / fmt) for fmt in FORMATS}
    finally:
        del os.environ[hub.HOME_ENV]


def _compare(elmo: Elmo, expected, prefix: str, sentences=SENTENCES) -> float:
    """Largest difference to the package's outputs for k = 0, 1, 2 and -1 (the average)."""
    layers = elmo.embed(sentences, layers="all")
    worst = 0.0
    for k in (0, 1, 2, -1):
        for i in range(len(sentences)):
            ours = layers[i].mean(axis=0) if k == -1 else layers[i][k]
            theirs = expected[f"{prefix}k{k}_{i}"]
            assert ours.shape == theirs.shape, (k, i, ours.shape, theirs.shape)
            worst = max(worst, float(np.abs(ours - theirs).max()))
    return worst


# -- torch files without torch ----------------------------------------------------------------
def test_both_torch_layouts_read_to_the_same_tensors():
    for name in (manylangs.TOKEN_EMBEDDER_FILE, manylangs.ENCODER_FILE):
        new, old = (load_state_dict(DATA / fmt / name) for fmt in FORMATS)
        assert list(new) == list(old) and len(new) > 10  # the same model, saved twice
        for key in new:
            assert new[key].dtype == np.float32
            np.testing.assert_array_equal(new[key], old[key])
    assert load_state_dict(DATA / "zip" / manylangs.ENCODER_FILE)["forward_layer_0.state_projection.weight"].shape == (
        16,
        24,
    )


def test_torch_reader_refuses_code_and_damage(tmp_path):
    evil = tmp_path / "evil.pkl"  # a pickle that would run a command when loaded by plain pickle
    evil.write_bytes(pickle.dumps(os.system, protocol=2))
    with pytest.raises(TorchFileError, match=r"neither a zip archive nor a legacy torch pickle"):
        load_state_dict(evil)
    blob = (DATA / "legacy" / manylangs.ENCODER_FILE).read_bytes()
    cut = tmp_path / "cut.pkl"
    cut.write_bytes(blob[: len(blob) - 100])
    with pytest.raises(TorchFileError, match=r"cut.pkl: the file ends inside storage"):
        load_state_dict(cut)
    zipped = (DATA / "zip" / manylangs.ENCODER_FILE).read_bytes()
    cut.write_bytes(zipped[: len(zipped) // 2])
    with pytest.raises(TorchFileError, match=r"cut.pkl"):
        load_state_dict(cut)
    with pytest.raises(FileNotFoundError, match="torch file not found"):
        load_state_dict(tmp_path / "nope.pkl")


# -- the format's details --------------------------------------------------------------------
def test_dic_files_are_read_as_the_package_reads_them(tmp_path):
    dic = tmp_path / "char.dic"
    dic.write_text("a\t0\n7\n\u00a0\t8\nb\t1\na\t2\n\n", encoding="utf-8")
    # one field = U+3000; a white-space token is stripped away and becomes U+3000 too (later wins)
    assert manylangs.read_dic(dic) == {"a": 2, "\u3000": 8, "b": 1}
    dic.write_text("a\tb\tc\n", encoding="utf-8")
    with pytest.raises(manylangs.ManyLangsError, match=r"char.dic, line 1: expected 'token<TAB>id'"):
        manylangs.read_dic(dic)


def test_architecture_falls_back_to_the_shipped_one_and_names_a_missing_one(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"config_path": "/abs/elsewhere/cnn_50_100_512_4096_sample.json"}))
    arch = manylangs.read_architecture(tmp_path)
    assert arch["encoder"]["dim"] == 4096 and arch["token_embedder"]["word_dim"] == 100
    (tmp_path / "config.json").write_text(json.dumps({"config_path": "mine.json"}))
    with pytest.raises(manylangs.ManyLangsError, match=r"names the architecture 'mine.json', which is neither"):
        manylangs.read_architecture(tmp_path)


def test_token_ids_follow_the_package_quirks(loaded):
    ids = loaded["zip"].token_ids
    chars, words = ids.char2id, ids.word2id
    row = ids.tokens_to_ids(["cat"])[0]
    # word id first, then <eow>'s id opening the word and <bow>'s closing it (create_one_batch's swap)
    assert row[0] == words["cat"] + 1
    assert list(row[1:6]) == [chars["<eow>"] + 1, chars["c"] + 1, chars["a"] + 1, chars["t"] + 1, chars["<bow>"] + 1]
    assert set(row[6:]) == {chars["<pad>"] + 1}
    unknown = ids.tokens_to_ids(["Ω"])[0]
    assert unknown[0] == words["<oov>"] + 1 and unknown[2] == chars["<oov>"] + 1
    long = "abcdefghijklmnopqrstuvwxyz"  # 26 characters; max_characters_per_token is 20
    assert np.array_equal(ids.tokens_to_ids([long])[0], ids.tokens_to_ids([long[:18]])[0])


# -- equal to the package -------------------------------------------------------------------
@pytest.mark.fidelity
@pytest.mark.parametrize("fmt", FORMATS)
def test_outputs_equal_the_package_within_1e5(loaded, fmt):
    """Against the package's outputs recorded by tests/peer_manylangs.py: unknown words and
    chars, Chinese, accented Latin, an over-long token, the marker strings, U+3000."""
    expected = np.load(DATA / "peer_outputs.npz")
    assert _compare(loaded[fmt], expected, f"{FORMATS.index(fmt)}_") < TOLERANCE


@pytest.mark.fidelity
def test_a_model_whose_widths_equal_the_projection_keeps_it_and_equals_the_package():
    """word_dim 8 + filters 16 = projection_dim 24: the package still has its projection
    (token_embedder.pkl holds projection.weight), so the converted model must too."""
    folder = DATA / "equal_projection"
    assert "projection.weight" in load_state_dict(folder / manylangs.TOKEN_EMBEDDER_FILE)
    elmo = Elmo.load(folder)
    config = elmo.config
    assert (config.word_dim, config.char_cnn.n_filters, config.projection_dim) == (8, 16, 24)
    assert elmo.params["proj"]["w"].shape == (24, 24)
    assert _compare(elmo, np.load(DATA / "peer_outputs_equal_projection.npz"), "0_") < TOLERANCE


@pytest.mark.fidelity
@pytest.mark.slow
def test_outputs_equal_the_package_run_live(tmp_path):
    """Models made now by the package in both layouts, embedded now by the package."""
    python = PEER_ENV / "bin" / "python"
    if not python.exists():
        pytest.skip(
            f"no ELMoForManyLangs environment at {PEER_ENV} (build it with "
            f"../shared/peers/elmoformanylangs-env.sh DIR and set ELMO_EFML_ENV=DIR)"
        )
    script = str(Path(__file__).parent / "peer_manylangs.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    folders = []
    for fmt in FORMATS:
        folder = tmp_path / fmt
        subprocess.run(
            [str(python), "-W", "ignore", script, "make", str(folder)] + (["--legacy"] if fmt == "legacy" else []),
            check=True,
            env=env,
        )
        folders.append(str(folder))
    subprocess.run(
        [str(python), "-W", "ignore", script, "make", str(tmp_path / "equal"), "--equal-projection"],
        check=True,
        env=env,
    )
    folders.append(str(tmp_path / "equal"))
    sentences = SENTENCES + [["über", "中文字", "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzz", "ÅÉÎ"]]
    (tmp_path / "s.json").write_text(json.dumps(sentences), encoding="utf-8")
    subprocess.run(
        [str(python), "-W", "ignore", script, "embed", str(tmp_path / "s.json"), str(tmp_path / "out.npz")] + folders,
        check=True,
        env=env,
    )
    expected = np.load(tmp_path / "out.npz")
    for n, folder in enumerate(folders):
        assert _compare(Elmo.load(folder), expected, f"{n}_", sentences) < TOLERANCE


# -- converted once, then without torch -----------------------------------------------------
def test_converted_once_into_the_cache_then_read_without_the_torch_files(tmp_path, home, monkeypatch):
    folder = tmp_path / "model"
    shutil.copytree(DATA / "legacy", folder)
    first = Elmo.load(folder)
    entries = sorted((home / "models").iterdir())
    assert len(entries) == 1 and entries[0].name.startswith("manylangs-model-")
    assert sorted(p.name for p in entries[0].iterdir()) == [
        "char.dic",
        "manylangs.json",
        "options.json",
        "weights.hdf5",
        "word.dic",
    ]

    class ConvertedAgain(Exception):
        pass

    def refuse(*args):
        raise ConvertedAgain()

    monkeypatch.setattr(manylangs, "load_state_dict", refuse)
    import jax

    for again in (Elmo.load(folder), Elmo.load(entries[0])):  # the converted folder is a model of its own
        for a, b in zip(jax.tree.leaves(first.params), jax.tree.leaves(again.params), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    (folder / "word.dic").write_text((folder / "word.dic").read_text(encoding="utf-8") + "new\t12\n", encoding="utf-8")
    with pytest.raises(ConvertedAgain):  # a changed source file: converted anew
        Elmo.load(folder)
    code = (
        "import sys, elmo_jax; e = elmo_jax.Elmo.load(sys.argv[1]); "
        "assert 'torch' not in sys.modules and e.config.vocab.n_words == 12; print('ok')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(entries[0])],
        capture_output=True,
        text=True,
        env={**os.environ, hub.HOME_ENV: str(home)},
    )
    assert out.stdout.strip() == "ok", out.stderr


def test_a_wrong_folder_gets_a_clear_error(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(DATA / "zip", folder)
    (folder / "char.dic").write_text("a\t0\n", encoding="utf-8")
    with pytest.raises(manylangs.ManyLangsError, match=r"char.dic has no <eow>, <bow>, <bos>, <eos>, <oov>, <pad>"):
        Elmo.load(folder)
    shutil.copy(DATA / "zip" / "char.dic", folder / "char.dic")
    shutil.copy(DATA / "zip" / "token_embedder.pkl", folder / "encoder.pkl")
    with pytest.raises(manylangs.ManyLangsError, match=r"encoder.pkl has no tensor 'forward_layer_0"):
        Elmo.load(folder)


# -- everything downstream ------------------------------------------------------------------
@pytest.mark.fidelity
def test_every_layers_mode_the_token_cache_and_save(loaded, tmp_path):
    elmo = loaded["zip"]
    sentences = SENTENCES[:4]
    full = elmo.embed(sentences, layers="all")
    np.testing.assert_allclose(elmo.embed(sentences, layers="top")[1], full[1][-1], atol=1e-6)
    np.testing.assert_allclose(elmo.embed(sentences, layers="average")[2], full[2].mean(0), atol=1e-6)
    mixed = elmo.embed(sentences, layers="mix", mix_params={"scalars": np.zeros(3), "gamma": 1.0})
    np.testing.assert_allclose(mixed[0], full[0].mean(0), atol=1e-5)
    assert elmo.sentence_vectors(sentences).shape == (4, 32)
    elmo.cache_vocabulary(["the", "cat", "中文", "café"])
    try:
        cached = elmo.embed(sentences, layers="all")
    finally:
        elmo.clear_token_cache()
    for a, b in zip(full, cached):
        np.testing.assert_allclose(a, b, atol=1e-5)
    elmo.save(tmp_path / "saved")
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == [
        "char.dic",
        "options.json",
        "weights.hdf5",
        "word.dic",
    ]
    again = Elmo.load(tmp_path / "saved")
    # Saving is lossless (the same weights, bit for bit); the reloaded model's own compiled
    # program agrees to rounding (a batch of 1 is another program than the batch of 4 above).
    for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(elmo.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert_close_across_programs(again.embed(sentences[:1])[0], full[0])


def test_the_nnx_layer(loaded):
    from flax import nnx

    from elmo_jax.nnx import ElmoLayer, batch_inputs

    elmo = loaded["legacy"]
    layer = ElmoLayer(elmo, dropout=0.0, rngs=nnx.Rngs(0))
    ids, mask = batch_inputs(SENTENCES[:3], layer)
    assert ids.shape[-1] == 21  # the word id + 20 chars
    out = layer.all_layers(ids, mask)
    for i, expected in enumerate(elmo.embed(SENTENCES[:3], layers="all")):
        np.testing.assert_allclose(np.asarray(out[:, i, : len(SENTENCES[i])]), expected, atol=1e-5)
    with pytest.raises(ValueError, match="with the ElmoLayer"):
        batch_inputs(SENTENCES[:1], layer.config)


def test_finetune_and_the_cli(loaded, tmp_path):
    import jax

    from elmo_jax import finetune
    from elmo_jax.cli import main

    elmo = loaded["legacy"]
    vectors = elmo.embed(SENTENCES[:3], layers="all")
    layers_LNTD, mask_NT = finetune.pad_layers(vectors)
    labels = finetune.pad_labels([["X"] * len(s) for s in SENTENCES[:3]], {"X": 0, "Y": 1}, layers_LNTD.shape[2])
    params = finetune.init_tagger(jax.random.key(0), elmo.config, 2)
    trained = finetune.train_tagger(params, layers_LNTD, labels, mask_NT, "mix", steps=20)
    assert finetune.accuracy(trained.params, layers_LNTD, labels, mask_NT, "mix") == 1.0

    src = tmp_path / "in.txt"
    src.write_text(" ".join(SENTENCES[0]) + "\n" + " ".join(SENTENCES[1]) + "\n", encoding="utf-8")
    assert (
        main(["embed", str(src), str(tmp_path / "out.hdf5"), "--all", "--model", str(DATA / "legacy"), "--no-progress"])
        == 0
    )
    import h5py

    with h5py.File(tmp_path / "out.hdf5", "r") as f:
        np.testing.assert_allclose(f["1"][...], vectors[1], atol=1e-5)


def test_continued_pretraining_from_one_is_refused_with_the_reason(tmp_path):
    from elmo_jax.train.init_from import TrainingError, load_pretrained

    with pytest.raises(TrainingError, match=r"char.dic / word.dic ids .* cannot continue training here"):
        load_pretrained(str(DATA / "zip"), progress=False)


def test_released_names_cover_the_44_models():
    from elmo_jax.hub import manylangs_names

    names = manylangs_names.released_names()
    assert len(names) == 44 and len(set(manylangs_names.RELEASED[n[10:]][0] for n in names)) == 44
    assert {manylangs_names.RELEASED[c][0] for c in ("ar", "de", "en", "es", "fr", "ja", "ru", "zh")} == {
        136,
        142,
        144,
        145,
        150,
        160,
        170,
        179,
    }
    assert manylangs_names.released_url("manylangs/fi", "http://127.0.0.1:1/m") == "http://127.0.0.1:1/m/149.zip"
    assert hub.model_source("manylangs/ur").archive_url.endswith("/repository/11/177.zip")


def test_an_incomplete_folder_names_the_missing_file(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(DATA / "zip", folder)
    (folder / "encoder.pkl").unlink()
    with pytest.raises(manylangs.ManyLangsError, match=r"encoder.pkl is missing: copy or unzip the model again"):
        Elmo.load(folder)
