"""Sentence sources: local text through a TFDS ArrayRecord builder, lm1b, the extracted 1B."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from elmo_jax.data import text_source as ts

REPO = Path(__file__).resolve().parents[1]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_local_text_round_trip_and_blank_lines(tmp_path, capsys):
    f1 = _write(tmp_path / "a.txt", "the cat sat .\n\n   \nle  café  \tnoir\r\n".encode("utf-8"))
    f2 = _write(tmp_path / "b.txt", b"last one")  # no final newline
    src = ts.make_source(f"text:{f1},{f2}", data_dir=tmp_path / "tfds")
    assert isinstance(src, ts.SentenceSource)
    assert src.prepared_now
    # One line of ours, not TFDS's "Downloading and preparing dataset Unknown size ..." for local text.
    out = capsys.readouterr().out
    assert "Downloading" not in out and "Unknown size" not in out
    assert out.count("preparing 2 files") == 1, out
    expected = [["the", "cat", "sat", "."], ["le", "café", "noir"], ["last", "one"]]
    assert len(src) == 3
    assert [src[i] for i in range(3)] == expected
    assert src.get_batch([2, 0]) == [expected[2], expected[0]]
    assert list(src) == expected
    assert src.num_tokens() == 9
    # It was written as ArrayRecord under data_dir.
    version_dir = Path(src.builder.data_dir)
    assert version_dir.is_relative_to(tmp_path / "tfds")
    assert any("array_record" in p.name for p in version_dir.iterdir())


def test_preparation_is_cached_and_keyed_on_the_files(tmp_path):
    f = _write(tmp_path / "a.txt", b"one two\nthree\n")
    first = ts.LocalTextSource(str(f), tmp_path / "tfds")
    marker = Path(first.builder.data_dir) / "elmo_jax_ready.json"
    stamp = marker.stat().st_mtime_ns
    second = ts.LocalTextSource(str(tmp_path / "*.txt"), tmp_path / "tfds")  # same file via a glob
    assert first.prepared_now and not second.prepared_now
    assert second.builder.data_dir == first.builder.data_dir
    assert marker.stat().st_mtime_ns == stamp
    assert list(second) == [["one", "two"], ["three"]]
    # Changed content (size/mtime) -> a different prepared dataset, not the stale one.
    time.sleep(0.01)
    f.write_bytes(b"four five six\n")
    third = ts.LocalTextSource(str(f), tmp_path / "tfds")
    assert third.prepared_now and third.builder.data_dir != first.builder.data_dir
    assert list(third) == [["four", "five", "six"]]


def test_invalid_utf8_names_file_and_line(tmp_path):
    f = _write(tmp_path / "bad.txt", b"fine line\n\nstill fine\nbro\xe9ken here\n")
    with pytest.raises(ValueError, match=r"bad\.txt, line 4: not valid UTF-8"):
        ts.LocalTextSource(str(f), tmp_path / "tfds")


def test_missing_files_and_empty_corpus(tmp_path):
    with pytest.raises(FileNotFoundError, match="text file not found"):
        ts.make_source(str(tmp_path / "nope.txt"), data_dir=tmp_path / "tfds")
    with pytest.raises(FileNotFoundError, match="no file matches the glob"):
        ts.make_source(f"text:{tmp_path}/*.nothing", data_dir=tmp_path / "tfds")
    with pytest.raises(FileNotFoundError, match="is a directory"):
        ts.make_source(str(tmp_path), data_dir=tmp_path / "tfds")
    empty = _write(tmp_path / "empty.txt", b"\n  \n\n")
    with pytest.raises(ValueError, match="empty corpus"):
        ts.make_source(str(empty), data_dir=tmp_path / "tfds")


def test_other_processes_wait_for_process_0(tmp_path):
    f = _write(tmp_path / "a.txt", b"x y\nz\n")
    with pytest.raises(TimeoutError, match="process 0 did not finish"):
        ts.prepare_local_text(str(f), tmp_path / "tfds", process_index=1, wait_timeout_s=0.3, poll_s=0.05)
    results = {}

    def waiter():
        results["info"] = ts.prepare_local_text(
            str(f), tmp_path / "tfds", process_index=1, wait_timeout_s=60, poll_s=0.05
        )[1]

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    assert t.is_alive()  # still waiting: nobody prepared yet
    _, info0 = ts.prepare_local_text(str(f), tmp_path / "tfds", process_index=0)
    t.join(30)
    assert info0["prepared_now"] and not results["info"]["prepared_now"]
    assert results["info"]["num_sentences"] == 2


def test_lm1b_extracted_layout(tmp_path):
    top = tmp_path / "1-billion-word-language-modeling-benchmark-r13output"
    train = top / "training-monolingual.tokenized.shuffled"
    held = top / "heldout-monolingual.tokenized.shuffled"
    train.mkdir(parents=True)
    held.mkdir(parents=True)
    _write(train / "news.en-00001-of-00100", b"a b c\n")
    _write(train / "news.en-00002-of-00100", b"d e\n")
    _write(held / "news.en.heldout-00000-of-00050", b"f\n")
    _write(held / "news.en.heldout-00001-of-00050", b"g h\n")
    for root in (tmp_path, top):
        assert ts.lm1b_extracted_files(root, "train") == str(train / "news.en-*-of-00100")
    src = ts.make_source(f"lm1b-extracted:{tmp_path}", "train", tmp_path / "tfds")
    assert list(src) == [["a", "b", "c"], ["d", "e"]]
    src = ts.make_source(f"lm1b-extracted:{top}", "test", tmp_path / "tfds")
    assert list(src) == [["f"], ["g", "h"]]
    assert list(ts.make_source(f"lm1b-extracted:{top}", "heldout0", tmp_path / "tfds")) == [["f"]]
    with pytest.raises(FileNotFoundError, match="no 1B Word Benchmark train files"):
        ts.lm1b_extracted_files(tmp_path / "elsewhere", "train")
    with pytest.raises(ValueError, match="unknown lm1b split"):
        ts.lm1b_extracted_files(top, "dev")
    # Without --config.heldout a run on the extracted benchmark evaluates on its usual test file.
    from elmo_jax.train.loop import default_heldout

    assert default_heldout(f"lm1b-extracted:{tmp_path}") == str(held / "news.en.heldout-00000-of-00050")
    assert default_heldout("lm1b") == "lm1b" and default_heldout(str(tmp_path / "x.txt")) is None
    (held / "news.en.heldout-00000-of-00050").unlink()  # only the training files extracted
    assert default_heldout(f"lm1b-extracted:{tmp_path}") is None


def test_specs_that_look_like_globs_or_lm1b_variants(tmp_path):
    """A file whose name holds glob characters is read literally; 'lm1b:...' spellings that
    would silently read another split are refused."""
    literal = _write(tmp_path / "corpus[2020].txt", b"the literal file\n")
    _write(tmp_path / "corpus0.txt", b"not me\n")
    _write(tmp_path / "corpus2.txt", b"nor me\n")
    assert ts.expand_files(str(literal)) == [str(literal)]
    assert len(ts.expand_files(str(tmp_path / "corpus[02].txt"))) == 2  # a real glob still globs
    comma = _write(tmp_path / "a,b.txt", b"x\n")
    assert ts.expand_files(str(comma)) == [str(comma)]
    assert len(ts.expand_files(f"{tmp_path / 'corpus0.txt'},{tmp_path / 'corpus2.txt'}")) == 2
    for spec in ("lm1b:test", "tfds:lm1b/test"):
        with pytest.raises(ValueError, match="spelled 'lm1b'"):
            ts.make_source(spec, "train", tmp_path / "tfds")


def test_content_id_follows_the_sentences_not_the_paths(tmp_path):
    a = _write(tmp_path / "a.txt", b"one two\n\nthree\n")
    (tmp_path / "sub").mkdir()
    b = _write(tmp_path / "sub" / "a.txt", b"one  two\nthree\n")  # same sentences, other bytes
    c = _write(tmp_path / "c.txt", b"one two\nfour\n")
    ids = [ts.LocalTextSource(str(p), tmp_path / "tfds").content_id() for p in (a, b, c)]
    assert ids[0] == ids[1] != ids[2]
    assert ids[0] == ts.InMemorySource(["one two", "three"]).content_id()
    # Data prepared by an older version (no digest in its marker) gets one on first use,
    # kept in the marker when its folder is writable and in memory when it is not.
    src = ts.LocalTextSource(str(a), tmp_path / "tfds")
    marker = Path(src.builder.data_dir) / "elmo_jax_ready.json"
    info = json.loads(marker.read_text())
    del info["content_sha256"]
    marker.write_text(json.dumps(info))

    def read_only(*args):
        raise OSError(30, "Read-only file system")

    real = ts._write_marker
    ts._write_marker = read_only
    try:
        assert ts.LocalTextSource(str(a), tmp_path / "tfds").content_id() == ids[0]
    finally:
        ts._write_marker = real
    assert "content_sha256" not in json.loads(marker.read_text())
    assert ts.LocalTextSource(str(a), tmp_path / "tfds").content_id() == ids[0]
    assert "content_sha256" in json.loads(marker.read_text())


def test_fixture_corpus(tmp_path, bilm_fixtures):
    path = bilm_fixtures / "train" / "data.txt"
    lines = [line.split() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    src = ts.make_source(f"text:{path}", data_dir=tmp_path / "tfds")
    assert list(src) == lines
    assert src.num_tokens() == sum(map(len, lines))


def test_lm1b_mock_data_without_tensorflow(tmp_path):
    """lm1b through tfds.data_source under mock_data, and the whole pipeline, never import TF.

    Run in a fresh interpreter so that no other test's imports can hide or cause an import.
    """
    script = textwrap.dedent(
        f"""
        import sys
        import tensorflow_datasets as tfds
        from elmo_jax.data.text_source import make_source, Lm1bSource, LocalTextSource
        from elmo_jax.data.vocab import Vocabulary
        from elmo_jax.data.batches import LMBatcher

        with tfds.testing.mock_data(num_examples=12):
            src = make_source("lm1b", split="train", data_dir={str(tmp_path / "none")!r})
            assert isinstance(src, Lm1bSource), src
            assert len(src) == 12
            sents = [src[i] for i in range(12)]
            assert all(isinstance(t, str) for s in sents for t in s), sents
            assert src.get_batch([3, 1]) == [sents[3], sents[1]]
            assert src.num_tokens() == sum(map(len, sents))
            vocab = Vocabulary.build(sents)
            batches = list(LMBatcher(src, vocab, batch_size=2, unroll_steps=4, num_epochs=1))
            assert batches and batches[0]["fwd_char_ids"].shape == (2, 4, 50)
        with open({str(tmp_path / "a.txt")!r}, "w", encoding="utf-8") as f:
            f.write("a b\\nc d e\\n")
        local = LocalTextSource({str(tmp_path / "a.txt")!r}, {str(tmp_path / "tfds")!r})
        next(LMBatcher(local, vocab, batch_size=2, unroll_steps=3))
        print("TF_IMPORTED", "tensorflow" in sys.modules)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "TF_IMPORTED False" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_unprepared_lm1b_is_a_clear_error_and_never_downloads(tmp_path, monkeypatch):
    import socket

    from elmo_jax.errors import ElmoError

    def no_network(*args, **kwargs):
        raise AssertionError("lm1b must not be downloaded")

    monkeypatch.setattr(socket, "create_connection", no_network)
    with pytest.raises(ElmoError, match=r"no prepared lm1b under .*(.|\n)*tfds build lm1b"):
        ts.Lm1bSource("train", data_dir=tmp_path)
