"""Where an ``Elmo`` computes: its devices as a 1-D mesh with the axis ``rows``.

Parameters are replicated over the mesh once (``NamedSharding(mesh, P())``); every padded
group, the carried LSTM state and the outputs are split over it by rows
(``NamedSharding(mesh, P(..., 'rows', ...))``), so each device runs ``rows / n`` rows of the
same program.  One device is the same code with a mesh of one.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding

AXIS = "rows"

Devices = None | int | Sequence[jax.Device]


def resolve_devices(devices: Devices) -> list[jax.Device]:
    """``None``: every local device of the default backend; an int ``n``: the first ``n`` of
    them; a list: those devices (each once)."""
    local = jax.local_devices()
    if devices is None:
        return list(local)
    if isinstance(devices, (bool, str, bytes)) or not isinstance(devices, (int, np.integer, Sequence)):
        raise TypeError(
            f"devices must be None (every local device), a count or a list of jax devices, got {type(devices).__name__}"
        )
    if isinstance(devices, (int, np.integer)):
        if not 1 <= devices <= len(local):
            raise ValueError(
                f"devices={devices}: this process has {len(local)} local "
                f"{local[0].platform} device(s); give 1..{len(local)} or None for all of them"
            )
        return list(local[:devices])
    out = list(devices)
    if not out:
        raise ValueError("devices=[] holds no device; give None for every local device")
    for d in out:
        if not isinstance(d, jax.Device):
            raise TypeError(f"devices must hold jax devices (jax.local_devices()), got {type(d).__name__}: {d!r}")
    if len(set(out)) != len(out):
        raise ValueError(f"devices lists a device twice: {out}")
    if len({d.platform for d in out}) > 1:
        raise ValueError(f"devices mixes platforms ({sorted({d.platform for d in out})}); give devices of one kind")
    return out


def parse_devices(text: str) -> Devices:
    """The command line's ``--devices``: ``all`` (every local device), a count ``N`` (the
    first ``N``) or ``id:I,J,...`` (those local devices, by ``jax.Device.id``)."""
    text = text.strip()
    if text == "all":
        return None
    if text.isdigit():
        n, local = int(text), jax.local_devices()
        if not 1 <= n <= len(local):  # checked now, before a model is loaded
            raise ValueError(
                f"--devices {n}: this process has {len(local)} local {local[0].platform} "
                f"device(s); give 1..{len(local)}, or all"
            )
        return n
    if text.startswith("id:"):
        try:
            ids = [int(i) for i in text[3:].split(",") if i.strip()]
        except ValueError:
            ids = []
        local = {d.id: d for d in jax.local_devices()}
        missing = [i for i in ids if i not in local]
        if len(set(ids)) != len(ids):
            raise ValueError(f"--devices {text}: a device id is listed twice; give each once")
        if ids and not missing:
            return [local[i] for i in ids]
        if missing:
            raise ValueError(
                f"--devices {text}: no local device has id {missing[0]}; this process's devices are {sorted(local)}"
            )
    raise ValueError(
        f"--devices {text!r}: give 'all' (every local device), a count such as 4, or device ids such as id:0,2"
    )


def rows_sharding(mesh: Mesh, ndim: int, axis: int) -> NamedSharding:
    """Arrays of ``ndim`` dimensions split along ``axis`` over the 1-D ``mesh``."""
    spec = [None] * ndim
    spec[axis] = mesh.axis_names[0]
    return NamedSharding(mesh, P(*spec))


class Placement:
    """A 1-D mesh over ``devices`` and the two ways arrays are placed on it."""

    def __init__(self, devices: Devices = None):
        self.devices = resolve_devices(devices)
        self.mesh = Mesh(np.asarray(self.devices), (AXIS,))
        self.replicated = NamedSharding(self.mesh, P())
        # One device: arrays placed as before devices existed (uncommitted on the default
        # device, else committed to that device), so ``jax.jit`` / ``nnx.jit`` callers given
        # ``elmo.params`` see the inputs they always saw (a 1-device mesh made nnx.jit retrace).
        self._single = None
        if len(self.devices) == 1:
            self._single = None if self.devices[0] == jax.local_devices()[0] else SingleDeviceSharding(self.devices[0])

    @property
    def n_devices(self) -> int:
        return len(self.devices)

    def put_replicated(self, tree):
        """A copy of ``tree`` on every device (host arrays or arrays placed elsewhere)."""
        return jax.device_put(tree, self._one_device() if self.n_devices == 1 else self.replicated)

    def _one_device(self):
        return self._single  # None: jax's default device, uncommitted

    def put_rows(self, tree, axis: int = 0):
        """``tree``'s arrays split over the devices along ``axis`` (its size must be a
        multiple of the device count)."""

        def put(x):
            x = x if isinstance(x, jax.Array) else np.asarray(x)
            if x.shape[axis] % self.n_devices:
                raise ValueError(
                    f"{x.shape[axis]} rows (axis {axis} of shape {x.shape}) do not split over "
                    f"{self.n_devices} devices; pad them to a multiple of {self.n_devices}"
                )
            if self.n_devices == 1:
                return jax.device_put(x, self._one_device())
            return jax.device_put(x, rows_sharding(self.mesh, x.ndim, axis))

        return jax.tree.map(put, tree)
