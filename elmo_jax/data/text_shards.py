"""Local text -> ArrayRecord shards in parallel processes (the work behind
:func:`elmo_jax.data.text_source.prepare_local_text` with ``workers >= 1``).

The files are cut into byte ranges (:func:`byte_ranges`); a line belongs to the range in
which its first byte lies, so every line is read by exactly one range, whole, and the
ranges in order give the lines in file order.  Each range is read by one worker process
(:func:`write_range`), which writes its sentences, in order, as serialized
``tf.train.Example`` records (:func:`text_example`, the bytes TFDS writes for the feature
``text``) into one ArrayRecord shard, and returns its counts and the sentences as the
content digest hashes them.  The digest (:class:`~elmo_jax.data.text_source.ContentDigest`,
one SHA-256 over all sentences in order) cannot be combined from per-range digests, so the
parent feeds the ranges' bytes to it in range order while later ranges are still being
written; hashing costs a few per cent of the reading.

Nothing here imports TensorFlow Datasets: the dataset's metadata is written by the caller.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from elmo_jax.textio import TextEncodingError, decode_line

__all__ = ["byte_ranges", "text_example", "write_range"]

_CHUNK_MAX = 64 << 20  # bytes of text per range at most: bounds what a worker returns
_CHUNK_MIN = 1 << 20


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_BYTE = [bytes((n,)) for n in range(0x80)]


def text_example(text: bytes) -> bytes:
    """``tf.train.Example`` with the single bytes feature ``text``, serialized as TFDS
    serializes ``{"text": ...}`` for a ``Text`` feature (the inverse of
    :func:`elmo_jax.data.text_source.example_text`).

    Example.features(1) -> Features.feature(1, map entry: key(1) = "text", value(2)) ->
    Feature.bytes_list(1) -> BytesList.value(1); every field length-delimited (tag 0x0a for
    field 1, 0x12 for field 2), nested from the inside out."""
    n0 = len(text)
    v0 = _varint(n0)
    n1 = 1 + len(v0) + n0  # BytesList
    v1 = _varint(n1)
    n2 = 1 + len(v1) + n1  # Feature
    v2 = _varint(n2)
    n3 = 7 + len(v2) + n2  # map entry: key "text" (6 bytes), value
    v3 = _varint(n3)
    n4 = 1 + len(v3) + n3  # Features
    return b"".join((b"\n", _varint(n4), b"\n", v3, b"\n\x04text\x12", v2, b"\n", v1, b"\n", v0, text))


def byte_ranges(sizes: Sequence[int], workers: int) -> list[tuple[int, int, int]]:
    """``(file_index, start, stop)`` byte ranges covering files of ``sizes`` bytes, in file
    order: about four ranges per worker, each 1-64 MiB (a smaller file is one range)."""
    total = sum(sizes)
    chunk = min(_CHUNK_MAX, max(_CHUNK_MIN, -(-total // max(1, 4 * workers))))
    ranges = []
    for i, size in enumerate(sizes):
        parts = max(1, -(-size // chunk))
        bounds = [size * k // parts for k in range(parts + 1)]
        ranges.extend((i, a, b) for a, b in zip(bounds, bounds[1:]))
    return ranges


def _line_number(path: str, offset: int) -> int:
    """1-based number of the line starting at byte ``offset`` (only for error messages)."""
    count, done = 1, 0
    with open(path, "rb") as f:
        while done < offset:
            block = f.read(min(1 << 20, offset - done))
            if not block:
                break
            count += block.count(b"\n")
            done += len(block)
    return count


def write_range(path: str, start: int, stop: int, shard_path: str) -> dict:
    """Write the sentences of the lines of ``path`` that start in ``[start, stop)`` to the
    ArrayRecord file ``shard_path``.

    Returns ``num_sentences``, ``num_tokens``, ``num_bytes`` (of the records), ``content``
    (each sentence's tokens joined by spaces, then a newline: what the content digest
    hashes) and ``cpu_s`` (this process's CPU time for the range).  Blank lines are skipped,
    a UTF-8 byte-order mark at the start of the file is dropped and invalid UTF-8 raises
    :class:`~elmo_jax.textio.TextEncodingError` naming the line, as in the one-process path.
    """
    from array_record.python.array_record_module import ArrayRecordWriter

    cpu0 = time.process_time()
    n_sentences = n_tokens = n_bytes = 0
    content: list[bytes] = []
    writer = ArrayRecordWriter(shard_path, "group_size:1")  # TFDS's options for ArrayRecord
    try:
        with open(path, "rb") as f:
            if start > 0:  # skip the line that began before this range
                f.seek(start - 1)
                pos = start - 1 + len(f.readline())
            else:
                pos = 0
            while pos < stop:
                raw = f.readline()
                if not raw:
                    break
                try:
                    line = decode_line(raw, path, 1 if pos == 0 else 2)
                except TextEncodingError:  # again, with the line's true number
                    decode_line(raw, path, _line_number(path, pos))
                    raise
                pos += len(raw)
                tokens = line.split()
                if not tokens:
                    continue
                text = " ".join(tokens).encode("utf-8", "surrogatepass")
                record = text_example(text)
                writer.write(record)
                content.append(text)
                n_sentences += 1
                n_tokens += len(tokens)
                n_bytes += len(record)
    finally:
        writer.close()
    content.append(b"")  # every sentence ends in a newline
    return {"num_sentences": n_sentences, "num_tokens": n_tokens, "num_bytes": n_bytes,
            "content": b"\n".join(content), "cpu_s": time.process_time() - cpu0}
