"""Messages that pointed the wrong way: a mistyped config key, option or config file gets
the name meant; a checkpoint whose shapes differ from the config names the field; a symlink
loop is called one; a vocabulary that differs only in its BOM or line ends says so; the
run's own vocabulary is not called the user's; the index rebuild's line does not ask the
user to delete what it rebuilds."""

import pytest

from elmo_jax.cli import main
from elmo_jax.config import ConfigError
from elmo_jax.train.config_loader import apply_overrides, load_config, parse_config_args


# ==========================================================================================
# Mistyped names get the name meant
# ==========================================================================================

def test_a_mistyped_config_key_gets_the_key_meant():
    cfg = load_config("tiny")
    with pytest.raises(ConfigError, match=r"unknown config key 'max_step' \(did you mean 'max_steps'\?\)"):
        apply_overrides(cfg, ["max_step=5"])
    with pytest.raises(ConfigError, match=r"unknown config key 'learning_rat' \(did you mean 'learning_rate'\?\)"):
        cfg.replace(learning_rat=0.1)
    with pytest.raises(ConfigError, match=r"unknown model_overrides key 'projection_dims' \(did you mean "
                                          r"'projection_dim'\?\)"):
        apply_overrides(cfg, ["model_overrides.projection_dims=8"])
    with pytest.raises(ConfigError, match=r"unknown model_overrides key 'n_layer' \(did you mean 'n_layers'\?\)"):
        apply_overrides(cfg, ["model_overrides={'n_layer': 1}"])
    with pytest.raises(ConfigError) as raised:  # nothing close: no guess
        apply_overrides(cfg, ["zzzz=1"])
    assert "did you mean" not in str(raised.value)


def test_a_mistyped_config_file_gets_the_shipped_config_meant(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for given in ("configs/tyni.py", "tyni", "smal"):
        with pytest.raises(ConfigError) as raised:
            parse_config_args(["--config", given])
        message = str(raised.value)
        meant = "tiny" if "tyni" in given else "small"
        assert f"did you mean configs/{meant}.py ('{meant}')?" in message, message
        assert "configs/configs" not in message, message


def test_a_mistyped_option_gets_the_option_meant(tmp_path, capsys):
    assert main(["train", "--workdr", str(tmp_path / "run"), "--config.max_steps=1"]) == 2
    err = capsys.readouterr().err
    assert "unrecognised arguments: --workdr" in err and "(did you mean --workdir?)" in err, err
    assert not (tmp_path / "run").exists()
    with pytest.raises(SystemExit):
        main(["export", str(tmp_path), str(tmp_path / "out"), "--ovewrite"])
    assert "(did you mean --overwrite?)" in capsys.readouterr().err
