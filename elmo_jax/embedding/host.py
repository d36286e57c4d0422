"""The host's side of embedding: sentences -> token lists -> padded groups of char ids.

Everything here is numpy and plain Python (no device work), so it can run in a thread ahead
of the device (:func:`maybe_ahead`, through :func:`elmo_jax.lookahead.ahead`):

* :func:`sentence_list` / :func:`token_lists`: ``embed``'s argument checked and tokenised;
* :func:`plan_groups`: which sentences share a padded group (sorted by length, cut per time
  bucket into groups of ``batch_size``), and each group's ``(rows, time)``;
* :class:`CallTokens`: the distinct tokens of one call, each converted to char ids once;
  a group's char ids ``[rows, time, C]`` are then one gather from that table (1.2M tokens
  per CPU-second on the 2-core benchmark machine, against 0.58M converting every group's
  tokens anew, see benchmarks/README.md);
* :class:`Group`: one group's host arrays, ready to be placed on the devices.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass

import numpy as np

from elmo_jax import chars
from elmo_jax.embedding.buckets import row_bucket, round_to_devices, time_bucket
from elmo_jax.lookahead import ahead
from elmo_jax.textio import refuse_nul

Sentence = str | Sequence[str]


def sentence_list(sentences: Sequence[Sentence]) -> list[Sentence]:
    """``embed``'s argument as a list, or a TypeError that says what it takes."""
    if isinstance(sentences, (str, bytes)):
        raise TypeError("embed() takes a list of sentences; wrap a single sentence as [sentence]")
    try:
        return list(sentences)
    except TypeError:
        raise TypeError(
            f"embed() takes a list of sentences (strings, or lists of str tokens), got "
            f"{type(sentences).__name__}: {sentences!r:.80}"
        ) from None


def token_lists(sentences: list[Sentence]) -> list[list[str]]:
    """Each sentence as a token list; an error names the sentence's index.  An empty-string
    token is refused: it would be embedded as a word with no characters; so is a NUL
    character (:mod:`elmo_jax.textio`)."""
    out = []
    for i, sentence in enumerate(sentences):
        try:
            tokens = chars.tokenize(sentence)
        except TypeError as e:
            raise TypeError(f"sentence {i}: {e}") from None
        refuse_nul(sentence if isinstance(sentence, str) else " ".join(tokens), f"sentence {i}")
        if not isinstance(sentence, str) and not all(tokens):  # str.split() never gives an empty token
            raise ValueError(
                f"sentence {i}: token {[bool(t) for t in tokens].index(False)} is an empty string: a token needs "
                f"at least one character (splitting a string sentence never gives one); drop empty strings "
                f"from the token list"
            )
        out.append(tokens)
    return out


@dataclass(frozen=True)
class GroupPlan:
    """Which input sentences form one padded group, and its padded shape."""

    indices: list[int]
    n_rows: int
    n_time: int


def plan_groups(lengths: Sequence[int], batch_size: int, *, stateful: bool, n_devices: int = 1) -> list[GroupPlan]:
    """The padded groups of one call, in the order they run.

    Stateless: empty sentences are left out (they need no model); the others are sorted by
    length, each goes to its time bucket, and each bucket is cut into groups of
    ``batch_size``; rows are :func:`row_bucket`.  Stateful: groups of ``batch_size``
    consecutive sentences in input order (row ``i`` continues the carried row ``i``), all of
    ``batch_size`` rows (rounded up to a multiple of ``n_devices``).
    """
    if stateful:
        n_rows = round_to_devices(batch_size, n_devices)
        cuts = [list(range(i, min(i + batch_size, len(lengths)))) for i in range(0, len(lengths), batch_size)]
        return [GroupPlan(g, n_rows, time_bucket(max(lengths[i] for i in g))) for g in cuts]
    by_bucket: dict[int, list[int]] = {}
    for i in sorted((i for i, n in enumerate(lengths) if n), key=lengths.__getitem__):
        by_bucket.setdefault(time_bucket(lengths[i]), []).append(i)
    return [
        GroupPlan(idx[j : j + batch_size], row_bucket(len(idx[j : j + batch_size]), batch_size, n_devices), t)
        for t, idx in by_bucket.items()
        for j in range(0, len(idx), batch_size)
    ]


class CallTokens:
    """The tokens of one call: each distinct token numbered once (``0`` is padding), every
    token position as its number (``flat``), and a char-id table built on first use."""

    def __init__(
        self, token_lists: list[list[str]], n_chars: int, to_ids: Callable[[list[str]], np.ndarray] | None = None
    ):
        # A new token takes the next number (a C-level loop: 1.6x the speed of setdefault).
        index: dict[str, int] = collections.defaultdict(itertools.count(1).__next__)
        self.lengths = [len(t) for t in token_lists]
        total = sum(self.lengths)
        self.flat = np.fromiter(
            map(index.__getitem__, itertools.chain.from_iterable(token_lists)), np.int64, count=total
        )
        self.starts = np.cumsum([0, *self.lengths])[:-1]
        self.words = list(index)  # number k is words[k - 1]
        self.n_chars = n_chars  # ids per token (ElmoConfig.token_id_width)
        # tokens -> ids [n, n_chars]: UTF-8 bytes by default, or a model's own (Elmo.token_ids)
        self._to_ids = to_ids or (lambda words: chars.tokens_to_ids(words, n_chars))
        self._char_table: np.ndarray | None = None

    def numbers_BT(self, plan: GroupPlan) -> np.ndarray:
        """``[rows, time]`` int64: each position's token number, ``0`` past a sentence's end."""
        out = np.zeros((plan.n_rows, plan.n_time), np.int64)
        for r, i in enumerate(plan.indices):
            n = self.lengths[i]
            out[r, :n] = self.flat[self.starts[i] : self.starts[i] + n]
        return out

    def char_table(self) -> np.ndarray:
        """``[n_distinct + 1, C]`` int32 char ids per token number (row 0 all zero: padding)."""
        if self._char_table is None:
            table = np.zeros((len(self.words) + 1, self.n_chars), np.int32)
            if self.words:
                table[1:] = self._to_ids(self.words)
            self._char_table = table
        return self._char_table


@dataclass
class Group:
    """One group's host arrays: ``lengths_R`` (``-1`` on padding rows) and either
    ``char_ids_RTC`` or, with a token cache, ``cache_rows_RT`` (rows of the cache's vectors
    followed by ``extra_words``' vectors, which the char CNN encodes for this group)."""

    plan: GroupPlan
    lengths_R: np.ndarray
    char_ids_RTC: np.ndarray | None = None
    cache_rows_RT: np.ndarray | None = None
    extra_words: list[str] | None = None


@dataclass(frozen=True)
class CacheRows:
    """Where a call's tokens are in a token cache: ``row_of[k]`` is token number ``k``'s row
    (``-1``: not cached; ``row_of[0] = 0``, padding looks up any row, the model ignores it);
    ``n_cache`` rows, after which a group's extra words go."""

    row_of: np.ndarray
    n_cache: int

    @classmethod
    def build(cls, tokens: CallTokens, index: dict[str, int], n_cache: int) -> "CacheRows":
        row_of = np.fromiter((index.get(w, -1) for w in tokens.words), np.int64, count=len(tokens.words))
        return cls(np.concatenate([[0], row_of]), n_cache)


def prepare_group(tokens: CallTokens, plan: GroupPlan, cache: CacheRows | None) -> Group:
    """``plan``'s host arrays: char ids, or (with ``cache``) rows of the token cache and the
    group's distinct uncached words."""
    lengths = np.full((plan.n_rows,), -1, np.int32)
    lengths[: len(plan.indices)] = [tokens.lengths[i] for i in plan.indices]
    numbers = tokens.numbers_BT(plan)
    if cache is None:
        # np.take: 3x faster than fancy indexing for this row gather (numpy 2, 2-core machine)
        return Group(plan, lengths, char_ids_RTC=np.take(tokens.char_table(), numbers, axis=0))
    rows = np.take(cache.row_of, numbers)
    missing = rows < 0
    extra: list[str] = []
    if missing.any():
        numbers_missing = numbers[missing]
        distinct = np.unique(numbers_missing)
        extra = [tokens.words[k - 1] for k in distinct]
        rows[missing] = cache.n_cache + np.searchsorted(distinct, numbers_missing)
    return Group(plan, lengths, cache_rows_RT=rows, extra_words=extra)


def maybe_ahead(items: Sequence, make: Callable, depth: int) -> Generator:
    """``make(x)`` for each ``x`` of ``items``: in a thread :func:`ahead` of the consumer
    when there is more than one, inline otherwise (a thread buys nothing for one group)."""
    if len(items) <= 1:
        return (make(x) for x in items)
    return ahead((make(x) for x in items), depth, name="elmo-jax-embed-host")
