"""Character ids: tokens -> the byte-level ids the character encoder reads.

One scheme is used everywhere in this package, the originals' *inference* scheme:

* a token is UTF-8 encoded with ``errors='ignore'`` (lone surrogates and other
  unencodable characters are dropped), truncated to ``max_characters_per_token - 2``
  bytes (a multi-byte character may be cut; ``Elmo`` says so once with a
  :class:`TokenTruncatedWarning`);
* ids are ``[bow, b1 .. bk, eow, pad, pad, ...]`` with ``bos=256, eos=257, bow=258,
  eow=259, pad=260``;
* every id is shifted by +1 so that 0 means "no token here" (padding). The character
  table therefore has 262 rows, row 0 being the zero vector for padding.

The sentence markers ``<S>`` and ``</S>`` are whole tokens whose only character is
``bos`` / ``eos``.  :func:`batch_to_ids` never adds them: the model encodes them once
(:func:`elmo_jax.model.bilm.marker_vectors`) and adds their vectors around each sentence
(:func:`elmo_jax.model.bilm.add_boundary_vectors`).  Training streams, which are
continuous sequences of ``<S> w1 .. wn </S>``, spell them as the strings ``"<S>"`` and
``"</S>"``; :func:`token_to_ids` maps those strings to the marker tokens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

BOS_CHAR = 256
EOS_CHAR = 257
BOW_CHAR = 258
EOW_CHAR = 259
PAD_CHAR = 260
# Number of distinct raw ids (bytes + 5 specials): the rows of the stored char table.
N_RAW_CHARS = 261
# Rows of the char table at run time: the raw ids + the padding row 0.
N_CHARS = 262
BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"


class TokenTruncatedWarning(UserWarning):
    """Tokens longer than the char CNN reads were cut to their first bytes."""


def _utf8(token: str | bytes) -> bytes:
    """A token's UTF-8 bytes as the char ids see them (invalid input dropped, as the originals do)."""
    if isinstance(token, bytes):
        token = token.decode("utf-8", errors="ignore")
    return token.encode("utf-8", errors="ignore")


def token_to_ids(token: str | bytes, max_characters_per_token: int = 50) -> np.ndarray:
    """Char ids of one token, int32 ``[max_characters_per_token]``, +1 offset applied.

    ``"<S>"`` and ``"</S>"`` map to the sentence-marker tokens.  ``bytes`` input is decoded
    as UTF-8 with invalid sequences dropped, as the originals do.
    """
    return tokens_to_ids([token], max_characters_per_token)[0]


def tokens_to_ids(tokens: Sequence[str | bytes], max_characters_per_token: int = 50) -> np.ndarray:
    """Char ids of each token, int32 ``[len(tokens), max_characters_per_token]``: row ``i``
    is :func:`token_to_ids` of ``tokens[i]``, all rows written by one numpy scatter."""
    if max_characters_per_token < 3:
        raise ValueError(
            f"max_characters_per_token must be at least 3 (bow, one char, eow), got {max_characters_per_token}"
        )
    if isinstance(tokens, (str, bytes)):
        raise TypeError("tokens_to_ids takes a list of tokens; for one token use token_to_ids(token)")
    keep = max_characters_per_token - 2
    raw_N: list[bytes] = []
    markers: list[tuple[int, int]] = []
    for i, token in enumerate(tokens):
        if isinstance(token, bytes):
            token = token.decode("utf-8", errors="ignore")
        if not isinstance(token, str):
            raise TypeError(f"a token must be a str, got {type(token).__name__}: {token!r}")
        if token == BOS_TOKEN or token == EOS_TOKEN:
            markers.append((i, BOS_CHAR if token == BOS_TOKEN else EOS_CHAR))
            token = ""
        raw_N.append(token.encode("utf-8", errors="ignore")[:keep])
    n = len(raw_N)
    out = np.full((n, max_characters_per_token), PAD_CHAR + 1, dtype=np.int32)
    out[:, 0] = BOW_CHAR + 1
    len_N = np.fromiter(map(len, raw_N), dtype=np.int64, count=n)
    bytes_C = np.frombuffer(b"".join(raw_N), dtype=np.uint8)
    row_C = np.repeat(np.arange(n), len_N)
    col_C = np.arange(bytes_C.size) - np.repeat(np.cumsum(len_N) - len_N, len_N) + 1
    out[row_C, col_C] = bytes_C.astype(np.int32) + 1
    out[np.arange(n), len_N + 1] = EOW_CHAR + 1
    for i, char in markers:
        out[i, 1:3] = (char + 1, EOW_CHAR + 1)
    return out


def truncated_tokens(token_lists: Iterable[Sequence[str | bytes]], max_characters_per_token: int) -> list[str | bytes]:
    """The tokens whose UTF-8 bytes do not fit ``max_characters_per_token - 2`` (the char
    ids keep only that many), in order, repeats included.  A token of at most a quarter
    that many characters always fits, so most tokens are only measured with ``len``."""
    keep = max_characters_per_token - 2
    fits = keep // 4  # a character is at most 4 UTF-8 bytes
    out: list[str | bytes] = []
    for tokens in token_lists:
        if tokens and max(map(len, tokens)) > fits:
            out.extend(t for t in tokens if len(t) > fits and len(_utf8(t)) > keep)
    return out


def truncation_message(cut: Sequence[str | bytes], max_characters_per_token: int) -> str:
    """What :class:`TokenTruncatedWarning` says about the tokens ``cut``."""
    keep = max_characters_per_token - 2
    first = cut[0]
    shown: str | bytes
    if len(first) <= 30:
        shown = first
    elif isinstance(first, str):
        shown = first[:30] + "..."
    else:
        shown = first[:30] + b"..."
    n = len(cut)
    return (
        f"{n} token{'' if n == 1 else 's'} longer than {keep} UTF-8 bytes (the first: {shown!r}, "
        f"{len(_utf8(first)):,} bytes) {'was' if n == 1 else 'were'} cut to {'its' if n == 1 else 'their'} "
        f"first {keep} bytes, as the original ELMo does: the char CNN reads max_characters_per_token="
        f"{max_characters_per_token} characters per token, two of them the begin/end-of-word marks "
        f"(a multi-byte character at the cut keeps only its first bytes). Said once per Elmo object."
    )


def tokenize(sentence: str | Sequence[str]) -> list[str]:
    """A sentence as a token list: strings are split on whitespace, lists are kept."""
    if isinstance(sentence, str):
        return sentence.split()
    if isinstance(sentence, bytes):
        raise TypeError(
            "a sentence must be a str or a list of tokens, got bytes: decode it first "
            "(e.g. sentence.decode('utf-8', errors='ignore'))"
        )
    try:
        tokens = list(sentence)
    except TypeError:
        raise TypeError(
            f"a sentence must be a str or a list of str tokens, got {type(sentence).__name__}: {sentence!r}"
        ) from None
    for t in tokens:
        if not isinstance(t, (str, bytes)):
            raise TypeError(f"a sentence given as a list must hold str tokens, got {type(t).__name__}: {t!r}")
    return tokens


def batch_to_ids(
    sentences: Iterable[str | Sequence[str]],
    max_characters_per_token: int = 50,
    max_length: int | None = None,
) -> np.ndarray:
    """Token lists -> int32 char ids ``[batch, max_len, max_characters_per_token]``.

    Sentences may be token lists or strings (split on whitespace).  Positions past a
    sentence's end are all zeros.  ``max_length`` pads the time axis further (it must be at
    least the longest sentence).  No sentence markers are added.
    """
    token_lists = [tokenize(s) for s in sentences]
    longest = max((len(t) for t in token_lists), default=0)
    width = longest if max_length is None else max_length
    if width < longest:
        raise ValueError(f"max_length={max_length} is shorter than the longest sentence ({longest} tokens)")
    out = np.zeros((len(token_lists), width, max_characters_per_token), dtype=np.int32)
    # Each distinct token is converted once; its row is then copied to every position.
    index: dict[str | bytes, int] = {}
    which = [index.setdefault(token, len(index)) for tokens in token_lists for token in tokens]
    if which:
        len_B = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
        row = np.repeat(np.arange(len(token_lists)), len_B)
        col = np.arange(len(which)) - np.repeat(np.cumsum(len_B) - len_B, len_B)
        out[row, col] = tokens_to_ids(list(index), max_characters_per_token)[which]
    return out


class ByteIds:
    """Tokens -> char ids for byte models: the ``token_ids`` of :class:`elmo_jax.Elmo` (a
    vocabulary model has :class:`elmo_jax.formats.manylangs.VocabIds`, with the same methods)."""

    def __init__(self, max_characters_per_token: int):
        self.max_chars = self.width = max_characters_per_token

    def tokens_to_ids(self, tokens: Sequence[str | bytes]) -> np.ndarray:
        return tokens_to_ids(tokens, self.max_chars)

    def batch_to_ids(self, token_lists: Sequence[Sequence[str]], max_length: int | None = None) -> np.ndarray:
        return batch_to_ids(token_lists, self.max_chars, max_length=max_length)

    def truncation_message(self, token_lists: Sequence[Sequence[str]]) -> str | None:
        cut = truncated_tokens(token_lists, self.max_chars)
        return truncation_message(cut, self.max_chars) if cut else None
