"""Every sentence of a corpus as token-type ids, made once: the batcher's fast path.

Reading a sentence from ArrayRecord, decoding it and looking each word up in a dict costs
about 30 us; a training epoch does that twice per sentence (forward and backward orders).
A :class:`TokenIndex` does it once, for the whole corpus, in parallel processes: each
distinct token string (a *type*) gets an id, in order of first occurrence, and each
sentence becomes a run of type ids.  The batcher then reads sentences with numpy gathers
(type id -> vocabulary id, type id -> char ids), with no Python per word.

A :class:`TokenIndex` is itself a sentence source (``len``, ``get_batch``, ``num_tokens``,
``content_id``), so it can stand wherever the source it was built from stood; its
``counts()`` are the token counts :meth:`Vocabulary.build` takes (same order of first
occurrence, so the same vocabulary as counting the source).

On disk (``build_token_index(source, folder)``; written to a temporary folder and renamed
into place whole, so a reader sees a complete index or none)::

    FOLDER/
      meta.json       {"version", "content_id", "sentences": n, "tokens": N, "types": V,
                       "bytes" / "sha256": the size / SHA-256 of each file below but
                       the char tables}
      types.json      the V token strings, in id order
      counts.npy      int64 [V]   occurrences of each type
      offsets.bin     int64 [n+1] sentence i is ids[offsets[i]:offsets[i+1]]
      ids.bin         int32 [N]   type ids
      chars_C.bin     int16 [V + 3, C] char ids of each type for C characters per token, then
                      those of <S>, </S> and a zero row
                      (made on first use, once per C)

Opening an index checks every file against ``meta.json`` (sizes, then SHA-256 of the
bytes: about 0.1 s per 100 MB, see benchmarks/README.md), so an index damaged in place (a
byte changed, ids swapped) is refused and :func:`open_or_build` rebuilds it instead of
serving other sentences.  The data workers map the files their parent checked.

The arrays are memory-mapped: processes share them through the page cache, and no
process holds the corpus in its own memory (a worker's resident memory is the vocabulary
id of each type, 4 bytes per type, plus the pages it touches).  Without a folder the index
is built in memory (small corpora, tests).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence

import numpy as np

from elmo_jax import chars as chars_lib
from elmo_jax.atomic import atomic_path, file_sha256, owned_temp_dir, replace_dir, write_json
from elmo_jax.errors import ElmoError

__all__ = ["INDEX_VERSION", "TokenIndex", "TokenIndexError", "build_token_index", "open_or_build"]

INDEX_VERSION = 2  # 2: meta.json holds each file's SHA-256 (an index of version 1 is rebuilt)
_RANGE = 1 << 16  # sentences per build task (~2M tokens: 7 MB of ids, and its distinct tokens)
_READ = 4096  # sentences per get_batch while building
_CHAR_BLOCK = 1 << 16  # types converted to char ids at once
_FILES = ("types.json", "counts.npy", "offsets.bin", "ids.bin")  # meta.json records their sizes and digests


class TokenIndexError(ElmoError):
    """A token index folder that cannot be used (incomplete, damaged, of another version)."""

    problem: str = ""
    """What is wrong, without the fix (what :func:`open_or_build` says while it rebuilds)."""


def _unusable(problem: str, folder: str) -> TokenIndexError:
    """``problem`` with the fix a caller that does not rebuild needs: delete ``folder``."""
    error = TokenIndexError(f"{problem}: delete {folder} and it is rebuilt")
    error.problem = problem
    return error


class TokenIndex:
    """Sentences as type ids (see the module docstring).  Use :meth:`open` or
    :func:`build_token_index`; the constructor takes the arrays as they are."""

    def __init__(
        self,
        offsets_n1: np.ndarray,
        ids_N: np.ndarray,
        counts_V: np.ndarray,
        types: Sequence[str] | None,
        content_id: str | None,
        folder: str | None = None,
    ):
        self.offsets_n1 = offsets_n1
        self.ids_N = ids_N
        self.counts_V = counts_V
        self._types = None if types is None else list(types)
        self._content_id = content_id
        self.folder = folder

    # -- opening ----------------------------------------------------------------------
    @classmethod
    def open(cls, folder: str | os.PathLike, verify: bool = True) -> "TokenIndex":
        """The index in ``folder``, memory-mapped; :class:`TokenIndexError` if it is not a
        complete index of this version, or (``verify``) a file's bytes are not those
        written (their SHA-256 differs from ``meta.json``'s)."""
        folder = os.fspath(folder)
        meta = read_meta(folder)
        if meta is None:
            raise _unusable(f"{folder} holds no complete token index (no readable meta.json)", folder)
        n, N, V = meta["sentences"], meta["tokens"], meta["types"]
        # every file as long as when it was written (the arrays' sizes follow from the counts)
        expected = {**meta["bytes"], "offsets.bin": 8 * (n + 1), "ids.bin": 4 * N}
        for name, size in expected.items():
            path = os.path.join(folder, name)
            found = os.path.getsize(path) if os.path.exists(path) else None
            if found != size:
                raise _unusable(f"{path} has {found} bytes, its meta.json says {size}: the index is damaged", folder)
        for name in _FILES if verify else ():
            path = os.path.join(folder, name)
            if file_sha256(path) != meta["sha256"][name]:
                raise _unusable(
                    f"{path} is not the file that was written (its SHA-256 differs from meta.json's): "
                    f"the index is damaged",
                    folder,
                )
        try:
            counts = np.load(os.path.join(folder, "counts.npy"), mmap_mode="r")
        except (OSError, ValueError) as e:
            raise _unusable(f"{folder}/counts.npy is unreadable ({e})", folder) from None
        if counts.shape != (V,):
            raise _unusable(f"{folder}/counts.npy holds {counts.shape}, expected ({V},)", folder)
        return cls(
            _map(os.path.join(folder, "offsets.bin"), np.int64, n + 1),
            _map(os.path.join(folder, "ids.bin"), np.int32, N),
            counts,
            None,
            meta["content_id"],
            folder,
        )

    def __reduce__(self):
        if self.folder is not None:  # worker processes map the same files, checked by the parent
            return TokenIndex.open, (self.folder, False)
        return TokenIndex, (self.offsets_n1, self.ids_N, self.counts_V, self._types, self._content_id)

    # -- the index --------------------------------------------------------------------
    @property
    def num_types(self) -> int:
        return len(self.counts_V)

    def types(self) -> list[str]:
        """The token strings, in id order (read from disk on each call for a folder index:
        lm1b has 2.4M of them)."""
        if self._types is not None:
            return self._types
        assert self.folder is not None  # an index without its types in memory was opened from a folder
        with open(os.path.join(self.folder, "types.json"), encoding="utf-8") as f:
            return json.load(f)

    def counts(self) -> dict[str, int]:
        """``type -> count`` in order of first occurrence (what :meth:`Vocabulary.build` takes)."""
        return dict(zip(self.types(), self.counts_V.tolist()))

    def sentence_types(self, positions: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lengths ``[n]`` int64, the sentences' type ids one after another ``[sum]`` int32)."""
        pos = np.asarray(positions, dtype=np.int64)
        start = self.offsets_n1[pos]
        lens_n = self.offsets_n1[pos + 1] - start
        total = int(lens_n.sum())
        # token j of sentence i is ids[start_i + j]
        within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens_n) - lens_n, lens_n)
        return lens_n, self.ids_N[np.repeat(start, lens_n) + within]

    def vocab_ids(self, vocab) -> np.ndarray:
        """int32 ``[V]``: each type's id in ``vocab`` (``<UNK>``'s for the others)."""
        return np.fromiter(map(vocab.id_of, self.types()), dtype=np.int32, count=self.num_types)

    def char_table(self, max_chars: int) -> np.ndarray:
        """int16 ``[V + 3, max_chars]``: each type's char ids
        (:func:`elmo_jax.chars.tokens_to_ids`), then those of ``<S>`` (row ``V``) and
        ``</S>`` (row ``V + 1``), then zeros (row ``V + 2``: padding).  A folder index keeps
        it as ``chars_<max_chars>.bin`` (made on the first call, memory-mapped after)."""
        max_chars = int(max_chars)
        shape = (self.num_types + 3, max_chars)
        if self.folder is None:
            return np.concatenate(list(_char_id_blocks(self.types(), max_chars)))
        path = os.path.join(self.folder, f"chars_{max_chars}.bin")
        if os.path.exists(path) and os.path.getsize(path) == 2 * shape[0] * shape[1]:
            return _map(path, np.int16, shape)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:  # concurrent makers write identical bytes
            for block in _char_id_blocks(self.types(), max_chars):  # never the whole table in memory
                block.tofile(f)
        return _map(path, np.int16, shape)

    # -- the sentence-source protocol -------------------------------------------------
    def __len__(self) -> int:
        return len(self.offsets_n1) - 1

    def num_tokens(self) -> int:
        return len(self.ids_N)

    def content_id(self) -> str | None:
        """The content id of the source it was built from."""
        return self._content_id

    def get_batch(self, indices: Sequence[int]) -> list[list[str]]:
        if self._types is None:  # a folder index: read the strings once, on first use
            self._types = self.types()
        types = self._types
        keys = [int(i) for i in indices]
        bad = [i for i in keys if not 0 <= i < len(self)]
        if bad:
            raise IndexError(f"sentence index {bad[0]} out of range ({len(self)} sentences)")
        lens, ids = self.sentence_types(keys)
        words = [types[t] for t in ids.tolist()]
        ends = np.cumsum(lens).tolist()
        return [words[e - n : e] for e, n in zip(ends, lens.tolist())]

    def __getitem__(self, i: int) -> list[str]:
        n = len(self)
        if not -n <= int(i) < n:
            raise IndexError(f"sentence index {i} out of range ({n} sentences)")
        return self.get_batch([int(i) % n])[0]

    def __iter__(self):
        for start in range(0, len(self), _READ):
            yield from self.get_batch(range(start, min(start + _READ, len(self))))

    def __repr__(self) -> str:
        where = self.folder or "in memory"
        return f"TokenIndex({len(self)} sentences, {self.num_tokens()} tokens, {self.num_types} types; {where})"


def _map(path: str, dtype, shape) -> np.ndarray:
    """A read-only memory map of ``path`` as a plain ndarray (a memmap subclass costs a
    Python call per gather)."""
    if (np.prod(shape) if isinstance(shape, tuple) else shape) == 0:
        return np.zeros(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=shape).view(np.ndarray)


def _char_id_blocks(types: Sequence[str], max_chars: int):
    """int16 blocks of rows: the types' char ids, ``<S>``'s, ``</S>``'s, then a zero row."""
    types = list(types) + [chars_lib.BOS_TOKEN, chars_lib.EOS_TOKEN]
    for a in range(0, len(types), _CHAR_BLOCK):
        yield chars_lib.tokens_to_ids(types[a : a + _CHAR_BLOCK], max_chars).astype(np.int16)
    yield np.zeros((1, max_chars), dtype=np.int16)


def read_meta(folder: str) -> dict | None:
    """``meta.json`` of an index folder of this version, or None (absent, unreadable, other version)."""
    try:
        with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("version") != INDEX_VERSION:
            return None
        for key in ("sentences", "tokens", "types"):
            meta[key] = int(meta[key])
        meta["bytes"] = {name: int(meta["bytes"][name]) for name in _FILES}
        meta["sha256"] = {name: str(meta["sha256"][name]) for name in _FILES}
        return meta
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


# -- building -------------------------------------------------------------------------
def _index_range(source, start: int, stop: int) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Sentences ``start..stop-1``: (their types in order of first occurrence, each type's
    count, the tokens as ids into those types, each sentence's length).  Read and numbered
    ``_READ`` sentences at a time, so that only one read's token strings are held."""
    local: dict[str, int] = {}
    ids_parts: list[np.ndarray] = []
    lengths: list[int] = []
    for at in range(start, stop, _READ):
        sentences = source.get_batch(range(at, min(at + _READ, stop)))
        flat = list(itertools.chain.from_iterable(sentences))
        lengths.extend(map(len, sentences))
        new = [t for t in dict.fromkeys(flat) if t not in local]
        local.update(zip(new, range(len(local), len(local) + len(new))))
        ids_parts.append(np.fromiter(map(local.__getitem__, flat), dtype=np.int32, count=len(flat)))
    ids = np.concatenate(ids_parts) if ids_parts else np.zeros(0, dtype=np.int32)
    return list(local), np.bincount(ids, minlength=len(local)), ids, np.asarray(lengths, dtype=np.int64)


class _Merger:
    """Joins the ranges' results in range order: local type ids become global ones (new
    types numbered as they first appear), ids and offsets appended (to files, or kept)."""

    def __init__(self, folder: str | None):
        self.ids: dict[str, int] = {}
        self.counts = np.zeros(1024, dtype=np.int64)
        self.n_tokens = 0
        self.n_sentences = 0
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []
        self.files = None
        if folder is not None:
            self.files = (open(os.path.join(folder, "offsets.bin"), "wb"), open(os.path.join(folder, "ids.bin"), "wb"))
            np.zeros(1, dtype=np.int64).tofile(self.files[0])

    def add(self, types: list[str], counts: np.ndarray, ids: np.ndarray, lengths: np.ndarray) -> None:
        known = np.fromiter(map(self.ids.get, types, itertools.repeat(-1)), dtype=np.int64, count=len(types))
        new = np.flatnonzero(known < 0)
        if len(new):
            first = len(self.ids)
            self.ids.update(zip([types[i] for i in new.tolist()], range(first, first + len(new))))
            known[new] = np.arange(first, first + len(new))
        if len(self.ids) > len(self.counts):
            self.counts = np.concatenate(
                [self.counts, np.zeros(max(len(self.ids), 2 * len(self.counts)) - len(self.counts), dtype=np.int64)]
            )
        self.counts[known] += counts  # a range's types are distinct: no repeated index
        global_ids = known.astype(np.int32)[ids]
        offsets = self.n_tokens + np.cumsum(lengths)
        if self.files is not None:
            offsets.tofile(self.files[0])
            global_ids.tofile(self.files[1])
        else:
            self.parts.append((offsets, global_ids))
        self.n_tokens += len(ids)
        self.n_sentences += len(lengths)

    def close(self) -> None:
        if self.files is not None:
            for f in self.files:
                f.close()


def build_token_index(
    source,
    folder: str | os.PathLike | None = None,
    workers: int = 0,
    log: Callable[[str], None] | None = None,
    range_size: int | None = None,
) -> TokenIndex:
    """Index every sentence of ``source`` (see the module docstring).

    ``folder``: where to write it (replaced whole when the index is complete; None builds it
    in memory).  ``workers``: 0 reads the source in this process; ``N >= 1`` in ``N``
    processes, each indexing ranges of consecutive sentences (the source must pickle, as
    the sources of :mod:`elmo_jax.data.text_source` do); the result does not depend on ``N``.
    ``range_size``: sentences per range (default: at most 65,536, at least 4 ranges per
    worker, at least 4,096); it does not change the result either.
    """
    if range_size is not None and range_size < 1:
        raise ValueError(f"range_size must be >= 1 sentence, got {range_size}")
    n = len(source)
    content_id = source.content_id() if hasattr(source, "content_id") else None
    t0 = time.perf_counter()
    tmp = None
    if folder is not None:
        folder = os.fspath(folder)
        parent = os.path.dirname(os.path.abspath(folder))
        os.makedirs(parent, exist_ok=True)
        # beside the folder, named by host and pid: what a killed build left is removed by the next
        tmp = owned_temp_dir(parent, f".{os.path.basename(folder)}.building_", suffix=".tmp")
    try:
        merger = _Merger(tmp)
        try:
            # ranges of at most _RANGE sentences, at least 4 per worker (for balance), at
            # least _READ sentences each
            size = range_size or max(_READ, min(_RANGE, -(-n // (4 * max(1, workers)))))
            bounds = list(range(0, n, size)) + [n]
            ranges = list(zip(bounds, bounds[1:]))
            with contextlib.closing(_range_results(source, ranges, workers)) as results:  # stops its workers
                for result in results:
                    merger.add(*result)
        finally:
            merger.close()
        if merger.n_sentences != n:
            raise TokenIndexError(f"the source gave {merger.n_sentences} sentences, its length is {n}")
        types = list(merger.ids)
        counts = merger.counts[: len(types)]
        if tmp is None:
            offsets = np.concatenate([np.zeros(1, dtype=np.int64)] + [o for o, _ in merger.parts])
            ids = np.concatenate([np.zeros(0, dtype=np.int32)] + [i for _, i in merger.parts])
            index = TokenIndex(offsets, ids, counts, types, content_id)
        else:
            assert folder is not None  # tmp is made only for a folder
            with open(os.path.join(tmp, "types.json"), "w", encoding="utf-8") as f:
                f.write(json.dumps(types))  # one C-level encode (json.dump iterates in Python)
            np.save(os.path.join(tmp, "counts.npy"), counts)
            write_json(
                os.path.join(tmp, "meta.json"),
                {  # last: an index is complete when it exists
                    "version": INDEX_VERSION,
                    "content_id": content_id,
                    "sentences": merger.n_sentences,
                    "tokens": merger.n_tokens,
                    "types": len(types),
                    "bytes": {name: os.path.getsize(os.path.join(tmp, name)) for name in _FILES},
                    "sha256": {name: file_sha256(os.path.join(tmp, name)) for name in _FILES},
                },
            )
            replace_dir(tmp, folder)
            tmp = None
            index = TokenIndex.open(folder, verify=False)  # just written and hashed
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if log is not None:
        log(
            f"indexed {n:,} sentences ({index.num_tokens():,} tokens, {index.num_types:,} distinct) in "
            f"{time.perf_counter() - t0:.1f} s" + (f" -> {folder}" if folder else "")
        )
    return index


def _range_results(source, ranges: list[tuple[int, int]], workers: int):
    """``_index_range`` of each range, in range order (at most ``2 * workers`` ahead)."""
    if workers <= 0 or len(ranges) < 2:
        for a, b in ranges:
            yield _index_range(source, a, b)
        return
    from elmo_jax.data.workers import worker_pool

    # The source goes to each worker once (a source held in memory pickles whole), then
    # only range bounds travel.  A worker that dies ends the build with one line naming it.
    with worker_pool(min(workers, len(ranges)), "token indexing", _hold_source, (source,)) as pool:
        pending = []
        todo = iter(ranges)
        for a, b in todo:
            pending.append(pool.submit(_index_held_range, a, b))
            if len(pending) >= 2 * workers:
                break
        while pending:
            result = pending.pop(0).result()
            for a, b in todo:
                pending.append(pool.submit(_index_held_range, a, b))
                break
            yield result


# The source of a build worker process, set by the pool's initializer (ProcessPoolExecutor
# calls module-level functions, so a process-wide value by necessity; worker processes only).
_HELD_SOURCE = None


def _hold_source(source) -> None:
    global _HELD_SOURCE
    _HELD_SOURCE = source


def _index_held_range(start: int, stop: int):
    return _index_range(_HELD_SOURCE, start, stop)


def open_or_build(
    source,
    folder: str | os.PathLike,
    workers: int = 0,
    log: Callable[[str], None] | None = None,
    may_build: bool = True,
) -> TokenIndex:
    """The index of ``source`` in ``folder``: opened if it is complete and was built from the
    same content (``source.content_id()``), else built there (replacing what was there)."""
    folder = os.fspath(folder)
    meta = read_meta(folder)
    wanted = source.content_id() if hasattr(source, "content_id") else None
    if (
        meta is not None
        and wanted is not None
        and meta.get("content_id") == wanted
        and meta["sentences"] == len(source)
    ):
        try:
            return TokenIndex.open(folder)
        except TokenIndexError as e:
            if not may_build:
                raise
            if log is not None:
                log(f"rebuilding the token index, which could not be used: {e.problem or e}")
    elif not may_build:
        raise TokenIndexError(f"{folder} holds no token index of this data (content {wanted})")
    if log is not None:
        log(f"indexing {len(source):,} sentences into {folder} ({workers} worker processes)")
    return build_token_index(source, folder, workers, log)
