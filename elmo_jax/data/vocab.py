"""Word vocabulary for the softmax targets, in the original's file format.

The vocabulary file is plain UTF-8 text, one token per line, in id order.  ``<S>``,
``</S>`` and ``<UNK>`` must be present (anywhere; the released 793,471-word file has them
near the top); the other tokens come by descending frequency, which the log-uniform
(Zipf) negative sampler relies on.  A file is loaded *in file order*, so ids match the
rows of a released softmax matrix.  As in the original reader, a line ``!!!MAXTERMID`` is
skipped without taking an id.

Inputs never use this vocabulary (the model reads characters, so there is no input OOV);
only targets are mapped, unknown words to ``<UNK>``.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from elmo_jax.atomic import atomic_path
from elmo_jax.chars import BOS_TOKEN, EOS_TOKEN, tokenize
from elmo_jax.textio import decode_line

BOS = BOS_TOKEN
EOS = EOS_TOKEN
UNK = "<UNK>"
SPECIALS = (BOS, EOS, UNK)
# The original reader skips this line (a leftover of the lm_1b vocabulary format).
_SKIPPED_LINE = "!!!MAXTERMID"


def read_token_lines(path: str | os.PathLike) -> list[tuple[int, str]]:
    """``(line number, token)`` for each line of a vocabulary file, as the original reads it:
    UTF-8, one token per line, surrounding whitespace stripped, ``!!!MAXTERMID`` skipped.

    Errors name the file (and line): missing, unreadable, invalid UTF-8, an empty line
    inside the file, no token at all.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw_lines = f.read().split(b"\n")
    except FileNotFoundError:
        raise FileNotFoundError(f"vocabulary file not found: {path}") from None
    except OSError as e:
        raise OSError(f"cannot read vocabulary file {path} ({e.strerror})") from None
    # Trailing blank lines (the final newline included) carry no token.
    while raw_lines and not raw_lines[-1].strip():
        raw_lines.pop()
    if not raw_lines:
        raise ValueError(f"vocabulary file {path} is empty")
    out: list[tuple[int, str]] = []
    for lineno, raw in enumerate(raw_lines, start=1):
        tok = decode_line(raw, path, lineno).strip()
        if not tok:
            raise ValueError(f"{path}, line {lineno}: empty line inside the vocabulary file")
        if tok != _SKIPPED_LINE:
            out.append((lineno, tok))
    if not out:
        raise ValueError(f"vocabulary file {path} holds no token")
    return out


class Vocabulary:
    """Tokens in id order with ``<S>``, ``</S>``, ``<UNK>`` somewhere among them.

    Build one from data with :meth:`build`, read one with :meth:`load`.
    """

    def __init__(self, tokens: Sequence[str], *, source: str = "tokens"):
        tokens = list(tokens)
        self._token_to_id: dict[str, int] = {}
        for i, tok in enumerate(tokens):
            if not isinstance(tok, str):
                raise TypeError(f"vocabulary tokens must be str, got {type(tok).__name__}: {tok!r}")
            if tok in self._token_to_id:
                raise ValueError(f"{source}: duplicated token {tok!r} (ids {self._token_to_id[tok]} and {i})")
            self._token_to_id[tok] = i
        missing = [s for s in SPECIALS if s not in self._token_to_id]
        if missing:
            # Appended at the end so that the ids of the existing tokens (and thus the rows
            # of a softmax trained with them) do not move.
            warnings.warn(
                f"{source}: the vocabulary lacks {', '.join(missing)}; added at the end "
                f"(ids {len(tokens)}..{len(tokens) + len(missing) - 1})",
                stacklevel=3,
            )
            for s in missing:
                self._token_to_id[s] = len(tokens)
                tokens.append(s)
        self._tokens = tokens

    # ------------------------------------------------------------------ building
    @classmethod
    def build(
        cls,
        data: Mapping[str, int] | Iterable[str | Sequence[str]],
        max_size: int | None = None,
        min_count: int = 1,
    ) -> "Vocabulary":
        """A vocabulary from token counts or from sentences.

        ``data`` is either a mapping ``token -> count`` (e.g. a ``Counter``) or an iterable
        of sentences (whitespace-separated strings or token lists).  The result is
        ``<S>, </S>, <UNK>`` (ids 0, 1, 2), then the tokens with ``count >= min_count`` by
        descending count; ties keep the order of first occurrence (the mapping's order).
        ``max_size`` bounds the total size, the three special tokens included.  Special
        tokens found in the data are not counted twice.
        """
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        if max_size is not None and max_size < len(SPECIALS):
            raise ValueError(f"max_size must be at least {len(SPECIALS)} (the special tokens), got {max_size}")
        if isinstance(data, Mapping):
            counts = data
        else:
            counts = Counter()
            for sentence in data:
                # Token lists (what sources yield) are counted as they are: a per-token check
                # would cost as much as the counting over a corpus of a billion tokens.
                counts.update(tokenize(sentence) if isinstance(sentence, (str, bytes)) else sentence)
        # sorted() is stable: equal counts keep first-occurrence order.
        ranked = sorted(
            ((t, c) for t, c in counts.items() if t not in SPECIALS and c >= min_count),
            key=lambda tc: -tc[1],
        )
        tokens = list(SPECIALS) + [t for t, _ in ranked]
        if max_size is not None:
            tokens = tokens[:max_size]
        return cls(tokens, source="built vocabulary")

    # ------------------------------------------------------------------ file I/O
    def save(self, path: str | os.PathLike) -> None:
        """Write one token per line, UTF-8, ``\\n`` line ends, in id order (atomically)."""
        for i, tok in enumerate(self._tokens):
            if not tok or tok != tok.strip() or any(ch in tok for ch in "\n\r\x00"):
                raise ValueError(
                    f"token {tok!r} (id {i}) cannot be written to a vocabulary file: it is "
                    "empty or contains line breaks / surrounding whitespace / a NUL byte"
                )
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
            for tok in self._tokens:
                f.write(tok)
                f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocabulary":
        """Read a vocabulary file (one token per line, UTF-8) keeping file order.

        Missing ``<S>``/``</S>``/``<UNK>`` are appended with a warning.  Errors name the
        file (and line): invalid UTF-8, an empty line inside the file, a duplicated token,
        an empty file.
        """
        path = os.fspath(path)
        tokens: list[str] = []
        first_line: dict[str, int] = {}
        for lineno, tok in read_token_lines(path):
            if tok in first_line:
                raise ValueError(f"{path}, line {lineno}: duplicated token {tok!r} (first on line {first_line[tok]})")
            first_line[tok] = lineno
            tokens.append(tok)
        return cls(tokens, source=f"vocabulary file {path}")

    # ------------------------------------------------------------------ lookups
    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, token: str) -> bool:
        return token in self._token_to_id

    def __iter__(self):
        return iter(self._tokens)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self._tokens == other._tokens

    def __repr__(self) -> str:
        return f"Vocabulary({len(self)} tokens)"

    @property
    def tokens(self) -> list[str]:
        """The tokens in id order (a copy)."""
        return list(self._tokens)

    @property
    def bos_id(self) -> int:
        return self._token_to_id[BOS]

    @property
    def eos_id(self) -> int:
        return self._token_to_id[EOS]

    @property
    def unk_id(self) -> int:
        return self._token_to_id[UNK]

    def id_of(self, token: str) -> int:
        """The id of ``token``, ``unk_id`` if it is not in the vocabulary."""
        return self._token_to_id.get(token, self._token_to_id[UNK])

    def encode(self, tokens: Iterable[str]) -> np.ndarray:
        """Token ids as ``np.int32`` (unknown tokens -> ``unk_id``); no markers added."""
        get = self._token_to_id.get
        unk = self._token_to_id[UNK]
        if isinstance(tokens, str):
            tokens = tokenize(tokens)
        return np.fromiter((get(t, unk) for t in tokens), dtype=np.int32)

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self._tokens[int(i)] for i in ids]
