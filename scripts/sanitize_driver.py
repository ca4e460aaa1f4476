"""The workload of scripts/sanitize.sh: every CUDA algorithm (or those named on the command line),
every dtype it takes (or those named in $DTYPES, e.g. "Float Half"), float32 with TF32 off and
on, the four transpose layouts and a misaligned view, on a few small shapes that are no tile
multiples and span several blocks and k steps, and batches for the algorithms that run one in a
launch. Exits non-zero on a wrong result."""
from __future__ import annotations

import os
import sys

import torch

import torch_mm_variants as mmv
from torch_mm_variants.bench import tolerance_for

# (M, N, K). The last one has 16-byte aligned rows in every layout, as TMA (the wgmma rung)
# needs.
SHAPES = [(1, 1, 1), (7, 5, 3), (33, 17, 65), (5, 70, 1100), (130, 129, 40), (136, 264, 72)]
# Paths that only larger shapes reach, kept off the SIMT rungs (racecheck follows each of their
# shared-memory accesses, and a K of thousands there takes it many minutes): wgmma's K split over a
# cluster for few tiles (136 x 264 x 4100: K >= 4096, rows aligned in every layout); skinny_tma's
# one-block-per-SM ring (64 tokens against a 4096 x 4096 weight, on a GPU of 132 SMs) and, with b
# row-major, its weight read N-major (rows aligned there and in 20 x 136 x 1000, whose last 64-row
# block is partly past N); wgmma's narrow tiles in six K splits (16 of them), past K = 8192 its wide
# tiles split 8 ways unpaired over an odd count of tile rows (3) and 4 ways in pairs over 2 rows,
# and a split tail (66 columns of pairs, then the last, partial column in 8 splits); rows 16-byte
# aligned in every layout. 128 x 192 tiles, unpaired over 3 rows (outside the nn.Linear layout,
# which computes that one transposed) and in pairs sharing B over 6. In the nn.Linear layout,
# transposed tiles of 160 tokens, stored by TMA and (N odd) not, and split K where wide tiles would:
# tiles of 160 tokens in 3 splits (N odd, a K tail), of 80 in 6, of 96 in 4; tiles of 96 and of 80
# tokens in one wave, unpaired (N odd, a K tail). 128 x 64 tiles split K in three (one row of 33
# tiles, a K tail in the last split). Of the small shapes above, (136, 264, 72) runs in 128 x 64
# tiles in every layout. skinny's token-tile counts that the small shapes miss: 3 tiles (17-24
# tokens) and 8 (49-64); its short-rows kernel at 8 chunks of k (8 x 1000 x 200) and 2 (3 x 70 x 64;
# the small shapes above take 1), both with 2-byte stores, and with whole-sector stores at 4 chunks
# (5 x 1000 x 96), at 2 chunks in 2 token tiles (16 x 6400 x 64, 48 rows per SM on 132 SMs) and at 4
# chunks in 4 tiles (24 x 6400 x 128), and in passes over the token tiles, spread over blocks: 2
# passes of 4 tiles at 4 chunks (48 x 4500 x 128), 4 of 2 at 8 chunks (64 x 4500 x 256), 3 that
# reach M of 4 (40 x 4500 x 256); 2 passes to a block (64 x 9000 x 256); all in a block, the last
# past M (40 x 34000 x 256); its row-major weights of long K at 33-64 tokens in two 16-column warp
# groups a block, the second of the last block past N (48 x 72 x 4100). skinny_gemv's 2 and 4
# tokens, and its K split over blocks (both weight layouts: the transposed layouts of b are its
# row-major weight), its row-major blocks of 32 and 16 warps (1-2 tokens on 66-132 and 133-264 lines
# of 128 bytes, 132 SMs), and its K-contiguous blocks with each count of warps to a row group's K
# (132 SMs): 8 on the first three shapes, 2 on the fourth, 1 on the next two and the batch of 40
# entries below, 4 on the next; its short-K kernel (at least 48 rows per SM) with 8, 16 and 32 lanes
# to a row over the next four shapes' dtypes, at 5-8 tokens on the two after them, and batched on
# the batch of 64 entries below, whose row-major entries' lines (all together) also take blocks of
# 16 warps (float32) and 32 (16 bits); 9-16 tokens in two launches, 8 tokens and the rest, K split
# (12 x 300 x 2100, and the batch of 3 entries of 13 tokens). The batch of 8 entries of 128 columns
# below splits K over all its entries' blocks (skinny and skinny_gemv; skinny_tma over clusters).
# skinny_tma's batched kernel: every batch below (the "gap" ones, which TMA cannot address, in
# skinny's up to 64 tokens and entry by entry past them: the batch of 100 tokens).
EXTRA_SHAPES = {"skinny": [(20, 129, 1000), (64, 70, 1100), (8, 1000, 200), (3, 70, 64),
                            (5, 1000, 96), (16, 6400, 64), (24, 6400, 128),
                            (48, 4500, 128), (64, 4500, 256), (40, 4500, 256), (64, 9000, 256),
                            (40, 34000, 256), (48, 72, 4100)],
                "skinny_gemv": [(2, 33, 4100), (4, 200, 9000), (8, 300, 2100), (1, 4100, 1000),
                                (2, 6000, 700), (1, 12000, 264), (4, 2000, 1100),
                                (1, 7000, 100), (3, 6400, 33), (4, 6337, 128), (2, 6400, 20),
                                (6, 6500, 64), (8, 6400, 60), (12, 300, 2100)],
                "skinny_tma": [(64, 4096, 4096), (20, 136, 1000)],
                "wgmma": [(136, 264, 4100), (200, 1024, 4104), (296, 264, 8200), (256, 1000, 8200),
                          (129, 17000, 4104), (300, 7680, 136), (704, 4104, 1000),
                          (300, 7000, 320), (300, 7001, 320), (160, 4001, 8200),
                          (160, 1000, 8200), (100, 2112, 4104), (288, 4001, 4088),
                          (312, 4001, 4088)]}
DTYPES = {"Float": torch.float32, "Half": torch.float16, "BFloat16": torch.bfloat16}
# Batches (mm_variants::bmm), for the algorithms that run a whole one in a launch: (B, M, N, K),
# with a and b as (layout of a, layout of b) in BATCH_LAYOUTS.
BATCH_SHAPES = [(3, 7, 5, 3), (3, 2, 150, 700), (3, 33, 17, 65), (2, 64, 70, 300),
                (40, 1, 100, 130), (64, 2, 100, 64), (8, 1, 128, 4096), (3, 13, 100, 700),
                (3, 100, 64, 520)]
# "gap": entries one element further apart than their size, so that only entry 0 is 16-byte
# aligned; "shared": one 2-D b for every entry, against an a whose entries do not fold into one
# matrix (column-major), so that the batch runs as a batch.
BATCH_LAYOUTS = [("row", "row"), ("row", "col"), ("gap", "gap"), ("col", "shared")]


def operand(rows, cols, dtype, layout):
    """Made on the CPU and copied over, so that the only kernels the sanitizer sees are the op's."""
    if layout == "row":
        return torch.randn(rows, cols).to(dtype).cuda()
    if layout == "col":
        return torch.randn(cols, rows).to(dtype).cuda().t()
    # "offset": one element into its storage, so not 16-byte aligned
    return torch.randn(rows * cols + 1).to(dtype).cuda()[1:].view(rows, cols)


def batch_operand(batch, rows, cols, dtype, layout):
    """A [batch, rows, cols] operand laid out as BATCH_LAYOUTS says, made as operand() is."""
    if layout == "shared":
        return operand(rows, cols, dtype, "col")
    if layout == "gap":
        storage = torch.randn(batch, rows * cols + 1).to(dtype).cuda()
        return storage[:, :rows * cols].view(batch, rows, cols)
    if layout == "col":
        return torch.randn(batch, cols, rows).to(dtype).cuda().transpose(1, 2)
    return torch.randn(batch, rows, cols).to(dtype).cuda()


def tf32_modes(dtype):
    """The TF32 settings to run `dtype` under: for float32 those named in $TF32 ("off on" by
    default: the tensor-core rungs run it in 3xTF32 with TF32 off and in TF32 with it on), the
    default otherwise."""
    if dtype != torch.float32:
        return [False]
    wanted = os.environ.get("TF32", "off on").split()
    return [mode == "on" for mode in ("off", "on") if mode in wanted]


def run(a, b, algorithm, tf32):
    """(a @ b by `algorithm` with TF32 allowed or not, the relative error allowed for it)."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        return mmv.matmul(a, b, algorithm), tolerance_for(a.dtype, tf32)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def main() -> int:
    torch.manual_seed(0)
    # Outputs start as NaN, so that an element a kernel leaves unwritten fails the value check
    # (memcheck sees only accesses out of bounds, and a fresh output may hold a right answer).
    mmv._C.set_poison_outputs(True)
    failures = 0
    layout_pairs = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col"),
                    ("offset", "offset")]
    wanted = os.environ.get("DTYPES", "").split() or list(DTYPES)
    for algorithm in sys.argv[1:] or mmv.algorithms("cuda"):
        for dtype_name in mmv._C.algorithm_dtypes("cuda", algorithm):
            if dtype_name not in wanted:
                continue
            dtype = DTYPES[dtype_name]
            cases = [(shape, layouts, tf32) for shape in SHAPES + EXTRA_SHAPES.get(algorithm, [])
                     for layouts in layout_pairs for tf32 in tf32_modes(dtype)]
            if mmv._C.algorithm_runs_batches("cuda", algorithm):
                cases += [(shape, layouts, tf32) for shape in BATCH_SHAPES
                          for layouts in BATCH_LAYOUTS for tf32 in tf32_modes(dtype)]
            for shape, (la, lb), tf32 in cases:
                if len(shape) == 4:
                    batch, m, n, k = shape
                    a = batch_operand(batch, m, k, dtype, la)
                    b = batch_operand(batch, k, n, dtype, lb)
                else:
                    m, n, k = shape
                    a, b = operand(m, k, dtype, la), operand(k, n, dtype, lb)
                try:
                    out, tolerance = run(a, b, algorithm, tf32)
                except RuntimeError as error:
                    if "cannot take these inputs" in str(error):  # refused by design
                        continue
                    raise
                ref = a.cpu().double() @ b.cpu().double()
                err = ((out.cpu().double() - ref).norm() / ref.norm()).item()
                if not err <= tolerance:
                    failures += 1
                    print(f"WRONG {algorithm} {dtype_name}{' (TF32)' if tf32 else ''} "
                          f"{'x'.join(map(str, shape))} {la}/{lb}: relative error {err:.2e}")
        print(f"ran {algorithm}", flush=True)
    torch.cuda.synchronize()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
