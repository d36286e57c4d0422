"""Mixed precision: matmuls run in a compute dtype, accumulate and carry state in >= f32."""

import jax.numpy as jnp


def accumulator(dtype) -> jnp.dtype:
    """The dtype of matmul results, cell state and carried state: at least float32."""
    return jnp.promote_types(dtype, jnp.float32)
