#!/usr/bin/env bash
# The speed and correctness checks for a GPU/TPU machine, as one bounded run (accelerator
# time is scarce, so every stage has its own time limit and writes its results as it goes).
#
#   bash benchmarks/accelerator.sh OUTDIR
#
# Stages (each under `timeout`; a stage cut short keeps OUTDIR/*.json.partial and its log):
#   env.txt           accelerator, driver, Python and package versions
#   train.json/.log   training steps (small, original; f32 and bf16) and step memory vs length
#   embed.json/.log   embedding throughput (small, original) up to batch 1024, bf16 and full-f32
#                     rows, and the device's outputs against this package on the host CPU
#   tests.log         the numerical tests (encoder fast paths, bilm incl. the bilm-tf fixture,
#                     LSTM, weight layout) on the accelerator with full-f32 matmuls, then the
#                     bilm tests at the default precision (TF32 on NVIDIA GPUs)
# No peer: AllenNLP is not installed on such machines (the CPU runs measure it).
# Environment: PYTHON (default python3), ELMO_JAX_SHARED (the fixtures' parent folder),
# TRAIN_TIMEOUT / EMBED_TIMEOUT / TEST_TIMEOUT in seconds.
set -u
out=${1:?usage: bash benchmarks/accelerator.sh OUTDIR}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# Memory on demand: a stage's leftover process cannot starve the next one, and the device
# peak each worker reports is what it used.
export XLA_PYTHON_CLIENT_PREALLOCATE=false

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null
  "$py" -c "import sys, jax, jaxlib, flax, optax, numpy, h5py
print(sys.version.split()[0], 'jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'flax', flax.__version__,
      'optax', optax.__version__, 'numpy', numpy.__version__, 'h5py', h5py.__version__)
print(jax.devices())"
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

timeout "${TRAIN_TIMEOUT:-130}" "$py" benchmarks/run.py --no-peer --presets none \
  --train-presets small,original --memory-lengths 20,1280 --out "$out/train.json" 2>&1 | tee "$out/train.log"

timeout "${EMBED_TIMEOUT:-250}" "$py" benchmarks/run.py --no-peer --presets original,small \
  --shapes 64x20,64x60,1x20,1024x20 --bf16-shapes 64x20,1024x20 --train-presets none \
  --memory-lengths none --out "$out/embed.json" 2>&1 | tee "$out/embed.log"

{
  echo "== numerical tests, full-f32 matmuls (JAX_DEFAULT_MATMUL_PRECISION=highest)"
  JAX_DEFAULT_MATMUL_PRECISION=highest timeout "${TEST_TIMEOUT:-110}" "$py" -m pytest -q -p no:cacheprovider \
    tests/test_encoder_fast_paths.py tests/test_bilm.py tests/test_lstm.py tests/test_weights.py
  echo "== bilm tests at the default matmul precision"
  timeout 45 "$py" -m pytest -q -p no:cacheprovider tests/test_bilm.py
} 2>&1 | tee "$out/tests.log"
