"""Multi-process (multi-host) runs on JAX's distributed runtime.

:func:`settings_from_args` decides whether a ``train`` run joins a multi-process job and
with which coordinator, process count and id: command-line flags first, then the
``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` environment
variables, then (with ``--distributed``) whatever ``jax.distributed.initialize`` detects
from the launcher (SLURM, Open MPI, TPU pods, ...).  With none of these the run stays
single-process and nothing here is called.

:func:`initialize` selects gloo for CPU collectives (so CPU-only processes can reduce over
each other's devices) and starts the runtime with a bounded heartbeat timeout: when one
process dies, the others are stopped by the runtime instead of waiting forever.

The small helpers below (``publish`` / ``wait_for_value`` / ``allgather_json``) use the
runtime's key-value store for host-side coordination (the data preparation hand-over, the
per-process data positions of a checkpoint); in a single process they are trivial.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
from typing import Any

import jax

from elmo_jax.errors import ElmoError

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
DEFAULT_HEARTBEAT_TIMEOUT_S = 60
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


class DistributedError(ElmoError):
    """A multi-process setting that cannot work, or a peer process that failed."""


@dataclasses.dataclass(frozen=True)
class Settings:
    coordinator: str | None = None  # host:port of process 0's coordination service
    num_processes: int | None = None
    process_id: int | None = None
    heartbeat_timeout_s: int = DEFAULT_HEARTBEAT_TIMEOUT_S
    initialization_timeout_s: int = 300


def _env_int(name: str, environ) -> int | None:
    value = environ.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise DistributedError(f"environment variable {name}={value!r} is not an integer") from None


def settings_from_args(args, environ=None) -> Settings | None:
    """The distributed settings of a ``train`` invocation, or None for a single-process run.

    A run is distributed when ``--distributed`` is given, when any of ``--coordinator`` /
    ``--num-processes`` / ``--process-id`` is given, or when ``JAX_NUM_PROCESSES`` (or
    ``JAX_COORDINATOR_ADDRESS``) is set in the environment.  Flags win over the environment;
    what neither gives is left to jax's launcher auto-detection.  ``--heartbeat-timeout``
    on a single-process run is refused: it would do nothing.
    """
    environ = os.environ if environ is None else environ
    coordinator = getattr(args, "coordinator", None) or environ.get(ENV_COORDINATOR) or None
    num_processes = getattr(args, "num_processes", None)
    if num_processes is None:
        num_processes = _env_int(ENV_NUM_PROCESSES, environ)
    process_id = getattr(args, "process_id", None)
    if process_id is None:
        process_id = _env_int(ENV_PROCESS_ID, environ)
    explicit = any(getattr(args, k, None) is not None for k in ("coordinator", "num_processes", "process_id"))
    from_env = environ.get(ENV_NUM_PROCESSES) not in (None, "") or environ.get(ENV_COORDINATOR) not in (None, "")
    heartbeat = getattr(args, "heartbeat_timeout", None)
    if heartbeat is not None and heartbeat < 1:
        raise DistributedError(f"--heartbeat-timeout must be at least 1 second, got {heartbeat}")
    if not (getattr(args, "distributed", False) or explicit or from_env):
        if heartbeat is not None:
            raise DistributedError(
                "--heartbeat-timeout only applies to a multi-process job, and this run is a single process; "
                "add --distributed (or --coordinator/--num-processes/--process-id), or drop the flag"
            )
        return None
    if num_processes is not None and num_processes < 1:
        raise DistributedError(f"--num-processes must be >= 1, got {num_processes}")
    if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
        raise DistributedError(f"--process-id {process_id} is not in 0..{num_processes - 1}")
    return Settings(coordinator, num_processes, process_id, int(heartbeat or DEFAULT_HEARTBEAT_TIMEOUT_S))


def _accelerator_plugin_present() -> bool:
    return any(
        importlib.util.find_spec(name) is not None
        for name in ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "libtpu")
    )


def _cpu_only() -> bool:
    # jax.config's options are set up at run time; its type declares none of them
    platforms = os.environ.get("JAX_PLATFORMS") or (jax.config.jax_platforms or "")  # type: ignore[attr-defined]
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    return not _accelerator_plugin_present()


def initialize(settings: Settings) -> None:
    """``jax.distributed.initialize`` with gloo CPU collectives and a bounded heartbeat."""
    if jax.distributed.is_initialized():
        return
    if _cpu_only():
        # Without it CPU processes cannot run collectives across each other.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs: dict[str, Any] = dict(
        coordinator_address=settings.coordinator,
        num_processes=settings.num_processes,
        process_id=settings.process_id,
        heartbeat_timeout_seconds=settings.heartbeat_timeout_s,
        initialization_timeout=settings.initialization_timeout_s,
    )
    if settings.coordinator and settings.coordinator.rsplit(":", 1)[0] in _LOOPBACK:
        # A one-machine job: listen on loopback only (jax's default binds every interface).
        kwargs["coordinator_bind_address"] = settings.coordinator
    try:
        jax.distributed.initialize(**kwargs)
    except (ValueError, TypeError) as e:
        raise DistributedError(
            f"cannot start the distributed runtime: {e}. Pass --coordinator HOST:PORT --num-processes N "
            f"--process-id I (or set {ENV_COORDINATOR}, {ENV_NUM_PROCESSES}, {ENV_PROCESS_ID}), or run under "
            f"a launcher jax detects (SLURM, Open MPI, Cloud TPU)"
        ) from None


def is_multiprocess() -> bool:
    return jax.process_count() > 1


def _client():
    from jax._src import distributed as _dist

    client = _dist.global_state.client
    if client is None:
        raise DistributedError("the distributed runtime is not initialized")
    return client


def publish(key: str, value: str) -> None:
    """Set ``key`` in the job's key-value store (no-op in a single process)."""
    if is_multiprocess():
        _client().key_value_set(f"elmo_jax/{key}", value)


def wait_for_value(key: str, timeout_s: float, what: str) -> str:
    """Block until another process publishes ``key``; a clear error after ``timeout_s``."""
    try:
        return _client().blocking_key_value_get(f"elmo_jax/{key}", int(timeout_s * 1000))
    except Exception as e:  # deadline exceeded, or the coordinator (process 0) went away
        raise DistributedError(
            f"process {jax.process_index()}: gave up waiting for {what} after at most {timeout_s:.0f} s "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); check process 0's log"
        ) from None


def allgather_json(key: str, value: Any, timeout_s: float = 600.0) -> list:
    """Every process's ``value`` (JSON-serialisable), in process order; ``[value]`` alone."""
    if not is_multiprocess():
        return [value]
    publish(f"{key}/{jax.process_index()}", json.dumps(value))
    return [
        json.loads(wait_for_value(f"{key}/{p}", timeout_s, f"process {p}'s {key}")) for p in range(jax.process_count())
    ]


def any_process(flag: bool) -> bool:
    """True when ``flag`` is true on at least one process (a collective: call on all)."""
    if not is_multiprocess():
        return bool(flag)
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.asarray([int(flag)], np.int32))))


def exit_now(code: int) -> None:
    """Leave a multi-process job without the runtime's shutdown barrier (which would make
    the failing process wait for peers that are waiting for it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
