import dataclasses
import json

import pytest

from elmo_jax import ConfigError, ElmoConfig, count_params


@pytest.mark.parametrize("name, expected", [("original", 93_600_848), ("medium", 28_027_728), ("small", 13_593_296)])
def test_released_preset_parameter_counts(name, expected):
    assert count_params(ElmoConfig.preset(name)) == expected


def test_unknown_preset():
    with pytest.raises(ConfigError, match="tiny"):
        ElmoConfig.preset("huge")


def test_options_round_trip_released_spelling():
    options = ElmoConfig.preset("original").to_options()
    assert options == {
        "lstm": {
            "dim": 4096,
            "projection_dim": 512,
            "n_layers": 2,
            "use_skip_connections": True,
            "cell_clip": 3,
            "proj_clip": 3,
        },
        "char_cnn": {
            "embedding": {"dim": 16},
            "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
            "n_highway": 2,
            "n_characters": 262,
            "max_characters_per_token": 50,
            "activation": "relu",
        },
    }
    assert ElmoConfig.from_options(json.loads(json.dumps(options))) == ElmoConfig.preset("original")


def test_261_and_262_characters_are_the_same_model():
    options = ElmoConfig.preset("small").to_options()
    options["char_cnn"]["n_characters"] = 261
    assert ElmoConfig.from_options(options) == ElmoConfig.preset("small")
    # A config built with 261 still writes the inference table's 262 (its weight file has 262 rows).
    built = ElmoConfig.preset("small").replace(n_characters=261)
    assert built.to_options()["char_cnn"]["n_characters"] == 262


def test_fixture_options_load(bilm_fixtures):
    cfg = ElmoConfig.from_json_file(bilm_fixtures / "model" / "options.json")
    assert cfg.lstm.dim == 64 and cfg.projection_dim == 16 and not cfg.lstm.use_skip_connections
    assert cfg.char_cnn.filters == ((1, 4), (2, 8), (3, 16), (4, 32), (5, 64))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda o: o["lstm"].pop("dim"), "lstm.dim"),
        (lambda o: o["char_cnn"].pop("embedding"), "embedding"),
        (lambda o: o["lstm"].update(n_layers="2"), "lstm.n_layers must be int"),
        (lambda o: o["char_cnn"].update(activation="gelu"), "activation 'gelu'"),
        (lambda o: o["char_cnn"].update(n_characters=300), "n_characters"),
        (lambda o: o["char_cnn"].update(filters=[[1, "a"]]), "filters"),
        (lambda o: o["lstm"].update(cell_clip="3"), "cell_clip"),
        (lambda o: o["char_cnn"].update(max_characters_per_token=2), "max_characters_per_token must be >= 3"),
    ],
)
def test_bad_options_name_the_field(mutate, message):
    options = ElmoConfig.preset("tiny").to_options()
    mutate(options)
    with pytest.raises(ConfigError, match=message) as caught:
        ElmoConfig.from_options(options, source="m/options.json")
    assert str(caught.value).startswith("m/options.json: ") and "m/options.json" not in str(caught.value)[17:]


def test_options_interoperate_with_both_original_readers():
    """Written: every key, clips as null when unset (AllenNLP indexes cell_clip/proj_clip).
    Read: n_highway and n_layers are optional as in bilm-tf (absent = 0 and 1)."""
    cfg = ElmoConfig.preset("tiny").replace(cell_clip=None, proj_clip=None)
    options = json.loads(json.dumps(cfg.to_options()))
    assert options["lstm"]["cell_clip"] is None and options["lstm"]["proj_clip"] is None
    assert ElmoConfig.from_options(options) == cfg
    del options["char_cnn"]["n_highway"], options["lstm"]["n_layers"]
    sparse = ElmoConfig.from_options(options)
    assert sparse.char_cnn.n_highway == 0 and sparse.lstm.n_layers == 1


def test_bad_json_file(tmp_path):
    p = tmp_path / "options.json"
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ElmoConfig.from_json_file(p)
    with pytest.raises(ConfigError, match="not found"):
        ElmoConfig.from_json_file(tmp_path / "missing.json")


def test_config_is_immutable_and_hashable():
    cfg = ElmoConfig.preset("tiny")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lstm.dim = 3  # type: ignore[misc]
    assert hash(cfg) == hash(ElmoConfig.from_options(cfg.to_options()))
    assert cfg.replace(dim=64).lstm.dim == 64
    with pytest.raises(ConfigError, match="unknown ElmoConfig field"):
        cfg.replace(width=3)
