"""Data parallelism for the pure step: ``jax.pmap`` over local devices, or ``jax.jit``
over a one-axis device mesh (``NamedSharding``).  Both give the same numbers.

The train state is replicated; the batch and the carried LSTM state are split over the
``data`` axis by rows.  Host code hands over this process's rows (``[B_local, ...]``) and
gets back host numpy arrays when it asks for them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from elmo_jax.train.step import eval_step, train_step

AXIS = "data"


class PmapRunner:
    """``jax.pmap`` over this process's devices; gradients summed with ``lax.psum``."""

    name = "pmap"

    def __init__(self, step_kwargs: dict):
        self.n_local = jax.local_device_count()
        self._train = jax.pmap(
            functools.partial(train_step, axis_name=AXIS, **step_kwargs),
            axis_name=AXIS,
            in_axes=(0, 0, 0, None, 0),
            donate_argnums=(0, 1),
        )

    # state layout: every leaf has a leading device axis
    def put_train_state(self, state):
        return jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (self.n_local,) + np.shape(x)), state)

    def put_rows(self, tree, axis: int = 0):
        """``[.., B_local, ..]`` host arrays -> per-device shards along ``axis``."""

        def split(x):
            x = np.asarray(x)
            if x.shape[axis] % self.n_local:
                raise ValueError(f"{x.shape[axis]} rows do not split over {self.n_local} devices")
            parts = np.split(x, self.n_local, axis=axis)
            return np.stack(parts)

        return jax.tree.map(split, tree)

    def step(self, train_state, lstm_state, batch, sample_rng, dropout_rngs):
        return self._train(train_state, lstm_state, batch, sample_rng, dropout_rngs)

    def get_train_state(self, state):
        return jax.tree.map(lambda x: np.asarray(x.addressable_shards[0].data)[0], state)

    def get_rows(self, tree, axis: int = 0):
        return jax.tree.map(lambda x: np.concatenate(list(np.asarray(x)), axis=axis), tree)

    def dropout_rngs(self, key):
        return jnp.stack([jax.random.fold_in(key, jax.process_index() * self.n_local + d) for d in range(self.n_local)])

    def metrics(self, m):
        return jax.tree.map(lambda x: np.asarray(x)[0], m)


class MeshRunner:
    """One ``jax.jit`` over a ``(data,)`` mesh of all devices; XLA inserts the reductions."""

    name = "mesh"

    def __init__(self, step_kwargs: dict):
        self.mesh = Mesh(np.asarray(jax.devices()), (AXIS,))
        self.n_local = jax.local_device_count()
        self._replicated = NamedSharding(self.mesh, P())
        self._train = jax.jit(functools.partial(train_step, **step_kwargs), donate_argnums=(0, 1))

    def _rows_sharding(self, ndim: int, axis: int):
        spec = [None] * ndim
        spec[axis] = AXIS
        return NamedSharding(self.mesh, P(*spec))

    def put_train_state(self, state):
        return jax.device_put(state, self._replicated)

    def put_rows(self, tree, axis: int = 0):
        def put(x):
            x = np.asarray(x)
            return jax.make_array_from_process_local_data(self._rows_sharding(x.ndim, axis), x)

        return jax.tree.map(put, tree)

    def step(self, train_state, lstm_state, batch, sample_rng, dropout_rng):
        return self._train(train_state, lstm_state, batch, sample_rng, dropout_rng)

    def get_train_state(self, state):
        return jax.tree.map(lambda x: np.asarray(x.addressable_shards[0].data), state)

    def get_rows(self, tree, axis: int = 0):
        def local(x):
            shards = sorted(x.addressable_shards, key=lambda s: s.index[axis].start or 0)
            return np.concatenate([np.asarray(s.data) for s in shards], axis=axis)

        return jax.tree.map(local, tree)

    def dropout_rngs(self, key):
        return key

    def metrics(self, m):
        return jax.tree.map(np.asarray, m)


def make_runner(kind: str, step_kwargs: dict):
    if kind == "pmap":
        return PmapRunner(step_kwargs)
    if kind == "mesh":
        return MeshRunner(step_kwargs)
    raise ValueError(f"parallel must be 'pmap' or 'mesh', got {kind!r}")


def make_eval_fn(config, dtype):
    """A jitted single-device full-softmax eval step (state carried by the caller)."""
    return jax.jit(functools.partial(eval_step, config=config, dtype=dtype))
