import h5py
import jax
import numpy as np
import pytest

from elmo_jax import ElmoConfig
from elmo_jax.model.bilm import init_params
from elmo_jax.formats.hdf5 import WeightFileError, expected_shapes, load_weights, save_weights


def _datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
    return out


@pytest.mark.fidelity
def test_fixture_round_trip_is_bit_identical(bilm_fixtures, tmp_path):
    cfg = ElmoConfig.from_json_file(bilm_fixtures / "model" / "options.json")
    params = load_weights(bilm_fixtures / "model" / "lm_weights.hdf5", cfg)
    assert params["char_embed"].shape == (262, 4) and not params["char_embed"][0].any()
    save_weights(params, cfg, tmp_path / "w.hdf5")
    original = _datasets(bilm_fixtures / "model" / "lm_weights.hdf5")
    written = _datasets(tmp_path / "w.hdf5")
    assert sorted(original) == sorted(written)
    for name in original:
        assert original[name].dtype == written[name].dtype, name
        assert original[name].tobytes() == written[name].tobytes(), name


@pytest.mark.fidelity
def test_random_params_round_trip_and_layout(tmp_path):
    cfg = ElmoConfig.preset("tiny")
    params = jax.tree.map(np.asarray, init_params(jax.random.key(0), cfg))
    save_weights(params, cfg, tmp_path / "w.hdf5")
    on_disk = _datasets(tmp_path / "w.hdf5")
    assert {k: v.shape for k, v in on_disk.items()} == expected_shapes(cfg)
    again = load_weights(tmp_path / "w.hdf5", cfg)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again)):
        assert a.tobytes() == b.tobytes()


def test_original_layout_names():
    shapes = expected_shapes(ElmoConfig.preset("original"))
    assert shapes["char_embed"] == (261, 16)
    assert shapes["CNN/W_cnn_6"] == (1, 7, 16, 1024)
    assert shapes["CNN_high_1/W_carry"] == (2048, 2048)
    assert shapes["CNN_proj/W_proj"] == (2048, 512)
    assert shapes["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"] == (1024, 16384)
    assert shapes["RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_P_0"] == (4096, 512)
    assert len(shapes) == 1 + 14 + 8 + 2 + 12


def test_missing_dataset_and_wrong_shape_are_named(tmp_path):
    cfg = ElmoConfig.preset("tiny")
    params = jax.tree.map(np.asarray, init_params(jax.random.key(0), cfg))
    save_weights(params, cfg, tmp_path / "w.hdf5")
    with h5py.File(tmp_path / "w.hdf5", "a") as f:
        del f["CNN_high_0/b_carry"]
    with pytest.raises(WeightFileError, match=r"'CNN_high_0/b_carry' is missing \(expected shape \(128,\)\)"):
        load_weights(tmp_path / "w.hdf5", cfg)
    bigger = cfg.replace(dim=256)
    save_weights(params, cfg, tmp_path / "w2.hdf5")
    with pytest.raises(WeightFileError, match=r"W_0' has shape \(64, 512\), expected \(64, 1024\)"):
        load_weights(tmp_path / "w2.hdf5", bigger)
    with pytest.raises(FileNotFoundError, match="weight file not found"):
        load_weights(tmp_path / "nope.hdf5", cfg)
    (tmp_path / "junk.hdf5").write_text("not hdf5")
    with pytest.raises(WeightFileError, match="not a readable HDF5"):
        load_weights(tmp_path / "junk.hdf5", cfg)


def test_a_projection_the_byte_options_leave_out_is_named_as_such(tmp_path):
    """Byte-model options whose filters' sum equals projection_dim describe no projection; a
    file holding one is refused with that reason, not with 'fewer layers'."""
    from elmo_jax.errors import ElmoError

    cfg = ElmoConfig.preset("tiny")
    save_weights(jax.tree.map(np.asarray, init_params(jax.random.key(0), cfg)), cfg, tmp_path / "w.hdf5")
    options = cfg.to_options()
    options["lstm"]["projection_dim"] = cfg.char_cnn.n_filters  # 128: the file's W_proj is [128, 32]
    with pytest.raises(
        ElmoError,
        match=r"holds CNN_proj/W_proj, CNN_proj/b_proj.*filters' sum the width of "
        r"lstm.projection_dim",
    ):
        load_weights(tmp_path / "w.hdf5", ElmoConfig.from_options(options))


@pytest.mark.parametrize(
    "mutate, named",
    [
        (lambda o: o["lstm"].update(n_layers=1), "RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/B"),
        (lambda o: o["char_cnn"].pop("n_highway"), "CNN_high_0/W_carry"),
        (lambda o: o["char_cnn"].update(filters=o["char_cnn"]["filters"][:-1]), "CNN/W_cnn_3"),
    ],
)
def test_weights_the_options_leave_out_are_refused_not_dropped(tmp_path, mutate, named):
    """Options describing fewer layers or filters than the file holds would load and give
    wrong vectors with no warning; the loader names what the options leave out."""
    from elmo_jax.errors import ElmoError

    cfg = ElmoConfig.preset("tiny")
    save_weights(jax.tree.map(np.asarray, init_params(jax.random.key(0), cfg)), cfg, tmp_path / "w.hdf5")
    options = cfg.to_options()
    mutate(options)
    fewer = ElmoConfig.from_options(options)
    with pytest.raises(ElmoError, match=f"holds {named}.*which options.json does not describe"):
        load_weights(tmp_path / "w.hdf5", fewer)
    # Datasets outside the layout (e.g. a softmax someone kept in the file) are ignored.
    with h5py.File(tmp_path / "w.hdf5", "a") as f:
        f["softmax/W"] = np.zeros((3, 2), np.float32)
    load_weights(tmp_path / "w.hdf5", cfg)
