"""A NUL byte in text is refused where the text is read, naming the file and line (or the
sentence) and how to remove it: training text (one process and parallel), vocabulary files,
``elmo-jax embed`` input in every output layout, and sentences given to ``Elmo.embed``."""

import pytest

from elmo_jax.cli import main
from elmo_jax.data import text_shards
from elmo_jax.data import text_source as ts
from elmo_jax.data.text_source import InMemorySource
from elmo_jax.data.vocab import Vocabulary
from elmo_jax.embedding.embed_input import scan_input
from elmo_jax.textio import NulByteError, TextEncodingError

TEXT = b"the cat sat\non the mat\nthe \x00dog\x00 barked\nlast line\n"
FIX = r"tr -d '\\000'"


@pytest.fixture
def nul_file(tmp_path):
    path = tmp_path / "nul.txt"
    path.write_bytes(TEXT)
    return path


def _leftover_files(folder):
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


def test_training_text_with_a_nul_is_refused_naming_the_line(nul_file, tmp_path):
    with pytest.raises(NulByteError, match=rf"nul.txt, line 3: holds a NUL byte .*position 4.*{FIX}"):
        ts.LocalTextSource(str(nul_file), tmp_path / "tfds")
    assert _leftover_files(tmp_path / "tfds") == []


def test_parallel_preparation_refuses_a_nul_naming_the_line(nul_file, tmp_path, monkeypatch):
    monkeypatch.setattr(text_shards, "_CHUNK_MIN", 16)  # several ranges, the NUL in a later one
    with pytest.raises(TextEncodingError, match=rf"nul.txt, line 3: holds a NUL byte.*{FIX}"):
        ts.LocalTextSource(str(nul_file), tmp_path / "tfds", workers=2)
    assert _leftover_files(tmp_path / "tfds") == []


def test_in_memory_training_sentences_with_a_nul_are_refused():
    with pytest.raises(NulByteError, match="sentence 1: holds a NUL byte"):
        InMemorySource(["fine", "bad\x00word"])
    with pytest.raises(NulByteError, match="sentence 0: holds a NUL byte"):
        InMemorySource([["a", "\x00"]])


def test_a_vocabulary_file_with_a_nul_is_refused(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes(b"<S>\n</S>\n<UNK>\n\x00dog\x00\n")
    with pytest.raises(NulByteError, match=rf"vocab.txt, line 4: holds a NUL byte.*{FIX}"):
        Vocabulary.load(path)


def test_embed_input_with_a_nul_is_refused_at_the_scan(nul_file):
    with pytest.raises(NulByteError, match=r"nul.txt, line 3: holds a NUL byte"):
        scan_input(nul_file, group_lines=2, max_tokens=100)


@pytest.mark.parametrize(
    "layout",
    [
        ["--all"],
        ["--top", "--format", "packed"],
        ["--average", "--format", "allennlp"],
        ["--average", "--sentence-vectors"],
    ],
)
def test_embed_refuses_a_nul_before_embedding_in_every_layout(nul_file, tmp_path, layout, capsys):
    out = tmp_path / "out.hdf5"
    assert main(["embed", str(nul_file), str(out), *layout, "--preset", "tiny", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "nul.txt, line 3: holds a NUL byte" in err and "tr -d" in err
    assert "VLEN" not in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nul.txt"]  # no output, no .partial
    if "packed" not in layout:
        return
    # Removed as the message says, the same command works.
    nul_file.write_bytes(TEXT.replace(b"\x00", b""))
    assert main(["embed", str(nul_file), str(out), *layout, "--preset", "tiny", "--no-progress"]) == 0


def test_elmo_embed_refuses_a_nul_in_a_sentence():
    from elmo_jax import Elmo

    elmo = Elmo.random("tiny", seed=0)
    with pytest.raises(NulByteError, match=rf"sentence 1: holds a NUL byte.*position 4.*{FIX}"):
        elmo.embed(["fine", "the \x00dog"])
    with pytest.raises(NulByteError, match="sentence 0: holds a NUL byte"):
        elmo.embed([["a", "b\x00"]])
    assert [a.shape for a in elmo.embed(["the dog"], layers="top")] == [(2, elmo.config.output_dim)]


def test_a_vocabulary_with_a_nul_token_is_not_written(tmp_path):
    """What every reader refuses is not written either (a vocabulary built from token lists)."""
    with pytest.raises(ValueError, match=r"'\\x00dog' \(id 3\) cannot be written .*a NUL byte"):
        Vocabulary(["<S>", "</S>", "<UNK>", "\x00dog"]).save(tmp_path / "vocab.txt")
    assert not (tmp_path / "vocab.txt").exists()
