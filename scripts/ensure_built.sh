# Sourced by scripts/bench and scripts/test: makes sure torch, the test tools and the compiled
# extension are there. Installs only what is missing, so on a machine that already has torch
# (and no network) it uses what it finds. The build is incremental.
# The caller's working directory is kept (relative paths in its arguments, e.g. bench --output,
# stay the caller's): the build runs in a subshell at the repository, and PYTHONPATH finds it.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  echo "torch_mm_variants: installing PyTorch ${TORCH_VERSION:-2.13.0}" >&2
  "$PYTHON" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
fi
for module in "$@"; do
  "$PYTHON" -c "import $module" 2>/dev/null || "$PYTHON" -m pip install -q "$module"
done
command -v ninja >/dev/null || "$PYTHON" -m pip install -q ninja || true

echo "torch_mm_variants: building the extension" >&2
(cd "$repo" && MAX_JOBS=${MAX_JOBS:-$(nproc)} "$PYTHON" setup.py -q build_ext --inplace \
  >build.log 2>&1) || {
  tail -50 "$repo/build.log" >&2
  echo "torch_mm_variants: build failed (full log in $repo/build.log)" >&2
  exit 1
}
