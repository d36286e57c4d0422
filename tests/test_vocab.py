"""Vocabulary: building, the original file format, bad files."""

import numpy as np
import pytest

from elmo_jax.data.vocab import Vocabulary


def test_build_orders_specials_then_frequency_ties_by_first_occurrence():
    v = Vocabulary.build(["b a c", "a c d", "a"])
    # counts: a 3, c 2, b 1, d 1 (b first seen before d)
    assert v.tokens == ["<S>", "</S>", "<UNK>", "a", "c", "b", "d"]
    assert (v.bos_id, v.eos_id, v.unk_id) == (0, 1, 2)
    assert len(v) == 7


def test_build_from_counts_min_count_max_size_and_specials_not_duplicated():
    v = Vocabulary.build({"x": 5, "<UNK>": 9, "y": 1, "z": 5}, min_count=2)
    assert v.tokens == ["<S>", "</S>", "<UNK>", "x", "z"]
    v = Vocabulary.build({"x": 5, "y": 4, "z": 3}, max_size=4)
    assert v.tokens == ["<S>", "</S>", "<UNK>", "x"]


def test_round_trip_utf8(tmp_path):
    v = Vocabulary.build(["héllo wörld 世界 héllo"])
    path = tmp_path / "vocab.txt"
    v.save(path)
    assert path.read_bytes().decode("utf-8").split("\n")[:4] == ["<S>", "</S>", "<UNK>", "héllo"]
    assert Vocabulary.load(path) == v


def test_encode_unknown_to_unk():
    v = Vocabulary.build(["a b"])
    ids = v.encode(["a", "zzz", "b"])
    assert ids.dtype == np.int32
    assert ids.tolist() == [v.id_of("a"), v.unk_id, v.id_of("b")]
    assert v.id_of("nope") == v.unk_id
    assert v.encode([]).shape == (0,)


def test_released_format_keeps_file_order(tmp_path):
    # The released file: frequency order with the specials near (not at) the top.
    path = tmp_path / "vocab.txt"
    path.write_bytes("the\n</S>\n<S>\n,\n<UNK>\n.\n".encode("utf-8"))
    v = Vocabulary.load(path)
    assert v.tokens == ["the", "</S>", "<S>", ",", "<UNK>", "."]
    assert (v.bos_id, v.eos_id, v.unk_id) == (2, 1, 4)


def test_missing_specials_added_with_warning(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("the\n<S>\nof\n", encoding="utf-8")
    with pytest.warns(UserWarning, match=r"</S>, <UNK>"):
        v = Vocabulary.load(path)
    # appended: the file's ids do not move
    assert v.tokens == ["the", "<S>", "of", "</S>", "<UNK>"]


def test_bad_files(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"<S>\n</S>\n<UNK>\nok\nba\xffd\n")
    with pytest.raises(ValueError, match=r"bad\.txt, line 5: not valid UTF-8"):
        Vocabulary.load(bad)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"\n\n")
    with pytest.raises(ValueError, match=r"empty\.txt is empty"):
        Vocabulary.load(empty)
    dup = tmp_path / "dup.txt"
    dup.write_text("<S>\n</S>\n<UNK>\nthe\nof\nthe\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 6: duplicated token 'the' \(first on line 4\)"):
        Vocabulary.load(dup)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        Vocabulary.load(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="duplicated token 'a'"):
        Vocabulary(["<S>", "</S>", "<UNK>", "a", "a"])


def test_fixture_vocab(bilm_fixtures):
    v = Vocabulary.load(bilm_fixtures / "train" / "vocab.txt")
    assert v.tokens[:3] == ["<S>", "</S>", "<UNK>"]
    assert len(v) == 32
    assert v.id_of("the") == 4
