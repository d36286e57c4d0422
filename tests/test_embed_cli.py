"""``elmo-jax embed``: the dumped-embeddings HDF5 layout, equality with Elmo.embed, bad input."""

import json
import os

import h5py
import numpy as np
import pytest

from elmo_jax import Elmo
from elmo_jax.cli import main
from elmo_jax.embedding.embed_file import embed_file
from tests.conftest import assert_close_across_programs

LINES = ["the bank of the river", "她 去 银行 取钱", "", "a", "the bank of the river"]


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("flag,layers", [("--all", "all"), ("--top", "top"), ("--average", "average")])
def test_cli_writes_the_dumped_layout_and_equals_embed(tmp_path, model_dir, elmo, flag, layers, capsys):
    src = _write(tmp_path / "in.txt", LINES)
    out = tmp_path / "out.hdf5"
    assert main(["embed", str(src), str(out), flag, "--model", str(model_dir), "--batch-size", "2"]) == 0
    assert "wrote 5 sentences" in capsys.readouterr().out
    expected = elmo.embed(LINES, layers=layers)
    with h5py.File(out, "r") as f:
        assert sorted(f.keys()) == ["0", "1", "2", "3", "4", "sentence_to_index"]
        for i, e in enumerate(expected):
            np.testing.assert_allclose(f[str(i)][...], e, atol=1e-6, rtol=0)
        assert f["0"].shape == ((3, 5, 64) if layers == "all" else (5, 64))
        assert f["2"].shape == ((3, 0, 64) if layers == "all" else (0, 64))  # the empty line
        index = json.loads(f["sentence_to_index"][0])
    assert index == {"the bank of the river": "4", "她 去 银行 取钱": "1", "": "2", "a": "3"}
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_cli_refuses_without_model_and_accepts_a_random_preset(tmp_path, capsys):
    src = _write(tmp_path / "in.txt", ["a b"])
    assert main(["embed", str(src), str(tmp_path / "o.hdf5"), "--top"]) == 2
    err = capsys.readouterr().err
    assert "--model" in err and "no downloadable default" in err
    assert not (tmp_path / "o.hdf5").exists()
    assert main(["embed", str(src), str(tmp_path / "o.hdf5"), "--top", "--preset", "tiny", "--no-progress"]) == 0
    with h5py.File(tmp_path / "o.hdf5", "r") as f:
        assert f["0"].shape == (2, 64)


def test_cli_bad_inputs(tmp_path, model_dir, capsys):
    m = ["--model", str(model_dir)]
    out = tmp_path / "out.hdf5"
    (tmp_path / "empty.txt").write_bytes(b"")
    assert main(["embed", str(tmp_path / "empty.txt"), str(out), "--all", *m]) == 2
    assert "is empty" in capsys.readouterr().err
    (tmp_path / "latin1.txt").write_bytes("ok line\nsecond\ncaf\xe9 au lait\n".encode("latin-1"))
    assert main(["embed", str(tmp_path / "latin1.txt"), str(out), "--all", *m]) == 2
    assert "line 3: not valid UTF-8" in capsys.readouterr().err
    (tmp_path / "utf16.txt").write_bytes("hello world\n".encode("utf-16"))  # a Windows "Unicode" file
    assert main(["embed", str(tmp_path / "utf16.txt"), str(out), "--all", *m]) == 2
    assert "utf16.txt is UTF-16 text" in capsys.readouterr().err
    assert main(["embed", str(tmp_path / "missing.txt"), str(out), "--all", *m]) == 2
    assert "input file not found" in capsys.readouterr().err
    assert not out.exists() and not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    # An existing output is refused unless --overwrite.
    src = _write(tmp_path / "in.txt", ["x y z"])
    out.write_bytes(b"precious")
    assert main(["embed", str(src), str(out), "--all", *m]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert out.read_bytes() == b"precious"
    assert main(["embed", str(src), str(out), "--all", *m, "--overwrite", "--no-progress"]) == 0
    with h5py.File(out, "r") as f:
        assert f["0"].shape == (3, 3, 64)
    # A model folder missing a file is named; options that misfit the weights name the tensor.
    broken = tmp_path / "broken"
    Elmo.random("tiny", seed=5).save(broken)
    (broken / "weights.hdf5").unlink()
    assert main(["embed", str(src), str(tmp_path / "o2.hdf5"), "--all", "--model", str(broken)]) == 2
    assert "weights.hdf5" in capsys.readouterr().err
    Elmo.random("tiny", seed=5).save(broken, overwrite=True)
    options = json.loads((broken / "options.json").read_text())
    options["lstm"]["projection_dim"] = 16
    (broken / "options.json").write_text(json.dumps(options))
    assert main(["embed", str(src), str(tmp_path / "o2.hdf5"), "--all", "--model", str(broken)]) == 2
    assert "CNN_proj/W_proj" in capsys.readouterr().err
    # Exactly one of --all/--top/--average.
    with pytest.raises(SystemExit):
        main(["embed", str(src), str(tmp_path / "o3.hdf5"), *m])


def test_cli_names_an_unwritable_output_folder_and_an_unreadable_input(tmp_path, model_dir, capsys, monkeypatch):
    import tempfile

    src = _write(tmp_path / "in.txt", ["x y"])

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    with monkeypatch.context() as mp:
        mp.setattr(tempfile, "mkstemp", refuse)
        assert main(["embed", str(src), str(tmp_path / "o.hdf5"), "--all", "--model", str(model_dir)]) == 2
    err = capsys.readouterr().err
    assert f"cannot write in the output folder {tmp_path} (Permission denied)" in err
    assert "Traceback" not in err
    # Any other OSError (here: reading a folder's contents as a file) is one line too.
    assert main(["embed", "/proc/self/mem", str(tmp_path / "o.hdf5"), "--all", "--model", str(model_dir)]) == 2
    err = capsys.readouterr().err
    assert "cannot read input file /proc/self/mem" in err and "Traceback" not in err


@pytest.mark.fidelity
def test_byte_order_mark_is_not_part_of_the_first_word(tmp_path, elmo):
    (tmp_path / "bom.txt").write_bytes("\ufeffHello world\r\nsecond line\n".encode("utf-8"))
    embed_file(elmo, tmp_path / "bom.txt", tmp_path / "out.hdf5", "top", progress=False)
    with h5py.File(tmp_path / "out.hdf5", "r") as f:
        index = json.loads(f["sentence_to_index"][0])
        first = f["0"][...]
    assert index == {"Hello world": "0", "second line": "1"}
    # embed_file batched it with the second line: another padded shape, another program.
    assert_close_across_programs(first, elmo.embed(["Hello world"], layers="top")[0])


def test_interrupted_write_leaves_nothing_under_the_output_name(tmp_path, elmo):
    """A failure mid-run leaves no output and no temporary file, only the resumable
    OUT.partial/ state (before resumable runs, it left nothing at all)."""
    src = _write(tmp_path / "in.txt", ["a b", "c d e"])

    class Boom(Exception):
        pass

    class Exploding:
        def __init__(self):
            self.config, self.params, self.batch_size, self.calls = elmo.config, elmo.params, 64, 0

        def embed(self, *a, **k):
            self.calls += 1
            if self.calls == 2:
                raise Boom()
            return elmo.embed(*a, **k)

    with pytest.raises(Boom):
        embed_file(Exploding(), src, tmp_path / "out.hdf5", group_lines=1, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5.partial"]
    embed_file(elmo, src, tmp_path / "out.hdf5", group_lines=1, progress=False)
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "out.hdf5"]


def test_cli_bfloat16_embeds_within_tolerance(tmp_path, model_dir, elmo):
    src = _write(tmp_path / "in.txt", LINES[:2])
    out = tmp_path / "bf16.hdf5"
    assert (
        main(["embed", str(src), str(out), "--top", "--model", str(model_dir), "--dtype", "bfloat16", "--no-progress"])
        == 0
    )
    expected = elmo.embed(LINES[:2], layers="top")
    with h5py.File(out, "r") as f:
        for i, e in enumerate(expected):
            got = f[str(i)][...]
            assert got.dtype == np.float32
            assert 0.0 < np.abs(got - e).max() / np.abs(e).max() <= 2e-2


def test_sigterm_during_a_command_is_one_line_and_143(tmp_path, monkeypatch, capsys):
    """SIGTERM to `elmo-jax embed` (here while it loads the model): one line, status 143
    (stopped), and the caller's SIGTERM handler is back afterwards."""
    import signal

    from elmo_jax import cli

    (tmp_path / "in.txt").write_text("a b\n", encoding="utf-8")

    def load(*a, **k):
        signal.raise_signal(signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the command")

    from elmo_jax.embedding.embedder import Elmo

    monkeypatch.setattr(Elmo, "random", staticmethod(load))
    before = signal.getsignal(signal.SIGTERM)
    assert (
        cli.main(
            [
                "embed",
                str(tmp_path / "in.txt"),
                str(tmp_path / "out.hdf5"),
                "--top",
                "--preset",
                "tiny",
                "--no-progress",
            ]
        )
        == 143
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["elmo-jax embed: stopped by SIGTERM"]
    assert signal.getsignal(signal.SIGTERM) is before
    assert not (tmp_path / "out.hdf5").exists()
