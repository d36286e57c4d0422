import json

import numpy as np
import pytest

from elmo_jax import Elmo, ElmoConfig, batch_to_ids
from elmo_jax.embedder import row_bucket, time_bucket


@pytest.fixture(scope="module")
def tiny():
    return Elmo.random("tiny", seed=0, batch_size=8)


def test_embed_shapes_order_strings_and_token_lists(tiny):
    sents = ["a b c", ["d", "e"], "", "   ", "f " * 20, ["银行", "取钱"]]
    out = tiny.embed(sents)
    assert [v.shape for v in out] == [(3, 3, 64), (3, 2, 64), (3, 0, 64), (3, 0, 64), (3, 20, 64), (3, 2, 64)]
    assert all(v.dtype == np.float32 for v in out)
    # Same vectors whatever the batch company and order.
    alone = tiny.embed(["a b c"])[0]
    np.testing.assert_allclose(out[0], alone, atol=1e-6)
    assert tiny.embed([]) == []


def test_deterministic_by_default_and_stateful_carries(tiny):
    a = tiny.embed(["the bank of the river"])[0]
    b = tiny.embed(["the bank of the river"])[0]
    np.testing.assert_array_equal(a, b)
    tiny.reset_state()
    s1 = tiny.embed(["the bank of the river"], stateful=True)[0]
    s2 = tiny.embed(["the bank of the river"], stateful=True)[0]
    np.testing.assert_allclose(s1, a, atol=1e-6)
    assert np.abs(s2[1:] - s1[1:]).max() > 1e-4
    tiny.reset_state()
    np.testing.assert_allclose(tiny.embed(["the bank of the river"], stateful=True)[0], a, atol=1e-6)
    tiny.reset_state()


def test_stateful_reproduces_reference_fixture(bilm_fixtures):
    model = bilm_fixtures / "model"
    elmo = Elmo.load(model, batch_size=3)
    sentences = json.loads((model / "lm_embeddings_sentences.json").read_text())
    import h5py

    expected = [h5py.File(model / f"lm_embeddings_{k}.hdf5", "r") for k in range(3)]
    for i in range(10):
        out = elmo.embed([sentences[k][i].split(" ") for k in range(3)], stateful=True)
        for k in range(3):
            top = out[k][-1]
            np.testing.assert_allclose(np.stack([top[:, :16], top[:, 16:]]), expected[k][str(i)][...], atol=1e-5)


def test_save_load_round_trip(tiny, tmp_path):
    tiny.save(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["options.json", "weights.hdf5"]
    again = Elmo.load(tmp_path / "m")
    assert again.config == tiny.config
    np.testing.assert_array_equal(again.embed(["x y"])[0], tiny.embed(["x y"])[0])
    via_files = Elmo.load(options_file=tmp_path / "m" / "options.json", weight_file=tmp_path / "m" / "weights.hdf5")
    np.testing.assert_array_equal(via_files.embed(["x y"])[0], tiny.embed(["x y"])[0])
    with pytest.raises(FileExistsError, match="overwrite=True"):
        tiny.save(tmp_path / "m")
    tiny.save(tmp_path / "m", overwrite=True)


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        Elmo.load(tmp_path / "nope")
    (tmp_path / "m").mkdir()
    with pytest.raises(FileNotFoundError, match="weights.hdf5"):
        Elmo.load(tmp_path / "m")
    Elmo.random("tiny").save(tmp_path / "m2")
    (tmp_path / "m2" / "options.json").unlink()
    with pytest.raises(FileNotFoundError, match="options.json"):
        Elmo.load(tmp_path / "m2")
    with pytest.raises(TypeError, match="list of sentences"):
        Elmo.random("tiny").embed("a single string")


def test_compilations_are_bounded_by_buckets():
    elmo = Elmo.random("tiny", batch_size=4)
    rng = np.random.default_rng(0)
    sents = [["w"] * int(n) for n in rng.integers(1, 40, size=30)]
    elmo.embed(sents)
    times = {t for _, t in elmo.compiled_shapes}
    rows = {r for r, _ in elmo.compiled_shapes}
    assert times <= {8, 16, 32, 64} and rows <= {1, 2, 4}
    assert time_bucket(1) == 8 and time_bucket(9) == 16 and time_bucket(16) == 16
    assert row_bucket(3, 64) == 4 and row_bucket(100, 64) == 64


def test_embed_equals_batch_to_ids_forward():
    elmo = Elmo.random(ElmoConfig.preset("tiny"))
    from elmo_jax.model.bilm import bilm

    layers, _ = bilm(elmo.params, elmo.config, batch_to_ids([["p", "q", "r"]]))
    np.testing.assert_allclose(elmo.embed([["p", "q", "r"]])[0], np.asarray(layers[:, 0]), atol=1e-6)
