"""Character ids: tokens -> the byte-level ids the character encoder reads.

One scheme is used everywhere in this package, the originals' *inference* scheme:

* a token is UTF-8 encoded with ``errors='ignore'`` (lone surrogates and other
  unencodable characters are dropped), truncated to ``max_characters_per_token - 2``
  bytes (a multi-byte character may be cut);
* ids are ``[bow, b1 .. bk, eow, pad, pad, ...]`` with ``bos=256, eos=257, bow=258,
  eow=259, pad=260``;
* every id is shifted by +1 so that 0 means "no token here" (padding). The character
  table therefore has 262 rows, row 0 being the zero vector for padding.

The sentence markers ``<S>`` and ``</S>`` are whole tokens whose only character is
``bos`` / ``eos``.  :func:`batch_to_ids` never adds them: the model adds them on its input
path (:func:`elmo_jax.model.bilm.add_sentence_boundaries`).  Training streams, which are
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


def _marker_ids(char: int, max_chars: int) -> np.ndarray:
    ids = np.full(max_chars, PAD_CHAR, dtype=np.int32)
    ids[:3] = (BOW_CHAR, char, EOW_CHAR)
    return ids + 1


def token_to_ids(token: str | bytes, max_characters_per_token: int = 50) -> np.ndarray:
    """Char ids of one token, int32 ``[max_characters_per_token]``, +1 offset applied.

    ``"<S>"`` and ``"</S>"`` map to the sentence-marker tokens.  ``bytes`` input is decoded
    as UTF-8 with invalid sequences dropped, as the originals do.
    """
    if max_characters_per_token < 3:
        raise ValueError(
            f"max_characters_per_token must be at least 3 (bow, one char, eow), got "
            f"{max_characters_per_token}"
        )
    if isinstance(token, bytes):
        token = token.decode("utf-8", errors="ignore")
    if not isinstance(token, str):
        raise TypeError(f"a token must be a str, got {type(token).__name__}: {token!r}")
    if token == BOS_TOKEN:
        return _marker_ids(BOS_CHAR, max_characters_per_token)
    if token == EOS_TOKEN:
        return _marker_ids(EOS_CHAR, max_characters_per_token)
    raw = token.encode("utf-8", errors="ignore")[: max_characters_per_token - 2]
    ids = np.full(max_characters_per_token, PAD_CHAR, dtype=np.int32)
    ids[0] = BOW_CHAR
    ids[1 : 1 + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    ids[1 + len(raw)] = EOW_CHAR
    return ids + 1


def tokenize(sentence: str | Sequence[str]) -> list[str]:
    """A sentence as a token list: strings are split on whitespace, lists are kept."""
    if isinstance(sentence, str):
        return sentence.split()
    if isinstance(sentence, bytes):
        raise TypeError(
            "a sentence must be a str or a list of tokens, got bytes: decode it first "
            "(e.g. sentence.decode('utf-8', errors='ignore'))"
        )
    tokens = list(sentence)
    for t in tokens:
        if not isinstance(t, (str, bytes)):
            raise TypeError(
                f"a sentence given as a list must hold str tokens, got "
                f"{type(t).__name__}: {t!r}"
            )
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
    cache: dict[str | bytes, np.ndarray] = {}
    for b, tokens in enumerate(token_lists):
        for t, token in enumerate(tokens):
            ids = cache.get(token)
            if ids is None:
                ids = cache[token] = token_to_ids(token, max_characters_per_token)
            out[b, t] = ids
    return out
