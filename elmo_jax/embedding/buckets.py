"""Padded shapes: which ``(rows, time)`` a group of sentences is padded to.

The rules are those of :mod:`elmo_jax.embedding.embedder`'s docstring (the ladder of scan lengths,
power-of-two row buckets capped at the batch size); on ``n_devices`` devices a row bucket is
rounded up to a multiple of ``n_devices`` so that every device holds the same number of rows.
"""

from __future__ import annotations

import math

MIN_SCAN_LENGTH = 8
N_MARKERS = 2
MIN_ENCODER_TOKENS = 16


def scan_length_bucket(n_steps: int) -> int:
    """The smallest rung of 8, 12, 16, 24, 32, 48, ... that is >= ``n_steps``."""
    n_steps = max(int(n_steps), MIN_SCAN_LENGTH)
    k = (n_steps - 1).bit_length() - 1  # 2^k < n_steps <= 2^(k+1)
    if n_steps <= 3 << (k - 1):
        return 3 << (k - 1)
    return 1 << (k + 1)


def time_bucket(n_tokens: int) -> int:
    """The padded token length of a group whose longest sentence has ``n_tokens``."""
    return scan_length_bucket(n_tokens + N_MARKERS) - N_MARKERS


def time_buckets(max_len: int) -> list[int]:
    """Every padded token length used for sentences of 0..``max_len`` tokens."""
    out, t = [], time_bucket(0)
    while True:
        out.append(t)
        if t >= max_len:
            return out
        t = time_bucket(t + 1)


def round_to_devices(n_rows: int, n_devices: int) -> int:
    """``n_rows`` rounded up to a multiple of ``n_devices`` (each device gets equal rows)."""
    return -(-n_rows // n_devices) * n_devices


def row_bucket(n_rows: int, batch_size: int, n_devices: int = 1) -> int:
    """The padded number of rows for a group of ``n_rows`` sentences: the next power of two,
    capped at ``batch_size``, rounded up to a multiple of ``n_devices``."""
    return round_to_devices(min(batch_size, 1 << max(0, int(n_rows) - 1).bit_length()), n_devices)


def n_row_buckets(batch_size: int) -> int:
    """How many row buckets there are (at most; rounding to devices can only merge some)."""
    return math.ceil(math.log2(batch_size)) + 1


def encoder_bucket(n_tokens: int) -> int:
    """The padded number of words the char CNN encodes at once for the token cache."""
    return max(MIN_ENCODER_TOKENS, 1 << max(0, n_tokens - 1).bit_length())
