import numpy as np
import pytest

from elmo_jax import batch_to_ids
from elmo_jax.chars import token_to_ids, tokens_to_ids


def raw(ids):
    return (np.asarray(ids) - 1).tolist()


def test_reference_examples_max_length_5():
    assert raw(token_to_ids("th", 5)) == [258, 116, 104, 259, 260]
    assert raw(token_to_ids("thhhhh", 5)) == [258, 116, 104, 104, 259]


def test_sentence_markers_are_whole_tokens():
    assert raw(token_to_ids("<S>"))[:4] == [258, 256, 259, 260]
    assert raw(token_to_ids("</S>"))[:4] == [258, 257, 259, 260]
    assert raw(token_to_ids("<S>"))[4:] == [260] * 46


def test_batch_shape_padding_and_offset():
    ids = batch_to_ids([["a", "bc"], ["d"], []])
    assert ids.shape == (3, 2, 50) and ids.dtype == np.int32
    assert raw(ids[0, 1, :5]) == [258, 98, 99, 259, 260]
    assert (ids[1, 1] == 0).all() and (ids[2] == 0).all()
    # No markers are added by batch_to_ids.
    assert raw(ids[0, 0, :3]) == [258, 97, 259]


def test_strings_split_on_whitespace():
    np.testing.assert_array_equal(batch_to_ids(["a  bc\t"]), batch_to_ids([["a", "bc"]]))
    assert batch_to_ids(["   "]).shape == (1, 0, 50)
    assert batch_to_ids([]).shape == (0, 0, 50)


def test_long_tokens_truncated_to_48_bytes_multibyte_may_be_cut():
    ids = raw(token_to_ids("x" * 100))
    assert ids[0] == 258 and ids[1:49] == [120] * 48 and ids[49] == 259
    # 17 three-byte characters = 51 bytes; the 17th is cut after 48 bytes.
    ids = raw(token_to_ids("银" * 17))
    assert ids[1:49] == list("银".encode() * 16) and ids[49] == 259


def test_lone_surrogates_and_invalid_utf8_are_ignored():
    assert raw(token_to_ids("a\ud800b"))[:4] == [258, 97, 98, 259]
    assert raw(token_to_ids(b"a\xffb"))[:4] == [258, 97, 98, 259]


def test_bad_input_named():
    with pytest.raises(TypeError, match="str tokens"):
        batch_to_ids([["a", 3]])
    with pytest.raises(TypeError, match="bytes"):
        batch_to_ids([b"a b"])
    with pytest.raises(TypeError, match="got NoneType: None"):
        batch_to_ids(["a b", None])
    with pytest.raises(ValueError, match="at least 3"):
        token_to_ids("a", 2)
    with pytest.raises(TypeError, match="list of tokens"):
        tokens_to_ids("abc")


def spelled_out(token, max_chars):
    """The documented scheme, one token at a time in plain Python (raw ids, no +1)."""
    if isinstance(token, bytes):
        token = token.decode("utf-8", errors="ignore")
    if token in ("<S>", "</S>"):
        return [258, 256 if token == "<S>" else 257, 259] + [260] * (max_chars - 3)
    body = list(token.encode("utf-8", errors="ignore")[: max_chars - 2])
    return [258] + body + [259] + [260] * (max_chars - 2 - len(body))


MIXED = ["a", "", "<S>", "bank", "x" * 60, "银" * 17, b"a\xffb", "</S>", "a\ud800b", "<s>", "é", "a"]


@pytest.mark.parametrize("max_chars", [3, 5, 50])
def test_many_tokens_at_once_equal_the_scheme_token_by_token(max_chars):
    got = tokens_to_ids(MIXED, max_chars)
    assert got.shape == (len(MIXED), max_chars) and got.dtype == np.int32
    for row, token in zip(got, MIXED):
        assert raw(row) == spelled_out(token, max_chars), token
    assert tokens_to_ids([], max_chars).shape == (0, max_chars)


def test_batch_puts_each_tokens_row_at_its_position():
    sentences = [MIXED[:5], [], MIXED[5:], ["a", "a", "<S>"]]
    ids = batch_to_ids(sentences, 50, max_length=9)
    assert ids.shape == (4, 9, 50)
    for b, tokens in enumerate(sentences):
        for t in range(9):
            want = spelled_out(tokens[t], 50) if t < len(tokens) else [-1] * 50
            assert raw(ids[b, t]) == want, (b, t)
