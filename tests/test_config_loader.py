"""Python config files and ``--config.KEY=VALUE`` overrides."""

import dataclasses
from pathlib import Path

import pytest

from elmo_jax.config import ConfigError, ElmoConfig
from elmo_jax.train.config_loader import (
    TrainConfig,
    apply_overrides,
    load_config,
    parse_config_args,
    resolve_config_path,
)

REPO = Path(__file__).resolve().parents[1]
CONFIGS = ["tiny", "small", "medium", "original"]


# -- the shipped config files ------------------------------------------------------------------


@pytest.mark.parametrize("name", CONFIGS)
def test_each_config_file_loads(name):
    cfg = load_config(REPO / "configs" / f"{name}.py")
    assert isinstance(cfg, TrainConfig)
    assert cfg.model == name
    assert isinstance(cfg.elmo_config(), ElmoConfig)
    hash(cfg)  # usable as a static jit argument / dict key


def test_tiny_is_the_laptop_default():
    cfg = load_config(REPO / "configs" / "tiny.py")
    assert cfg.data == "synthetic"
    assert cfg.batch_size == 32 and cfg.batch_size_per_device is None
    assert cfg.global_batch_size(1) == 32 and cfg.global_batch_size(2) == 32
    assert cfg.num_negatives == 8192
    assert cfg.optimizer == "adam" and cfg.learning_rate == 0.003  # see configs/tiny.py


def test_original_recipe():
    cfg = load_config(REPO / "configs" / "original.py")
    assert cfg.data == "lm1b"
    assert cfg.batch_size_per_device == 128
    assert cfg.global_batch_size(3) == 384
    assert (cfg.unroll_steps, cfg.num_negatives, cfg.epochs) == (20, 8192, 10)
    assert (cfg.learning_rate, cfg.initial_accumulator, cfg.clip_norm, cfg.dropout) == (0.2, 1.0, 10.0, 0.1)
    assert cfg.elmo_config() == ElmoConfig.preset("original")


def test_global_batch_must_split_over_devices():
    cfg = TrainConfig(batch_size=32)
    assert cfg.global_batch_size(4) == 32
    with pytest.raises(ConfigError, match="not divisible"):
        cfg.global_batch_size(3)


def test_resolution_cwd_first_then_repo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # Not in the cwd: found in the repository.
    assert resolve_config_path("configs/tiny.py") == REPO / "configs" / "tiny.py"
    assert resolve_config_path("small.py") == REPO / "configs" / "small.py"
    assert resolve_config_path("medium") == REPO / "configs" / "medium.py"
    # A file of the same name in the cwd wins.
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tiny.py").write_text(
        "from elmo_jax.train.config_loader import TrainConfig\ndef get_config():\n    return TrainConfig(seed=7)\n"
    )
    assert load_config("configs/tiny.py").seed == 7
    cfg, rest = parse_config_args([])
    assert cfg.seed == 7 and rest == []


def test_default_config_is_tiny(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg, rest = parse_config_args(["train", "--steps", "3"])
    assert cfg == load_config(REPO / "configs" / "tiny.py")
    assert rest == ["train", "--steps", "3"]


# -- loading errors ----------------------------------------------------------------------------


def test_missing_file_is_a_clear_error():
    with pytest.raises(ConfigError, match="not found"):
        load_config("no/such/config.py")


def test_a_folder_or_a_syntax_error_is_named(tmp_path):
    (tmp_path / "cfgs").mkdir()
    with pytest.raises(ConfigError, match="is a folder; give a config file"):
        load_config(tmp_path / "cfgs")
    p = tmp_path / "c.py"
    p.write_text("def get_config(:\n    return {}\n")
    with pytest.raises(ConfigError, match=r"c\.py, line 1: syntax error"):
        load_config(p)


def test_file_without_get_config(tmp_path):
    p = tmp_path / "c.py"
    p.write_text("X = 1\n")
    with pytest.raises(ConfigError, match="get_config"):
        load_config(p)


def test_get_config_may_return_a_dict(tmp_path):
    p = tmp_path / "c.py"
    p.write_text("def get_config():\n    return {'batch_size': 8, 'epochs': 1}\n")
    cfg = load_config(p)
    assert cfg.batch_size == 8 and cfg.epochs == 1
    p.write_text("def get_config():\n    return {'batchsize': 8}\n")
    with pytest.raises(
        ConfigError, match=r"unknown config key 'batchsize' \(did you mean 'batch_size'\?\); valid keys: model"
    ):
        load_config(p)
    p.write_text("def get_config():\n    return 3\n")
    with pytest.raises(ConfigError, match="expected a TrainConfig"):
        load_config(p)


def test_invalid_values_in_a_file_name_the_file(tmp_path):
    p = tmp_path / "c.py"
    p.write_text(
        "from elmo_jax.train.config_loader import TrainConfig\n"
        "def get_config():\n    return TrainConfig(compute_dtype='float16')\n"
    )
    with pytest.raises(ConfigError, match=r"c\.py.*compute_dtype 'float16'.*float32, bfloat16"):
        load_config(p)


# -- the dataclass's own validation ------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"compute_dtype": "fp16"}, "compute_dtype 'fp16' is not supported; use one of float32, bfloat16"),
        ({"parallel": "tpu"}, "parallel 'tpu' is not supported"),
        ({"model": "huge"}, "model 'huge' is not a preset; choose one of"),
        ({"model_overrides": {"dim": 0}}, "lstm.dim must be positive"),
        (
            {"model_overrides": {"max_characters_per_token": 2, "filters": [[1, 4]]}},
            "max_characters_per_token must be >= 3, got 2",
        ),
        ({"model_overrides": {"bogus": 1}}, "unknown ElmoConfig field"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
        ({"learning_rate": 0.0}, "learning_rate must be positive"),
        ({"batch_size": 2.5}, "batch_size must be int, got float"),
        ({"max_steps": True}, "max_steps must be int or None, got bool"),
        ({"eval_every": -1}, "eval_every must be >= 0"),
        ({"data_workers": -1}, "data_workers must be >= 0"),
        ({"data_workers": 100_000}, "data_workers 100000 is more than 256: each is a process"),
        ({"data": ""}, "data must name a corpus source"),
        ({"data": "lm1b "}, "data 'lm1b ' has surrounding spaces; write 'lm1b'"),
        ({"learning_rate": float("inf")}, "learning_rate must be finite"),
        # A whole model_overrides dict (a config file, or a literal) is typed like the dotted form.
        ({"model_overrides": {"dim": True}}, r"model_overrides.dim must be int, got bool"),
        ({"model_overrides": {"dim": 64.0}}, r"model_overrides.dim must be int, got float"),
        (
            {"model_overrides": {"filters": [[1, 4], [2]]}},
            r"filters must be a list of \[width, count\] integer pairs, found \[2\]",
        ),
    ],
)
def test_validation_messages(changes, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**changes)


def test_config_is_frozen_and_owns_its_overrides():
    d = {"dim": 64}
    cfg = TrainConfig(model_overrides=d)
    d["dim"] = 1
    assert cfg.model_overrides == {"dim": 64}
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.batch_size = 3
    assert cfg.to_dict()["model_overrides"] == {"dim": 64}


# -- overrides ---------------------------------------------------------------------------------


def test_overrides_convert_by_field_type():
    cfg = apply_overrides(
        TrainConfig(),
        [
            "batch_size=64",
            "learning_rate=0.1",
            "clip_norm=5",
            "max_steps=1e3",
            "vocab_size=none",
            "data_dir=/tmp/data",
            "data=train.txt",
            "heldout='text:held out.txt'",
            "compute_dtype=bfloat16",
            "seed=3",
        ],
    )
    assert cfg.batch_size == 64 and isinstance(cfg.batch_size, int)
    assert cfg.learning_rate == 0.1
    assert cfg.clip_norm == 5.0 and isinstance(cfg.clip_norm, float)
    assert cfg.max_steps == 1000 and isinstance(cfg.max_steps, int)
    assert cfg.vocab_size is None
    assert cfg.data_dir == "/tmp/data"
    assert cfg.heldout == "text:held out.txt"
    assert cfg.compute_dtype == "bfloat16"
    assert cfg.seed == 3
    # None back to a value, and optional fields reset with null.
    cfg = apply_overrides(cfg, ["max_steps=null", "vocab_size=5000"])
    assert cfg.max_steps is None and cfg.vocab_size == 5000


@pytest.mark.parametrize("text, value", [("true", True), ("False", False), ("1", True), ("0", False), ("yes", True)])
def test_bool_overrides(text, value):
    cfg = apply_overrides(TrainConfig(), [f"model_overrides.use_skip_connections={text}"])
    assert cfg.model_overrides == {"use_skip_connections": value}
    assert cfg.elmo_config().lstm.use_skip_connections is value


def test_nested_model_overrides():
    cfg = apply_overrides(
        TrainConfig(model_overrides={"n_layers": 1}),
        [
            "model_overrides.dim=64",
            "model_overrides.projection_dim=16",
            "model_overrides.cell_clip=none",
            "model_overrides.filters=[[1, 8], [2, 8]]",
            "model_overrides.activation=tanh",
        ],
    )
    assert cfg.model_overrides == {
        "n_layers": 1,
        "dim": 64,
        "projection_dim": 16,
        "cell_clip": None,
        "filters": ((1, 8), (2, 8)),
        "activation": "tanh",
    }
    e = cfg.elmo_config()
    assert (e.lstm.dim, e.lstm.projection_dim, e.lstm.n_layers, e.lstm.cell_clip) == (64, 16, 1, None)
    assert e.char_cnn.filters == ((1, 8), (2, 8))
    # A whole dict at once replaces the overrides.
    cfg = apply_overrides(cfg, ["model_overrides={'dim': 32}"])
    assert cfg.model_overrides == {"dim": 32}
    assert apply_overrides(cfg, ["model_overrides={}"]).model_overrides == {}


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError) as e:
        apply_overrides(TrainConfig(), ["batchsize=3"])
    msg = str(e.value)
    assert "unknown config key 'batchsize'" in msg
    for f in ("batch_size", "learning_rate", "model_overrides", "parallel"):
        assert f in msg
    with pytest.raises(ConfigError, match=r"unknown model_overrides key 'dimm' \(did you mean 'dim'\?\); valid: .*dim"):
        apply_overrides(TrainConfig(), ["model_overrides.dimm=3"])
    with pytest.raises(ConfigError, match="batch_size is not a dict"):
        apply_overrides(TrainConfig(), ["batch_size.x=3"])


def test_values_are_stripped_unless_quoted():
    cfg = apply_overrides(TrainConfig(data="train.txt"), ["optimizer= adam ", "seed= 3", "heldout= 'my file.txt'"])
    assert (cfg.optimizer, cfg.seed, cfg.heldout) == ("adam", 3, "my file.txt")
    with pytest.raises(ConfigError, match="optimizer ' adam' is not supported"):  # quoted: as written
        apply_overrides(TrainConfig(), ["optimizer=' adam'"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("batch_size=abc", "batch_size: expected an integer, got 'abc'"),
        ("batch_size=2.5", "batch_size: expected an integer"),
        ("learning_rate=fast", "learning_rate: expected a number"),
        ("max_steps=lots", r"max_steps: cannot parse 'lots' as int or None \(or none\)"),
        ("model_overrides.use_skip_connections=maybe", "expected a boolean"),
        ("model_overrides.dim=-4", "lstm.dim must be positive"),
        ("compute_dtype=float16", "compute_dtype 'float16' is not supported"),
        ("batch_size=none", "batch_size: expected an integer, got 'none'"),
        ("model_overrides=[1, 2]", "expected dict"),
        ("batch_size", "must look like KEY=VALUE"),
    ],
)
def test_bad_override_values_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(TrainConfig(), [override])


def test_overrides_leave_the_original_untouched():
    cfg = TrainConfig()
    new = apply_overrides(cfg, ["model_overrides.dim=64", "epochs=2"])
    assert cfg.model_overrides == {} and cfg.epochs == 10
    assert new.model_overrides == {"dim": 64} and new.epochs == 2
    assert apply_overrides(cfg, []) is cfg


# -- command lines -----------------------------------------------------------------------------


def test_parse_config_args_both_forms_and_remaining_argv():
    cfg, rest = parse_config_args(
        [
            "train",
            "--config",
            str(REPO / "configs" / "small.py"),
            "--config.batch_size_per_device=4",
            "--config.learning_rate",
            "0.05",
            "--workdir",
            "/tmp/run",
            "--config.model_overrides.dim",
            "256",
            "--config.seed",
            "11",
            "--",
            "--config.epochs=1",
        ]
    )
    assert cfg.model == "small"
    assert cfg.batch_size_per_device == 4 and cfg.learning_rate == 0.05 and cfg.seed == 11
    assert cfg.model_overrides == {"dim": 256}
    assert cfg.epochs == 10  # after "--": not ours
    assert rest == ["train", "--workdir", "/tmp/run", "--", "--config.epochs=1"]


def test_parse_config_args_equals_form_of_path_and_later_overrides_win():
    cfg, rest = parse_config_args(["--config=configs/original.py", "--config.epochs=2", "--config.epochs=3"])
    assert cfg.model == "original" and cfg.epochs == 3 and rest == []


def test_parse_config_args_errors():
    with pytest.raises(ConfigError, match="expects a value"):
        parse_config_args(["--config.epochs"])
    with pytest.raises(ConfigError, match="expects a value"):
        parse_config_args(["--config.epochs", "--other"])
    with pytest.raises(ConfigError, match="expects a path"):
        parse_config_args(["--config"])
    with pytest.raises(ConfigError, match="given twice"):
        parse_config_args(["--config", "tiny", "--config", "small"])
    with pytest.raises(ConfigError, match="unknown config key 'epoch'"):
        parse_config_args(["--config.epoch=3"])
    # A negative value after the key is a value, not an option.
    with pytest.raises(ConfigError, match="learning_rate must be positive, got -1.0"):
        parse_config_args(["--config.learning_rate", "-1"])
