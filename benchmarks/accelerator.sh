#!/usr/bin/env bash
# The speed and correctness checks for a GPU/TPU machine, as one bounded run (accelerator
# time is scarce, so every stage has its own time limit and writes its results as it goes).
#
#   bash benchmarks/accelerator.sh OUTDIR
#
# Stages (each under `timeout`; a stage cut short keeps OUTDIR/*.json.partial, and run.log
# says which stage ended how), all logged to OUTDIR/run.log (six files in all: a lease
# brings back at most eight):
#   env.txt              accelerator, driver, Python and package versions
#   train.json           step memory against window length (small, 20 and 1,280 steps, with
#                        and without remat; compile-only) and the device-to-host copy rate
#   embed.json           embedding throughput and Elmo.embed end to end (original, small;
#                        64x20, 1x20, 1024x20), and the device's outputs against the CPU's
#   agreement.json       bilm-tf fixture and padding differences at the default and the
#                        highest matmul precision (benchmarks/fixture_agreement.py)
#   train_large.json     `original` training at 512 rows per step (f32): does a larger
#                        per-device batch lift the 26 % of matmul peak seen at 128 rows?
#   run.log              all of the above as printed, then the LSTM and weight-layout tests
#                        with full-f32 matmuls (pytest compiles per test: ~6 s each on an H200)
# Budget from the first H200 run (2026-12-04, fbd0a9e): each benchmark process starts in
# ~8 s (CUDA), `original` embedding processes took 15-26 s, a training compile 15-18 s,
# fixture agreement ~50 s.  What was measured there already and has not changed since
# (training at 128 rows, bf16 and full-f32 embedding, step skipping: step_skip.py) is not
# repeated.  The stage limits add up to 530 s and the environment stage takes at most 30 s:
# 560 s, under the 600 s a device command may run.
# No peer: AllenNLP is not installed on such machines (the CPU runs measure it).
# Environment: PYTHON (default python3), ELMO_JAX_SHARED (the fixtures' parent folder; without
# it the fixture checks skip), TRAIN_TIMEOUT / EMBED_TIMEOUT / AGREE_TIMEOUT /
# TRAIN_LARGE_TIMEOUT / TEST_TIMEOUT in seconds (whole numbers >= 1).
set -u
out=${1:?usage: bash benchmarks/accelerator.sh OUTDIR}
for name in TRAIN_TIMEOUT EMBED_TIMEOUT AGREE_TIMEOUT TRAIN_LARGE_TIMEOUT TEST_TIMEOUT; do
  value=${!name:-}
  if [[ -n "$value" && ! "$value" =~ ^[1-9][0-9]*$ ]]; then
    # (0 would mean no limit at all to timeout(1))
    echo "accelerator.sh: $name=$value is not a whole number of seconds >= 1 (unset it for the default)" >&2
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
  timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null
  timeout 20 "$py" -c "import sys, jax, jaxlib, optax, orbax.checkpoint as ocp, numpy, h5py
print(sys.version.split()[0], 'jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'orbax-checkpoint', ocp.__version__,
      'optax', optax.__version__, 'numpy', numpy.__version__, 'h5py', h5py.__version__)
print(jax.devices())"
  echo "ELMO_JAX_SHARED=${ELMO_JAX_SHARED:-<unset: fixture checks will skip>}"
} >"$out/env.txt" 2>&1
cat "$out/env.txt" | tee "$log"

failed=()
# stage NAME LIMIT COMMAND...: run under `timeout`, log how it ended (124: cut at the limit).
stage() {
  local name=$1 limit=$2 start=$SECONDS rc
  shift 2
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  if [[ $rc -eq 124 ]]; then
    printf '\n== stage %s: CUT at its %s s limit (partial results kept)\n' "$name" "$limit" | tee -a "$log"
  else
    printf '\n== stage %s: exit %s after %s s (limit %s s)\n' "$name" "$rc" "$((SECONDS - start))" "$limit" | tee -a "$log"
  fi
  [[ $rc -eq 0 ]] || failed+=("$name")
}

stage train "${TRAIN_TIMEOUT:-130}" "$py" benchmarks/run.py --no-peer --presets none \
  --train-presets none --memory-lengths 20,1280 --out "$out/train.json"

stage embed "${EMBED_TIMEOUT:-240}" "$py" benchmarks/run.py --no-peer --presets original,small \
  --shapes 64x20,1x20,1024x20 --bf16-shapes none --highest-shapes none --train-presets none \
  --memory-lengths none --no-parts --out "$out/embed.json"

stage agreement "${AGREE_TIMEOUT:-55}" "$py" benchmarks/fixture_agreement.py --out "$out/agreement.json"

stage train_large "${TRAIN_LARGE_TIMEOUT:-60}" "$py" benchmarks/run.py --no-peer --presets none \
  --train-presets original --train-batch 512 --no-bf16-train --memory-lengths none \
  --out "$out/train_large.json"

echo "== LSTM and weight-layout tests, full-f32 matmuls (JAX_DEFAULT_MATMUL_PRECISION=highest)" | tee -a "$log"
JAX_DEFAULT_MATMUL_PRECISION=highest stage tests "${TEST_TIMEOUT:-45}" "$py" -m pytest -q -p no:cacheprovider -rfE \
  tests/test_lstm.py tests/test_weights.py

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "== stages that did not finish cleanly: ${failed[*]}" | tee -a "$log"
  exit 1
fi
echo "== every stage finished" | tee -a "$log"
