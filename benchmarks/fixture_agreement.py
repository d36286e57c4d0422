#!/usr/bin/env python
"""How far this device's outputs are from bilm-tf's own, at each matmul precision.

    python benchmarks/fixture_agreement.py [--shared DIR] [--out results.json]

Runs the 10 stateful batches of the bilm-tf test fixture (``DIR/fixtures/bilm-tf/model``,
DIR defaulting to ``$ELMO_JAX_SHARED`` or ``../shared``) under
``jax.default_matmul_precision`` "default" (TF32 on recent NVIDIA GPUs, bf16 passes on TPU)
and "highest" (full float32), and prints the largest absolute difference from the expected
top-layer outputs (the test suite asserts 1e-5 on the CPU).  Also prints the padding
difference: one sentence embedded alone against the same sentence inside a padded batch
(``tiny`` preset, random weights), which is exact up to rounding on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import h5py  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from elmo_jax import ElmoConfig, batch_to_ids  # noqa: E402
from elmo_jax.model.bilm import bilm, init_params  # noqa: E402
from elmo_jax.formats.hdf5 import load_weights  # noqa: E402


def fixture_max_abs_diff(model_dir: pathlib.Path) -> float:
    """Largest |ours - bilm-tf| over the fixture's 10 stateful batches (top layer)."""
    cfg = ElmoConfig.from_json_file(model_dir / "options.json")
    params = load_weights(model_dir / "lm_weights.hdf5", cfg)
    sentences = json.loads((model_dir / "lm_embeddings_sentences.json").read_text())
    expected = [h5py.File(model_dir / f"lm_embeddings_{k}.hdf5", "r") for k in range(3)]
    batches = [[sentences[k][i].split(" ") for k in range(3)] for i in range(10)]
    max_len = max(len(s) for b in batches for s in b)
    forward = jax.jit(bilm, static_argnums=1)  # one padded shape: one compile per precision
    p, state, worst = cfg.projection_dim, None, 0.0
    for i, batch in enumerate(batches):
        layers, state = forward(params, cfg, batch_to_ids(batch, max_length=max_len), state)
        for k in range(3):
            top = np.asarray(layers[-1, k, : len(batch[k])])
            got = np.stack([top[:, :p], top[:, p:]])
            worst = max(worst, float(np.abs(got - expected[k][str(i)][...]).max()))
    return worst


def padding_max_abs_diff() -> float:
    cfg = ElmoConfig.preset("tiny")
    params = init_params(jax.random.key(1), cfg)
    forward = jax.jit(bilm, static_argnums=1)
    short = ["the", "bank", "of", "it"]
    alone, _ = forward(params, cfg, batch_to_ids([short]))
    batch, _ = forward(params, cfg, batch_to_ids([["x"] * 9, short, ["y"] * 13], max_length=16))
    return float(np.abs(np.asarray(batch[:, 1, :4]) - np.asarray(alone[:, 0])).max())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", default=os.environ.get("ELMO_JAX_SHARED", str(REPO.parent / "shared")))
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    model_dir = pathlib.Path(args.shared) / "fixtures" / "bilm-tf" / "model"
    from machine import cpu_summary, machine_info  # benchmarks/, this script's folder

    result = dict(
        device=jax.devices()[0].device_kind, backend=jax.default_backend(), jax=jax.__version__, machine=machine_info()
    )
    print(f"machine: {cpu_summary(result['machine'])}", flush=True)  # the CPU's vector code sets the rounding
    for precision in ("highest", "default"):
        with jax.default_matmul_precision(precision):
            row = dict(padding_max_abs_diff=padding_max_abs_diff())
            if model_dir.is_dir():
                row["fixture_max_abs_diff"] = fixture_max_abs_diff(model_dir)
        result[precision] = row
        print(
            f"{result['device']} precision={precision}: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()),
            flush=True,
        )
    if not model_dir.is_dir():
        print(f"bilm-tf fixture not found at {model_dir}: pass --shared DIR holding fixtures/bilm-tf")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
