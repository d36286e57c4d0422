"""Cutting a time axis into equal chunks and back (for rematerialisation in chunks)."""

import jax
import jax.numpy as jnp


def to_chunks(x: jax.Array, axis: int, size: int) -> jax.Array:
    """``x`` with ``axis`` of length ``T`` -> ``[N, ...]`` chunks of ``size`` along ``axis``.

    The axis is zero-padded at the end to ``N * size``; chunk ``n`` holds steps
    ``n * size .. (n + 1) * size - 1`` at the same ``axis`` position.
    """
    T = x.shape[axis]
    n = -(-T // size)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, n * size - T)
    x = jnp.pad(x, pad)
    x = x.reshape(*x.shape[:axis], n, size, *x.shape[axis + 1 :])
    return jnp.moveaxis(x, axis, 0)


def from_chunks(x_N: jax.Array, axis: int, length: int) -> jax.Array:
    """Inverse of :func:`to_chunks`: ``[N, ...]`` with chunks at ``axis`` (of the chunk's own
    shape) -> one axis of ``length`` (the padding dropped)."""
    x = jnp.moveaxis(x_N, 0, axis)
    x = x.reshape(*x.shape[:axis], x.shape[axis] * x.shape[axis + 1], *x.shape[axis + 2 :])
    return jax.lax.slice_in_dim(x, 0, length, axis=axis)
