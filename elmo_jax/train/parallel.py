"""Data parallelism for the pure step: ``jax.pmap`` over local devices, or ``jax.jit``
over a one-axis device mesh (``NamedSharding``).  Both give the same numbers.

The train state is replicated; the batch and the carried LSTM state are split over the
``data`` axis by rows.  Host code hands over this process's rows (``[B_local, ...]``) and
gets back host numpy arrays when it asks for them.

Multi-process: every process runs the same program on its own rows.  ``pmap`` spans the
devices of all processes (its ``psum`` is global); the mesh holds every device of the job,
ordered by process so that each process's rows form one contiguous block of the global
batch (process ``p`` holds global rows ``[p * B_local, (p + 1) * B_local)``), and global
arrays are assembled with ``jax.make_array_from_process_local_data``.  Nothing here ever
reads a non-addressable shard: host values come from this process's own shards.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from elmo_jax.embedding.devices import rows_sharding
from elmo_jax.train.config_loader import PARALLEL_MODES
from elmo_jax.train.step import eval_step, train_step

AXIS = "data"


def global_mesh() -> Mesh:
    """A ``(data,)`` mesh of all devices of the job, process by process."""
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return Mesh(np.asarray(devices), (AXIS,))


def to_global_replicated(tree, mesh: Mesh):
    """Host arrays identical on every process -> global arrays replicated over ``mesh``."""
    sharding = NamedSharding(mesh, P())

    def put(x):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(put, tree)


def to_global_rows(tree, mesh: Mesh, axis: int):
    """This process's rows (host arrays) -> global arrays split by rows along ``axis``."""

    def put(x):
        x = np.asarray(x)
        return jax.make_array_from_process_local_data(rows_sharding(mesh, x.ndim, axis), x)

    return jax.tree.map(put, tree)


def local_replica(x) -> np.ndarray:
    """A host copy of a replicated array (this process's first shard; no gather).  Host
    arrays (a run resumed at its last step has not put its state on the devices) pass as is."""
    if not isinstance(x, jax.Array):
        return np.asarray(x)
    return np.asarray(x.addressable_shards[0].data)


def local_rows(x, axis: int) -> np.ndarray:
    """This process's rows of an array split along ``axis``, in global order (host arrays
    pass as is)."""
    if not isinstance(x, jax.Array):
        return np.asarray(x)
    seen, parts = set(), []
    for shard in sorted(x.addressable_shards, key=lambda s: s.index[axis].start or 0):
        start = shard.index[axis].start or 0
        if start in seen:  # replicated along another mesh axis
            continue
        seen.add(start)
        parts.append(np.asarray(shard.data))
    return np.concatenate(parts, axis=axis)


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
        # pmap compiles once per input placement: host arrays on the first step and its own
        # outputs afterwards would compile the step twice.  Inputs go through this identity
        # first, so every step sees arrays placed exactly as the step returns them.
        self._place = jax.pmap(lambda tree: tree, axis_name=AXIS)

    # state layout: every leaf has a leading device axis
    def put_train_state(self, state):
        return self._place(jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (self.n_local,) + np.shape(x)), state))

    def put_rows(self, tree, axis: int = 0):
        """``[.., B_local, ..]`` host arrays -> per-device shards along ``axis``."""

        def split(x):
            x = np.asarray(x)
            if x.shape[axis] % self.n_local:
                raise ValueError(f"{x.shape[axis]} rows do not split over {self.n_local} devices")
            parts = np.split(x, self.n_local, axis=axis)
            return np.stack(parts)

        return self._place(jax.tree.map(split, tree))

    def step(self, train_state, lstm_state, batch, sample_rng, dropout_rngs):
        return self._train(train_state, lstm_state, batch, sample_rng, dropout_rngs)

    def get_train_state(self, state):
        return jax.tree.map(lambda x: local_replica(x)[0], state)

    def get_rows(self, tree, axis: int = 0):
        # [n_local, ...] per-device blocks (leading axis) -> rows concatenated along ``axis``.
        return jax.tree.map(lambda x: np.concatenate(list(local_rows(x, 0)), axis=axis), tree)

    def dropout_rngs(self, key):
        return jnp.stack([jax.random.fold_in(key, jax.process_index() * self.n_local + d) for d in range(self.n_local)])

    def metrics(self, m):
        return jax.tree.map(lambda x: local_replica(x)[0], m)


class MeshRunner:
    """One ``jax.jit`` over a ``(data,)`` mesh of all devices; XLA inserts the reductions."""

    name = "mesh"

    def __init__(self, step_kwargs: dict):
        self.mesh = global_mesh()
        self.n_local = jax.local_device_count()
        self._train = jax.jit(functools.partial(train_step, **step_kwargs), donate_argnums=(0, 1))

    def put_train_state(self, state):
        return to_global_replicated(state, self.mesh)

    def put_rows(self, tree, axis: int = 0):
        return to_global_rows(tree, self.mesh, axis)

    def step(self, train_state, lstm_state, batch, sample_rng, dropout_rng):
        return self._train(train_state, lstm_state, batch, sample_rng, dropout_rng)

    def get_train_state(self, state):
        return jax.tree.map(local_replica, state)

    def get_rows(self, tree, axis: int = 0):
        return jax.tree.map(lambda x: local_rows(x, axis), tree)

    def dropout_rngs(self, key):
        # One key for the global batch: with partitionable threefry (jax's default) the
        # masks depend on the global row, not on how the rows are split over devices.
        return key

    def metrics(self, m):
        return jax.tree.map(local_replica, m)


def make_runner(kind: str, step_kwargs: dict):
    if kind == "pmap":
        return PmapRunner(step_kwargs)
    if kind == "mesh":
        return MeshRunner(step_kwargs)
    raise ValueError(f"parallel must be one of {', '.join(PARALLEL_MODES)}, got {kind!r}")


def make_eval_fn(config, dtype):
    """A jitted single-device full-softmax eval step (state carried by the caller)."""
    return jax.jit(functools.partial(eval_step, config=config, dtype=dtype))
