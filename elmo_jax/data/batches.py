"""The original's pretraining batches, as a deterministic, checkpointable numpy iterator.

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

Throughput (one CPU core, B=128, T=20, both directions, a generated 200k-sentence corpus
with a 100k-type Zipf vocabulary): about 100 batches/s from ArrayRecord (local text
source), 155 batches/s from memory.  The training loop builds the next batch while the
device runs the current step (JAX dispatches the step asynchronously), so this overlaps
with the device's work without a thread.

Checkpointing: :meth:`LMBatcher.get_state` returns a small JSON-serializable dict (epoch,
per-direction read position and per-row queues of sentence positions plus offsets; no
token data).  :meth:`LMBatcher.set_state` on a batcher built with the same arguments
continues with exactly the batches that would have followed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from elmo_jax import chars as chars_lib
from elmo_jax.data.vocab import Vocabulary

__all__ = ["LMBatcher", "STATE_VERSION"]

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

    def _add(self, tokens: Sequence[str]) -> None:
        new = list(dict.fromkeys(t for t in tokens if t not in self.index))
        if len(self.index) + len(new) > self.max_entries:
            self._reset()
            new = list(dict.fromkeys(tokens))
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
        """(vocab ids [n] int32, char ids [n, C] int16) of ``tokens``."""
        get = self.index.get
        rows = [get(t, -1) for t in tokens]
        if -1 in rows:
            self._add(tokens)
            rows = [self.index[t] for t in tokens]
        rows = np.asarray(rows, dtype=np.int64)
        return self.vocab_ids[rows], self.char_ids[rows]


class _Stream:
    """One direction: a sentence order per epoch and B rows each consuming its stream."""

    def __init__(self, owner: "LMBatcher", direction: int):
        self.o = owner
        self.direction = direction  # 0 forward, 1 backward
        self.order = np.empty(0, dtype=np.int64)
        self.next_pos = 0
        # Per row: [offset, [positions in `order` of the queued sentences]]; offset is the
        # index of the row's next input token within the concatenation of its queue.
        self.rows: list[list] = []
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    # -- epochs ------------------------------------------------------------------------
    def start_epoch(self, epoch: int) -> None:
        local = self.o._local_indices
        if self.o.shuffle:
            rng = np.random.default_rng([self.o.seed, epoch, self.direction])
            self.order = local[rng.permutation(len(local))]
        else:
            self.order = local
        self.next_pos = 0
        self.rows = [[0, []] for _ in range(self.o.batch_size)]
        self._cache.clear()

    # -- sentence data -----------------------------------------------------------------
    def _sentence(self, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """(vocab ids [n+2] int32, char ids [n+2, C] int16) of the sentence at ``pos``."""
        hit = self._cache.get(pos)
        if hit is not None:
            return hit
        if pos < self.next_pos:  # a queued sentence after set_state: just this one
            positions = [pos]
        else:  # read ahead along the order
            end = min(pos + self.o.read_chunk, len(self.order))
            positions = [p for p in range(pos, end) if p not in self._cache]
        sentences = self.o.source.get_batch([int(self.order[p]) for p in positions])
        for p, tokens in zip(positions, sentences):
            self._cache[p] = self.o._encode(tokens, reverse=self.direction == 1)
        return self._cache[pos]

    def _row_avail(self, row: list) -> int:
        offset, queue = row
        return sum(len(self._sentence(p)[0]) for p in queue) - offset

    def dry(self) -> bool:
        """No row can produce another (input, target) pair and no sentence is left."""
        if self.next_pos < len(self.order):
            return False
        return all(self._row_avail(row) <= 1 for row in self.rows)

    # -- one window --------------------------------------------------------------------
    def fill(self, char_out: np.ndarray, tgt_out: np.ndarray, mask_out: np.ndarray) -> None:
        T = self.o.unroll_steps
        n_order = len(self.order)
        for r, row in enumerate(self.rows):
            offset, queue = row
            avail = self._row_avail(row)
            while avail < T + 1 and self.next_pos < n_order:
                queue.append(self.next_pos)
                avail += len(self._sentence(self.next_pos)[0])
                self.next_pos += 1
            k = min(T, avail - 1)  # inputs that have a target
            if k <= 0:
                continue
            # Gather tokens [offset, offset + k] (k inputs + one more for the last target).
            ids_parts, char_parts = [], []
            need, start = k + 1, offset
            for p in queue:
                ids, chs = self._sentence(p)
                if start >= len(ids):
                    start -= len(ids)
                    continue
                take = min(len(ids) - start, need)
                ids_parts.append(ids[start : start + take])
                char_parts.append(chs[start : start + take])
                need -= take
                start = 0
                if need == 0:
                    break
            ids = np.concatenate(ids_parts) if len(ids_parts) > 1 else ids_parts[0]
            chs = np.concatenate(char_parts) if len(char_parts) > 1 else char_parts[0]
            char_out[r, :k] = chs[:k]
            tgt_out[r, :k] = ids[1 : k + 1]
            mask_out[r, :k] = 1.0
            # Advance and drop the sentences all of whose tokens have been read as input.
            offset += k
            while queue:
                n = len(self._sentence(queue[0])[0])
                if offset < n:
                    break
                offset -= n
                self._cache.pop(queue.pop(0), None)
            row[0] = offset

    # -- state -------------------------------------------------------------------------
    def get_state(self) -> dict:
        return {"next_pos": int(self.next_pos), "rows": [[int(o), [int(p) for p in q]] for o, q in self.rows]}

    def set_state(self, epoch: int, state: dict) -> None:
        self.start_epoch(epoch)
        rows = state["rows"]
        if len(rows) != self.o.batch_size:
            raise ValueError(f"state has {len(rows)} rows, the batcher has batch_size={self.o.batch_size}")
        self.next_pos = int(state["next_pos"])
        if not 0 <= self.next_pos <= len(self.order):
            raise ValueError(f"state read position {self.next_pos} is outside 0..{len(self.order)}")
        self.rows = [[int(o), [int(p) for p in q]] for o, q in rows]


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
      read_chunk: sentences read from the source at once (read-ahead, not part of the state).
      char_cache_size: bound on the distinct tokens cached with their ids (about 100 bytes each).
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
    ):
        if batch_size < 1 or unroll_steps < 1:
            raise ValueError(f"batch_size and unroll_steps must be >= 1, got {batch_size}, {unroll_steps}")
        if not 0 <= process_index < process_count:
            raise ValueError(f"process_index={process_index} is not in 0..process_count-1={process_count - 1}")
        if num_epochs is not None and num_epochs < 1:
            raise ValueError(f"num_epochs must be None or >= 1, got {num_epochs}")
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
        self.num_sentences = len(source)
        if self.num_sentences == 0:
            raise ValueError("the sentence source is empty")
        self._local_indices = np.arange(self.process_index, self.num_sentences, self.process_count, dtype=np.int64)
        if len(self._local_indices) == 0:
            raise ValueError(
                f"process {process_index} of {process_count} gets no sentence: the source has only "
                f"{self.num_sentences}"
            )
        self._tokens = _TokenTable(vocab, self.max_characters_per_token, char_cache_size)
        self._bos, self._eos = vocab.bos_id, vocab.eos_id
        self._marker_chars = chars_lib.batch_to_ids(
            [[chars_lib.BOS_TOKEN, chars_lib.EOS_TOKEN]], self.max_characters_per_token
        )[0].astype(np.int16)
        self._streams = [_Stream(self, 0), _Stream(self, 1)]
        self.epoch = 0
        self.batches_in_epoch = 0
        self._finished = False
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

    # ------------------------------------------------------------------ encoding
    def _encode(self, tokens: Sequence[str], reverse: bool) -> tuple[np.ndarray, np.ndarray]:
        n = len(tokens)
        ids = np.empty(n + 2, dtype=np.int32)
        ids[0], ids[-1] = self._bos, self._eos
        chs = np.empty((n + 2, self.max_characters_per_token), dtype=np.int16)
        chs[0], chs[-1] = self._marker_chars[0], self._marker_chars[1]
        if n:
            ids[1:-1], chs[1:-1] = self._tokens.lookup(tokens)
        if reverse:  # </S> wn .. w1 <S>
            return ids[::-1].copy(), chs[::-1].copy()
        return ids, chs

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> "LMBatcher":
        return self

    def __next__(self) -> dict:
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
        batch = {}
        for name, stream in zip(_DIRECTIONS, self._streams):
            ch = np.zeros((B, T, C), dtype=np.int16)
            tg = np.zeros((B, T), dtype=np.int32)
            mk = np.zeros((B, T), dtype=np.float32)
            stream.fill(ch, tg, mk)
            batch[f"{name}_char_ids"] = ch.astype(np.int32)
            batch[f"{name}_targets"] = tg
            batch[f"{name}_mask"] = mk
        self.batches_in_epoch += 1
        return batch

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
        """The input position (JSON-serializable, no token data): resumes after the last batch."""
        return {
            "version": STATE_VERSION,
            **self._config_fingerprint(),
            "epoch": int(self.epoch),
            "batches_in_epoch": int(self.batches_in_epoch),
            "finished": bool(self._finished),
            **{name: s.get_state() for name, s in zip(_DIRECTIONS, self._streams)},
        }

    def set_state(self, state: dict) -> None:
        """Continue from a :meth:`get_state` dict of a batcher built with the same arguments."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unknown batcher state version {state.get('version')!r} (expected {STATE_VERSION})")
        mismatched = {
            k: (state.get(k), v) for k, v in self._config_fingerprint().items() if state.get(k) != v
        }
        if mismatched:
            detail = ", ".join(f"{k}: state {a!r} vs batcher {b!r}" for k, (a, b) in mismatched.items())
            raise ValueError(f"the batcher state does not match this batcher ({detail})")
        self.epoch = int(state["epoch"])
        self.batches_in_epoch = int(state["batches_in_epoch"])
        self._finished = bool(state.get("finished", False))
        for name, s in zip(_DIRECTIONS, self._streams):
            s.set_state(self.epoch, state[name])
