"""Will a run fit a TPU, and how fast could it go?  Compile the real step for TPU chips
without having any.

libtpu (``pip install 'elmo-jax[tpu]'``) offers *compile-only* TPU devices on any host:
``jax.experimental.topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x4")``
gives the chips of a v5e-8.  This module jits the training step exactly as
:class:`elmo_jax.train.parallel.MeshRunner` does (state replicated, rows split over a
``(data,)`` mesh of every chip of every host, the state donated), lowers it with
``ShapeDtypeStruct``s and compiles it.  What comes back is the TPU program itself:

* whether it fits the chip's HBM (XLA refuses most oversized programs with
  ``RESOURCE_EXHAUSTED``; the bytes it needs, ``memory_analysis``, are also held against the
  chip's published memory, since the compile-only devices let some through);
* its FLOPs and bytes per chip, loop bodies counted once per trip
  (:mod:`elmo_jax.train.hlo_cost`; XLA's own ``cost_analysis`` counts them once); the bytes
  are those moved to and from HBM, and the traffic of the buffers XLA placed in on-chip
  memory (VMEM: the LSTM's weights across its steps, a loop's per-step arrays) is given apart;
* a roofline time ``max(FLOPs / peak, HBM bytes / HBM bandwidth)`` from the chip's published
  figures (:data:`CHIPS`), and from it tokens per second per chip and the time for
  10 epochs of lm1b; beside it an upper bound that also moves the on-chip traffic at the
  HBM bandwidth.

All of these are compile-time estimates, not measurements: a real step also waits on
collectives, the host and latencies the roofline ignores, so it is slower.

(Over 500 lines: the chip table, building the step and ``Elmo.embed`` programs for a
topology, the rows-per-chip search and the report are one check's parts, each used only
here; the HLO walk already lives apart in :mod:`elmo_jax.train.hlo_cost`.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import time
from typing import Any, Callable, cast

import jax
import jax.numpy as jnp
import numpy as np

from elmo_jax.errors import ElmoError
from elmo_jax.model.platform import compiling_for
from elmo_jax.train.hlo_cost import Cost, loop_aware_cost

# lm1b's training split (ELMO.md: ~768.6M tokens, vocabulary 793,471).
LM1B_TRAIN_TOKENS = 768_600_000
LM1B_VOCAB = 793_471
GB = 1e9
GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    """Published per-chip figures.  TPUs publish no float32 peak: float32 matmuls run on the
    bf16 units (one bf16 pass at JAX's default precision), so the bf16 peak bounds them."""

    name: str
    bf16_flops: float  # FLOP/s
    hbm_bandwidth: float  # bytes/s
    hbm_bytes: float
    source: str


CHIPS = {
    "v4": Chip(
        "TPU v4", 275e12, 1200e9, 32 * GiB, "cloud.google.com/tpu/docs/v4 (275 TFLOPs bf16, 32 GiB HBM2, 1200 GBps)"
    ),
    "v5e": Chip(
        "TPU v5e", 197e12, 819e9, 16 * GiB, "cloud.google.com/tpu/docs/v5e (197 TFLOPs bf16, 16 GB HBM2, 819 GBps)"
    ),
    "v5p": Chip(
        "TPU v5p", 459e12, 2765e9, 95 * GiB, "cloud.google.com/tpu/docs/v5p (459 TFLOPs bf16, 95 GB HBM2e, 2765 GBps)"
    ),
    "v6e": Chip(
        "TPU v6e", 918e12, 1640e9, 32 * GiB, "cloud.google.com/tpu/docs/v6e (918 TFLOPs bf16, 32 GB HBM, 1640 GBps)"
    ),
}

ESTIMATE_NOTE = (
    "compile-time estimates: memory from XLA's buffer assignment, FLOPs and bytes counted in the "
    "compiled program (loops once per trip), time = max(FLOPs / peak bf16, HBM bytes / HBM bandwidth); "
    "the upper bound also moves the on-chip (VMEM) traffic at HBM bandwidth. "
    "Not measured on a device; a real step is slower."
)


class CompileCheckError(ElmoError):
    """The compile-only check cannot run (no libtpu, an unknown topology)."""


LOCAL = "local"  # the devices of this process's job instead of compile-only ones
_DEVICE_KINDS = {
    "TPU v4": "v4",
    "TPU v5 lite": "v5e",
    "TPU v5e": "v5e",
    "TPU v5p": "v5p",
    "TPU v5": "v5p",
    "TPU v6 lite": "v6e",
    "TPU v6e": "v6e",
}


def chip_of(topology: str) -> Chip | None:
    """``"v5e:2x4"`` -> the v5e's figures; ``"local"``: those of this job's TPU, None off TPU."""
    if topology == LOCAL:
        kind = _DEVICE_KINDS.get(jax.devices()[0].device_kind)
        return CHIPS[kind] if kind else None
    kind = topology.split(":")[0].lower()
    if kind not in CHIPS:
        raise CompileCheckError(
            f"topology {topology!r}: unknown chip {kind!r}; use one of "
            f"{', '.join(k + ':...' for k in CHIPS)} (e.g. v5e:2x4, v4:2x2x1, v5p:2x2x2)"
        )
    return CHIPS[kind]


def per_device(chip: Chip, devices: list) -> Chip:
    """``chip``'s figures for one of ``devices``: a topology may list each TensorCore as a device
    (libtpu's compile-only ``v4:2x2x1`` has 8 devices on 4 chips, two per chip coordinate), and
    then one device has its share of the chip's peak, bandwidth and memory."""
    coords = {tuple(getattr(d, "coords", ())) for d in devices}
    cores = len(devices) // len(coords) if coords and () not in coords else 1
    if cores <= 1:
        return chip
    return dataclasses.replace(
        chip,
        name=f"{chip.name} TensorCore (1/{cores} of a chip)",
        bf16_flops=chip.bf16_flops / cores,
        hbm_bandwidth=chip.hbm_bandwidth / cores,
        hbm_bytes=chip.hbm_bytes / cores,
    )


def topology_devices(topology: str) -> list:
    """The compile-only devices of ``topology`` (``"local"``: this job's own devices),
    ordered as :func:`elmo_jax.train.parallel.global_mesh`."""
    if topology == LOCAL:
        return sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    try:
        from jax.experimental import topologies

        desc = topologies.get_topology_desc(platform="tpu", topology_name=topology)
    except Exception as e:  # noqa: BLE001 - libtpu missing or the name unknown: say which
        if "libtpu_lockfile" in str(e):  # libtpu serves one process at a time on a host
            raise CompileCheckError(
                f"no compile-only TPU devices for {topology!r}: another process on this machine is using libtpu "
                f"(it holds /tmp/libtpu_lockfile); run the check when that one has finished, or remove the file "
                f"if no such process is left"
            ) from None
        raise CompileCheckError(
            f"no compile-only TPU devices for {topology!r} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
            f"install libtpu with  pip install 'elmo-jax[tpu]'  (jax[tpu] of the installed jax's version) and "
            f"name a topology such as v5e:2x4"
        ) from None
    return sorted(desc.devices, key=lambda d: (d.process_index, d.id))


@dataclasses.dataclass
class ProgramReport:
    """One compiled program on one topology (per chip)."""

    what: str
    topology: str
    chips: int
    hosts: int
    rows_per_chip: int
    tokens_per_chip: int  # tokens one step (or call) handles per chip
    fits: bool
    hbm_needed: float | None  # bytes: arguments + outputs - aliased + temporaries + code
    temp_bytes: float | None
    argument_bytes: float | None
    error: str | None
    cost: Cost | None
    xla_flops: float | None  # XLA's own count (loop bodies once), for comparison
    xla_bytes: float | None
    compile_seconds: float

    def roofline_seconds(self, chip: Chip, upper_bound: bool = False) -> float | None:
        """``max(FLOPs / peak, HBM bytes / bandwidth)``; ``upper_bound``: the on-chip bytes too."""
        if self.cost is None:
            return None
        moved = self.cost.bytes + (self.cost.on_chip_bytes if upper_bound else 0.0)
        return max(self.cost.flops / chip.bf16_flops, moved / chip.hbm_bandwidth)

    def tokens_per_second(self, chip: Chip) -> float | None:
        t = self.roofline_seconds(chip)
        return self.tokens_per_chip / t if t else None


def _over_memory(topology: str, devices: list, need: float) -> str | None:
    """Why a compiled program does not fit its device after all, else None.  libtpu's
    compile-only devices refuse most oversized programs, but not all: a v5e-8 step of
    ``original`` at 256 rows per chip compiled while its buffers needed 20.6 GiB of the
    chip's 16.  So the need is also held against the chip's published memory."""
    kind = topology.split(":")[0]
    if topology == LOCAL or kind not in CHIPS:
        return None
    device = per_device(CHIPS[kind], devices)
    if need <= device.hbm_bytes:
        return None
    return (
        f"its buffers need {need / GiB:.2f} GiB per device, more than the {device.hbm_bytes / GiB:.0f} GiB of "
        f"{device.name} (the compile-only devices compiled it all the same)"
    )


def _oom_message(error: Exception) -> str | None:
    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text and "Ran out of memory" not in text:
        return None
    m = re.search(r"Ran out of memory in memory space hbm[^.]*\.[^\n]*", text)
    return (m.group(0) if m else text.splitlines()[0])[:300]


def compile_program(
    what: str,
    topology: str,
    fn: Callable,
    args: tuple,
    rows_per_chip: int,
    tokens_per_chip: int,
    donate: tuple[int, ...] = (),
    dump: str | None = None,
) -> ProgramReport:
    """Lower ``jit(fn)`` on ``args`` (``ShapeDtypeStruct``s with shardings) and compile it;
    ``dump``: a file to write the compiled HLO text to (for :mod:`elmo_jax.train.hlo_cost`)."""
    devices = topology_devices(topology)
    hosts = len({d.process_index for d in devices})
    start = time.perf_counter()
    try:
        # Trace what a TPU runs: the model picks its CPU formulations by platform.
        with contextlib.nullcontext() if topology == LOCAL else compiling_for("tpu"):
            lowered = jax.jit(fn, donate_argnums=donate).lower(*args)
        compiled = lowered.compile()
    except Exception as e:  # noqa: BLE001 - only an out-of-memory is an answer; anything else is raised
        message = _oom_message(e)
        if message is None:
            raise
        return ProgramReport(
            what,
            topology,
            len(devices),
            hosts,
            rows_per_chip,
            tokens_per_chip,
            False,
            None,
            None,
            None,
            message,
            None,
            None,
            None,
            time.perf_counter() - start,
        )
    seconds = time.perf_counter() - start
    # Both are None only on a backend without HLO text or memory statistics; the compile-only
    # TPU and the local backends have them (elsewhere the code below fails as it always has).
    text = cast(str, compiled.as_text())
    if dump:
        with open(dump, "w", encoding="utf-8") as f:
            f.write(text)
    mem = cast(Any, compiled.memory_analysis())
    need = (
        mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        - mem.alias_size_in_bytes
        + mem.temp_size_in_bytes
        + mem.generated_code_size_in_bytes
    )
    over = _over_memory(topology, devices, float(need))
    xla = compiled.cost_analysis() or {}
    if isinstance(xla, (list, tuple)):
        xla = xla[0] if xla else {}
    return ProgramReport(
        what,
        topology,
        len(devices),
        hosts,
        rows_per_chip,
        tokens_per_chip,
        over is None,
        float(need),
        float(mem.temp_size_in_bytes),
        float(mem.argument_size_in_bytes),
        over,
        # a TPU's S(n) memory spaces are on chip (VMEM, scalar memory): not HBM traffic
        loop_aware_cost(text, on_chip=all(d.platform == "tpu" for d in devices)),
        xla.get("flops"),
        xla.get("bytes accessed"),
        seconds,
    )


def _sharded(tree, sharding):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def train_step_program(cfg, topology: str, rows_per_chip: int | None = None, vocab_size: int | None = None):
    """``(fn, args, rows_per_chip, tokens_per_chip)`` of ``cfg``'s training step as the
    mesh runner jits it, for the chips of ``topology``."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from elmo_jax.model.lstm import zero_state
    from elmo_jax.model.precision import compute_dtype
    from elmo_jax.train.loop import step_kwargs
    from elmo_jax.train.losses import make_loss_fn
    from elmo_jax.train.step import init_train_state, make_optimizer, train_step

    devices = topology_devices(topology)
    mesh = Mesh(np.asarray(devices), ("data",))
    n = len(devices)
    rows = rows_per_chip or cfg.global_batch_size(n) // n
    B, T = rows * n, cfg.unroll_steps
    model_config = cfg.elmo_config()
    vocab = vocab_size or default_vocab_size(cfg)
    optimizer = make_optimizer(cfg.optimizer, cfg.learning_rate, cfg.initial_accumulator, cfg.clip_norm)
    selection = make_loss_fn(vocab, cfg.num_negatives)
    kwargs = step_kwargs(cfg, model_config, selection, optimizer, compute_dtype(cfg.compute_dtype))
    replicated = NamedSharding(mesh, P())

    def rows_on(axis, ndim):
        spec = [None] * ndim
        spec[axis] = "data"
        return NamedSharding(mesh, P(*spec))

    state = _sharded(
        jax.eval_shape(lambda: init_train_state(jax.random.key(0), model_config, vocab, optimizer)), replicated
    )
    lstm = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rows_on(2, x.ndim)),
        jax.eval_shape(lambda: zero_state(model_config, B)),
    )
    C = model_config.char_cnn.max_characters_per_token
    batch = {}
    for d in ("fwd", "bwd"):
        batch[f"{d}_char_ids"] = jax.ShapeDtypeStruct((B, T, C), jnp.int32, sharding=rows_on(0, 3))
        batch[f"{d}_targets"] = jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=rows_on(0, 2))
        batch[f"{d}_mask"] = jax.ShapeDtypeStruct((B, T), jnp.float32, sharding=rows_on(0, 2))
    key = jax.eval_shape(lambda: jax.random.key(0))
    key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated)
    fn = functools.partial(train_step, **kwargs)
    return fn, (state, lstm, batch, key, key), rows, rows * T


def default_vocab_size(cfg) -> int:
    """The softmax's rows: ``cfg.vocab_size``, else lm1b's full vocabulary for lm1b data."""
    if cfg.vocab_size is not None:
        return cfg.vocab_size
    if str(cfg.data).startswith("lm1b"):
        return LM1B_VOCAB
    raise CompileCheckError(f"data {cfg.data!r} has no known vocabulary size here; pass --vocab-size N")


def check_train_step(
    cfg, topology: str, rows_per_chip: int | None = None, vocab_size: int | None = None, dump: str | None = None
) -> ProgramReport:
    fn, args, rows, tokens = train_step_program(cfg, topology, rows_per_chip, vocab_size)
    return compile_program("train step", topology, fn, args, rows, tokens, donate=(0, 1), dump=dump)


def largest_rows(
    cfg,
    topology: str,
    start: int,
    vocab_size: int | None = None,
    max_compiles: int = 4,
    first: ProgramReport | None = None,
    log: Callable[[str], None] = lambda m: None,
) -> int | None:
    """The most rows per chip (a multiple of 8) found to fit, by compiling: doubling from
    ``start`` until a compile fails, then halving the gap, at most ``max_compiles`` compiles
    besides ``first`` (the report at ``start``, if already compiled)."""
    fits = (first or check_train_step(cfg, topology, start, vocab_size)).fits
    low, high = (start, None) if fits else (None, start)
    for _ in range(max_compiles):
        if high is None:
            assert low is not None  # high is None only while low holds the start, or a fit since
            probe = low * 2
        elif low is None:
            probe = max(8, high // 2)
            if probe == high:
                break
        else:
            probe = (low + high) // 2 // 8 * 8
            if probe <= low:
                break
        ok = check_train_step(cfg, topology, probe, vocab_size).fits
        log(f"  {probe} rows per chip: {'fits' if ok else 'does not fit'}")
        if ok:
            low = probe
        else:
            high = probe
    return low


def embed_program(cfg, topology: str, batch: int = 1024, tokens: int = 20):
    """``Elmo.embed``'s forward program (``bilm`` over ``[batch, tokens, C]`` char ids, rows
    split over the chips, weights replicated)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from elmo_jax.model.bilm import bilm, init_params
    from elmo_jax.model.precision import compute_dtype

    devices = topology_devices(topology)
    mesh = Mesh(np.asarray(devices), ("data",))
    n = len(devices)
    if batch % n:
        raise CompileCheckError(f"an embed batch of {batch} does not split over {n} chips; use a multiple of {n}")
    config = cfg.elmo_config()
    params = _sharded(jax.eval_shape(lambda: init_params(jax.random.key(0), config)), NamedSharding(mesh, P()))
    ids = jax.ShapeDtypeStruct(
        (batch, tokens, config.char_cnn.max_characters_per_token),
        jnp.int32,
        sharding=NamedSharding(mesh, P("data", None, None)),
    )
    fn = functools.partial(bilm, config=config, dtype=compute_dtype(cfg.compute_dtype))

    def forward(p, x):
        return fn(p, char_ids_BTC=x)[0]

    return forward, (params, ids), batch // n, batch // n * tokens


def check_embed(cfg, topology: str, batch: int = 1024, tokens: int = 20, dump: str | None = None) -> ProgramReport:
    fn, args, rows, tok = embed_program(cfg, topology, batch, tokens)
    return compile_program(
        f"Elmo.embed forward, batch {batch} x {tokens} tokens", topology, fn, args, rows, tok, dump=dump
    )


# -- the report -----------------------------------------------------------------------------


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / GiB:.2f} GiB"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds < 72 * 3600 else f"{seconds / 86400:.1f} days"


def describe(
    report: ProgramReport, chip: Chip | None, epochs: int = 10, train_tokens: int = LM1B_TRAIN_TOKENS
) -> list[str]:
    """Lines for a human (see :data:`ESTIMATE_NOTE`).  Figures are per device: a chip, or where
    the topology lists each TensorCore as a device (:func:`per_device`), a TensorCore."""
    unit = "TensorCore" if chip is not None and "TensorCore" in chip.name else "chip"
    head = (
        f"{report.what} on {report.topology} ({report.chips} {unit}s, {report.hosts} host"
        f"{'s' if report.hosts > 1 else ''}), {report.rows_per_chip} rows per {unit}:"
    )
    hbm = f"{chip.hbm_bytes / GiB:.0f} GiB" if chip else "the device's memory"
    if not report.fits:
        return [head, f"  does NOT fit {hbm}: {report.error}"]
    cost = report.cost
    assert cost is not None  # a program that fits has its cost (compile_program)
    lines = [
        head,
        f"  fits: HBM needed {_gib(report.hbm_needed)} of {hbm} per {unit} "
        f"(temporaries {_gib(report.temp_bytes)}, arguments {_gib(report.argument_bytes)})",
        f"  per {unit} and step, loops counted per trip: {cost.flops / 1e12:.3f} TFLOP, {cost.bytes / GB:.2f} GB "
        f"to and from HBM"
        + (f" and {cost.on_chip_bytes / GB:.2f} GB in on-chip memory" if cost.on_chip_bytes else "")
        + f" (XLA's loop-once count, all memories: {(report.xla_flops or 0) / 1e12:.3f} TFLOP, "
        f"{(report.xla_bytes or 0) / GB:.2f} GB)",
    ]
    if cost.unknown_trip_counts:
        lines.append(
            f"  {cost.unknown_trip_counts} loop(s) run to a data-dependent length, counted at their "
            f"upper bound (the longest sentence of the batch)"
        )
    if chip is None:
        return lines + ["  no roofline: not a TPU with published figures"]
    t = report.roofline_seconds(chip)
    assert t is not None  # None only without a cost
    bound = "memory" if cost.bytes / chip.hbm_bandwidth >= cost.flops / chip.bf16_flops else "compute"
    # None only for a roofline time of 0 (no FLOPs and no bytes), which the format below refuses as it always has
    tps = cast(float, report.tokens_per_second(chip))
    lines.append(
        f"  roofline {t * 1e3:.1f} ms per step ({bound}-bound on {chip.name}: "
        f"{chip.bf16_flops / 1e12:.0f} TFLOP/s bf16, {chip.hbm_bandwidth / GB:.0f} GB/s) -> "
        f"{tps:,.0f} tokens/s per {unit}, {tps * report.chips:,.0f} on {report.chips} {unit}s"
    )
    total = epochs * train_tokens / (tps * report.chips)  # the epochs' time at the roofline
    if report.what == "train step":
        lines.append(
            f"  {epochs} epochs of lm1b ({train_tokens / 1e6:.1f}M tokens each) in {_hours(total)} "
            f"on {report.chips} {unit}s"
        )
    if cost.on_chip_bytes:
        upper = cast(float, report.roofline_seconds(chip, upper_bound=True))
        epochs_at_upper = f", {epochs} epochs in {_hours(total * upper / t)}" if report.what == "train step" else ""
        lines.append(
            f"  upper bound, the on-chip traffic moved at HBM bandwidth too: {upper * 1e3:.1f} ms per step{epochs_at_upper}"
        )
    return lines


def run_check(
    cfg,
    topology: str,
    rows_per_chip: int | None = None,
    vocab_size: int | None = None,
    search: bool = True,
    max_compiles: int = 4,
    embed: bool = True,
    log: Callable[[str], None] = print,
) -> list[ProgramReport]:
    """The compile-only check of ``elmo-jax compile`` and ``train --compile_check``."""
    chip = chip_of(topology)
    if chip is not None:
        chip = per_device(chip, topology_devices(topology))
    source = f"{chip.name}; figures from {chip.source}" if chip else "no published figures"
    log(f"compiling for {topology} ({source}); this may take minutes")
    report = check_train_step(cfg, topology, rows_per_chip, vocab_size)
    reports = [report]
    for line in describe(report, chip):
        log(line)
    if not report.fits and not cfg.remat_steps:
        log("  hint: set --config.remat_steps=5 (recompute activations in chunks of 5 steps; the same numbers)")
    if search:
        best = largest_rows(cfg, topology, report.rows_per_chip, vocab_size, max_compiles, report, log)
        log(
            f"  largest rows per chip found to fit: {best if best else 'none (not even 8)'}"
            f" (within {max_compiles} compiles)"
        )
    if embed:
        e = check_embed(cfg, topology)
        reports.append(e)
        for line in describe(e, chip):
            log(line)
    log(f"NOTE: {ESTIMATE_NOTE}")
    return reports
