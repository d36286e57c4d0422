#!/usr/bin/env python
"""Times the LSTM recurrence's two inference loops on the current device: the fixed-length
``scan`` and the ``while_loop`` that stops after the last step any row uses
(``lstm._recurrence_active_steps``, which ``lstm.recurrence`` uses on the CPU only).

    python benchmarks/step_skip.py [--out results.json]

Shapes are the ``original`` preset's (both directions stacked, P=512, H=4096): a 20-token
sentence in its 24-step bucket (22 steps used) and a batch of 64 in a 32-step bucket (25 used),
plus all steps used.  Prints one line per case and the ratio ``while / scan``; a ratio below
1 means the step skipping pays on this device.  Outputs are compared exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import machine_info  # noqa: E402  (benchmarks/, this script's folder)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from elmo_jax.model import lstm  # noqa: E402

CASES = (  # (rows, bucket steps, steps used)
    (1, 24, 22),
    (64, 32, 25),
    (64, 32, 32),
)


def _median_ms(fn, args, repeats):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)

    n_dir, dim_p, dim_h = 2, 512, 4096
    rng = np.random.default_rng(0)
    w_h = jnp.asarray(rng.normal(0, 0.02, (n_dir, dim_p, 4 * dim_h)), jnp.float32)
    w_p = jnp.asarray(rng.normal(0, 0.02, (n_dir, dim_h, dim_p)), jnp.float32)
    clips = (3.0, 3.0, jnp.float32)

    def scan(w_h, w_p, gx, mask, h0, c0):
        return lstm._recurrence_scan(w_h, w_p, gx, mask, h0, c0, *clips, False)

    def active(w_h, w_p, gx, mask, h0, c0):
        return lstm._recurrence_active_steps(w_h, w_p, gx, mask, h0, c0, *clips)

    scan_j, active_j = jax.jit(scan), jax.jit(active)
    rows = []
    print(f"device: {jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}")
    for n_rows, n_time, n_used in CASES:
        gx = jnp.asarray(rng.normal(0, 1, (n_time, n_dir, n_rows, 4 * dim_h)), jnp.float32)
        mask = np.zeros((n_time, n_dir, n_rows, 1), np.float32)
        mask[:n_used] = 1.0
        mask = jnp.asarray(mask)
        h0 = jnp.zeros((n_dir, n_rows, dim_p), jnp.float32)
        c0 = jnp.zeros((n_dir, n_rows, dim_h), jnp.float32)
        call = (w_h, w_p, gx, mask, h0, c0)
        same = all(
            bool(jnp.array_equal(a, b))
            for a, b in zip(jax.tree.leaves(scan_j(*call)), jax.tree.leaves(active_j(*call)))
        )
        t_scan = _median_ms(scan_j, call, args.repeats)
        t_active = _median_ms(active_j, call, args.repeats)
        row = dict(
            rows=n_rows,
            steps=n_time,
            used=n_used,
            scan_ms=round(t_scan, 4),
            while_ms=round(t_active, 4),
            ratio=round(t_active / t_scan, 3),
            identical=same,
        )
        rows.append(row)
        print(
            f"rows {n_rows:3d}  steps {n_used:2d}/{n_time:2d}  scan {t_scan:8.3f} ms  "
            f"while {t_active:8.3f} ms  while/scan {t_active / t_scan:5.2f}  identical {same}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                dict(
                    device=jax.devices()[0].device_kind,
                    backend=jax.default_backend(),
                    jax=jax.__version__,
                    machine=machine_info(),
                    cases=rows,
                ),
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
