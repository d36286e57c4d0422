"""The bytes of a ``tf.train.Example`` holding one bytes feature ``text`` (what TFDS writes
for ``lm1b`` and for this package's local text), written and read without TensorFlow.

Example.features(1) -> Features.feature(1, map entry: key(1) = "text", value(2)) ->
Feature.bytes_list(1) -> BytesList.value(1); every field is length-delimited (a varint key,
a varint length, the bytes).
"""

from __future__ import annotations

import functools

__all__ = ["example_text", "text_example"]


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
    :func:`example_text`)."""
    return _text_header(len(text)) + text


def _text_header(n0: int) -> bytes:
    """The bytes of :func:`text_example`'s record before a text of ``n0`` bytes.

    Example.features(1) -> Features.feature(1, map entry: key(1) = "text", value(2)) ->
    Feature.bytes_list(1) -> BytesList.value(1); every field length-delimited (tag 0x0a for
    field 1, 0x12 for field 2), nested from the inside out."""
    v0 = _varint(n0)
    n1 = 1 + len(v0) + n0  # BytesList
    v1 = _varint(n1)
    n2 = 1 + len(v1) + n1  # Feature
    v2 = _varint(n2)
    n3 = 7 + len(v2) + n2  # map entry: key "text" (6 bytes), value
    v3 = _varint(n3)
    n4 = 1 + len(v3) + n3  # Features
    return b"".join((b"\n", _varint(n4), b"\n", v3, b"\n\x04text\x12", v2, b"\n", v1, b"\n", v0))


def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int] | None:
    """``(value, position after it)`` of the varint at ``buf[pos:end]``; None if cut short."""
    value = shift = 0
    while pos < end:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, pos
    return None


def _len_field(buf: bytes, pos: int, end: int, number: int) -> tuple[int, int] | None:
    """``(start, end)`` of the first length-delimited field ``number`` of the protobuf
    message ``buf[pos:end]``; None if absent or not parseable."""
    while pos < end:
        key = _read_varint(buf, pos, end)
        if key is None or key[0] & 7 != 2:  # only length-delimited fields here; else: not ours
            return None
        size = _read_varint(buf, key[1], end)
        if size is None or size[1] + size[0] > end:
            return None
        pos = size[1] + size[0]
        if key[0] >> 3 == number:
            return size[1], pos
    return None


@functools.lru_cache(maxsize=4096)
def _header(record_length: int) -> bytes | None:
    """The bytes before the text in :func:`text_example`'s record of ``record_length``
    bytes (None if no text length gives that size).  The header grows with the text, so at
    most one text length fits."""
    for size in range(16, 37):  # 11 fixed bytes and five varints of 1-5 bytes
        if record_length >= size:
            header = _text_header(record_length - size)
            if len(header) == size:
                return header
    return None


def example_text(record: bytes) -> bytes | None:
    """The ``text`` feature of a serialized record of this layout, read straight from the
    protobuf bytes; None for any other layout (the caller then lets TFDS decode it).

    A record exactly as :func:`text_example` writes it (TFDS writes the same bytes) is
    recognised by its header, one comparison; any other arrangement of the same fields is
    parsed field by field."""
    header = _header(len(record))
    if header is not None and record.startswith(header):
        return record[len(header) :]
    span = _len_field(record, 0, len(record), 1)
    if span is None:
        return None
    entry = _len_field(record, span[0], span[1], 1)
    if entry is None or entry[1] != span[1]:  # exactly one feature
        return None
    key = _len_field(record, entry[0], entry[1], 1)
    if key is None or record[key[0] : key[1]] != b"text":
        return None
    for number in (2, 1, 1):  # map value -> bytes_list -> first value
        found = _len_field(record, entry[0], entry[1], number)
        if found is None:
            return None
        entry = found
    return record[entry[0] : entry[1]]
