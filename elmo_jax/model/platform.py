"""Which platform the program being traced is for.

Some model code picks a formulation by platform (the CPU's chunked char CNN, its
early-stopping LSTM loop, its bf16 products).  It asks :func:`target_platform`, which is
jax's default backend, except inside :func:`compiling_for`: the compile-only TPU check
(:mod:`elmo_jax.train.compile_check`) traces on a CPU host a program for TPU chips, and
must trace what a TPU would run.
"""

from __future__ import annotations

import contextlib
import contextvars

import jax

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("elmo_jax_target_platform", default=None)


def target_platform() -> str:
    """``"cpu"``, ``"gpu"``, ``"tpu"``: the platform the code now traced will run on."""
    return _TARGET.get() or jax.default_backend()


@contextlib.contextmanager
def compiling_for(platform: str):
    """Trace for ``platform`` (e.g. ``"tpu"``) whatever the default backend is."""
    token = _TARGET.set(platform)
    try:
        yield
    finally:
        _TARGET.reset(token)
