"""What elmo-jax survives: faults and misuse that must neither lose the user's data nor end
in a traceback (issue #30).  One test per fault, grouped by the issue's items; each
injects the fault itself (a path that names the input twice, a truncated file, a stop
signal, a restrictive umask, a bad argument) and checks what the user gets."""

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import pytest

from elmo_jax import Elmo
from elmo_jax.cli import main
from elmo_jax.config import ElmoConfig
from elmo_jax.embed_file import embed_file
from elmo_jax.errors import ElmoError
from elmo_jax.weights import WeightFileError, datasets_to_params, expected_shapes

from tests.conftest import REPO

# A model that compiles in a second or two; 16 chars per token, so at most 14 bytes of a word.
MICRO = {"dim": 16, "projection_dim": 8, "embedding_dim": 4, "filters": [[1, 8], [2, 8], [3, 16]],
         "n_highway": 1, "max_characters_per_token": 16}


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
    assert main(["embed", str(src), str(model_dir / name), "--top", "--overwrite", "--model", str(model_dir),
                 "--no-progress"]) == 2
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
#      checkpoint, a full disk during a checkpoint.  (Tests added with the training fixes.)
# ==========================================================================================


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
        return {"workdir": workdir, "step": 3, "interrupted": "SIGTERM",
                "checkpoint": os.path.join(workdir, "checkpoints", "3")}

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
    proc = subprocess.Popen([sys.executable, "-u", str(REPO / "examples" / "finetune_heads.py"), "--quick"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
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
    from elmo_jax.data.synthetic import write_corpus

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


@pytest.mark.parametrize("bad, named", [
    (None, "got NoneType"),
    (7, "got int"),
    ("one sentence", "wrap a single sentence"),
    (["ok", ["a", 5]], "sentence 1: .*got int"),
    (["ok", None], "sentence 1: .*got NoneType"),
])
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
