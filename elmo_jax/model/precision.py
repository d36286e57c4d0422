"""Mixed precision: matmuls run in a compute dtype, accumulate and carry state in >= f32."""

import jax
import jax.numpy as jnp

from elmo_jax.config import COMPUTE_DTYPES
from elmo_jax.model.platform import target_platform


def compute_dtype(name) -> jnp.dtype:
    """``"float32"`` / ``"bfloat16"`` (or the dtype itself) -> the dtype; anything else is a ``ValueError``."""
    dtype = jnp.dtype(name) if not isinstance(name, str) or name in COMPUTE_DTYPES else None
    if dtype is None or dtype.name not in COMPUTE_DTYPES:
        raise ValueError(f"compute dtype {name!r} is not supported; use one of {', '.join(COMPUTE_DTYPES)}")
    return dtype


def accumulator(dtype) -> jnp.dtype:
    """The dtype of matmul results, cell state and carried state: at least float32."""
    return jnp.promote_types(dtype, jnp.float32)


def product_dtype(dtype):
    """``preferred_element_type`` for a matmul whose operands are in ``dtype``.

    float32 accumulation everywhere it is supported.  XLA:CPU has no bf16 x bf16 -> f32 dot
    kernel inside loops (``Unsupported element type for DotThunk``), so on the CPU a bf16
    product comes out in bf16 and is upcast by :func:`einsum`.
    """
    acc = accumulator(dtype)
    if jnp.dtype(dtype) != acc and target_platform() == "cpu":
        return None
    return acc


def einsum(subscripts: str, a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """``jnp.einsum`` with operands cast to ``dtype`` and the result in the accumulator dtype."""
    out = jnp.einsum(subscripts, a.astype(dtype), b.astype(dtype), preferred_element_type=product_dtype(dtype))
    return out.astype(accumulator(dtype))
