"""Local text -> ArrayRecord shards in parallel processes (the work behind
:func:`elmo_jax.data.text_source.prepare_local_text` with ``workers >= 1``).

The files are cut into byte ranges (:func:`byte_ranges`); a line belongs to the range in
which its first byte lies, so every line is read by exactly one range, whole, and the
ranges in order give the lines in file order.  Each range is read by one worker process
(:func:`write_range`), which writes its sentences, in order, as serialized
``tf.train.Example`` records (:func:`~elmo_jax.data.example_proto.text_example`, the bytes TFDS writes for the feature
``text``) into one ArrayRecord shard, and returns its counts and the sentences as the
content digest hashes them.  The digest (:class:`~elmo_jax.data.text_source.ContentDigest`,
one SHA-256 over all sentences in order) cannot be combined from per-range digests, so the
parent feeds the ranges' bytes to it in range order while later ranges are still being
written; hashing costs a few per cent of the reading.

Nothing here imports TensorFlow Datasets: the dataset's metadata is written by the caller.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from elmo_jax.data.example_proto import text_example
from elmo_jax.textio import UTF8_BOM, decode_line

__all__ = ["byte_ranges", "write_range"]

_CHUNK_MAX = 16 << 20  # bytes of text per range at most: bounds a worker's memory and what it returns
_CHUNK_MIN = 1 << 20


def byte_ranges(sizes: Sequence[int], workers: int) -> list[tuple[int, int, int]]:
    """``(file_index, start, stop)`` byte ranges covering files of ``sizes`` bytes, in file
    order: about four ranges per worker, each 1-16 MiB (a smaller file is one range)."""
    total = sum(sizes)
    chunk = min(_CHUNK_MAX, max(_CHUNK_MIN, -(-total // max(1, 4 * workers))))
    ranges: list[tuple[int, int, int]] = []
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


_other_space = re.compile(r"[^\S \n]").search  # \s is str.split()'s whitespace
_ASCII_OTHER_SPACE = b"\t\v\f\r\x1c\x1d\x1e\x1f"  # the same set within ASCII


def _is_normal(text: str) -> bool:
    """Whether every line of ``text`` is empty or is its tokens joined by single spaces
    (" ".join(line.split()) == line): no whitespace but spaces and newlines, no two spaces
    in a row, no space at a line's start or end.  Such text (tokenized corpora such as the
    1B Word Benchmark) needs no splitting: a few scans of the whole block instead."""
    if text.isascii():  # the same test, ten times cheaper for ASCII
        raw = text.encode("ascii")
        other = len(raw.translate(None, _ASCII_OTHER_SPACE)) != len(raw)
    else:
        other = _other_space(text) is not None
    return (
        not other
        and "  " not in text
        and "\n " not in text
        and " \n" not in text
        and not text.startswith(" ")
        and not text.endswith(" ")
    )


def _read_lines(path: str, start: int, stop: int) -> tuple[int, bytes]:
    """``(offset, block)``: the bytes of the lines of ``path`` whose first byte lies in
    ``[start, stop)``, whole, and the offset of the first one."""
    with open(path, "rb") as f:
        if start > 0:  # skip the line that began before this range
            f.seek(start - 1)
            begin = start - 1 + len(f.readline())
        else:
            begin = 0
        if begin >= stop:
            return begin, b""
        f.seek(begin)
        block = f.read(stop - begin)
        if block and not block.endswith(b"\n"):
            block += f.readline()  # the last line starts in the range: read it to its end
    return begin, block


def _decode(block: bytes, path: str, begin: int) -> str:
    """``block`` (whole lines from byte ``begin``) as text, as :func:`decode_line` decodes
    each line: the block at once (a newline is never part of a multi-byte character, so
    the block decodes iff each line does), and line by line only to report an error (a
    line that is not UTF-8 or holds a NUL byte)."""
    text = None
    if b"\x00" not in block:
        try:
            text = block.decode("utf-8")
        except UnicodeDecodeError:
            pass
    if text is None:
        lineno = _line_number(path, begin)
        for raw in block.split(b"\n"):
            decode_line(raw, path, lineno)  # raises for the first bad line, naming it
            lineno += 1
        raise AssertionError("unreachable: a block that does not decode has a line that does not") from None
    return text[1:] if begin == 0 and text.startswith(UTF8_BOM) else text


def write_range(path: str, start: int, stop: int, shard_path: str) -> dict:
    """Write the sentences of the lines of ``path`` that start in ``[start, stop)`` to the
    ArrayRecord file ``shard_path``.

    Returns ``num_sentences``, ``num_tokens``, ``num_bytes`` (of the records), ``content``
    (each sentence's tokens joined by spaces, then a newline: what the content digest
    hashes) and ``cpu_s`` (this process's CPU time for the range).  As in the one-process
    path, lines end at ``\n`` only, tokens are split on whitespace, blank lines are skipped,
    a UTF-8 byte-order mark at the start of the file is dropped and invalid UTF-8 (or a NUL
    byte) raises :class:`~elmo_jax.textio.TextEncodingError` naming the line.
    """
    from array_record.python.array_record_module import ArrayRecordWriter

    cpu0 = time.process_time()
    begin, block = _read_lines(path, start, stop)
    text = _decode(block, path, begin)
    del block
    n_sentences = n_tokens = n_bytes = 0
    content: list[str] = []
    writer = ArrayRecordWriter(shard_path, "group_size:1")  # TFDS's options for ArrayRecord
    try:
        if _is_normal(text):  # each line empty or its tokens joined by single spaces
            lines = [line for line in text.split("\n") if line]
            for line in lines:
                record = text_example(line.encode("utf-8", "surrogatepass"))
                writer.write(record)
                n_bytes += len(record)
            n_sentences, n_tokens = len(lines), text.count(" ") + len(lines)
            content = lines
        else:
            for line in text.split("\n"):
                tokens = line.split()
                if not tokens:
                    continue
                line = " ".join(tokens)
                record = text_example(line.encode("utf-8", "surrogatepass"))
                writer.write(record)
                content.append(line)
                n_sentences += 1
                n_tokens += len(tokens)
                n_bytes += len(record)
    finally:
        writer.close()
    content.append("")  # every sentence ends in a newline
    return {
        "num_sentences": n_sentences,
        "num_tokens": n_tokens,
        "num_bytes": n_bytes,
        "content": "\n".join(content).encode("utf-8", "surrogatepass"),
        "cpu_s": time.process_time() - cpu0,
    }
