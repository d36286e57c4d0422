"""``elmo-jax embed`` at corpus scale: layouts read back by ``read_embeddings``, resume after a
failure / SIGTERM / kill -9 bit for bit, changed input or model refused, bad lines, protected
files, and two processes writing shards.

All on a tiny random model; sentences of 1-6 tokens in groups of 16 lines with
``batch_size=16``, so every group runs the same compiled program (one time bucket, one row
bucket): bit-equality between a resumed and an uninterrupted run is the right check.
"""

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import h5py
import jax
import numpy as np
import pytest

from elmo_jax import Elmo, read_embeddings

from elmo_jax.embedding import embed_layouts
from elmo_jax.cli import main
from elmo_jax.embedding.embed_file import EmbedStopped, embed_file
from tests.conftest import device_env, unmount

REPO = Path(__file__).resolve().parents[1]
N_LINES = 96
GROUP = ["--group-lines", "16", "--batch-size", "16", "--no-progress"]


def _lines(n=N_LINES, seed=0):
    rng = np.random.default_rng(seed)
    words = ["the", "bank", "river", "money", "she", "went", "to", "a", "of", "银行", "取钱", "去"]
    return [" ".join(rng.choice(words, size=rng.integers(1, 7))) for _ in range(n)]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    path = tmp_path_factory.mktemp("input") / "in.txt"
    path.write_text("\n".join(_lines()) + "\n", encoding="utf-8")
    return path


def _embed(elmo, src, out, layout="packed", layers="top", **kw):
    return embed_file(elmo, src, out, layers, layout=layout, group_lines=16, batch_size=16, progress=False, **kw)


def _contents(path) -> dict:
    """Every dataset's bytes, dtype and shape, and the file attributes."""
    out = {}

    def visit(name, d):
        if isinstance(d, h5py.Dataset):
            value = d.asstr()[...].tolist() if d.dtype.kind == "O" else d[...].tobytes()
            out[name] = (d.dtype.str, d.shape, value)

    with h5py.File(path, "r") as f:
        f.visititems(visit)
        out["attrs"] = dict(f.attrs)
    return out


@pytest.fixture(scope="module")
def reference(elmo, src, tmp_path_factory):
    """Uninterrupted runs, per layout (layers="top")."""
    d = tmp_path_factory.mktemp("reference")
    return {layout: _embed(elmo, src, d / f"{layout}.hdf5", layout)["output"] for layout in embed_layouts.LAYOUTS}


@pytest.mark.fidelity
@pytest.mark.parametrize("layout", embed_layouts.LAYOUTS)
@pytest.mark.parametrize("layers", ["top", "all"])
def test_every_layout_reads_back_as_embed_gives(elmo, tmp_path, layout, layers):
    lines = _lines(40, seed=1)
    lines[7] = ""  # an empty line is an empty sentence
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _embed(elmo, tmp_path / "in.txt", tmp_path / "out.hdf5", layout, layers)
    if layout == "sentence_vectors":
        expected = list(elmo.sentence_vectors(lines, layers, batch_size=16))
    else:
        expected = elmo.embed(lines, layers, batch_size=16)
    with read_embeddings(tmp_path / "out.hdf5") as emb:
        assert len(emb) == 40 and emb.layout == layout
        for got, e in zip(emb, expected):
            assert got.shape == e.shape and got.dtype == np.float32
            np.testing.assert_allclose(got, e, atol=1e-6, rtol=0)
        width = (3, 64) if layers == "all" else (64,)
        assert emb[7].shape == (width if layout == "sentence_vectors" else width[:-1] + (0, 64))
        np.testing.assert_array_equal(emb[-1], emb[39])
        assert emb.line(12) == 12 and emb.sentence(12) == lines[12] and emb.sentence(7) == ""
        with pytest.raises(IndexError, match="40 sentences"):
            emb[40]
    if layout == "allennlp":  # still the layout other tools read
        with h5py.File(tmp_path / "out.hdf5", "r") as f:
            assert json.loads(f["sentence_to_index"][0])[lines[3]] in {
                str(i) for i, s in enumerate(lines) if s == lines[3]
            }


@pytest.mark.parametrize("layout", ["packed", "allennlp"])
def test_full_disk_mid_group_resumes_bit_for_bit(elmo, src, tmp_path, reference, monkeypatch, layout, capsys):
    out = tmp_path / "out.hdf5"
    original, calls = embed_layouts.append, []

    def half_then_full_disk(f, first_line, arrays, texts):
        calls.append(first_line)
        if len(calls) == 3:  # group 3: half of it reaches the file, then the disk is full
            original(f, first_line, arrays[:8], texts[:8])
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(f, first_line, arrays, texts)

    monkeypatch.setattr(embed_layouts, "append", half_then_full_disk)
    with pytest.raises(Exception, match="No space left on device.*lines before 33 are kept.*run the same command"):
        _embed(elmo, src, out, layout)
    assert not out.exists() and (tmp_path / "out.hdf5.partial" / "progress.json").exists()
    monkeypatch.setattr(embed_layouts, "append", original)
    result = _embed(elmo, src, out, layout, say=print)
    assert "resuming from line 33 (32 of 96 lines were done" in capsys.readouterr().out
    assert result["resumed_from"] == 32 and result["sentences"] == N_LINES - 32
    assert _contents(out) == _contents(reference[layout])
    assert sorted(os.listdir(tmp_path)) == ["out.hdf5"]


def test_sigterm_stops_at_a_group_end_and_the_run_continues(elmo, src, tmp_path, reference, monkeypatch):
    out = tmp_path / "out.hdf5"
    original, calls = embed_layouts.append, []

    def terminated(*a):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while group 2 is being written
        return original(*a)

    monkeypatch.setattr(embed_layouts, "append", terminated)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(EmbedStopped, match="stopped by SIGTERM after line 32 of 96"):
        _embed(elmo, src, out)
    monkeypatch.setattr(embed_layouts, "append", original)
    assert signal.getsignal(signal.SIGTERM) is before  # the run's handler is gone
    assert not out.exists()
    assert _embed(elmo, src, out)["resumed_from"] == 32
    assert _contents(out) == _contents(reference["packed"])


def _partial_run(elmo, src, out, monkeypatch, **kw):
    """A run stopped by a failure after two groups."""
    original = embed_layouts.append

    def failing(f, first_line, *a):
        if first_line >= 32:
            raise OSError(errno.EIO, "Input/output error")
        return original(f, first_line, *a)

    with monkeypatch.context() as mp:
        mp.setattr(embed_layouts, "append", failing)
        with pytest.raises(Exception, match="Input/output error"):
            _embed(elmo, src, out, **kw)


def test_changed_input_model_or_options_are_refused_and_restart_starts_over(
    elmo, src, tmp_path, reference, monkeypatch
):
    out = tmp_path / "out.hdf5"
    changed = tmp_path / "in.txt"
    changed.write_bytes(src.read_bytes())
    _partial_run(elmo, changed, out, monkeypatch)
    with open(changed, "a", encoding="utf-8") as f:
        f.write("one more line\n")
    with pytest.raises(
        Exception,
        match=r"does not match this one: the input file changed: .*in.txt now has 97 lines"
        r".*the partial run read 96 lines.*nothing was mixed.*--restart",
    ):
        _embed(elmo, changed, out)
    changed.write_bytes(src.read_bytes())
    with pytest.raises(Exception, match="the model changed"):
        _embed(Elmo.random("tiny", seed=6), changed, out)
    with pytest.raises(Exception, match="the option layers is now 'all', the partial run used 'top'"):
        _embed(elmo, changed, out, layers="all")
    with pytest.raises(Exception, match="the option layout is now 'allennlp'"):
        _embed(elmo, changed, out, layout="allennlp")
    assert not out.exists()
    # The same input, model and options continue; --restart would start over.
    with open(changed, "a", encoding="utf-8") as f:
        f.write("one more line\n")
    result = _embed(elmo, changed, out, restart=True)
    assert result["resumed_from"] is None and result["sentences"] == 97


def test_bad_lines_are_named_and_nothing_is_written(model_dir, tmp_path, capsys):
    m = ["--top", "--model", str(model_dir), *GROUP]
    out = tmp_path / "out.hdf5"
    (tmp_path / "long.txt").write_text("a b\n" + " ".join(["w"] * 100_000) + "\nc\n", encoding="utf-8")
    assert main(["embed", str(tmp_path / "long.txt"), str(out), *m]) == 2
    err = capsys.readouterr().err
    assert "long.txt, line 2: 100000 tokens, more than --max-tokens 10000" in err and "split the line" in err
    (tmp_path / "latin1.txt").write_bytes("ok\n".encode() * 20 + "caf\xe9\n".encode("latin-1"))
    assert main(["embed", str(tmp_path / "latin1.txt"), str(out), *m]) == 2
    assert "line 21: not valid UTF-8" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latin1.txt", "long.txt"]


def test_overwrite_never_replaces_a_models_or_a_runs_files(model_dir, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("a b\n", encoding="utf-8")
    model = tmp_path / "run" / "export"
    Elmo.load(model_dir).save(model)
    (model / "vocab.txt").write_text("<S>\n</S>\n<UNK>\n", encoding="utf-8")
    (tmp_path / "run" / "checkpoints").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n", encoding="utf-8")
    for victim in (model / "vocab.txt", tmp_path / "run" / "metrics.jsonl", model / "weights.hdf5"):
        before = victim.read_bytes()
        assert main(["embed", str(src), str(victim), "--top", "--model", str(model), "--overwrite", *GROUP]) == 2
        err = capsys.readouterr().err
        assert "whatever --overwrite says" in err, err
        assert victim.read_bytes() == before
    # A new file beside the model is fine.
    assert main(["embed", str(src), str(model / "new.hdf5"), "--top", "--model", str(model), *GROUP]) == 0


def _env(devices: int = 1) -> dict:
    env = device_env(
        devices, PYTHONUNBUFFERED="1", JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir or ""
    )
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        env.pop(k, None)
    if not env["JAX_COMPILATION_CACHE_DIR"]:
        env.pop("JAX_COMPILATION_CACHE_DIR")
    return env


# The CLI in a subprocess; KILL_AT (a call count of a patched function) makes it kill -9 itself
# at that exact point: mid-group (half of a group written) or after a flush, before the progress.
_CLI = textwrap.dedent("""
    import os, signal, sys
    from elmo_jax.embedding import embed_layouts, embed_state
    where, at = sys.argv[1], int(sys.argv[2])
    if where == "mid_group":
        original, calls = embed_layouts.append, []
        def append(f, first_line, arrays, texts):
            calls.append(1)
            if len(calls) == at:
                original(f, first_line, arrays[:5], texts[:5])
                f.flush()  # as much of the half group on disk as a kill can leave
                os.kill(os.getpid(), signal.SIGKILL)
            return original(f, first_line, arrays, texts)
        embed_layouts.append = append
    elif where == "before_progress":
        original_w, calls = embed_state.write_progress, []
        def write_progress(*a):
            calls.append(1)
            if len(calls) == at:
                os.kill(os.getpid(), signal.SIGKILL)
            return original_w(*a)
        embed_state.write_progress = write_progress
    from elmo_jax.cli import main
    sys.exit(main(sys.argv[3:]))
""")


def _cli_process(where: str, at: int, args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _CLI, where, str(at), *args],
        env=_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **kw,
    )


@pytest.mark.parametrize("where", ["random", "mid_group", pytest.param("before_progress", marks=pytest.mark.slow)])
def test_kill_9_then_the_same_command_finishes_bit_for_bit(model_dir, elmo, src, tmp_path, reference, where):
    out = tmp_path / "out.hdf5"
    args = ["embed", str(src), str(out), "--top", "--format", "packed", "--model", str(model_dir), *GROUP]
    proc = _cli_process(where, 3, args)
    try:
        if where == "random":  # killed once it has flushed 2 groups, as the progress file says
            progress = tmp_path / "out.hdf5.partial" / "progress.json"
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and proc.poll() is None:
                if progress.exists() and json.loads(progress.read_text())["lines_done"] >= 32:
                    break
                time.sleep(0.01)
            proc.send_signal(signal.SIGKILL)
        log = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, log
    assert not out.exists()
    done = json.loads((tmp_path / "out.hdf5.partial" / "progress.json").read_text())["lines_done"]
    assert done >= 32 if where == "random" else done == {"mid_group": 32, "before_progress": 16}[where]
    result = _embed(elmo, src, out)
    assert result["resumed_from"] == done
    assert _contents(out) == _contents(reference["packed"])
    assert sorted(os.listdir(tmp_path)) == ["out.hdf5"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(args: list[str], n: int = 2, kill: dict | None = None) -> list[subprocess.Popen]:
    """``n`` CLI processes of one job; ``kill``: {process: (where, at)} as in ``_CLI``."""
    port = _free_port()
    procs = []
    for i in range(n):
        where, at = (kill or {}).get(i, ("none", 0))
        dist = [
            "--coordinator",
            f"127.0.0.1:{port}",
            "--num-processes",
            str(n),
            "--process-id",
            str(i),
            "--heartbeat-timeout",
            "10",
        ]
        procs.append(_cli_process(where, at, args + dist))
    return procs


def _wait(procs, timeout=300) -> list[str]:
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return logs


def test_two_processes_write_shards_read_as_one(model_dir, src, tmp_path, reference):
    out = tmp_path / "out.shards"
    args = ["embed", str(src), str(out), "--top", "--format", "packed", "--model", str(model_dir), *GROUP]
    procs = _job(args)
    logs = _wait(procs)
    assert [p.returncode for p in procs] == [0, 0], logs
    assert "1 device(s) x 2 host(s)" in logs[0]
    # The job's totals (both shares added up), said once, by process 0.
    tokens = sum(len(line.split()) for line in _lines())
    assert f"wrote {N_LINES} sentences ({tokens} tokens, " in logs[0], logs[0]
    assert "wrote " not in logs[1], logs[1]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(s["first_line"], s["end_line"]) for s in manifest["shards"]] == [(0, 48), (48, 96)]
    assert sorted(os.listdir(tmp_path)) == ["out.shards"]
    with read_embeddings(out) as sharded, read_embeddings(reference["packed"]) as single:
        assert len(sharded) == len(single) == N_LINES
        for i in range(N_LINES):
            np.testing.assert_allclose(sharded[i], single[i], atol=1e-6, rtol=0)
            assert sharded.line(i) == i and sharded.sentence(i) == single.sentence(i)


@pytest.mark.slow  # two jobs and a heartbeat timeout
def test_a_killed_process_resumes_its_own_shard(model_dir, src, tmp_path, reference):
    out = tmp_path / "out.shards"
    args = ["embed", str(src), str(out), "--top", "--format", "packed", "--model", str(model_dir), *GROUP]
    procs = _job(args, kill={1: ("mid_group", 2)})  # process 1 dies writing its second group (lines 64-79)
    logs = _wait(procs, timeout=300)
    assert procs[1].returncode == -signal.SIGKILL and procs[0].returncode != 0, logs
    assert not out.exists()
    assert (tmp_path / "out.shards.partial" / "shard-00000-of-00002.hdf5").exists()  # process 0 had finished
    procs = _job(args)
    logs = _wait(procs)
    assert [p.returncode for p in procs] == [0, 0], logs
    assert "shard 0 of 2 is already complete" in logs[0]
    assert "resuming from line 65 (16 of 48 lines were done" in logs[1]
    assert "resumed at line 65 (process 1)" in logs[0] and "wrote " not in logs[1], logs
    with read_embeddings(out) as sharded, read_embeddings(reference["packed"]) as single:
        assert len(sharded) == N_LINES
        for i in range(N_LINES):
            np.testing.assert_allclose(sharded[i], single[i], atol=1e-6, rtol=0)


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs (needs root and mount; skipped elsewhere)."""
    folder = tmp_path / "small"
    folder.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(folder)], capture_output=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mount.stderr.decode().strip() or mount.returncode})")
    try:
        yield folder
    finally:
        unmount(folder)


def test_a_real_full_disk_keeps_the_partial_output_and_resumes(elmo, src, reference, small_disk, monkeypatch):
    out = small_disk / "out.hdf5"
    filler = small_disk / "filler"
    original, calls = embed_layouts.append, []

    def fill_the_disk(*a):
        calls.append(1)
        if len(calls) == 3:  # another program takes every free byte while group 3 is written
            with open(filler, "wb") as f:
                try:
                    while True:
                        f.write(b"x" * 65536)
                        f.flush()
                except OSError:
                    pass
        return original(*a)

    monkeypatch.setattr(embed_layouts, "append", fill_the_disk)
    with pytest.raises(Exception, match=r"No space left on device.*lines before 49 are kept"):
        _embed(elmo, src, out, "allennlp")
    assert not out.exists()
    monkeypatch.setattr(embed_layouts, "append", original)
    filler.unlink()  # space freed: the same command continues
    assert _embed(elmo, src, out, "allennlp")["resumed_from"] == 48
    assert _contents(out) == _contents(reference["allennlp"])
    assert sorted(os.listdir(small_disk)) == ["out.hdf5"]
    assert os.path.getsize(out) < 2 * os.path.getsize(reference["allennlp"])  # the reserved space is given back
