"""Rates for people to read (tokens/s): as many digits as say something at any size."""

from __future__ import annotations

import math


def rate_text(count: float, seconds: float) -> str:
    """``count / seconds`` as text: whole numbers with thousands separators from 1,000 up
    (``12,345``), three significant digits below (``457``, ``12.3``, ``0.420``), ``0`` for none."""
    rate = count / max(seconds, 1e-9)
    if rate >= 999.5:
        return f"{rate:,.0f}"
    if rate == 0:
        return "0"
    return f"{rate:.{max(0, 2 - math.floor(math.log10(rate)))}f}"
