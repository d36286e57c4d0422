"""Will the training step fit?  A lower bound of its memory, checked before anything is built.

A ``batch_size`` of a million or a ``dim`` of 1e8 passes every other check and then takes the
machine's memory until the kernel kills the process (or the swap does).  :func:`check_fits`
estimates, from the config alone, what one device needs at the least:

* the parameters, the optimizer's state and the gradients (their exact sizes, from
  ``jax.eval_shape`` of the real initialisation: nothing is allocated),
* the activations the backward pass keeps for the device's ``B x T`` tokens: the character
  CNN (embeddings, each filter's outputs before the max-pool, the highways), each LSTM
  layer and direction (the four gates, cell, hidden and projected output per step; only
  the carried state with ``remat_steps``) and the softmax logits (``S + 1`` per token for
  the sampled softmax, ``V`` for the full one), in the compute dtype,

and refuses a step that cannot fit in what the devices have: on CPU the host's available
RAM shared by all local devices, on an accelerator the device's own memory.  The estimate
leaves out XLA's temporaries and buffers, so it is below what the step really takes: what
it refuses cannot run, and what it passes may still be tight.  Checked against XLA's own
count (``jit(train_step).lower(...).compile().memory_analysis()``: arguments + outputs +
temporaries) on the ``tiny`` preset (2026-12-07, AMD EPYC Zen 3, 2 cores, AVX2, shared):
53 MiB estimated against XLA's 120 MiB (32 rows x 20 tokens, full softmax over 5,000), 129
against 349 MiB (128 x 20, 1,024 sampled negatives).  XLA's count needs the step compiled,
which for a large model takes minutes (and is what the refusal must come before), so it is
not used here.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np

from elmo_jax.config import ElmoConfig
from elmo_jax.errors import ElmoError

GiB = 2**30


class MemoryEstimateError(ElmoError):
    """The configured training step cannot fit in the devices' memory."""


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """Bytes one device needs at the least for one training step."""

    params: int
    optimizer: int
    gradients: int
    activations: int

    @property
    def total(self) -> int:
        return self.params + self.optimizer + self.gradients + self.activations


def _nbytes(tree) -> int:
    return int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def activation_bytes(
    config: ElmoConfig, rows: int, unroll_steps: int, softmax_width: int, *, itemsize: int = 4, remat: bool = False
) -> int:
    """What the backward pass keeps for ``rows x unroll_steps`` tokens (see the module
    docstring); ``softmax_width``: logits per token (``S + 1`` sampled, ``V`` full)."""
    cnn = config.char_cnn
    n_chars, width = cnn.max_characters_per_token, sum(n for _, n in cnn.filters)
    per_token = n_chars * cnn.embedding_dim  # character embeddings
    per_token += sum(max(1, n_chars - w + 1) * n for w, n in cnn.filters)  # convolutions before the pool
    per_token += cnn.n_highway * 3 * width + config.projection_dim  # highway gates and the projection
    lstm = config.lstm
    per_step = lstm.dim + lstm.projection_dim if remat else 6 * lstm.dim + lstm.projection_dim
    per_token += 2 * lstm.n_layers * per_step  # both directions
    per_token += 2 * softmax_width  # both directions' logits
    return int(rows) * int(unroll_steps) * per_token * itemsize


def step_memory(
    train_state_shapes,
    config: ElmoConfig,
    rows_per_device: int,
    unroll_steps: int,
    softmax_width: int,
    *,
    itemsize: int = 4,
    remat: bool = False,
) -> StepMemory:
    """``train_state_shapes``: ``jax.eval_shape`` of the train state (``{"params", "opt_state", ...}``)."""
    params = _nbytes(train_state_shapes["params"])
    return StepMemory(
        params=params,
        optimizer=_nbytes(train_state_shapes["opt_state"]),
        gradients=params,
        activations=activation_bytes(
            config, rows_per_device, unroll_steps, softmax_width, itemsize=itemsize, remat=remat
        ),
    )


def available_bytes() -> tuple[int, str] | None:
    """``(bytes, what)`` the step's devices can use: an accelerator's memory limit, or on
    CPU the host's available RAM (``MemAvailable``); None where it cannot be read."""
    device = jax.local_devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        if "bytes_limit" in stats:
            return int(stats["bytes_limit"]), f"each {device.device_kind} device's memory"
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "the host's available RAM"
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "the host's free RAM"
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(
    estimate: StepMemory, *, rows_per_device: int, unroll_steps: int, limit: tuple[int, str] | None = None
) -> None:
    """Refuse a step whose estimate exceeds the limit (default :func:`available_bytes`); on
    CPU all local devices share the host's RAM, so their estimates add up."""
    limit = available_bytes() if limit is None else limit
    if limit is None:
        return
    devices = jax.local_device_count() if jax.local_devices()[0].platform == "cpu" else 1
    need = estimate.total * devices
    if need <= limit[0]:
        return
    on = f" x {devices} local devices" if devices > 1 else ""
    raise MemoryEstimateError(
        f"the training step needs at least {need / GiB:.1f} GiB{on} (parameters {estimate.params / GiB:.2f}, "
        f"optimizer state {estimate.optimizer / GiB:.2f}, gradients {estimate.gradients / GiB:.2f}, activations "
        f"{estimate.activations / GiB:.2f} GiB for {rows_per_device} rows x {unroll_steps} tokens per device) "
        f"but {limit[1]} is {limit[0] / GiB:.1f} GiB; lower batch_size, unroll_steps or the model's size "
        f"(model_overrides), or set remat_steps"
    )
