#!/usr/bin/env bash
# The whole proof on a GPU machine, in one command: build with CUDA, run the test suite, the
# compute-sanitizer checks and the benchmark tables (fp32 with TF32 off, fp32 with TF32 on,
# fp16, bf16, and the nn.Linear shapes in bf16, fp16 and TF32). Logs and JSON rows go to ${OUT:-gpu_report}/. ROUNDS=3 measures every table three
# times over and adds the spread of each algorithm's % of torch.mm (bench --rounds).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_report}
SIZES=${SIZES:-4096,8192}
ROUNDS=${ROUNDS:-1}
mkdir -p "$OUT"
status=0
step() { echo "== $*" >&2; }

step build
source scripts/ensure_built.sh pytest || exit 1
cp build.log "$OUT/build.log"
python3 -c "import torch, torch_mm_variants as m; print(torch.cuda.get_device_name(), 'cuda algorithms:', m.algorithms('cuda'))"

step tests
# Two runs, so that a crash in one part still leaves the other's results.
python3 -m pytest -q -p no:cacheprovider tests -k "not auto" >"$OUT/tests.log" 2>&1 || status=1
tail -3 "$OUT/tests.log"
python3 -m pytest -q -p no:cacheprovider tests -k "auto" >"$OUT/tests_auto.log" 2>&1 || status=1
tail -3 "$OUT/tests_auto.log"

if [ -x scripts/sanitize.sh ] && [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  step sanitizer
  bash scripts/sanitize.sh >"$OUT/sanitizer.log" 2>&1 || status=1
  tail -5 "$OUT/sanitizer.log"
fi

step benchmark
# The Hopper rung exists only on sm_90 GPUs of an sm_90a build.
HOPPER=$(python3 -c "import torch_mm_variants as m; print(',wgmma' if 'wgmma' in m.algorithms('cuda') else '')")
bench() {  # bench NAME ARGS...
  local name=$1; shift
  python3 -m torch_mm_variants.bench --sizes "$SIZES" --rounds "$ROUNDS" \
    --output "$OUT/bench_$name.json" "$@" \
    2>/dev/null | tee "$OUT/bench_$name.md" || status=1
}
bench fp32 --dtype float32
bench tf32 --dtype float32 --tf32 --algorithms auto,warp_tiling,tensor_core
bench bf16 --dtype bfloat16 --algorithms "auto,block_tiled_vectorized,warp_tiling,tensor_core$HOPPER"
bench fp16 --dtype float16 --algorithms "auto,warp_tiling,tensor_core$HOPPER"
# nn.Linear shapes of a Llama-style model: 4096 tokens, weight [N, K].
LINEAR_SIZES=4096x4096x4096,4096x14336x4096,4096x4096x14336
SIZES=$LINEAR_SIZES bench linear_bf16 --dtype bfloat16 --weight-layout --algorithms "auto,tensor_core$HOPPER"
SIZES=$LINEAR_SIZES bench linear_fp16 --dtype float16 --weight-layout --algorithms "auto,tensor_core$HOPPER"
# TF32 in this layout runs on wgmma where it is listed; the other layouts' TF32 on tensor_core.
SIZES=$LINEAR_SIZES bench linear_tf32 --dtype float32 --tf32 --weight-layout \
  --algorithms "auto,tensor_core$HOPPER"
# Mid-size products (prefill chunks, batched decode), where wgmma's planner picks tiles and splits.
MID_SIZES=128x4096x4096,256x4096x4096,384x4096x4096,128x14336x4096,384x14336x4096,640x14336x4096,384x4096x14336,256x1024x4096,1536x14336x4096,640x28672x8192,384x11008x4096,896x14336x4096
SIZES=$MID_SIZES bench mid_bf16 --dtype bfloat16 --weight-layout --algorithms "auto$HOPPER"
python3 scripts/bench_skinny.py 2>/dev/null | tee "$OUT/bench_skinny.md" || status=1
python3 scripts/bench_skinny.py --timing graph 2>/dev/null | tee "$OUT/bench_skinny_graph.md" \
  || status=1
exit $status
