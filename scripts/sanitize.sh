#!/usr/bin/env bash
# Runs compute-sanitizer's memcheck (out-of-bounds and misaligned accesses) and racecheck (shared
# memory hazards) over every CUDA algorithm on small odd shapes (scripts/sanitize_driver.py).
# Fails if either tool reports anything or a result is wrong. Needs a GPU and a CUDA build.
#   bash scripts/sanitize.sh            # both tools
#   bash scripts/sanitize.sh racecheck  # one tool
#   ALGORITHMS="tiled warp_tiling" bash scripts/sanitize.sh  # some algorithms only
#   DTYPES="Float" bash scripts/sanitize.sh                  # some dtypes only (Float Half BFloat16)
#   TF32=on DTYPES=Float bash scripts/sanitize.sh            # float32 with TF32 allowed only
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SANITIZER=${SANITIZER:-compute-sanitizer}
command -v "$SANITIZER" >/dev/null || { echo "sanitize: $SANITIZER not found" >&2; exit 1; }
# One cudaMalloc per tensor, so memcheck sees an overrun past a tensor's end (the caching
# allocator would hand out neighbouring bytes of a larger block).
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the driver imports the in-place build

tools=("$@")
[ ${#tools[@]} -eq 0 ] && tools=(memcheck racecheck)
status=0
for tool in "${tools[@]}"; do
  echo "== compute-sanitizer --tool $tool"
  log=$(mktemp)
  # API errors are left to the driver: a failing CUDA call raises there and fails the run.
  "$SANITIZER" --tool "$tool" --error-exitcode 3 --report-api-errors no \
    "$PYTHON" scripts/sanitize_driver.py ${ALGORITHMS:-} 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ] || grep -q -E "^========= (Invalid|Race|Error|Warning)" "$log"; then
    echo "sanitize: $tool FAILED (exit $rc)"
    status=1
  else
    echo "sanitize: $tool clean"
  fi
  rm -f "$log"
done
exit $status
