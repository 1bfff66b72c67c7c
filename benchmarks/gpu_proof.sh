#!/usr/bin/env bash
# The GPU proof in one device session, within 9 minutes: the machine's facts, the GPU tests
# and the GPU suite, each step under `timeout`, each writing into OUT_DIR as it goes (a step
# cut short keeps what it wrote).
#
#   bash benchmarks/gpu_proof.sh OUT_DIR
#
# OUT_DIR/facts.txt          nvidia-smi, clocks and power, python/torch/CUDA, peer versions
# OUT_DIR/pytest_gpu.txt     python3 -m pytest -m gpu -q tests
# OUT_DIR/gpu_suite.md/.json the suite's table, rewritten as each case ends
# OUT_DIR/gpu_suite.log      the suite's progress and tracebacks
# OUT_DIR/gpu_proof.txt      each step's exit status and seconds
#
# Wheels in .whl/ (packages the machine lacks, e.g. structlog, orjson) are unpacked into a
# directory put in front of PYTHONPATH with the repository root; an existing PYTHONPATH is
# kept behind them, never replaced, so every subprocess (torchrun's workers too) sees it.
set -u -o pipefail

OUT=${1:?usage: bash benchmarks/gpu_proof.sh OUT_DIR}
TOTAL_S=${GPU_PROOF_SECONDS:-530}  # the whole script; 9 minutes less a margin
SUITE_S=455                        # the suite's budgets (440 s) and its start-up
SITE=${GPU_PROOF_SITE:-/tmp/site}

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export PYTHONUNBUFFERED=1
START=$SECONDS

left() { echo $((TOTAL_S - (SECONDS - START))); }

# step NAME SECONDS COMMAND...: run COMMAND under timeout, note its status and duration.
step() {
    local name=$1 limit=$2 began=$SECONDS rc
    shift 2
    echo "== $name (limit ${limit} s, $(left) s left) ==" >&2
    timeout -k 10 "$limit" "$@"
    rc=$?
    echo "$name: exit $rc in $((SECONDS - began)) s (limit $limit s)" >> "$OUT/gpu_proof.txt"
    return $rc
}

: > "$OUT/gpu_proof.txt"
if compgen -G ".whl/*.whl" > /dev/null; then
    step wheels 60 python3 -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target "$SITE" .whl/*.whl 2>&1 | tee "$OUT/pip.txt"
    export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi

{
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc --all) CPU cores"
    echo "# PYTHONPATH=$PYTHONPATH"
    timeout 20 nvidia-smi
    timeout 20 nvidia-smi --format=csv --query-gpu=name,driver_version,memory.total,\
pstate,power.limit,clocks.max.sm,clocks.sm,temperature.gpu
    timeout 60 python3 - <<'PY'
import importlib.metadata as md
import platform

import torch

print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}: {props.total_memory / 2**30:.1f} GiB, {props.multi_processor_count} SMs")
for name in ("lightning", "accelerate", "structlog", "orjson", "anyio", "pytest"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} not installed")
PY
} > "$OUT/facts.txt" 2>&1
echo "facts: written in $((SECONDS - START)) s" >> "$OUT/gpu_proof.txt"

# The tests get what the suite does not need, between 60 and 180 s.
pytest_s=$(( $(left) - SUITE_S ))
(( pytest_s > 180 )) && pytest_s=180
(( pytest_s < 60 )) && pytest_s=60
step pytest_gpu "$pytest_s" python3 -m pytest -m gpu -q tests 2>&1 | tee "$OUT/pytest_gpu.txt"
pytest_rc=${PIPESTATUS[0]}

# The suite shortens or skips its last cases to end within --time-limit; the outer timeout
# is the last resort (the rows of finished cases are already on disk).
suite_s=$(( $(left) - 5 ))
(( suite_s < 20 )) && suite_s=20  # then every case is skipped, and says why
step gpu_suite "$suite_s" python3 -m benchmarks.gpu_suite --out "$OUT" \
    --time-limit $(( suite_s - 15 )) 2>&1 | tee "$OUT/gpu_suite.log"
suite_rc=${PIPESTATUS[0]}

echo "total: $((SECONDS - START)) s; pytest exit $pytest_rc, gpu_suite exit $suite_rc" \
    | tee -a "$OUT/gpu_proof.txt"
(( pytest_rc == 0 && suite_rc == 0 ))
