#!/usr/bin/env bash
# Compiles every CUDA source for the default architectures without linking, against the installed
# torch's headers, then builds the stand-alone scripts/mma_sync_ceiling.cu. Lets a machine with
# nvcc but a CPU-only torch (CI) catch CUDA compile errors.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
NVCC=${NVCC:-nvcc}
command -v "$NVCC" >/dev/null || { echo "check_cuda_compile: nvcc not found" >&2; exit 1; }
TORCH_DIR=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
PY_INCLUDE=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
OUT_DIR=$(mktemp -d)
trap 'rm -rf "$OUT_DIR"' EXIT
# A CPU-only torch lacks this one generated header of c10/cuda; it only sets the export macro.
SHIM="$OUT_DIR/include"
if [ ! -f "$TORCH_DIR/include/c10/cuda/impl/cuda_cmake_macros.h" ]; then
  mkdir -p "$SHIM/c10/cuda/impl"
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' >"$SHIM/c10/cuda/impl/cuda_cmake_macros.h"
fi

# nvcc's optimizer on every core for each file, as setup.py builds it (the same SASS; on two cores,
# where the files already take both, CI's whole run took about as long with it, 509 s against 490).
# grep reads all of the help: with -q it stops at the match, and nvcc's broken pipe fails the test
# (pipefail).
SPLIT_COMPILE=""
if "$NVCC" --help | grep -- "--split-compile " >/dev/null; then
  SPLIT_COMPILE="--split-compile=0"
fi

compile() {
  "$NVCC" $SPLIT_COMPILE -std=c++17 -O3 --expt-relaxed-constexpr -Xcompiler -fPIC \
    -DMM_VARIANTS_WITH_CUDA \
    -Xcudafe --diag_suppress=3306 -Xcompiler -Wno-c++20-extensions \
    -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H \
    -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_80,code=compute_80 \
    -gencode=arch=compute_90a,code=sm_90a -DMM_VARIANTS_WITH_SM90A \
    -I"$SHIM" -I"$TORCH_DIR/include" -I"$TORCH_DIR/include/torch/csrc/api/include" -I"$PY_INCLUDE" \
    -c "$1" -o "$OUT_DIR/$(basename "$1").o" && echo "compiled $1"
}
export -f compile
export NVCC TORCH_DIR PY_INCLUDE OUT_DIR SHIM SPLIT_COMPILE
find torch_mm_variants/csrc -name '*.cu' | sort | xargs -P "$(nproc)" -I{} bash -c 'compile {}'
# The stand-alone microbenchmark beside the package (no torch).
"$NVCC" -O3 -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a \
  -o "$OUT_DIR/mma_sync_ceiling" scripts/mma_sync_ceiling.cu && echo "compiled scripts/mma_sync_ceiling.cu"
