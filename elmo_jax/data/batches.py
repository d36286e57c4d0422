"""The original's pretraining batches, as a deterministic, checkpointable numpy iterator.

(Over 500 lines: the chunk encoders, the per-row streams and :class:`LMBatcher` are the stages
of one iterator whose resumable state they share; the encoders are the part that could leave.)

Layout (ELMo §3, the TensorFlow trainer's scheme)
-------------------------------------------------
* Each of the ``B`` rows of a batch is its own continuous stream of sentences
  ``<S> w1 .. wn </S> <S> v1 .. vm </S> ...``.  A batch holds, per row, the next window of
  ``T = unroll_steps`` inputs and the ``T`` targets shifted by one.  The target of a
  window's last input is the first input of the row's next window, so no token is lost at
  window edges; a sentence that does not fit continues in the next window.  The LSTM state
  of a row can therefore be carried from batch to batch.
* Rows draw sentences from one shuffled order of the (local) sentences: whenever a row
  needs more tokens it takes the next sentence of that order (rows are served in order
  0..B-1, so the draw is deterministic).
* The backward LM reads its *own*, separately shuffled stream of reversed sentences.  As in
  the original trainer (``reverse=True`` there), a reversed sentence is the whole forward
  sequence reversed, ``</S> wn .. w1 <S>``: exactly what the backward LSTM sees at inference
  time when it runs over ``<S> w1 .. wn </S>`` from right to left.  The backward arrays are
  laid out left to right in reading order (the backward LSTM runs left to right over them),
  and ``bwd_targets[t]`` is the token after ``bwd_char_ids[t]`` in that order, i.e. the
  previous token of the original sentence.
* Epochs: an epoch is one pass over the local sentences in both directions, each direction
  shuffled with a seed derived from ``(seed, epoch, direction)``.  When the order runs out
  the rows run dry one by one; the last (at most ``ceil(longest sentence / T)``) batches of
  an epoch are therefore partly padded: ``*_mask`` is 0 there, char ids and targets are 0.
  Every other batch is full.  The next epoch starts with fresh streams once both
  directions are dry.  Within an epoch every ``</S>``-terminated word of every local
  sentence is a target exactly once (as is every ``<S>`` but the first of each row's
  stream).  With 1B words the padded batches are a negligible fraction.
* ``steps_per_epoch`` is computed from the data: ``(words + sentences) // (B_global * T)``
  with ``B_global = B * process_count`` (the count of tokens including ``</S>``, like the
  original's ``n_train_tokens``); the iterator's own epochs are a little longer because
  of the padded tail.

Multi-process: process ``p`` of ``P`` reads only the sentences ``i`` with ``i % P == p`` and
produces its local batch of ``B`` rows.  The *global* batch is the concatenation of the
local batches of all processes (``B * P`` rows); each process must run the same number of
steps (training iterators are endless, so they do).

Batch dict (numpy)::

    fwd_char_ids [B, T, C] int32   char ids (elmo_jax.chars scheme, +1 offset, 0 = pad)
    fwd_targets  [B, T]    int32   vocabulary ids (unknown words -> <UNK>), 0 where masked
    fwd_mask     [B, T]    float32 1 where the target is real
    bwd_char_ids, bwd_targets, bwd_mask   the same for the backward stream

Evaluation (held-out perplexity): ``LMBatcher(source, vocab, B, T, shuffle=False,
num_epochs=1)``: sentences in corpus order dealt to the rows as they need them, one pass,
``StopIteration`` at the end; average the loss over masked positions.

How a window is built: the shuffled order is read in chunks of ``read_chunk`` positions,
each chunk encoded once: from a :class:`~elmo_jax.data.token_index.TokenIndex` (what
training reads) by array gathers of the sentences' type ids, from any other source by one
token-table lookup for all its words; markers and reversal by index arithmetic.  Which row takes which sentence depends only on sentence lengths; the
window's char ids and targets are then gathered from the chunks in bulk.  The batches are
byte-identical to those of the earlier per-row implementation (tests/test_data_pipeline.py
holds digests of its output).  With ``workers=N`` the chunks are encoded in ``N`` worker
processes and the batches assembled in a background thread, ahead of the consumer
(:mod:`elmo_jax.data.prefetch`); the batches and states do not depend on ``N``.
Throughput: ``benchmarks/data.py`` (numbers in benchmarks/README.md).

Checkpointing: :meth:`LMBatcher.get_state` returns a small JSON-serializable dict (epoch,
per-direction read position and per-row queues of sentence positions plus offsets; no
token data).  :meth:`LMBatcher.set_state` on a batcher built with the same arguments
continues with exactly the batches that would have followed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from elmo_jax import chars as chars_lib
from elmo_jax.data.token_index import TokenIndex
from elmo_jax.data.vocab import Vocabulary

if TYPE_CHECKING:  # for annotations only: LMBatcher imports them where it uses them (workers > 0)
    from elmo_jax.data.prefetch import BatchPipeline, WorkerChunks

__all__ = [
    "LMBatcher",
    "STATE_VERSION",
    "ChunkEncoder",
    "EncodedChunk",
    "IndexChunkEncoder",
    "assemble_chunk",
    "encode_chunk",
]

STATE_VERSION = 1
_DIRECTIONS = ("fwd", "bwd")


class _TokenTable:
    """token string -> (vocab id, char ids row), one dict lookup per token.

    Each distinct token string gets a row in two growing arrays (vocab id, char ids as
    int16); a sentence is then encoded by one dict lookup per token and two fancy-index
    gathers.  Bounded: when ``max_entries`` is reached the table starts afresh (already
    encoded sentences keep their own arrays).
    """

    def __init__(self, vocab: Vocabulary, max_chars: int, max_entries: int):
        self.vocab_id = vocab.id_of
        self.max_chars = max_chars
        self.max_entries = max(16, int(max_entries))
        self._reset()

    def _reset(self) -> None:
        self.index: dict[str, int] = {}
        self.vocab_ids = np.zeros(1024, dtype=np.int32)
        self.char_ids = np.zeros((1024, self.max_chars), dtype=np.int16)

    def _add(self, new: list[str]) -> None:
        """Give rows to the distinct tokens ``new`` (none of them in the table)."""
        n0 = len(self.index)
        n1 = n0 + len(new)
        if n1 > len(self.vocab_ids):
            size = max(n1, 2 * len(self.vocab_ids))
            self.vocab_ids = np.resize(self.vocab_ids, size)
            char_ids = np.zeros((size, self.max_chars), dtype=np.int16)
            char_ids[:n0] = self.char_ids[:n0]
            self.char_ids = char_ids
        for i, tok in enumerate(new, start=n0):
            self.index[tok] = i
            self.vocab_ids[i] = self.vocab_id(tok)
        self.char_ids[n0:n1] = chars_lib.tokens_to_ids(new, self.max_chars)

    def lookup(self, tokens: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(vocab ids [n] int32, char ids [n, C] int16) of ``tokens``.

        One dict lookup per token; the tokens not yet in the table (a few per chunk once the
        frequent words are in) are added and looked up again on their own.
        """
        rows = np.fromiter(map(self.index.get, tokens, itertools.repeat(-1)), dtype=np.int64, count=len(tokens))
        missing = np.flatnonzero(rows < 0)
        if len(missing):
            missing_tokens = [tokens[i] for i in missing.tolist()]
            new = list(dict.fromkeys(missing_tokens))
            if len(self.index) + len(new) > self.max_entries:  # start afresh with these tokens
                self._reset()
                self._add(list(dict.fromkeys(tokens)))
                rows = np.fromiter(map(self.index.__getitem__, tokens), dtype=np.int64, count=len(tokens))
            else:
                self._add(new)
                rows[missing] = np.fromiter(
                    map(self.index.__getitem__, missing_tokens), dtype=np.int64, count=len(missing_tokens)
                )
        return self.vocab_ids[rows], self.char_ids[rows]


def marker_chars(max_chars: int) -> np.ndarray:
    """int16 ``[2, C]``: the char ids of ``<S>`` and ``</S>``."""
    return chars_lib.batch_to_ids([[chars_lib.BOS_TOKEN, chars_lib.EOS_TOKEN]], max_chars)[0].astype(np.int16)


class ChunkEncoder:
    """Reads sentences by index and encodes them into :class:`EncodedChunk` s.

    Picklable (the source, the vocabulary's tokens and the sizes): worker processes get a
    copy and build their own token table, so nothing is shared between processes.
    """

    chars_VC = None  # its chunks carry their own char ids (no shared char table)

    def __init__(self, source, vocab: Vocabulary, max_chars: int, char_cache_size: int):
        self.source = source
        self.vocab = vocab
        self.max_chars = int(max_chars)
        self.char_cache_size = int(char_cache_size)
        self._setup()

    def _setup(self) -> None:
        self.table = _TokenTable(self.vocab, self.max_chars, self.char_cache_size)
        self.bos_id, self.eos_id = self.vocab.bos_id, self.vocab.eos_id
        self.marker_chars_2C = marker_chars(self.max_chars)

    def __getstate__(self) -> dict:
        return {
            "source": self.source,
            "vocab": self.vocab,
            "max_chars": self.max_chars,
            "char_cache_size": self.char_cache_size,
        }

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    def __call__(self, positions: Sequence[int], reverse: bool) -> EncodedChunk:
        sentences = self.source.get_batch([int(i) for i in positions])
        return encode_chunk(sentences, self.table, self.bos_id, self.eos_id, self.marker_chars_2C, reverse)


class IndexChunkEncoder:
    """Encodes chunks from a :class:`~elmo_jax.data.token_index.TokenIndex`: the sentences'
    type ids gathered and mapped to vocabulary ids by array lookups (no Python per word).
    The chunk keeps type ids, not char ids: the window's char ids are gathered from the
    index's char table (``chars_VC``, shared by memory map) when the window is filled, so a
    chunk from a worker process is 8 bytes per token instead of 104.  Gives the same
    batches as :class:`ChunkEncoder` on the source the index was built from.

    Picklable: a folder index travels as its path, the vocabulary as its per-type ids.
    """

    def __init__(self, index, vocab: Vocabulary, max_chars: int):
        self.index = index
        self.max_chars = int(max_chars)
        self.vocab_ids_V = index.vocab_ids(vocab)
        self.bos_id, self.eos_id = vocab.bos_id, vocab.eos_id
        self._setup()

    def _setup(self) -> None:
        self.chars_VC = self.index.char_table(self.max_chars)  # rows V, V + 1, V + 2: <S>, </S>, zeros
        self.bos_row, self.eos_row = self.index.num_types, self.index.num_types + 1

    def __getstate__(self) -> dict:
        # A folder index is reopened on the first chunk, not while unpickling, so that a
        # folder gone missing is reported as the worker's error, not as a dead worker.
        index = self.index if self.index.folder is None else None
        return {
            "index": index,
            "folder": self.index.folder,
            "max_chars": self.max_chars,
            "vocab_ids_V": self.vocab_ids_V,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
        }

    def __setstate__(self, state: dict) -> None:
        folder = state.pop("folder")
        self.__dict__.update(state)
        self._folder = folder
        if self.index is not None:
            self._setup()

    def __call__(self, positions: Sequence[int], reverse: bool) -> EncodedChunk:
        if self.index is None:  # unpickled in a worker: open the folder now
            self.index = TokenIndex.open(self._folder, verify=False)  # checked when the parent opened it
            self._setup()
        lens_n, types = self.index.sentence_types(positions)
        starts, (ids_N, types_N) = assemble_chunk(
            lens_n, [(self.vocab_ids_V[types], self.bos_id, self.eos_id), (types, self.bos_row, self.eos_row)], reverse
        )
        return EncodedChunk(ids_N, None, starts, types_N)


def encode_chunk(
    sentences: Sequence[Sequence[str]],
    table: "_TokenTable",
    bos_id: int,
    eos_id: int,
    marker_chars_2C: np.ndarray,
    reverse: bool,
) -> "EncodedChunk":
    """Sentences -> one :class:`EncodedChunk` (``<S> w1 .. wn </S>`` each, or reversed):
    one token-table lookup for all words of the chunk, then :func:`assemble_chunk`."""
    lens_n = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
    if int(lens_n.sum()):
        word_ids, word_chars = table.lookup([t for s in sentences for t in s])
    else:
        word_ids = np.zeros(0, dtype=np.int32)
        word_chars = np.zeros((0, table.max_chars), dtype=np.int16)
    starts, (ids_N, chars_NC) = assemble_chunk(
        lens_n, [(word_ids, bos_id, eos_id), (word_chars, marker_chars_2C[0], marker_chars_2C[1])], reverse
    )
    return EncodedChunk(ids_N, chars_NC, starts)


def assemble_chunk(lens_n: np.ndarray, columns, reverse: bool) -> tuple[np.ndarray, list[np.ndarray]]:
    """Sentences of ``lens_n`` words laid out as ``<S> w1 .. wn </S>`` each (or reversed,
    ``</S> wn .. w1 <S>``), one after another.

    ``columns``: ``(words, bos, eos)`` triples, ``words`` ``[sum(lens_n), ...]`` holding a
    value per word (the sentences' words one after another), ``bos`` / ``eos`` the values of
    the markers.  Returns (``starts [n + 1]``: sentence ``i`` is ``starts[i]:starts[i + 1]``,
    one array per column).  Every marker and every reversal is placed with index arithmetic
    (no Python loop per sentence).
    """
    lens_n = np.asarray(lens_n, dtype=np.int64)
    n = len(lens_n)
    sizes_n = lens_n + 2
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes_n, out=starts[1:])
    total = int(starts[-1])
    first, last = starts[:-1], starts[1:] - 1
    n_words = int(lens_n.sum())
    # word j of sentence i goes to starts[i] + 1 + j: shift each sentence's run of words.
    at = np.arange(n_words, dtype=np.int64) + np.repeat(first + 1 - (np.cumsum(lens_n) - lens_n), lens_n)
    src = None
    if reverse and total:  # position p of sentence i reads first_i + last_i - p
        src = (first + last)[np.repeat(np.arange(n), sizes_n)] - np.arange(total, dtype=np.int64)
    out = []
    for words, bos, eos in columns:
        column = np.empty((total,) + words.shape[1:], dtype=words.dtype)
        column[first], column[last] = bos, eos
        column[at] = words
        out.append(column if src is None else column[src])
    return starts, out


class EncodedChunk:
    """Consecutive sentences of one direction's order, encoded: sentence ``i`` is tokens
    ``starts[i]:starts[i + 1]`` of ``ids_N`` (vocabulary ids, int32) and ``chars_NC`` (char
    ids, int16), markers included; or, from a token index, ``types_N`` (int32 rows of the
    encoder's char table) instead of ``chars_NC``."""

    __slots__ = ("ids_N", "chars_NC", "types_N", "starts", "lengths_n", "lengths")

    def __init__(
        self, ids_N: np.ndarray, chars_NC: np.ndarray | None, starts: np.ndarray, types_N: np.ndarray | None = None
    ):
        self.ids_N, self.chars_NC, self.starts, self.types_N = ids_N, chars_NC, starts, types_N
        self.lengths_n = np.diff(starts)
        self.lengths = self.lengths_n.tolist()  # Python ints: read one at a time

    def __reduce__(self):
        return EncodedChunk, (self.ids_N, self.chars_NC, self.starts, self.types_N)


class _Stream:
    """One direction: a sentence order per epoch and B rows each consuming its stream.

    The order is read in chunks of ``read_chunk`` consecutive positions (chunk ``c`` holds
    positions ``c * R .. (c + 1) * R - 1``), each encoded once into an :class:`EncodedChunk`
    by the batcher's chunk provider (in this thread, or by worker processes).  Which row
    takes which sentence is decided from the sentence lengths alone; the window's tokens are
    then gathered from the chunks with one fancy index per chunk.  Chunks are dropped once
    no row holds a sentence of theirs, so memory stays bounded by the sentences in flight.
    """

    def __init__(self, owner: "LMBatcher", direction: int):
        self.o = owner
        self.direction = direction  # 0 forward, 1 backward
        self.epoch = 0
        self.order = np.empty(0, dtype=np.int64)
        self.next_pos = 0
        # Per row: the positions (in `order`) of its queued sentences, the index of its next
        # input token within their concatenation, and how many tokens are left from there.
        self.queues: list[list[int]] = []
        self.offsets = np.zeros(0, dtype=np.int64)
        self.avail = np.zeros(0, dtype=np.int64)
        self._chunks: dict[int, EncodedChunk] = {}

    # -- epochs ------------------------------------------------------------------------
    def start_epoch(self, epoch: int) -> None:
        local = self.o._local_indices
        if self.o.shuffle:
            rng = np.random.default_rng([self.o.seed, epoch, self.direction])
            self.order = local[rng.permutation(len(local))]
        else:
            self.order = local
        self.epoch = epoch
        self.next_pos = 0
        B = self.o.batch_size
        self.queues = [[] for _ in range(B)]
        self.offsets = np.zeros(B, dtype=np.int64)
        self.avail = np.zeros(B, dtype=np.int64)
        self._chunks.clear()

    # -- sentence data -----------------------------------------------------------------
    def _chunk_positions(self, c: int) -> np.ndarray:
        R = self.o.read_chunk
        return self.order[c * R : (c + 1) * R]

    def chunk(self, c: int) -> EncodedChunk:
        hit = self._chunks.get(c)
        if hit is None:
            provider = self.o._provider
            hit = provider.get((self.epoch, self.direction, c), self._chunk_positions(c), self.direction == 1)
            self._chunks[c] = hit
            n_chunks = -(-len(self.order) // self.o.read_chunk)
            for ahead in range(c + 1, min(c + 1 + provider.lookahead, n_chunks)):
                if ahead not in self._chunks:
                    provider.prefetch(
                        (self.epoch, self.direction, ahead), self._chunk_positions(ahead), self.direction == 1
                    )
        return hit

    def length(self, pos: int) -> int:
        c, i = divmod(pos, self.o.read_chunk)
        return self.chunk(c).lengths[i]

    def _drop_finished_chunks(self) -> None:
        heads = [q[0] for q in self.queues if q]
        oldest = min(heads, default=self.next_pos)
        first_live = min(oldest, self.next_pos) // self.o.read_chunk
        for c in [c for c in self._chunks if c < first_live]:
            del self._chunks[c]

    def dry(self) -> bool:
        """No row can produce another (input, target) pair and no sentence is left."""
        return self.next_pos >= len(self.order) and bool((self.avail <= 1).all())

    # -- one window --------------------------------------------------------------------
    def fill(self, char_out: np.ndarray, tgt_out: np.ndarray, mask_out: np.ndarray) -> None:
        """Write the next window into ``char_out [B, T, C]``, ``tgt_out [B, T]``, ``mask_out [B, T]``
        (zero-initialised)."""
        T = self.o.unroll_steps
        R = self.o.read_chunk
        n_order = len(self.order)
        avail, offsets, queues = self.avail, self.offsets, self.queues
        # 1. Row assignment from lengths only, rows in order 0..B-1 (the draw order).
        if self.next_pos < n_order:
            needy = np.flatnonzero(avail < T + 1).tolist()
            filled = []
            p = self.next_pos
            c, i = divmod(p, R)
            lens = self.chunk(c).lengths if needy else []  # Python ints of chunk c
            for r in needy:
                a, q = int(avail[r]), queues[r]
                while a < T + 1 and p < n_order:
                    if i == len(lens):
                        c, i = c + 1, 0
                        lens = self.chunk(c).lengths
                    q.append(p)
                    a += lens[i]
                    i += 1
                    p += 1
                filled.append(a)
                if p >= n_order:
                    break
            avail[needy[: len(filled)]] = filled
            self.next_pos = p
        k_B = np.minimum(T, avail - 1)  # inputs that have a target
        # 2. Every queued sentence of every row, flattened (rows in order): its row, its
        #    length, where it starts in the row's token stream and in its chunk.
        q_lens = np.fromiter(map(len, queues), dtype=np.int64, count=len(queues))
        pos = np.fromiter(itertools.chain.from_iterable(queues), dtype=np.int64, count=int(q_lens.sum()))
        if not len(pos):
            return
        row = np.repeat(np.arange(len(queues)), q_lens)
        chunk_of = pos // R
        lengths = np.empty(len(pos), dtype=np.int64)
        src0 = np.empty(len(pos), dtype=np.int64)
        chunk_ids = np.unique(chunk_of).tolist()
        for c in chunk_ids:
            ch = self.chunk(c)
            sel = chunk_of == c
            i = pos[sel] - c * R
            lengths[sel] = ch.lengths_n[i]
            src0[sel] = ch.starts[i]
        ends = np.cumsum(lengths)
        row_base = np.zeros(len(queues), dtype=np.int64)
        np.cumsum(q_lens[:-1], out=row_base[1:])
        row_first = row_base[row]  # index (in the flat list) of the row's first sentence
        before = ends - lengths - (ends - lengths)[row_first]  # sentence start within the row stream
        # 3. The window of row r is tokens [offset, offset + k] (k inputs and one more for the
        #    last target) of its stream: clip every sentence to it.
        k = np.maximum(k_B, 0)[row]
        lo = np.maximum(offsets[row], before)
        hi = np.minimum(offsets[row] + k + 1, before + lengths)
        take = np.where(k > 0, hi - lo, 0)
        hit = take > 0
        seg_len = take[hit]
        seg_of = np.repeat(np.flatnonzero(hit), seg_len)
        within = np.arange(len(seg_of), dtype=np.int64) - np.repeat(np.cumsum(seg_len) - seg_len, seg_len)
        tok_row = row[seg_of]
        t = (lo - offsets[row])[seg_of] + within
        src = (src0 + lo - before)[seg_of] + within
        tok_chunk = chunk_of[seg_of]
        is_input = t < k_B[tok_row]
        is_target = t >= 1
        table_VC = self.o._encoder.chars_VC  # the char table of a token index's chunks, or None
        # one flat index per token instead of (row, time) pairs: [B, T] viewed as [B * T]
        at_input = tok_row * T + t
        char_out_BtC = char_out.reshape(-1, char_out.shape[-1])
        tgt_out_Bt = tgt_out.reshape(-1)
        if table_VC is not None:  # each position's row of the table (padding: its zero row)
            rows_Bt = np.full(len(tgt_out_Bt), len(table_VC) - 1, dtype=np.int32)
        for c in chunk_ids:
            ch = self._chunks[c]
            sel = tok_chunk == c
            inp = sel & is_input
            if table_VC is None:
                assert ch.chars_NC is not None  # a ChunkEncoder's chunk: char ids, no table
                char_out_BtC[at_input[inp]] = ch.chars_NC[src[inp]]
            else:
                assert ch.types_N is not None  # an IndexChunkEncoder's chunk: rows of its table
                rows_Bt[at_input[inp]] = ch.types_N[src[inp]]
            tg = sel & is_target
            tgt_out_Bt[at_input[tg] - 1] = ch.ids_N[src[tg]]
        if table_VC is not None:  # one contiguous gather, then one cast to the output's dtype
            char_out_BtC[...] = table_VC[rows_Bt]
        mask_out[np.arange(T)[None, :] < k_B[:, None]] = 1.0
        # 4. Advance; drop the sentences all of whose tokens have been read as input.
        new_offsets = offsets + np.maximum(k_B, 0)
        done = (before + lengths) <= new_offsets[row]
        n_done = np.bincount(row[done], minlength=len(queues))
        dropped_tokens = np.bincount(row[done], weights=lengths[done], minlength=len(queues)).astype(np.int64)
        for r in np.flatnonzero(n_done).tolist():
            del queues[r][: n_done[r]]
        offsets[:] = new_offsets - dropped_tokens
        avail -= np.maximum(k_B, 0)
        self._drop_finished_chunks()

    # -- state -------------------------------------------------------------------------
    def snapshot(self) -> tuple:
        """The stream's position, cheaply (numpy copies; taken after every batch a pipeline
        builds ahead): ``state_of`` turns it into :meth:`get_state`'s form."""
        q_lens = np.fromiter(map(len, self.queues), dtype=np.int64, count=len(self.queues))
        flat = np.fromiter(itertools.chain.from_iterable(self.queues), dtype=np.int64, count=int(q_lens.sum()))
        return self.next_pos, self.offsets.copy(), flat, q_lens

    @staticmethod
    def state_of(snapshot: tuple) -> dict:
        next_pos, offsets, flat, q_lens = snapshot
        ends = np.cumsum(q_lens).tolist()
        flat = flat.tolist()
        return {
            "next_pos": int(next_pos),
            "rows": [[o, flat[e - n : e]] for o, e, n in zip(offsets.tolist(), ends, q_lens.tolist())],
        }

    def get_state(self) -> dict:
        return self.state_of(self.snapshot())

    def set_state(self, epoch: int, state: dict) -> None:
        self.start_epoch(epoch)
        rows = state["rows"]
        if len(rows) != self.o.batch_size:
            raise ValueError(f"state has {len(rows)} rows, the batcher has batch_size={self.o.batch_size}")
        self.next_pos = int(state["next_pos"])
        if not 0 <= self.next_pos <= len(self.order):
            raise ValueError(f"state read position {self.next_pos} is outside 0..{len(self.order)}")
        self.queues = [[int(p) for p in q] for _, q in rows]
        self.offsets = np.asarray([int(o) for o, _ in rows], dtype=np.int64)
        for q in self.queues:
            if any(not 0 <= p < self.next_pos for p in q):
                raise ValueError(f"state queues a sentence position outside 0..{self.next_pos - 1}")
        self.avail = np.asarray([sum(self.length(p) for p in q) for q in self.queues], dtype=np.int64) - self.offsets


class _InlineChunks:
    """Chunk provider that encodes in the calling thread (``workers=0``)."""

    lookahead = 0

    def __init__(self, encode):
        self._encode = encode

    def get(self, key, positions, reverse: bool) -> EncodedChunk:
        del key
        return self._encode(positions, reverse)

    def prefetch(self, key, positions, reverse: bool) -> None:
        pass

    def close(self) -> None:
        pass


class LMBatcher(Iterator[dict]):
    """Bidirectional LM training/eval batches from a :class:`SentenceSource`.

    Args:
      source: random-access sentences (``len``, ``get_batch(indices)``, ``num_tokens()``).
      vocab: the target vocabulary.
      batch_size: ``B``, the rows of this process's (local) batch.
      unroll_steps: ``T``, the window length.
      max_characters_per_token: ``C``.
      seed: shuffling seed; epoch ``e`` of direction ``d`` is shuffled with ``(seed, e, d)``.
      shuffle: False reads the sentences in order (evaluation).
      num_epochs: None = endless (training); else ``StopIteration`` after that many passes.
      process_index, process_count: this process reads sentences ``i % count == index``.
      read_chunk: sentences read and encoded at once (not part of the state: any value gives
        the same batches).
      char_cache_size: bound on the distinct tokens cached with their ids (about 100 bytes each).
      workers: 0 builds each batch in the thread that calls ``next``; ``N >= 1`` reads and
        encodes the sentences in ``N`` worker processes and assembles batches in a
        background thread, ``prefetch`` batches ahead (:mod:`elmo_jax.data.prefetch`).  The
        batches and states are the same for every value.  Call :meth:`close` (or use the
        batcher as a context manager) to stop the workers.
      prefetch: batches built ahead of the consumer when ``workers >= 1``.
      log: where the line saying a dead worker process was replaced goes (default: stderr).
    """

    def __init__(
        self,
        source,
        vocab: Vocabulary,
        batch_size: int,
        unroll_steps: int = 20,
        max_characters_per_token: int = 50,
        *,
        seed: int = 0,
        shuffle: bool = True,
        num_epochs: int | None = None,
        process_index: int = 0,
        process_count: int = 1,
        read_chunk: int = 1024,
        char_cache_size: int = 500_000,
        workers: int = 0,
        prefetch: int = 8,
        log: Callable[[str], None] | None = None,
    ):
        if batch_size < 1 or unroll_steps < 1:
            raise ValueError(f"batch_size and unroll_steps must be >= 1, got {batch_size}, {unroll_steps}")
        if not 0 <= process_index < process_count:
            raise ValueError(f"process_index={process_index} is not in 0..process_count-1={process_count - 1}")
        if num_epochs is not None and num_epochs < 1:
            raise ValueError(f"num_epochs must be None or >= 1, got {num_epochs}")
        if workers < 0 or prefetch < 1:
            raise ValueError(f"workers must be >= 0 and prefetch >= 1, got {workers} and {prefetch}")
        self.source = source
        self.vocab = vocab
        self.batch_size = int(batch_size)
        self.unroll_steps = int(unroll_steps)
        self.max_characters_per_token = int(max_characters_per_token)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.num_epochs = num_epochs
        self.process_index = int(process_index)
        self.process_count = int(process_count)
        self.read_chunk = max(1, int(read_chunk))
        self.char_cache_size = int(char_cache_size)
        self.workers = int(workers)
        self.num_sentences = len(source)
        if self.num_sentences == 0:
            raise ValueError("the sentence source is empty")
        self._local_indices = np.arange(self.process_index, self.num_sentences, self.process_count, dtype=np.int64)
        if len(self._local_indices) == 0:
            raise ValueError(
                f"process {process_index} of {process_count} gets no sentence: the source has only {self.num_sentences}"
            )
        self._encoder: IndexChunkEncoder | ChunkEncoder
        if isinstance(source, TokenIndex):  # numpy gathers, no Python per word
            self._encoder = IndexChunkEncoder(source, vocab, self.max_characters_per_token)
        else:
            self._encoder = ChunkEncoder(source, vocab, self.max_characters_per_token, char_cache_size)
        self._streams = [_Stream(self, 0), _Stream(self, 1)]
        self.epoch = 0
        self.batches_in_epoch = 0
        self._finished = False
        self._provider: WorkerChunks | _InlineChunks
        self._pipeline: BatchPipeline | None
        if self.workers:
            from elmo_jax.data.prefetch import BatchPipeline, WorkerChunks

            self._provider = WorkerChunks(self._encoder, self.workers, log)
            self._pipeline = BatchPipeline(self, prefetch)
        else:
            self._provider = _InlineChunks(self._encoder)
            self._pipeline = None
        for s in self._streams:
            s.start_epoch(0)

    # ------------------------------------------------------------------ sizes
    def num_epoch_tokens(self) -> int:
        """Tokens of the whole source counting one ``</S>`` per sentence (all processes)."""
        return int(self.source.num_tokens()) + self.num_sentences

    @property
    def steps_per_epoch(self) -> int:
        """``(words + sentences) // (B * process_count * T)``, at least 1."""
        global_batch = self.batch_size * self.process_count * self.unroll_steps
        return max(1, self.num_epoch_tokens() // global_batch)

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> "LMBatcher":
        return self

    def __next__(self) -> dict:
        if self._pipeline is not None:
            return self._pipeline.next()
        return self._build_next()

    def _build_next(self) -> dict:
        """The next batch from the streams (the thread that owns them calls this)."""
        if self._finished:
            raise StopIteration
        if all(s.dry() for s in self._streams):
            if self.num_epochs is not None and self.epoch + 1 >= self.num_epochs:
                self._finished = True
                raise StopIteration
            self.epoch += 1
            self.batches_in_epoch = 0
            for s in self._streams:
                s.start_epoch(self.epoch)
        B, T, C = self.batch_size, self.unroll_steps, self.max_characters_per_token
        batch: dict[str, np.ndarray] = {}
        for name, stream in zip(_DIRECTIONS, self._streams):
            ch = np.zeros((B, T, C), dtype=np.int32)
            tg = np.zeros((B, T), dtype=np.int32)
            mk = np.zeros((B, T), dtype=np.float32)
            stream.fill(ch, tg, mk)
            batch[f"{name}_char_ids"] = ch
            batch[f"{name}_targets"] = tg
            batch[f"{name}_mask"] = mk
        self.batches_in_epoch += 1
        return batch

    # ------------------------------------------------------------------ workers
    def close(self) -> None:
        """Stop the background thread and the worker processes (``workers >= 1``); idempotent.
        The workers first: the thread may be waiting for one of them."""
        self._provider.close()
        if self._pipeline is not None:
            self._pipeline.close()

    def __enter__(self) -> "LMBatcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ state
    def _config_fingerprint(self) -> dict:
        return {
            "batch_size": self.batch_size,
            "unroll_steps": self.unroll_steps,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "process_index": self.process_index,
            "process_count": self.process_count,
            "num_sentences": self.num_sentences,
        }

    def get_state(self) -> dict:
        """The input position (JSON-serializable, no token data): resumes after the last batch
        that ``next`` returned (with workers, batches built ahead are not counted)."""
        if self._pipeline is not None:
            return self._pipeline.state()
        return self._build_state()

    def _build_state(self) -> dict:
        return self._state_of(self._snapshot())

    def _snapshot(self) -> tuple:
        """:meth:`get_state` after the batch just built, in a form that is cheap to take
        (what a pipeline keeps beside each batch built ahead); see :meth:`_state_of`."""
        return (
            int(self.epoch),
            int(self.batches_in_epoch),
            bool(self._finished),
            [s.snapshot() for s in self._streams],
        )

    def _state_of(self, snapshot: tuple) -> dict:
        epoch, batches_in_epoch, finished, streams = snapshot
        return {
            "version": STATE_VERSION,
            **self._config_fingerprint(),
            "epoch": epoch,
            "batches_in_epoch": batches_in_epoch,
            "finished": finished,
            **{name: _Stream.state_of(snap) for name, snap in zip(_DIRECTIONS, streams)},
        }

    def set_state(self, state: dict) -> None:
        """Continue from a :meth:`get_state` dict of a batcher built with the same arguments
        (any ``workers``, ``prefetch`` and ``read_chunk``)."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unknown batcher state version {state.get('version')!r} (expected {STATE_VERSION})")
        mismatched = {k: (state.get(k), v) for k, v in self._config_fingerprint().items() if state.get(k) != v}
        if mismatched:
            detail = ", ".join(f"{k}: state {a!r} vs batcher {b!r}" for k, (a, b) in mismatched.items())
            raise ValueError(f"the batcher state does not match this batcher ({detail})")
        if self._pipeline is not None:
            self._pipeline.set_state(state)
        else:
            self._apply_state(state)

    def _apply_state(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self.batches_in_epoch = int(state["batches_in_epoch"])
        self._finished = bool(state.get("finished", False))
        for name, s in zip(_DIRECTIONS, self._streams):
            s.set_state(self.epoch, state[name])
