#!/usr/bin/env bash
# The speed and correctness checks for a GPU/TPU machine, as one bounded run (accelerator
# time is scarce, so every stage has its own time limit and writes its results as it goes).
#
#   bash benchmarks/accelerator.sh OUTDIR
#
# Stages (each under `timeout`; a stage cut short keeps OUTDIR/*.json.partial), all logged
# to OUTDIR/run.log (seven files in all: a lease brings back at most eight):
#   env.txt              accelerator, driver, Python and package versions
#   train.json           training steps (small, original; f32 and bf16), step memory vs length
#   embed.json           embedding throughput (small, original) up to batch 1024, bf16 and
#                        full-f32 rows, and the device's outputs against the host CPU's
#   agreement.json       bilm-tf fixture and padding differences at the default and the
#                        highest matmul precision (benchmarks/fixture_agreement.py)
#   step_skip.json       the LSTM's step-skipping while_loop against the scan (step_skip.py)
#   train_large.json     `original` training at 512 rows per step (f32): does a larger
#                        per-device batch lift the 26 % of matmul peak seen at 128 rows?
#   run.log              all of the above as printed, then the LSTM and weight-layout tests
#                        with full-f32 matmuls (pytest compiles per test: ~6 s each on an H200)
# Seen on an H200 (2026-12-04): training 4 rows ~105 s, embedding `original` ~215 s for 6
# rows incl. writing its weights, fixture agreement ~50 s, step skipping ~25 s.
# The stage limits add up to 580 s, under the 600 s a device command may run.
# No peer: AllenNLP is not installed on such machines (the CPU runs measure it).
# Environment: PYTHON (default python3), ELMO_JAX_SHARED (the fixtures' parent folder),
# TRAIN_TIMEOUT / EMBED_TIMEOUT / AGREE_TIMEOUT / STEP_SKIP_TIMEOUT / TRAIN_LARGE_TIMEOUT / TEST_TIMEOUT in seconds.
set -u
out=${1:?usage: bash benchmarks/accelerator.sh OUTDIR}
for name in TRAIN_TIMEOUT EMBED_TIMEOUT AGREE_TIMEOUT STEP_SKIP_TIMEOUT TRAIN_LARGE_TIMEOUT TEST_TIMEOUT; do
  value=${!name:-}
  if [[ -n "$value" && ! "$value" =~ ^[0-9]+$ ]]; then
    echo "accelerator.sh: $name=$value is not a whole number of seconds (unset it for the default)" >&2
    exit 2
  fi
done
mkdir -p "$out"
py=${PYTHON:-python3}
log="$out/run.log"
export PYTHONUNBUFFERED=1
# Memory on demand: a stage's leftover process cannot starve the next one.
export XLA_PYTHON_CLIENT_PREALLOCATE=false

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null
  "$py" -c "import sys, jax, jaxlib, flax, optax, numpy, h5py
print(sys.version.split()[0], 'jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'flax', flax.__version__,
      'optax', optax.__version__, 'numpy', numpy.__version__, 'h5py', h5py.__version__)
print(jax.devices())"
} >"$out/env.txt" 2>&1
cat "$out/env.txt" | tee "$log"

timeout "${TRAIN_TIMEOUT:-140}" "$py" benchmarks/run.py --no-peer --presets none \
  --train-presets small,original --memory-lengths 20,1280 --out "$out/train.json" 2>&1 | tee -a "$log"

timeout "${EMBED_TIMEOUT:-260}" "$py" benchmarks/run.py --no-peer --presets original,small \
  --shapes 64x20,1x20,1024x20 --bf16-shapes 1024x20 --train-presets none \
  --memory-lengths none --out "$out/embed.json" 2>&1 | tee -a "$log"

timeout "${AGREE_TIMEOUT:-55}" "$py" benchmarks/fixture_agreement.py --out "$out/agreement.json" 2>&1 | tee -a "$log"

timeout "${STEP_SKIP_TIMEOUT:-30}" "$py" benchmarks/step_skip.py --out "$out/step_skip.json" 2>&1 | tee -a "$log"

timeout "${TRAIN_LARGE_TIMEOUT:-55}" "$py" benchmarks/run.py --no-peer --presets none \
  --train-presets original --train-batch 512 --no-bf16-train --memory-lengths none \
  --out "$out/train_large.json" 2>&1 | tee -a "$log"

echo "== LSTM and weight-layout tests, full-f32 matmuls (JAX_DEFAULT_MATMUL_PRECISION=highest)" | tee -a "$log"
JAX_DEFAULT_MATMUL_PRECISION=highest timeout "${TEST_TIMEOUT:-40}" "$py" -m pytest -q -p no:cacheprovider -rfE \
  tests/test_lstm.py tests/test_weights.py 2>&1 | tee -a "$log"
