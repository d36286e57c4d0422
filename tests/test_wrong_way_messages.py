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
    with pytest.raises(
        ConfigError,
        match=r"unknown model_overrides key 'projection_dims' \(did you mean "
        r"'projection_dim'\?\)",
    ):
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


# ==========================================================================================
# A symlink loop is called one
# ==========================================================================================


def _loop(path):
    path.symlink_to(path.name)  # a link to itself
    return path


def test_a_symlink_loop_is_named_as_one(tmp_path, capsys):
    from elmo_jax import hub
    from elmo_jax.embedding.embed_input import scan_input
    from elmo_jax.train.checkpoints import Checkpoints
    from elmo_jax.train.workdir import check_writable

    loop = _loop(tmp_path / "loop")
    two = tmp_path / "a"
    two.symlink_to("b")
    (tmp_path / "b").symlink_to("a")  # a -> b -> a
    for path in (loop, two):
        for call in (
            lambda p=path: check_writable(str(p)),
            lambda p=path: scan_input(p, 1, 1),
            lambda p=path: hub.resolve_model(str(p)),
        ):
            with pytest.raises(Exception, match=f"{path} is a symbolic link loop .*remove the link") as raised:
                call()
            assert "File exists" not in str(raised.value) and "is a file" not in str(raised.value)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(Exception, match=r"dangling is a symbolic link to .*nowhere, which does not exist"):
        check_writable(str(dangling))
    run = tmp_path / "run"
    run.mkdir()
    _loop(run / "checkpoints")
    with pytest.raises(Exception, match=r"checkpoints is a symbolic link loop"):
        Checkpoints(run)
    for argv in (
        ["train", "--workdir", str(loop), "--config.max_steps=1"],
        ["export", str(loop), str(tmp_path / "o")],
        ["embed", str(loop), str(tmp_path / "o.hdf5"), "--top", "--preset", "tiny"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "is a symbolic link loop" in err and len(err.strip().splitlines()) == 1, err


# ==========================================================================================
# The index rebuild's line does not ask to delete what it rebuilds
# ==========================================================================================


def test_the_index_rebuild_line_does_not_ask_to_delete_the_index(tmp_path):
    from elmo_jax.data.text_source import InMemorySource
    from elmo_jax.data.token_index import TokenIndex, TokenIndexError, open_or_build

    source = InMemorySource([f"w{i % 7} x{i % 3} y" for i in range(40)])
    folder = tmp_path / "index"
    open_or_build(source, folder)
    ids = folder / "ids.bin"
    with open(ids, "r+b") as f:
        f.truncate(ids.stat().st_size - 4)
    with pytest.raises(TokenIndexError, match=r"ids.bin has .* bytes.*damaged[:;] delete .* and it is rebuilt"):
        TokenIndex.open(folder)  # a caller that does not rebuild is told how
    logs = []
    open_or_build(source, folder, log=logs.append)
    rebuild = [line for line in logs if "rebuilding the token index" in line]
    assert len(rebuild) == 1 and "ids.bin has" in rebuild[0] and "delete" not in rebuild[0], logs


# ==========================================================================================
# A resumed run's checkpoint against a changed config or a re-saved vocab.txt
# ==========================================================================================


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """Two steps with a checkpoint at 2."""
    from elmo_jax.train.loop import train
    from tests.test_train import _cfg

    tmp = tmp_path_factory.mktemp("trained")
    cfg = _cfg(tmp, max_steps=2, checkpoint_every=2)
    train(cfg, str(tmp / "run"), progress=False, log=lambda _: None)
    return cfg, tmp / "run"


def _copy(trained_run, tmp_path):
    import shutil

    cfg, run = trained_run
    shutil.copytree(run, tmp_path / "run")
    return cfg, tmp_path / "run"


def test_a_changed_model_without_config_json_names_the_field(trained_run, tmp_path):
    from elmo_jax.train.loop import train
    from elmo_jax.train.workdir import TrainingError

    cfg, work = _copy(trained_run, tmp_path)
    (work / "config.json").unlink()
    dim = cfg.model_overrides["dim"]
    changed = cfg.replace(model_overrides={**cfg.model_overrides, "dim": 2 * dim})
    with pytest.raises(TrainingError) as raised:
        train(changed, str(work), progress=False, log=lambda _: None)
    message = str(raised.value)
    assert f"model_overrides.dim: checkpoint has {dim}, this run has {2 * dim}" in message, message
    assert "config.json, which holds the run's config, is missing" in message and "strict" not in message
    assert "resume with the checkpoint's values, or start a new --workdir" in message


@pytest.mark.parametrize("resave", ["crlf", "bom"])
def test_a_vocabulary_resaved_with_a_bom_or_crlf_says_so(trained_run, tmp_path, resave):
    from elmo_jax.train.loop import train
    from elmo_jax.train.workdir import TrainingError

    cfg, work = _copy(trained_run, tmp_path)
    vocab = work / "vocab.txt"
    original = vocab.read_bytes()
    vocab.write_bytes(original.replace(b"\n", b"\r\n") if resave == "crlf" else b"\xef\xbb\xbf" + original)
    logs = []
    with pytest.raises(TrainingError) as raised:
        train(cfg.replace(max_steps=3), str(work), progress=False, log=logs.append)
    message = str(raised.value)
    what = "its line ends (CRLF where the run's file has LF)" if resave == "crlf" else "a byte-order mark at its start"
    assert "vocab.txt differs from the vocabulary" in message and f"only in {what}" in message, message
    assert "the words and their order are the same" in message and "rows follow" not in message, message
    # the run's own vocabulary is not "used as given" on the way to this refusal
    assert not [line for line in logs if "as given" in line], logs
    vocab.write_bytes(original)


def test_the_runs_own_vocabulary_is_not_called_the_users(trained_run, tmp_path):
    """vocab_source.json gone (a run of an earlier version, or deleted): a resume says nothing
    about the vocabulary; a new run that finds a built vocab.txt edited says so."""
    from elmo_jax.train.loop import train

    cfg, work = _copy(trained_run, tmp_path)
    (work / "vocab_source.json").unlink()
    logs = []
    summary = train(cfg.replace(max_steps=3), str(work), progress=False, log=logs.append)
    assert summary["step"] == 3
    assert not [line for line in logs if "as given" in line or "not built by this package" in line], logs

    cfg, fresh = _copy(trained_run, tmp_path / "fresh")
    import shutil

    shutil.rmtree(fresh / "checkpoints")
    vocab = fresh / "vocab.txt"
    vocab.write_bytes(vocab.read_bytes().replace(b"\n", b"\r\n"))
    logs = []
    train(cfg.replace(max_steps=1), str(fresh), progress=False, log=logs.append)
    given = [line for line in logs if "as given" in line]
    assert len(given) == 1 and "changed after this package built it" in given[0], logs


def test_a_checkpoint_of_another_model_names_the_array_not_orbax(trained_run):
    """Without the record's config check (a checkpoint of an earlier version records no
    config digest), orbax's advice ("set strict=False in ArrayRestoreArgs") is replaced by
    the array, both shapes and the fix; with host templates as with placed ones."""
    import jax

    from elmo_jax.model.lstm import zero_state
    from elmo_jax.train.checkpoints import CheckpointError, Checkpoints
    from elmo_jax.train.step import init_train_state, make_optimizer

    cfg, work = trained_run
    changed = cfg.replace(model_overrides={**cfg.model_overrides, "dim": 2 * cfg.model_overrides["dim"]})
    optimizer = make_optimizer(cfg.optimizer, cfg.learning_rate, cfg.initial_accumulator, cfg.clip_norm)
    ckpts = Checkpoints(work, create=False)
    meta = ckpts.read_meta(2)
    template = jax.eval_shape(
        lambda: (
            init_train_state(jax.random.key(0), changed.elmo_config(), meta["vocab_size"], optimizer),
            zero_state(changed.elmo_config(), meta["global_batch"]),
        )
    )
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    placed = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), template)
    try:
        for tree in (placed, template):
            with pytest.raises(CheckpointError) as raised:
                ckpts.restore(tree, 2)
            message = str(raised.value)
            assert "was trained with another model" in message and "strict" not in message, message
            assert "(first train state params/bilm/" in message and "model_overrides" in message, message
    finally:
        ckpts.close()
