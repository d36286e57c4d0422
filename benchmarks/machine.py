"""The machine a benchmark ran on, recorded in every result file and header.

Numbers (speed, and trained models' scores too) depend on the kind of CPU, not only on its
name: XLA compiles other vector code for AVX2 than for AVX-512 or AMX.  So the record holds
the CPU model and its vector extensions (``avx*``, ``amx*``, ``fma``, ``f16c`` from the
flags of ``/proc/cpuinfo``; elsewhere what :mod:`platform` and ``sysctl`` say).
"""

from __future__ import annotations

import os
import platform
import subprocess

VECTOR_PREFIXES = ("avx", "amx", "fma", "f16c", "sve", "neon", "asimd")


def vector_extensions(flags: str) -> list[str]:
    """The vector-extension names among a CPU's feature ``flags`` (space-separated, any
    case), sorted: e.g. ``['avx', 'avx2', 'f16c', 'fma']`` on an AMD EPYC Zen 3."""
    return sorted({f.lower() for f in flags.split() if f.lower().startswith(VECTOR_PREFIXES)})


def amd_core(family: int, model: int) -> str | None:
    """The AMD core generation of an x86 ``cpu family`` / ``model`` (``/proc/cpuinfo``), where
    known: the model name ("AMD EPYC") alone does not tell Zen 3 from Zen 4 or Zen 5, whose
    vector code differs (AVX2 only; AVX-512; AVX-512 with VP2INTERSECT)."""
    if family == 0x19:
        if 0x10 <= model <= 0x1F or 0x60 <= model <= 0x7F or 0xA0 <= model <= 0xAF:
            return "Zen 4"
        return "Zen 3"
    if family == 0x1A:
        return "Zen 5"
    if family == 0x17:
        return "Zen 2" if model >= 0x30 else "Zen 1"
    return None


def cpu_family_and_model() -> tuple[int | None, int | None, str]:
    """``(cpu family, model, vendor_id)`` from ``/proc/cpuinfo`` (``None`` where absent)."""
    family = model = None
    vendor = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "cpu family" and family is None:
                    family = int(value)
                elif key == "model" and model is None and value.isdigit():
                    model = int(value)
                elif key == "vendor_id" and not vendor:
                    vendor = value
                elif not key and family is not None:
                    break  # the first processor's block is enough
    except (OSError, ValueError):
        pass
    return family, model, vendor


def cpu_model_and_flags() -> tuple[str, str]:
    """The CPU's model name and its feature flags, or ``("?", "")`` where neither is found."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            model, flags = "?", ""
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "?":
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:  # x86 / ARM
                    flags = value.strip()
            return model, flags
    except OSError:
        pass
    try:  # macOS
        out = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string", "machdep.cpu.features", "machdep.cpu.leaf7_features"],
            capture_output=True,
            text=True,
        ).stdout.splitlines()
        if out:
            return out[0].strip(), " ".join(out[1:])
    except OSError:
        pass
    return platform.processor() or "?", ""


def cpu_summary(info: dict) -> str:
    """``"AMD EPYC, Zen 3 (family 25 model 1) (avx avx2 f16c fma)"``: the header's words for the CPU."""
    ext = info.get("vector_extensions")
    where = ""
    if info.get("cpu_family") is not None:
        core = f"{info['cpu_core']} " if info.get("cpu_core") else ""
        where = f", {core}(family {info['cpu_family']} model {info.get('cpu_model_number')})"
    return f"{info.get('cpu_model', '?')}{where} ({' '.join(ext) if ext else 'vector extensions unknown'})"


def machine_info() -> dict:
    """What a result file records about the machine: host, Python, CPUs, CPU model and
    vector extensions, memory (and ``lscpu``'s topology where it exists)."""
    model, flags = cpu_model_and_flags()
    info = {
        "hostname": platform.node(),
        "python": platform.python_version(),
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "machine": platform.machine(),
        "vector_extensions": vector_extensions(flags),
    }
    family, number, vendor = cpu_family_and_model()
    if family is not None:
        info.update(
            cpu_family=family,
            cpu_model_number=number,
            cpu_core=amd_core(family, number or 0) if vendor == "AuthenticAMD" else None,
        )
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)"):
                info[k.strip()] = v.strip()
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_gb"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    return info
