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
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string", "machdep.cpu.features",
                              "machdep.cpu.leaf7_features"], capture_output=True, text=True).stdout.splitlines()
        if out:
            return out[0].strip(), " ".join(out[1:])
    except OSError:
        pass
    return platform.processor() or "?", ""


def cpu_summary(info: dict) -> str:
    """``"AMD EPYC 7B13 (avx avx2 f16c fma)"``: the header's words for the CPU."""
    ext = info.get("vector_extensions")
    return f"{info.get('cpu_model', '?')} ({' '.join(ext) if ext else 'vector extensions unknown'})"


def machine_info() -> dict:
    """What a result file records about the machine: host, Python, CPUs, CPU model and
    vector extensions, memory (and ``lscpu``'s topology where it exists)."""
    model, flags = cpu_model_and_flags()
    info = {"hostname": platform.node(), "python": platform.python_version(),
            "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "cpu_count": os.cpu_count(), "cpu_model": model, "machine": platform.machine(),
            "vector_extensions": vector_extensions(flags)}
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
