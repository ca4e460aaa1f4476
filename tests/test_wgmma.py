"""The Hopper rung: listed only where it can run, TMA and wgmma really in the compiled kernels,
and the paths the generic sweeps of test_matmul.py do not force: every operand layout on sizes
just off the 128 x 256 x 64 tiles with TMA-compatible strides, K tails inside a stage, more tiles
than SMs (the persistent loop), K split over clusters for outputs of few tiles, the 128 x 192
and 128 x 64 tiles, nn.Linear products computed transposed in token tiles, and views TMA cannot
address falling back to rung 8. Streams, graph capture and devices are covered for every CUDA rung
in test_cuda_ladder_extras.py."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

import torch_mm_variants as mmv
from conftest import (assert_matches_reference, capture_graph, gpu_available, gpu_capability,
                      kernel_sass, launched_kernels, product_kernels, random_matrix,
                      sm90a_available, tolerance_for)

ALGORITHM = "wgmma"
LAYOUTS = [("row", "row"), ("row", "col"), ("col", "row"), ("col", "col")]
# float32 with TF32 allowed runs in tf32 wgmma in every layout (row, col: the nn.Linear layout;
# col, col: A from registers; row, row: transposed, B from registers; col, row: the smaller
# operand copied K-major first) and with TF32 off takes rung 8's kernel.
TF32 = pytest.param(torch.float32, marks=pytest.mark.tf32, id="float32-tf32")
DTYPES = [torch.float16, torch.bfloat16, TF32]


needs_sm90 = pytest.mark.skipif(not sm90a_available(),
                                reason="needs an sm_90 GPU and a build with the sm_90a target")
pytestmark = pytest.mark.cuda
# The planner's expected grids are those of a GPU with 132 SMs (H100 SXM and H200).
needs_132_sms = pytest.mark.skipif(
    not gpu_available() or torch.cuda.get_device_properties(0).multi_processor_count != 132,
    reason="the expected grids are those of a GPU with 132 SMs")


def padded_view(rows, cols, layout, dtype):
    """A [rows, cols] view that TMA can address (16-byte aligned base and stride) whatever rows
    and cols are."""
    return random_matrix(rows, cols, dtype, "cuda", f"padded-{layout}")


def test_only_cuda_builds_report_sm90a():
    assert mmv.has_cuda() or not mmv._C.has_sm90a()


@pytest.mark.skipif(gpu_capability() != (9, 0), reason="needs an sm_90 GPU")
def test_sm90_gpus_run_a_build_with_sm90a():
    """On an sm_90 GPU the build must hold the sm_90a kernels: without them wgmma and skinny_tma
    are not listed, and their tests skip as on other GPUs, which passes unnoticed. A build made
    without them on purpose is allowed with MM_VARIANTS_ALLOW_NO_SM90A=1."""
    if os.environ.get("MM_VARIANTS_ALLOW_NO_SM90A") == "1":
        pytest.skip("MM_VARIANTS_ALLOW_NO_SM90A=1 allows a build without sm_90a")
    assert mmv._C.has_sm90a(), (
        "this sm_90 GPU runs a build without sm_90a (TORCH_CUDA_ARCH_LIST without 9.0a): the "
        "Hopper rungs' tests would skip; build with it, or set MM_VARIANTS_ALLOW_NO_SM90A=1")


@pytest.mark.skipif(not gpu_available() or sm90a_available(),
                    reason="needs a GPU other than sm_90, or a build without sm_90a")
def test_refused_by_name_on_other_gpus():
    assert ALGORITHM not in mmv.algorithms("cuda")
    a = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="algorithm 'wgmma' cannot run on cuda"):
        mmv.matmul(a, a, ALGORITHM)


@needs_sm90
def test_listed_on_sm90():
    assert ALGORITHM in mmv.algorithms("cuda")
    assert sorted(mmv._C.algorithm_dtypes("cuda", ALGORITHM)) == ["BFloat16", "Float", "Half"]


@needs_sm90
@pytest.mark.parametrize("allow_tf32", [True, False])
@pytest.mark.parametrize("a_layout,b_layout", LAYOUTS)
def test_float32_runs_in_tf32_where_allowed(allow_tf32, a_layout, b_layout):
    """float32 takes tf32 wgmma only where the user allows TF32: x @ w.t() as it is, A
    transposed against a K-major B as it is (A the M-major operand that goes to wgmma from
    registers), a row-major product transposed (a tile shape stored transposed, B^T the operand
    in registers), and with neither operand K-major the smaller one (here A) copied K-major
    first, then transposed as a row-major product. With TF32 off rung 8's kernel keeps
    float32's accuracy (3xTF32). auto follows the same choice."""
    torch.manual_seed(0)
    a, b = padded_view(300, 1000, a_layout, torch.float32), padded_view(1000, 500, b_layout,
                                                                      torch.float32)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    try:
        wgmma_reads = allow_tf32
        names = product_kernels(lambda: mmv.matmul(a, b, ALGORITHM))
        expected = "wgmma_kernel" if wgmma_reads else "tensor_core_kernel"
        assert len(names) == 1 and expected in names[0] and "float" in names[0], names
        if wgmma_reads:
            transposed = b_layout == "row"  # the copied A is row-major
            a_in_registers = a_layout == "col" or transposed
            assert (", true>, float, false, true," in names[0]) == transposed, names
            assert (", float, false, true," in names[0]) == a_in_registers, names
        assert mmv.auto_choice(a, b) == (ALGORITHM if wgmma_reads else "tensor_core")
        assert_matches_reference(a, b, ALGORITHM)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


@needs_sm90
@pytest.mark.tf32
@pytest.mark.parametrize("m,n,k,copied", [
    (300, 500, 1000, "a"),   # A the smaller: copied row-major, then computed transposed
    (500, 300, 1000, "b"),   # B the smaller: copied K-major, then A from registers
    (400, 400, 64, "a"),     # a tie copies A
    (300, 1, 1000, "a"),     # a single column of B is N-major however it is copied
    (300, 500, 1001, None),  # rows of K floats not 16-byte aligned: rung 8 in place
])
def test_float32_copies_one_operand_where_neither_is_k_major(m, n, k, copied):
    """a.t() @ x (a weight's gradient) has neither operand K-major, which tf32 wgmma needs of one:
    the smaller is copied K-major first, unless TMA could not address the copy or the other
    operand, where rung 8 multiplies them in place."""
    torch.manual_seed(0)
    a = random_matrix(k, m, torch.float32, "cuda").t()
    b = random_matrix(k, max(n, 4), torch.float32, "cuda")[:, :n]  # rows 16-byte aligned
    names = product_kernels(lambda: mmv.matmul(a, b, ALGORITHM))
    assert len(names) == 1, names
    if copied is None:
        assert "tensor_core_kernel" in names[0], names
    else:
        assert "wgmma_kernel" in names[0], names
        # a copied A [M, K] is row-major: the product runs transposed, B^T from registers
        stored_transposed = copied == "a"
        assert (", true>, float, false, true," in names[0]) == stored_transposed, names
    if n > 1:
        assert mmv.auto_choice(a, b) == (ALGORITHM if copied else "tensor_core")
    assert_matches_reference(a, b, ALGORITHM)


# test_float32_multiplies_in_place_where_the_copy_finds_no_memory's process: argv[1] is the tests'
# folder. Prints the kernels of the call before, under and after the memory limit, and the
# limited call's relative error against float64.
COPY_WITHOUT_MEMORY = """
import json, sys
import torch
import torch_mm_variants as mmv
sys.path.insert(0, sys.argv[1])
from conftest import product_kernels, random_matrix, relative_error
torch.backends.cuda.matmul.allow_tf32 = True
torch.manual_seed(0)
a = random_matrix(2048, 2048, torch.float32, "cuda").t()
b = random_matrix(2048, 2048, torch.float32, "cuda")
before = product_kernels(lambda: mmv.matmul(a, b, "wgmma"))
torch.cuda.synchronize()
torch.cuda.empty_cache()
limit = torch.cuda.memory_reserved() + 24 * 2**20
torch.cuda.set_per_process_memory_fraction(limit / torch.cuda.get_device_properties(0).total_memory)
outs = []
try:
    limited = product_kernels(lambda: outs.append(mmv.matmul(a, b, "wgmma")))
finally:
    torch.cuda.set_per_process_memory_fraction(1.0)
error = relative_error(outs[0], a.double() @ b.double())
after = product_kernels(lambda: mmv.matmul(a, b, "wgmma"))
print(json.dumps({"before": before, "limited": limited, "after": after, "error": error}))
"""


@needs_sm90
@pytest.mark.tf32
def test_float32_multiplies_in_place_where_the_copy_finds_no_memory():
    """The K-major copy of a.t() @ x is memory the product itself does not need: where the
    allocator has none left for it, rung 8 multiplies the operands in place rather than the call
    failing, and with memory again the copy returns. A per-process limit leaves room for the
    16 MB output but not for a 16 MB copy. It runs in a process of its own: blocks that other
    tests leave cached could otherwise hold the output inside the limit, and leave it room for
    the copy."""
    tests = os.path.dirname(os.path.abspath(__file__))
    child = subprocess.run([sys.executable, "-c", COPY_WITHOUT_MEMORY, tests],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stdout + child.stderr
    result = json.loads(child.stdout.strip().splitlines()[-1])
    assert "wgmma_kernel" in result["before"][0], result
    limited = result["limited"]
    assert len(limited) == 1 and "tensor_core_kernel" in limited[0], result
    assert result["error"] <= tolerance_for(torch.float32, "cuda"), result
    assert "wgmma_kernel" in result["after"][0], result


@needs_sm90
@pytest.mark.tf32
def test_tf32_register_operand_is_rounded_to_nearest():
    """B's elements, which a row-major float32 product takes to wgmma from registers, are rounded
    to the nearest tf32, not truncated: 1 + 3 * 2^-12 lies 3/4 of a tf32 step above 1, so 64
    products with ones (exact in tf32) sum to 64 * (1 + 2^-10), where truncation gives 64."""
    a = torch.ones(128, 64, device="cuda")
    b = torch.full((64, 256), 1 + 3 * 2.0**-12, device="cuda")
    out = mmv.matmul(a, b, ALGORITHM)
    assert torch.all(out == 64 * (1 + 2.0**-10)), out.unique()


@needs_sm90
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_layout,b_layout", LAYOUTS)
def test_layouts_off_the_tile_boundaries(dtype, a_layout, b_layout):
    """Output widths that are multiples of 8 take the TMA-store epilogue, clipped at the edges;
    the others the direct store."""
    torch.manual_seed(0)
    for m, n, k in [(1, 1, 1), (7, 9, 5), (63, 65, 63), (127, 255, 65), (129, 257, 129),
                    (128, 256, 64), (1000, 300, 1000), (65, 1, 200), (2, 513, 31),
                    (129, 264, 65), (1000, 8, 100), (300, 1000, 72)]:
        a, b = padded_view(m, k, a_layout, dtype), padded_view(k, n, b_layout, dtype)
        assert_matches_reference(a, b, ALGORITHM)


@needs_sm90
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_layout,b_layout", LAYOUTS)
def test_more_tiles_than_sms_and_many_k_steps(dtype, a_layout, b_layout):
    """Each block of the persistent grid walks several tiles and the stage ring wraps many times
    per tile, so the barrier phases carry across tiles. The 17 tile rows run in pairs, the last
    pair's second block past M (it only passes its share of B on)."""
    torch.manual_seed(0)
    a, b = padded_view(2100, 1100, a_layout, dtype), padded_view(1100, 3000, b_layout, dtype)
    assert_matches_reference(a, b, ALGORITHM)


@needs_sm90
@pytest.mark.parametrize("a_layout,b_layout", LAYOUTS)
def test_wide_tiles_without_a_cluster(a_layout, b_layout):
    """One tile row (no block to pair with) and enough 256-wide tiles to fill the SMs in whole
    waves: the wide tile shape, launched without clusters. (Small outputs take the narrow tiles,
    large ones wide tiles in clusters: the tests above.)"""
    torch.manual_seed(0)
    n = 256 * 2 * torch.cuda.get_device_properties(0).multi_processor_count
    a, b = padded_view(128, 64, a_layout, torch.bfloat16), padded_view(64, n, b_layout, torch.bfloat16)
    assert_matches_reference(a, b, ALGORITHM)


@needs_sm90
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_layout,b_layout", LAYOUTS)
def test_wider_tiles(dtype, a_layout, b_layout):
    """Widths that divide into 320-column tiles in fewer waves than into 256-column ones (an
    nn.Linear weight of about 14336 rows against 4096 tokens; on 132 SMs 11 waves of 128 x 320
    tiles against 14 of 128 x 256) take the wider tile: two wgmmas per k16 step (N = 256 and 64),
    B's five 64-column boxes split 3 / 2 between the pair, five store rounds over two staging
    halves. K = 200 ends in a partial step; N = 14328 stores through TMA, N = 14333 directly."""
    torch.manual_seed(0)
    for n in (14328, 14333):
        a, b = padded_view(4093, 200, a_layout, dtype), padded_view(200, n, b_layout, dtype)
        assert_matches_reference(a, b, ALGORITHM)


@needs_sm90
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_layout,b_layout", LAYOUTS)
def test_every_split_count(dtype, a_layout, b_layout):
    """Outputs with too few tiles to fill half the SMs split K (from K = 4096) over a thread-block
    cluster: 8 ways with one tile row (M = 100), 4 where pairs of blocks share B tiles (M = 129,
    clusters of 2 x 4), with K tails in the last split. N = 201 stores the sums one element at a
    time, N = 264 four at a time."""
    torch.manual_seed(0)
    for k in (4096, 4097, 4351, 5000):
        for m in (100, 129):
            for n in (201, 264):
                a, b = padded_view(m, k, a_layout, dtype), padded_view(k, n, b_layout, dtype)
                assert_matches_reference(a, b, ALGORITHM)


# Outputs of few tiles: K split over clusters on a GPU of 132 SMs (narrow tiles in 2, 8 and 8
# splits). K keeps contiguous rows 16-byte aligned (TMA's need; other views run rung 8) and leaves
# a K tail of 8 in the last split.
SPLIT_SHAPES = [(256, 4096, 4104), (136, 264, 4104), (100, 1000, 4104)]


def wgmma_launches(run):
    """The profiler's events of the wgmma kernels that run() launches."""
    return [e for e in launched_kernels(run) if "wgmma_kernel" in e["name"]]


def kernel_grids(run):
    """The launch grids (x, y, z) of the wgmma kernels that run() launches."""
    return [tuple(e["args"]["grid"]) for e in wgmma_launches(run)]


# The kernel's template arguments after the tile shape and the dtype: whether A and B are
# K-contiguous, then kCluster, the blocks paired along M to share B (1 or 2).
CLUSTER_ARGUMENT = re.compile(r"wgmma_kernel<.*?, (?:true|false), (?:true|false), (\d+), ")


def cluster_of(name: str) -> int:
    """kCluster of a wgmma kernel, from its name in the profiler's trace."""
    match = CLUSTER_ARGUMENT.search(name)
    assert match, f"no cluster argument in {name}"
    return int(match.group(1))


def plan_of(event):
    """(grid, kCluster) of a wgmma kernel's profiler event."""
    return tuple(event["args"]["grid"]), cluster_of(event["name"])


def kernel_plans(run):
    """(grid, kCluster) of each wgmma kernel that run() launches, in launch order."""
    return [plan_of(e) for e in wgmma_launches(run)]


def assert_one_launch(run, tile, grid, cluster, shape):
    """run() launches one wgmma kernel, in the given grid and cluster and with tile (part of its
    template arguments) in its name; returns that name."""
    kernels = wgmma_launches(run)
    assert [plan_of(e) for e in kernels] == [(grid, cluster)], f"{shape}: {kernels}"
    assert tile in kernels[0]["name"], kernels[0]["name"]
    return kernels[0]["name"]


@needs_sm90
def test_split_k_takes_the_split_path():
    """The split shapes really launch splits (a grid with gridDim.y > 1, at most 8 per cluster),
    and a shape with many tiles does not."""
    for m, n, k in SPLIT_SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        grids = kernel_grids(lambda: mmv.matmul(a, b, ALGORITHM))
        assert len(grids) == 1 and 1 < grids[0][1] <= 8, f"{m}x{n}x{k}: grids {grids}"
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    assert kernel_grids(lambda: mmv.matmul(a, a, ALGORITHM))[0][1] == 1


# Mid-size outputs and the launch grid (blocks, splits) and cluster (1 alone, 2 in pairs along M)
# each takes on a GPU of 132 SMs: narrow 128 x 128 tiles in two splits (2 tile rows x 32 columns,
# a K tail of 8 in the last split) and in eight (8 tiles), unpaired; 128 x 64 tiles in two splits
# (2 x 32 and 3 x 16 of them, half a wave or less, where their blocks have less work than narrow
# or wide tiles' splits); past K = 8192 wide tiles, split 8 ways unpaired over an odd count of
# tile rows (3) and 4 ways in pairs over 2 rows; narrow tiles filling most SMs in one wave,
# unpaired (3 x 40; 2 x 55, too short a K for pairs over a partial wave; 3 x 32 full rows: 73% of
# the SMs); 128 x 192 tiles over 3 rows (3 x 40), unpaired; and wide tiles unpaired where pairs
# would need a second wave (3 x 43).
PLAN_SHAPES = [((200, 4000, 4104), (64, 2, 1)), ((128, 1024, 4096), (8, 8, 1)),
               ((256, 2048, 8192), (64, 2, 1)), ((300, 1000, 8200), (48, 2, 1)),
               ((300, 640, 8200), (9, 8, 1)),
               ((256, 1000, 8200), (8, 4, 2)), ((300, 5000, 200), (120, 1, 1)),
               ((256, 7000, 320), (110, 1, 1)), ((384, 4096, 4096), (96, 1, 1)),
               ((300, 7680, 136), (120, 1, 1)), ((320, 11008, 256), (129, 1, 1))]


@needs_sm90
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_layout,b_layout", LAYOUTS)
def test_mid_size_plans(dtype, a_layout, b_layout):
    """Each plan of PLAN_SHAPES computes the product in every operand layout."""
    assert_plans_match_reference(PLAN_SHAPES, dtype, a_layout, b_layout)


def assert_plans_match_reference(plans, dtype, a_layout, b_layout):
    """Checks the product of each ((m, n, k), grids) of plans in the given operand layouts."""
    torch.manual_seed(0)
    for (m, n, k), _ in plans:
        a, b = padded_view(m, k, a_layout, dtype), padded_view(k, n, b_layout, dtype)
        assert_matches_reference(a, b, ALGORITHM)


@needs_sm90
@needs_132_sms
def test_mid_size_plans_take_their_grids():
    """The grids and clusters of PLAN_SHAPES, which depend on the SM count (H100 SXM and H200:
    132)."""
    for (m, n, k), (blocks, splits, cluster) in PLAN_SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        plans = kernel_plans(lambda: mmv.matmul(a, b, ALGORITHM))
        assert plans == [((blocks, splits, 1), cluster)], f"{m}x{n}x{k}: {plans}"


# Outputs whose wide tiles make a whole wave and a few more on 132 SMs (launch_split_tail): 3 tile
# rows x 47 columns run as 44 columns unsplit (132 tiles) and 3 (9 tiles, the last column partial)
# in 8 splits, the last with a K tail of 8; the same with an odd N, whose C rows TMA cannot store
# (not 16-byte aligned); 4 tile rows, whose first 33 columns run in pairs sharing B.
TAIL_SHAPES = [((380, 12000, 4104), [((132, 1, 1), 1), ((9, 8, 1), 1)]),
               ((380, 12001, 4104), [((132, 1, 1), 1), ((9, 8, 1), 1)]),
               ((512, 8900, 4104), None)]

# nn.Linear products computed transposed (C^T = W X^T): the tokens in tiles of 160 or 192, the
# weight's rows in 128-row tiles, with the grids and clusters they take on 132 SMs. 300 tokens
# in two tiles of 160 over 55 weight tiles, in 28 pairs sharing the tokens' tile (the last pair's
# second block past the weight's rows); the same with an odd N, whose C rows TMA cannot store,
# and a K tail; 192 tokens in one tile of 192 over 112 weight tiles, in pairs; 640 tokens in four
# tiles of 160 over 33 weight tiles, unpaired, since 17 pairs a column would take a second wave.
# Where wide tiles would split K, few enough transposed tiles to fit half the SMs split it instead:
# 160 tokens over 32 weight tiles with an odd N and a K tail in the last of 3 splits; 352 tokens in two tiles of 192; 224
# tokens in three tiles of 80 and 256 in three of 96, over 8 weight tiles (the last partial), in 4
# splits with a K tail. Tiles of 96 tokens run in one wave, unpaired, where they fill most SMs
# and the tokens fill them: 384 tokens over 32 weight tiles (narrow tiles' one wave otherwise);
# 288 over 32 with an odd N and a K tail, where K is short (a split otherwise); 768 over 16 with
# K = 8184 (a tail), where narrow tiles would take one wave. Where 96-token tiles leave a third
# of a tile empty and 128 x 64 tiles would not fill the wave, tiles of 80 tokens: 320 over 32
# weight tiles (a split of 160-token tiles otherwise), and 312 with an odd N and a K tail.
TRANSPOSED_SHAPES = [((300, 7000, 320), ("TileShape<160", (112, 1, 1), 2)),
                     ((300, 7001, 4104), ("TileShape<160", (112, 1, 1), 2)),
                     ((192, 14336, 256), ("TileShape<192", (112, 1, 1), 2)),
                     ((640, 4224, 320), ("TileShape<160", (132, 1, 1), 1)),
                     ((160, 4001, 8200), ("TileShape<160", (32, 3, 1), 1)),
                     ((352, 4096, 4096), ("TileShape<192", (64, 2, 1), 1)),
                     ((224, 1000, 8200), ("TileShape<80", (24, 4, 1), 1)),
                     ((256, 1000, 8200), ("TileShape<96", (24, 4, 1), 1)),
                     ((384, 4096, 4096), ("TileShape<96", (128, 1, 1), 1)),
                     ((288, 4001, 4088), ("TileShape<96", (96, 1, 1), 1)),
                     ((768, 2048, 8184), ("TileShape<96", (128, 1, 1), 1)),
                     ((320, 4096, 4096), ("TileShape<80", (128, 1, 1), 1)),
                     ((312, 4001, 4088), ("TileShape<80", (128, 1, 1), 1))]


# Outputs that take the tile shapes between narrow and wide, with the tiles, grids and clusters
# they take on 132 SMs (B row-major). 128 x 192 tiles: 12 x 8 of them in one wave, unpaired since
# K is short and the wave partial, with an odd N (C rows TMA cannot store) and without; 6 x 22 in
# 66 pairs sharing B over a long K with a K tail, odd N; 18 x 12 over two waves of the persistent
# grid, unpaired, K of four steps. 128 x 64 tiles, unpaired, for outputs that fit one wave of
# them: 8 x 16, and 2 x 16 with an odd N and a K tail; where narrow tiles would split K: 2 x 64
# of them (K = 4096), and one row of 128 over a long K with a tail; and split in three: one row
# of 33, a K tail in the last split.
BETWEEN_SHAPES = [((1500, 1501, 1000), ("TileShape<192, 4, false>", (96, 1, 1), 1)),
                  ((1500, 1504, 1000), ("TileShape<192, 4, false>", (96, 1, 1), 1)),
                  ((700, 4099, 4104), ("TileShape<192, 4, false>", (132, 1, 1), 2)),
                  ((2304, 2304, 200), ("TileShape<192, 4, false>", (132, 1, 1), 1)),
                  ((1000, 1000, 1000), ("TileShape<64, 8, false>", (128, 1, 1), 1)),
                  ((129, 1001, 65), ("TileShape<64, 8, false>", (32, 1, 1), 1)),
                  ((256, 4096, 4096), ("TileShape<64, 8, false>", (128, 1, 1), 1)),
                  ((100, 8192, 8200), ("TileShape<64, 8, false>", (128, 1, 1), 1)),
                  ((100, 2112, 4104), ("TileShape<64, 8, false>", (33, 3, 1), 1))]


@needs_sm90
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_layout,b_layout", LAYOUTS)
def test_between_tile_plans(dtype, a_layout, b_layout):
    """The 128 x 192 and 128 x 64 tiles write the whole product, in every layout."""
    assert_plans_match_reference(BETWEEN_SHAPES, dtype, a_layout, b_layout)


@needs_sm90
@needs_132_sms
def test_between_tile_plans_take_their_grids():
    """Each shape of BETWEEN_SHAPES runs in its tile shape, grid and cluster (132 SMs)."""
    for (m, n, k), (tile, grid, cluster) in BETWEEN_SHAPES:
        a = padded_view(m, k, "row", torch.bfloat16)
        b = padded_view(k, n, "row", torch.bfloat16)  # rows TMA can address, also where n is odd
        assert_one_launch(lambda: mmv.matmul(a, b, ALGORITHM), tile, grid, cluster,
                          f"{m}x{n}x{k}")


@needs_sm90
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_layout,b_layout", LAYOUTS)
def test_split_tail_plans(dtype, a_layout, b_layout):
    """The two launches of a split tail together write the whole product, in every layout."""
    assert_plans_match_reference(TAIL_SHAPES, dtype, a_layout, b_layout)


@needs_sm90
@needs_132_sms
def test_split_tail_takes_its_grids():
    """A launch over the whole wave's columns, then one over the rest in K splits, unpaired
    (132 SMs)."""
    for (m, n, k), expected in TAIL_SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()  # rows TMA can address
        plans = kernel_plans(lambda: mmv.matmul(a, b, ALGORITHM))
        if expected is None:  # paired blocks: as many pairs as the GPU holds at once
            assert (len(plans) == 2 and plans[0][1] == 2 and plans[1] == ((8, 8, 1), 1)), \
                f"{m}x{n}x{k}: {plans}"
        else:
            assert plans == expected, f"{m}x{n}x{k}: {plans}"


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_transposed_plans(dtype):
    """The transposed tiles write the whole product, TMA storing their C rows or not."""
    assert_plans_match_reference(TRANSPOSED_SHAPES, dtype, "row", "col")


@needs_sm90
@needs_132_sms
def test_transposed_plans_take_their_grids():
    """x @ w.t() with few tokens against many weight rows runs transposed (132 SMs)."""
    for (m, n, k), (tile, grid, cluster) in TRANSPOSED_SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        name = assert_one_launch(lambda: mmv.matmul(x, w.t(), ALGORITHM), tile, grid, cluster,
                                 f"{m}x{n}x{k}")
        assert ", true>" in name, name


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, TF32])
@pytest.mark.parametrize("activation", ["none", "relu", "silu"])
def test_split_k_with_linear_epilogue(dtype, activation):
    """The bias and relu are applied to the sums as they are stored: by the splits, the split
    tails, the transposed tiles (16 bits) and the 128 x 192 and 128 x 64 ones (silu in a pass
    after the kernel)."""
    torch.manual_seed(0)
    shapes = TAIL_SHAPES + TRANSPOSED_SHAPES + BETWEEN_SHAPES
    for m, n, k in SPLIT_SHAPES + [shape for shape, _ in shapes]:
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        w = torch.randn(n, k, device="cuda", dtype=dtype)
        bias = torch.randn(n, device="cuda", dtype=dtype)
        out = mmv.linear(x, w, bias, activation, ALGORITHM)
        y = x.double() @ w.double().t() + bias.double()
        ref = {"none": y, "relu": torch.relu(y), "silu": torch.nn.functional.silu(y)}[activation]
        error = ((out.double() - ref).norm() / ref.norm()).item()
        assert error < 1e-2, f"{m}x{n}x{k} {activation}: relative error {error:.2e}"


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, TF32])
def test_split_k_is_deterministic_and_graph_capturable(dtype):
    """The splits are added in the same order on every run, so repeated runs give the same bits;
    the cluster launch also runs inside a CUDA graph. (float32: A row-major, which tf32 wgmma
    reads, B as it is (the product runs transposed) and as w.t(), where TMA can address A.)"""
    torch.manual_seed(0)
    shapes = SPLIT_SHAPES + [shape for shape, _ in TAIL_SHAPES + BETWEEN_SHAPES]
    inputs = [(torch.randn(m, k, device="cuda", dtype=dtype),
               torch.randn(k, n, device="cuda", dtype=dtype)) for m, n, k in shapes]
    if dtype == torch.float32:
        inputs = [pair for a, b in inputs if a.shape[1] % 4 == 0
                  for pair in ((a, b), (a, b.t().contiguous().t()))]
    inputs += [(torch.randn(m, k, device="cuda", dtype=dtype),
                torch.randn(n, k, device="cuda", dtype=dtype).t())
               for (m, n, k), _ in TRANSPOSED_SHAPES]  # the nn.Linear layout: transposed tiles
    expected = [mmv.matmul(a, b, ALGORITHM) for a, b in inputs]
    for (a, b), first in zip(inputs, expected):
        assert torch.equal(mmv.matmul(a, b, ALGORITHM), first)
    graph, captured = capture_graph(lambda: [mmv.matmul(a, b, ALGORITHM) for a, b in inputs])
    for out in captured:
        out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for out, first in zip(captured, expected):
        assert torch.equal(out, first)


@needs_sm90
@pytest.mark.parametrize("dtype", DTYPES)
def test_nn_linear_shapes(dtype):
    """x @ w.t() for an nn.Linear weight w [N, K], the layout models use."""
    torch.manual_seed(0)
    x = torch.randn(512, 4096, device="cuda").to(dtype)
    for n, k in [(4096, 4096), (1024, 4096)]:  # narrow tiles in one wave, then in K splits
        w = torch.randn(n, k, device="cuda").to(dtype)
        assert_matches_reference(x[:, :k], w.t(), ALGORITHM)


@needs_sm90
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["odd_leading_dimension", "storage_offset", "general_strides"])
def test_views_tma_cannot_address_fall_back(dtype, case):
    """Views whose rows or base TMA cannot address run on another rung (no wgmma kernel
    launched), never a fault, and match float64."""
    torch.manual_seed(0)
    if case == "odd_leading_dimension":  # rows 2 * 301 bytes apart: not a multiple of 16
        a = torch.randn(200, 301, device="cuda").to(dtype)
    elif case == "storage_offset":  # base 2 bytes past a 16-byte boundary
        a = torch.randn(200 * 320 + 1, device="cuda").to(dtype)[1:].view(200, 320)
    else:
        a = torch.randn(200, 640, device="cuda").to(dtype)[:, ::2]
    b = torch.randn(a.shape[1], 150, device="cuda").to(dtype)
    names = product_kernels(lambda: mmv.matmul(a, b, ALGORITHM))
    assert names and not any("wgmma_kernel" in name for name in names), names
    assert_matches_reference(a, b, ALGORITHM)


@needs_sm90
def test_auto_picks_wgmma_for_large_16_bit_products():
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    assert mmv.auto_choice(a, a) == ALGORITHM


@needs_sm90
@pytest.mark.tf32
def test_tf32_takes_the_split_path():
    """Outputs of few tiles split K in float32 too, counted in K steps of 32 floats: the split
    shapes' K of 4104 is 129 steps, as many as 8208 in 16 bits."""
    for m, n, k in SPLIT_SHAPES:
        x = torch.randn(m, k, device="cuda")
        w = torch.randn(n, k, device="cuda")
        grids = kernel_grids(lambda: mmv.matmul(x, w.t(), ALGORITHM))
        assert len(grids) == 1 and 1 < grids[0][1] <= 8, f"{m}x{n}x{k}: grids {grids}"


@needs_sm90
def test_kernels_use_tma_and_wgmma():
    """Every compiled wgmma kernel, plain or with linear's fused bias and relu, copies with TMA
    (UTMALDG) and multiplies with HGMMA, with no register spills to local memory."""
    for name, body in kernel_sass("wgmma_kernel"):
        for opcode in ("HGMMA", "UTMALDG"):
            assert re.search(rf"\b{opcode}\b", body), f"{opcode} missing from {name}"
        assert not re.search(r"\b(LDL|STL)\b", body), f"local memory traffic in {name}"
