"""The skinny rungs (LLM decode): `skinny` (mma.sync, sm_80+, M <= 64), on sm_90 builds
`skinny_tma` (TMA + wgmma, M <= 128), and `skinny_gemv` (CUDA cores, sm_80+, M <= 16). Correctness
over sizes that cross their weight-row blocks, token tiles and k steps, the four layouts,
misaligned views, the split-K pass, determinism, CUDA graphs, their refusal of more rows than they
take, the weight layouts read in place, the SASS of the Hopper one and the `auto` choice."""
from __future__ import annotations

import contextlib
import math
import re

import pytest
import torch

import torch_mm_variants as mmv
from conftest import (assert_matches_reference, capture_graph, check_bmm, gemv_short_k,
                      gemv_takes, gpu_available, gpu_capability, kernel_sass, kernels_of_rung,
                      launched_kernels, product_kernels, random_matrix, relative_error,
                      rung10_blocks_fit_at_once, short_rows_fragments, skinny_short_rows,
                      sm90a_available, sm_count, tf32_allowed, tolerance_for)

pytestmark = pytest.mark.skipif(gpu_capability() < (8, 0),
                                reason="needs a CUDA build and an sm_80+ GPU")

DTYPE_BY_C10_NAME = {"Float": torch.float32, "Half": torch.float16, "BFloat16": torch.bfloat16}
LAYOUTS = [("row", "col"), ("row", "row"), ("col", "col"), ("col", "row")]  # first: x @ w.t()


def skinny_algorithms() -> list[str]:
    """Every skinny rung this build lists for this GPU, in ladder order."""
    if not gpu_available():
        return []
    return [name for name in mmv.algorithms("cuda") if name.startswith("skinny")]


def dtypes_of(algorithm: str) -> list[torch.dtype]:
    return [DTYPE_BY_C10_NAME[t] for t in mmv._C.algorithm_dtypes("cuda", algorithm)]


def algorithm_dtypes() -> list:
    return [pytest.param(name, dtype, id=f"{name}-{dtype}".replace("torch.", ""))
            for name in skinny_algorithms() for dtype in dtypes_of(name)]


ALGORITHM_DTYPES = algorithm_dtypes()


def test_listed_where_they_run():
    """skinny and skinny_gemv on every sm_80+ GPU, skinny_tma only where sm_90a code runs."""
    expected = ["skinny"] + (["skinny_tma"] if sm90a_available() else []) + ["skinny_gemv"]
    assert skinny_algorithms() == expected


def sizes() -> list[tuple[int, int, int]]:
    """(M, N, K) varying one dimension at a time, plus a few corners. Small N splits K over
    blocks; N >= 2112 (skinny) or 17000 (skinny_tma) gives every SM blocks without a split."""
    # Each side of rung 10's token-tile counts and rung 11's token tiles (rung 10 refuses M > 64),
    # and of rung 12's token counts (1, 2, 4, 8, then groups of 8; it refuses M > 16).
    ms = [1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 24, 25, 33, 48, 49, 64, 65, 100, 128]
    ns, ks = [1, 7, 33, 65, 129, 1000], [1, 3, 7, 129, 1000, 4097]
    return ([(m, 129, 1000) for m in ms] + [(m, n, 1000) for m in (3, 16) for n in ns]
            + [(7, 129, k) for k in ks]
            + [(1, 1, 1), (64, 1000, 4097), (3, 4103, 1000), (64, 2500, 129), (5, 17000, 1000),
               (1, 300, 70001), (8, 33, 20000)])


def weight_view(n, k, dtype, offset=0, pad=0):
    """b = w.t() for a weight w [n, k] that starts `offset` elements into its storage, rows `pad`
    elements apart beyond k."""
    storage = torch.randn(n, k + pad + offset, device="cuda").to(dtype)
    return storage[:, offset:offset + k].t()


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"{l[0]}-{l[1]}")
@pytest.mark.parametrize("algorithm, dtype", ALGORITHM_DTYPES)
def test_sizes_and_layouts(algorithm, dtype, layout):
    torch.manual_seed(0)
    for m, n, k in sizes():
        a = random_matrix(m, k, dtype, "cuda", layout[0])
        b = random_matrix(k, n, dtype, "cuda", layout[1])
        assert_matches_reference(a, b, algorithm)


@pytest.mark.parametrize("algorithm, dtype", ALGORITHM_DTYPES)
def test_misaligned_and_strided_views(algorithm, dtype):
    torch.manual_seed(0)
    for m, n, k in [(1, 300, 1000), (16, 129, 4097), (33, 2200, 77), (100, 129, 4097)]:
        x_storage = torch.randn(m * (k + 5) + 3, device="cuda").to(dtype)
        misaligned_x = x_storage[1:1 + m * (k + 5)].view(m, k + 5)[:, 2:2 + k]
        for a in [random_matrix(m, k, dtype, "cuda"), misaligned_x,
                  random_matrix(m, k, dtype, "cuda", "sliced")]:
            for b in [weight_view(n, k, dtype, offset=1), weight_view(n, k, dtype, pad=3),
                      weight_view(n, k, dtype, offset=8, pad=8),
                      random_matrix(k, n, dtype, "cuda", "sliced"),
                      random_matrix(k, 2 * n, dtype, "cuda")[:, ::2]]:
                assert_matches_reference(a, b, algorithm)


@pytest.mark.parametrize("algorithm, dtype", ALGORITHM_DTYPES)
def test_every_split_count(algorithm, dtype):
    """Two weight-row blocks and K = 512 s - 1: skinny_tma splits K s ways (128 k per stage, at
    least 4 stages per split), one thread-block cluster of s blocks for each row block, for every
    cluster size up to 8; rung 10 splits as its own rule says."""
    torch.manual_seed(0)
    for splits in range(1, 9):
        k = 512 * splits - 1
        a = random_matrix(rows_for(algorithm, 33), k, dtype, "cuda")
        assert_matches_reference(a, weight_view(65, k, dtype), algorithm)


MAX_ROWS = {"skinny": 64, "skinny_tma": 128, "skinny_gemv": 16}


@pytest.mark.parametrize("algorithm, m", [(name, m) for name in skinny_algorithms()
                                          if torch.float32 in dtypes_of(name)
                                          for m in [1, 8, 17, 40, 64, 128]
                                          if m <= MAX_ROWS[name]])
def test_float32_keeps_float32_accuracy_over_long_k(algorithm, m):
    """float32 runs in 3xTF32 on the tensor cores, whose accumulators lose bits over long chains
    of MMAs: the product must stay within float32's tolerance at the K of large nn.Linear layers
    (K = 14336 and more, with a tail), one block row and many, split K or not."""
    torch.manual_seed(0)
    for n, k in [(4096, 14336), (129, 28676), (129, 28675)]:
        a = random_matrix(m, k, torch.float32, "cuda")
        assert_matches_reference(a, weight_view(n, k, torch.float32), algorithm)


@pytest.mark.parametrize("algorithm, dtype", ALGORITHM_DTYPES)
def test_deterministic(algorithm, dtype):
    torch.manual_seed(0)
    for m, n, k in [(16, 129, 4097), (7, 4103, 1000), (64, 300, 2000)]:  # split K, then not
        m = rows_for(algorithm, m)
        a, b = random_matrix(m, k, dtype, "cuda"), weight_view(n, k, dtype)
        first = mmv.matmul(a, b, algorithm)
        assert torch.equal(first, mmv.matmul(a, b, algorithm))


@pytest.mark.parametrize("algorithm", skinny_algorithms())
def test_cuda_graph_capture(algorithm):
    torch.manual_seed(0)
    a = random_matrix(8, 4096, torch.bfloat16, "cuda")
    b_split = weight_view(256, 4096, torch.bfloat16)  # few blocks: K split, a second pass
    b_whole = weight_view(20000, 4096, torch.bfloat16)

    def run_both():
        return [mmv.matmul(a, b, algorithm) for b in (b_split, b_whole)]

    expected = run_both()  # also the warm-up outside the capture
    graph, outs = capture_graph(run_both)
    a.copy_(random_matrix(8, 4096, torch.bfloat16, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    for out, b, before in zip(outs, (b_split, b_whole), expected):
        assert torch.equal(out, mmv.matmul(a, b, algorithm)) and not torch.equal(out, before)


def product_or_batch(x: torch.Tensor, w: torch.Tensor):
    """x [entries, M, K] and nn.Linear weights w [entries, N, K] as the op's a and b: a batch
    where there are several entries, else the single product x[0] @ w[0].t()."""
    return (x, w.mT) if x.shape[0] > 1 else (x[0], w[0].t())


def check_against_float64(a: torch.Tensor, b: torch.Tensor, algorithm: str) -> None:
    """a @ b on `algorithm` against float64: as a batch where a is 3-D, else one product."""
    if a.dim() == 3:
        check_bmm(a, b, algorithm)
    else:
        assert_matches_reference(a, b, algorithm)


def gemv_n_major_warps(m: int, lines: int, sms: int) -> int:
    """The warps of skinny_gemv's blocks on a row-major weight of `lines` 128-byte lines of
    columns (a batch's entries' all together): at 1-2 tokens with at least half as many lines as SMs, 32 where a block per line fits
    on the SMs at once (one an SM), 16 where two an SM do, else 8."""
    if m > 2 or 2 * lines < sms:
        return 8
    if lines <= sms:
        return 32
    return 16 if lines <= 2 * sms else 8


def rows_for(algorithm: str, m: int) -> int:
    """m, or the most rows `algorithm` takes where that is fewer."""
    return min(m, MAX_ROWS[algorithm])


@pytest.mark.parametrize("algorithm", skinny_algorithms())
def test_more_rows_than_the_rung_takes_are_refused(algorithm):
    rows = MAX_ROWS[algorithm]
    a = torch.randn(rows + 1, 32, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(32, 16, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError,
                       match=rf"algorithm '{algorithm}' cannot take these inputs: .*M <= {rows}"):
        mmv.matmul(a, b, algorithm)
    assert MAX_ROWS.get(mmv.auto_choice(a, b), rows + 1) > rows  # never a rung that refuses
    assert mmv.matmul(a[:rows], b, algorithm).shape == (rows, 16)


@pytest.mark.parametrize("algorithm", skinny_algorithms())
def test_training_through_a_skinny_linear(algorithm):
    """A decode-sized Linear run by a skinny rung trains: the gradient product it refuses (the
    weight's has out_features rows) runs on `auto`, the input's on the rung itself."""
    torch.manual_seed(0)
    layer = mmv.Linear(256, 192, algorithm=algorithm, device="cuda", dtype=torch.bfloat16)
    reference = torch.nn.Linear(256, 192, device="cuda", dtype=torch.float64)
    with torch.no_grad():
        reference.weight.copy_(layer.weight)
        reference.bias.copy_(layer.bias)
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x64 = x.detach().double().requires_grad_()
    grad = torch.randn(8, 192, device="cuda", dtype=torch.bfloat16)
    out = layer(x)
    assert kernels_of_rung(product_kernels(lambda: layer(x)), algorithm)
    backward = product_kernels(lambda: out.backward(grad))
    on_rung = kernels_of_rung(backward, algorithm)
    assert len(on_rung) == 1 and len(backward) > 1, backward  # the weight's on another rung
    reference(x64).backward(grad.double())
    for ours, theirs in [(x.grad, x64.grad), (layer.weight.grad, reference.weight.grad),
                         (layer.bias.grad, reference.bias.grad)]:
        assert (ours.double() - theirs).norm() / theirs.norm() < 1e-2


@pytest.mark.skipif(not sm90a_available(), reason="needs sm_90 and sm_90a")
def test_tma_kernels_use_tma_and_wgmma():
    """skinny_tma streams the weight with TMA (UTMALDG), multiplies with HGMMA and keeps its
    few accumulators in registers (no local memory)."""
    for name, body in kernel_sass("skinny_tma_kernel"):
        for opcode in ("HGMMA", "UTMALDG"):
            assert re.search(rf"\b{opcode}\b", body), f"{opcode} missing from {name}"
        assert not re.search(r"\b(LDL|STL)\b", body), f"local memory traffic in {name}"


def row_major_weight(k: int, n: int, dtype: torch.dtype, offset: int = 0, pad: int = 0):
    """b = w for a weight stored row-major [k, n] (x @ w), starting `offset` elements into its
    storage, rows `pad` elements apart beyond n."""
    storage = torch.randn(k, n + pad + offset, device="cuda").to(dtype)
    return storage[:, offset:offset + n]


@pytest.mark.skipif(not sm90a_available(), reason="needs sm_90 and sm_90a")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_tma_reads_a_row_major_weight_in_place(dtype):
    """x @ w with w stored row-major [K, N]: skinny_tma copies its tiles N-major straight from w,
    one launch (besides the test's output poisoning) and no copy of the weight, on sizes just off
    the 64-row blocks, the k boxes and the token tiles, split K or not, with w's rows padded and
    its base 16 bytes in. Row-major weights whose rows TMA cannot address (an odd N, or a K that
    leaves x's rows unaligned) still come out right, through copies."""
    torch.manual_seed(0)
    vec = 16 // dtype.itemsize
    for m, n, k in [(1, 64, 64), (7, 72, 136), (16, 1000, 1000), (17, 4104, 72), (33, 136, 4104),
                    (64, 2048, 2000), (5, 17000, 520), (64, 4096, 4096), (8, 4096, 14336),
                    (100, 136, 1000), (128, 4096, 4096)]:
        x = random_matrix(m, k, dtype, "cuda")
        for w in [row_major_weight(k, n, dtype), row_major_weight(k, n, dtype, vec, vec)]:
            names = [e["name"] for e in launched_kernels(lambda: mmv.matmul(x, w, "skinny_tma"))
                     if "FillFunctor" not in e["name"]]
            assert len(names) == 1 and "skinny_tma_kernel" in names[0], names
            assert re.search(r"Ring<[^<>]+>, false>", names[0]), names[0]
            assert_matches_reference(x, w, "skinny_tma")
    for m, n, k in [(9, 129, 130), (2, 1000, 63), (64, 7, 4097)]:
        assert_matches_reference(random_matrix(m, k, dtype, "cuda"), row_major_weight(k, n, dtype),
                                 "skinny_tma")


@pytest.mark.skipif(not sm90a_available(), reason="needs sm_90 and sm_90a")
@pytest.mark.parametrize("tf32", [False, True], ids=["tf32-off", "tf32-on"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [65, 128])
def test_auto_past_64_tokens(m, dtype, tf32):
    """65-128 tokens: `auto` takes skinny_tma for float32 with TF32 off, where the rungs below run
    3xTF32 in 128-row tiles that leave most SMs idle, and wgmma for 16 bits and TF32; both weight
    layouts, every product exact."""
    torch.manual_seed(0)
    x = random_matrix(m, 4096, dtype, "cuda")
    for w in [random_matrix(4096, 4096, dtype, "cuda"),
              random_matrix(4096, 4096, dtype, "cuda", "col")]:
        with tf32_allowed() if tf32 else contextlib.nullcontext():
            expected = "skinny_tma" if dtype == torch.float32 and not tf32 else "wgmma"
            assert mmv.auto_choice(x, w) == expected
            assert_matches_reference(x, w, "auto")


@pytest.mark.skipif(not sm90a_available(), reason="needs sm_90 and sm_90a")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 64, 128])
def test_auto_reads_a_row_major_weight_in_place(m, dtype):
    """Decode against a weight stored row-major [K, N] (x @ w): `auto` takes skinny_tma, which
    reads it in place, where rung 10 would first copy it K-contiguous, a copy that takes longer
    than the product itself; past 64 tokens, for float32 with TF32 off only (wgmma otherwise).
    float32 takes skinny_gemv, which reads it in place too, up to 8 tokens on 4096 columns and up
    to 2 on more."""
    torch.manual_seed(0)
    x = random_matrix(m, 4096, dtype, "cuda")
    for n in (4096, 4104):
        w = random_matrix(4096, n, dtype, "cuda")
        expected = "skinny_tma" if m <= 64 or dtype == torch.float32 else "wgmma"
        if gemv_takes(m, n, 4096, dtype, row_major=True, tma_reads_it=True):  # in place too
            expected = "skinny_gemv"
        assert mmv.auto_choice(x, w) == expected, n
        assert_matches_reference(x, w, "auto")


def short_rows_layout(m: int, k: int) -> str:
    """short_rows_kernel's template arguments for m tokens of k-element rows: dtype, chunks of 32
    k and token tiles of 8 (powers of two), the tiles of a pass keeping chunks x tiles within 16."""
    chunks = short_rows_fragments(1, k)
    tiles = min(short_rows_fragments(m, 1), 16 // chunks)
    return rf"c10::\w+, {chunks}, {tiles}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_short_rows_on_tensor_cores(dtype):
    """16-bit K-contiguous rows of at most 256 elements, 16-byte aligned: skinny runs
    short_rows_kernel (a warp owns whole rows: 1, 2, 4 or 8 chunks of 32 k, 1-8 token tiles)
    where skinny_short_rows says so, else skinny_kernel; on K just off each chunk count and off
    256, N just off a group's 16 rows and off 32 rows per SM (9-64 tokens; past 16 x vectors a
    lane in passes over the token tiles: spread over blocks on the fewest rows, half so on twice
    as many, all in each block on 8 times as many), tokens off each tile count, products and
    batches, rows aligned and one element in, against float64."""
    torch.manual_seed(0)
    rows = 32 * sm_count()
    cases = [(m, k, n, entries) for m in (1, 3, 8, 9)
             for k in (1, 7, 31, 32, 33, 64, 65, 100, 128, 129, 255, 256, 257)
             for n, entries in ((1, 1), (17, 1), (1000, 1), (65, 3))]
    cases += [(m, k, n, entries) for m in (9, 16, 17, 32, 33, 40, 64)
              for k in (32, 33, 64, 65, 128, 129, 256)
              for n, entries in ((rows, 1), (rows + 1, 1), (-(-rows // 3) + 1, 3),
                                 (2 * rows + 1, 1), (8 * rows + 1, 1))]
    for m, k, n, entries in cases:
        pitch = -(-(k + 1) // 8) * 8  # rows 16-byte aligned at offset 0
        for offset in (0, 1):
            w = torch.randn(entries, n, pitch, device="cuda").to(dtype)[..., offset:offset + k]
            a, b = product_or_batch(torch.randn(entries, m, k, device="cuda").to(dtype), w)
            names = product_kernels(lambda: mmv.matmul(a, b, "skinny"))
            short = offset == 0 and skinny_short_rows(m, n * entries, k)
            batched = str(entries > 1).lower()
            layout = short_rows_layout(m, k)  # then PASSES, SPREAD
            kernel = (rf"short_rows_kernel<{layout}, {batched}, \d, (true|false)>\(" if short
                      else rf"skinny_kernel<.*, {batched}, 1>\(")  # BATCHED, COLUMN_WARPS
            assert len(names) == 1 and re.search(kernel, names[0]), (m, k, n, entries, names)
            check_against_float64(a, b, "skinny")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_reads_a_16bit_row_major_weight_in_place(dtype):
    """x @ w with w stored row-major [K, N]: skinny reads 16-bit weights in place (fragments
    transposed in registers), no copy of the weight launched, on sizes just off the 16- and
    32-column blocks, the 32-k chunks and the token tiles, split K or not; with w's rows padded to
    16 bytes (blocks of 32 columns up to 32 tokens, also with an odd N), its base 8 bytes in
    (8-byte loads; from 33 tokens on K >= 4096 two warps side by side along N, the second one's
    columns past N at N = 136) or one element in (element by element), and an odd N. K up to
    1024 is not split (520 at 32 tokens on N = 1001 was), a long K over a few blocks is."""
    torch.manual_seed(0)
    for m, n, k in [(1, 64, 64), (7, 72, 136), (16, 1000, 1000), (17, 4104, 72), (33, 136, 4104),
                    (64, 2048, 2000), (5, 17000, 520), (8, 4096, 4096), (64, 4095, 4097),
                    (2, 3, 63), (9, 129, 130), (32, 1001, 520), (24, 40, 8200)]:
        x = random_matrix(m, k, dtype, "cuda")
        for w in [row_major_weight(k, n, dtype), row_major_weight(k, n, dtype, 4, 4),
                  row_major_weight(k, n, dtype, 1), row_major_weight(k, n, dtype, 0, -n % 8 + 8)]:
            names = [e["name"] for e in launched_kernels(lambda: mmv.matmul(x, w, "skinny"))
                     if "FillFunctor" not in e["name"]]
            products = [name for name in names if "skinny_kernel" in name]
            rows_16_bytes = w.data_ptr() % 16 == 0 and w.stride(0) % 8 == 0
            rows_8_bytes = w.data_ptr() % 8 == 0 and w.stride(0) % 4 == 0
            columns = 2 if rows_16_bytes and m <= 32 else 1  # groups of 16 a warp owns
            column_warps = 2 if rows_8_bytes and m > 32 and k >= 4096 else 1  # along N
            assert len(products) == 1 and re.search(
                rf"skinny_kernel<[^<>]+, true, {columns}, false, {column_warps}>",
                products[0]), products
            splits = [name for name in names if "sum_splits_kernel" in name]
            if k <= 1024:  # K left whole
                assert not splits, (m, n, k, names)
            elif n <= 136:  # 2-5 blocks and a long K: split
                assert splits, (m, n, k, names)
            if k % 8 == 0:  # x's rows 16-byte aligned: no copy of x either
                assert all("skinny_kernel" in name or "sum_splits_kernel" in name
                           for name in names), names
            assert_matches_reference(x, w, "skinny")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_gemv_reads_both_weight_layouts_in_place(dtype):
    """skinny_gemv reads an nn.Linear weight [N, K] (x @ w.t()) and a weight stored row-major
    [K, N] (x @ w) as they are: one product kernel of the layout's kind (then the adding pass where
    K is split over blocks), no copy; rows 16-byte aligned (vector loads) or one element in
    (element by element), on sizes just off a block's rows or 128-byte columns and its k steps,
    with row-major blocks of each warp count (gemv_n_major_warps)."""
    torch.manual_seed(0)
    sms = sm_count()
    for m, n, k in [(1, 4096, 1000), (3, 129, 4104), (8, 72, 136), (2, 1000, 72), (4, 33, 8200),
                    (1, 17000, 264), (2, 6144, 264), (1, 8000, 1000), (1, 12000, 264)]:
        x = random_matrix(m, k, dtype, "cuda")  # k % 8 == 0: rows 16-byte aligned, never copied
        lines = -(-n * x.element_size() // 128)
        n_major = "n_major_kernel"
        n_major_warps = f", {gemv_n_major_warps(m, lines, sms)}, false>("  # not batched
        for w, kinds in [(weight_view(n, k, dtype), ["k_major_kernel"]),
                         (weight_view(n, k, dtype, offset=1), ["k_major_kernel"]),
                         (row_major_weight(k, n, dtype), [n_major, n_major_warps]),
                         (row_major_weight(k, n, dtype, offset=1), [n_major, n_major_warps])]:
            names = [e["name"] for e in launched_kernels(lambda: mmv.matmul(x, w, "skinny_gemv"))
                     if "FillFunctor" not in e["name"]]
            products = [name for name in names if "sum_splits_kernel" not in name]
            assert len(products) == 1 and all(kind in products[0] for kind in kinds), names
            assert_matches_reference(x, w, "skinny_gemv")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [9, 12, 15, 16])
def test_gemv_runs_9_to_16_tokens_in_groups_of_8(m, dtype):
    """Past 8 tokens skinny_gemv launches its kernels twice, tokens 0-7 and the rest (as many
    tokens as the kernel's next power of two), each writing its own rows of out: both weight
    layouts, rows aligned or one element in, single products and batches (some with K split,
    where the adding pass follows each launch), each checked against float64."""
    torch.manual_seed(0)
    rest = 1 << (m - 9).bit_length()  # the second launch's token count
    kernel = r"(?:k_major|short_k|n_major)_kernel<[^,]+, (\d+),"
    for n, k, entries in [(129, 1000, 1), (4100, 264, 1), (72, 136, 6), (130, 1000, 3)]:
        for row_major, offset in [(False, 0), (False, 1), (True, 0), (True, 1)]:
            if row_major:
                b = torch.randn(entries, k, n + offset, device="cuda").to(dtype)[..., offset:]
            else:
                b = torch.randn(entries, n, k + offset, device="cuda").to(dtype)[..., offset:].mT
            a = random_matrix(entries * m, k, dtype, "cuda").view(entries, m, k)
            if entries == 1:
                a, b = a[0], b[0]
            names = product_kernels(lambda: mmv.matmul(a, b, "skinny_gemv"))
            tokens = [int(re.search(kernel, name).group(1)) for name in names]
            assert tokens == [8, rest], (n, k, entries, row_major, offset, names)
            check_against_float64(a, b, "skinny_gemv")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gemv_row_major_batches_count_lines_together(dtype):
    """A batch of row-major products (p @ v at decode) takes skinny_gemv's blocks of 32, 16 or 8
    warps by its entries' 128-byte lines of columns all together (gemv_n_major_warps), on counts
    just off the SMs, twice them and half them, rows 16-byte aligned or one element in; each
    checked against float64."""
    torch.manual_seed(0)
    sms = sm_count()
    line = 128 // dtype.itemsize  # columns
    cases = [(1, 4 * line, sms // 4), (2, 4 * line - 3, sms // 4 + 1), (1, line, 2 * sms + 1),
             (2, 2 * line, sms // 4 - 1), (3, 4 * line, sms // 4), (2, line + 1, sms // 2)]
    seen = set()
    for m, n, entries in cases:
        lines = -(-n // line) * entries
        warps = gemv_n_major_warps(m, lines, sms)
        seen.add(warps)
        for offset in (0, 1):
            b = torch.randn(entries, 300, n + offset, device="cuda").to(dtype)[..., offset:]
            a = torch.randn(entries, m, 300, device="cuda").to(dtype)
            names = product_kernels(lambda: mmv.matmul(a, b, "skinny_gemv"))
            kernel = rf"n_major_kernel<.*, {warps}, true>\("  # WARPS, BATCHED
            assert len(names) == 1 and re.search(kernel, names[0]), (m, n, entries, names)
            check_bmm(a, b, "skinny_gemv")
    assert seen == {8, 16, 32}, seen


def gemv_k_warps(m: int, n: int, k: int, dtype: torch.dtype, sms: int, entries: int = 1) -> int:
    """The warps of skinny_gemv's K-contiguous blocks that split each 4 weight rows' K: a power
    of two up to 8 and no more than K has steps for (a step is 32 lanes' 16-byte loads of each
    row, 3, 2, 2 or 1 of them at 1, 2, 3-4 and 5-8 tokens), the one that brings the grid's warps
    (every entry's of a batch) nearest, by ratio, to 16 an SM."""
    tokens = 1 if m == 1 else 2 if m == 2 else 4 if m <= 4 else 8
    steps = -(-k // (32 * (16 // dtype.itemsize) * max(1, 16 // (4 + tokens))))
    row_groups = -(-n // 4) * entries
    wave = 16 * sms
    k_warps = 1
    while k_warps < 8 and k_warps < steps and 2 * (row_groups * k_warps) ** 2 < wave ** 2:
        k_warps *= 2
    return k_warps


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gemv_k_warps_fill_the_sms(dtype):
    """The warps that split each row group's K in skinny_gemv's K-contiguous blocks: 1, 2, 4 and
    8 (gemv_k_warps), on products and batches just off the rows that fill the SMs at each count
    and the K of each count of steps; rows 16-byte aligned or one element in; each checked
    against float64."""
    torch.manual_seed(0)
    sms = sm_count()
    load = 32 * (16 // dtype.itemsize)  # k of a warp's 16-byte load
    rows = 4 * math.ceil(16 * sms / math.sqrt(2))  # the fewest on which one warp a group is nearest
    cases = [(1, rows, 128, 1), (1, rows - 4, 24 * load, 1), (1, rows // 2, 24 * load, 1),
             (1, rows // 2 - 4, 3 * load + 8, 1), (2, rows // 2 - 1, 16 * load, 1),
             (3, rows // 4, 6 * load + 8, 1), (4, rows // 4 - 4, 16 * load, 1),
             (1, rows // 4, 3 * load, 1), (8, rows // 8, 8 * load - 8, 1), (6, 4100, 72, 1),
             (2, 33, 4 * load + 8, 1), (1, 1024, 128, 4), (4, 1000, 200, 3), (1, 33, 64, 128),
             (8, 1000, 2000, 2)]
    assert not any(gemv_short_k(m, n * entries, k, dtype) for m, n, k, entries in cases)
    seen = set()
    for m, n, k, entries in cases:
        k_warps = gemv_k_warps(m, n, k, dtype, sms, entries)
        seen.add(k_warps)
        for offset in (0, 1):
            w = torch.randn(entries, n, k + offset, device="cuda").to(dtype)[..., offset:]
            a, b = product_or_batch(torch.randn(entries, m, k, device="cuda").to(dtype), w)
            names = [e["name"] for e in launched_kernels(lambda: mmv.matmul(a, b, "skinny_gemv"))
                     if "k_major_kernel" in e["name"]]
            flags = rf", {str(entries > 1).lower()}, {k_warps}>\("  # BATCHED, K_WARPS
            assert len(names) == 1 and re.search(flags, names[0]), (m, n, k, entries, names)
            check_against_float64(a, b, "skinny_gemv")
    assert seen == {1, 2, 4, 8}, seen


def gemv_row_lanes(k: int, dtype: torch.dtype) -> int | None:
    """The lanes that share a weight row in skinny_gemv's short-K kernel (one 16-byte vector
    each: 8, 16 or 32), or None where K is more than 32 vectors and k_major_kernel runs."""
    vectors = -(-k // (16 // dtype.itemsize))
    if vectors > 32:
        return None
    return 8 if vectors <= 8 else 16 if vectors <= 16 else 32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_gemv_short_rows(dtype):
    """K of at most 32 16-byte vectors a row (q @ k^T's head size, a LoRA's rank): where
    gemv_short_k holds, 8, 16 or 32 lanes share each row in short_k_kernel, else k_major_kernel
    runs; on K just off each count of vectors and off 64 elements (the longest rows it takes at
    5-8 tokens), 1-8 tokens, rows just off 48 per SM (a batch's
    entries' together) and off a block's, 16-byte aligned or one element in, products and
    batches; each checked against float64."""
    torch.manual_seed(0)
    vec = 16 // dtype.itemsize
    ks = sorted({1, 3, vec - 1, vec + 1, 8 * vec - 1, 8 * vec, 8 * vec + 1, 16 * vec, 16 * vec + 3,
                 32 * vec - 1, 32 * vec, 63, 64, 65})
    rows = 48 * sm_count()  # the fewest short_k_kernel takes
    cases = [(1, rows, 1), (2, rows + 193, 1), (3, -(-rows // 7), 7), (4, 129, -(-rows // 129)),
             (2, rows - 1, 1), (5, rows, 1), (1, 193, 1), (8, -(-rows // 3), 3), (7, rows - 1, 1)]
    seen = set()
    for k in ks:
        lanes = gemv_row_lanes(k, dtype)
        for m, n, entries in cases:
            short = gemv_short_k(m, n * entries, k, dtype)
            seen.add(lanes if short else "k_major")
            for offset in (0, 1):
                w = torch.randn(entries, n, k + offset, device="cuda").to(dtype)[..., offset:]
                a, b = product_or_batch(torch.randn(entries, m, k, device="cuda").to(dtype), w)
                names = product_kernels(lambda: mmv.matmul(a, b, "skinny_gemv"))
                batched = str(entries > 1).lower()
                kernel = rf"short_k_kernel<.*, {batched}, {lanes}>\(" if short else (
                    rf"k_major_kernel<.*, {batched}, \d+>\(")
                assert len(names) == 1 and re.search(kernel, names[0]), (m, n, k, entries, names)
                check_against_float64(a, b, "skinny_gemv")
    assert seen == {8, 16, 32, "k_major"}, seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [1, 8, 16, 64])
def test_auto_and_a_row_major_weight_tma_cannot_read(m, dtype):
    """A weight stored row-major [K, N] whose base lies one element into a 16-byte line, so that
    TMA cannot read it in place: 16-bit ones go to skinny, which reads them as they are; float32
    ones, which skinny would first copy K-contiguous, go, once the copy takes longer than the
    product, to tensor_core (through wgmma's refusal on sm_90a), and stay on a skinny rung below
    that size; up to 16 tokens float32 ones go to skinny_gemv, which reads them in place."""
    torch.manual_seed(0)
    for n, k in [(4096, 4096), (1024, 4096), (136, 1000), (1024, 1024)]:
        x = random_matrix(m, k, dtype, "cuda")
        w = row_major_weight(k, n, dtype, offset=1)
        if gemv_takes(m, n, k, dtype, row_major=True):  # it reads these in place too
            assert mmv.auto_choice(x, w) == "skinny_gemv"
        elif dtype != torch.float32:
            assert mmv.auto_choice(x, w) == "skinny"
        elif n * k >= 1024 * 4096:
            assert mmv.auto_choice(x, w) == "tensor_core"
        else:
            assert mmv.auto_choice(x, w).startswith("skinny")
        assert_matches_reference(x, w, "auto")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [9, 32, 33, 64])
def test_auto_and_a_large_16bit_row_major_weight_rung11_does_not_take(m, dtype):
    """A 16-bit weight stored row-major [K, N] that skinny_tma does not take (no sm_90a; here,
    rows 16 bytes apart and aligned but overlapping, which it leaves alone), so skinny reads it in
    place: from 33 tokens on weights of more than 4096 x 4096 elements `auto` passes it on to rung 8
    (tensor_core, or wgmma on sm_90a, which runs rung 8 on it), whose 16-byte loads read its rows
    as they are. Fewer tokens, 4096 x 4096, and rows rung 8 could only load element by element
    (the base one element in) stay on skinny."""
    torch.manual_seed(0)
    rung8 = "wgmma" if sm90a_available() else "tensor_core"
    for k, n, offset, expected in [(4096, 4608, 0, rung8 if m > 32 else "skinny"),
                                   (4096, 4096, 0, "skinny"), (4096, 4608, 1, "skinny")]:
        x = random_matrix(m, k, dtype, "cuda")
        pitch = n - 64  # a multiple of 8 elements, below n: the rows overlap
        storage = torch.randn(k * pitch + n + offset, device="cuda").to(dtype)
        w = storage.as_strided((k, n), (pitch, 1), offset)
        assert mmv.auto_choice(x, w) == expected, (k, n, offset)
        assert_matches_reference(x, w, "auto")


def expected_auto_choice(m: int, n: int, k: int, dtype: torch.dtype) -> str:
    """The highest skinny rung for the dtype, except that skinny_tma defers to skinny where that
    one measured faster: in 16 bits on weights under 64 MiB, up to 8 tokens, and at 16 while its
    16-row blocks fit on the GPU at once (two per SM), but not where skinny_tma's blocks reach
    more than half the SMs and skinny splits K or runs 9-16 tokens, or up to 8 tokens they take
    one place on every SM but at most an eighth; in float32 up to 8 tokens,
    and at 16 on weights of up to 4096 x 4096; and at every token count on small weights (up to
    256 x 256 elements in 16 bits; in float32 up to 512 x 512, or up to 1024 x 4096 with at most
    1024 rows); in 16 bits, short rows at 9-64 tokens that skinny's short-rows kernel takes
    (skinny_short_rows) where chunks x token tiles are at most 8 or k <= 64; and at 17-64
    tokens rows of k <= 128 while its 16-row blocks fit at once. Above them skinny_gemv, where
    gemv_takes says so."""
    names = [name for name in skinny_algorithms() if dtype in dtypes_of(name)]
    if "skinny_gemv" in names and gemv_takes(m, n, k, dtype):
        return "skinny_gemv"
    highest = [name for name in names if name != "skinny_gemv"][-1]
    if highest != "skinny_tma":
        return highest
    if dtype == torch.float32:
        if n * k <= 512 * 512 or (n <= 1024 and n * k <= 1024 * 4096):
            return "skinny"
    elif n * k <= 256 * 256:
        return "skinny"
    if dtype == torch.float32:
        return "skinny" if m <= 8 or (m <= 16 and n * k <= 4096 * 4096) else highest
    if m > 8 and skinny_short_rows(m, n, k):
        fragments = short_rows_fragments(m, k)
        if fragments <= 8 or k <= 64:
            return "skinny"
    if n * k * dtype.itemsize >= 64 * 2**20:
        return highest
    one_wave = rung10_blocks_fit_at_once(n)
    if one_wave and k <= 128:
        return "skinny"
    blocks, sms = -(-n // 64), sm_count()  # skinny_tma's 64-row blocks
    # Those blocks in up to 8 K splits reach more than half the SMs, and skinny splits K (its
    # 16-row blocks are fewer than the SMs) or runs 9-16 tokens.
    if 2 * blocks * 8 > sms and (m > 8 or -(-n // 16) < sms):
        return highest
    # Up to 8 tokens they take one place on every SM, or all but an eighth.
    if m <= 8 and blocks <= sms and 8 * (sms - blocks) <= sms:
        return highest
    return "skinny" if m <= 8 or (one_wave and m <= 16) else highest


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (2, 4096, 4096), (4, 14336, 4096),
                                     (8, 4096, 4096), (8, 14336, 4096),
                                     (1, 4096, 14336), (16, 4096, 4096), (16, 4096, 14336),
                                     (16, 14336, 4096), (32, 4096, 4096), (32, 14336, 4096),
                                     (33, 4096, 4096), (64, 4096, 4096), (64, 64, 64),
                                     (64, 256, 256), (48, 512, 512), (64, 1024, 1024),
                                     (1, 64, 1024), (40, 1024, 64), (32, 1024, 4096),
                                     (48, 2048, 2048), (1, 1024, 4096), (2, 2048, 14336),
                                     (2, 1024, 1024), (1, 1024, 1000), (4, 1024, 4096),
                                     (2, 500, 4096), (1, 3072, 4096), (1, 4096, 128),
                                     (1, 16384, 128), (4, 14336, 200), (8, 16384, 128),
                                     (3, 8192, 256), (1, 8192, 264), (8, 16384, 64),
                                     (6, 16384, 64), (8, 16384, 65), (16, 16384, 128),
                                     (17, 16384, 128), (32, 14336, 64), (64, 16384, 32),
                                     (16, 4096, 128), (24, 16384, 128), (48, 14336, 64),
                                     (16, 16384, 256), (64, 6400, 64), (32, 4096, 64),
                                     (48, 2048, 128), (64, 4096, 32), (24, 6144, 64),
                                     (40, 4096, 129), (17, 4224, 128), (17, 4225, 128),
                                     (33, 4500, 96), (64, 8448, 128), (64, 8449, 128),
                                     (40, 10240, 128), (32, 6144, 128), (40, 6144, 129),
                                     (8, 2048, 2048), (8, 3072, 3072), (12, 3072, 3072),
                                     (8, 600, 4096), (16, 512, 4096), (12, 8192, 2048),
                                     (8, 8192, 2048), (1, 7680, 4096), (4, 8448, 1024),
                                     (8, 7360, 4096), (2, 7361, 4096), (8, 8449, 1024)])
def test_auto_picks_skinny_for_decode(m, n, k, dtype):
    x = random_matrix(m, k, dtype, "cuda")
    w = random_matrix(n, k, dtype, "cuda")
    assert mmv.auto_choice(x, w.t()) == expected_auto_choice(m, n, k, dtype)
    assert_matches_reference(x, w.t(), "auto")


def skinny_tma_launches(x, w):
    """The skinny_tma kernels that x @ w launches (the output's poisoning fill left out)."""
    return [e for e in launched_kernels(lambda: mmv.matmul(x, w, "skinny_tma"))
            if "skinny_tma_kernel" in e["name"]]


@pytest.mark.skipif(not sm90a_available(), reason="needs sm_90 and sm_90a")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_tma_ring_sizes(dtype):
    """skinny_tma runs two blocks per SM (96 KB rings) or one (192 KB) where that leaves the
    busiest SM less of the weight to stream. Both are exact, on sizes just off the 64-row blocks
    and 64-k boxes (K stays a multiple of 8: TMA needs 16-byte rows, or rung 10 runs instead); on
    a GPU of 132 SMs, 64 16-bit tokens on 4096 x 4096 and 4096 x 14336 weights take the deep
    ring and 14336 x 4096 the shared one."""
    torch.manual_seed(0)
    rings = {}
    for m, n, k in [(64, 4096, 4096), (64, 4096, 14336), (64, 14336, 4096), (61, 4033, 4104),
                    (33, 4095, 8200), (64, 4100, 3992), (128, 4096, 4096), (97, 14336, 4104)]:
        x, w = random_matrix(m, k, dtype, "cuda"), random_matrix(n, k, dtype, "cuda")
        names = [e["name"] for e in skinny_tma_launches(x, w.t())]
        assert len(names) == 1, names
        rings[(m, n, k)] = int(re.search(r"Ring<[^,<>]+, \d+, (\d+)>", names[0]).group(1))
        assert_matches_reference(x, w.t(), "skinny_tma")
    assert set(rings.values()) <= {96, 192}
    if dtype == torch.float32:  # 128 float32 tokens fit three stages in the deep ring only
        assert rings[(128, 4096, 4096)] == rings[(97, 14336, 4104)] == 192, rings
    if dtype != torch.float32 and torch.cuda.get_device_properties(0).multi_processor_count == 132:
        assert rings[(64, 4096, 4096)] == rings[(64, 4096, 14336)] == 192, rings
        assert rings[(64, 14336, 4096)] == 96, rings


# skinny_tma's short-K ring by its token columns: two stages of (64 + tokens) x 128 bytes, in KB.
SHORT_RING_KB = {8: 18, 16: 20, 32: 24, 64: 32, 128: 48}


@pytest.mark.skipif(not sm90a_available(), reason="needs sm_90 and sm_90a")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_tma_short_k_ring(dtype):
    """bmm batches of 16-bit K-contiguous rows of at most 256 elements (q @ k^T's keys) run
    skinny_tma's ring of two one-box stages, (64 + tokens) x 128 bytes each (18, 20, 24, 32 and
    48 KB for 8-128 token columns), so that more blocks share an SM; single products, longer
    rows and row-major weights keep the 96 or 192 KB rings. Exact on sizes just off the 64-row
    blocks, the 64-k boxes and the token columns, against float64."""
    torch.manual_seed(0)
    for m, n, k, entries in [(1, 65, 8, 2), (9, 1000, 64, 3), (17, 63, 120, 3), (33, 4097, 128, 2),
                             (64, 1000, 136, 4), (65, 129, 256, 2), (100, 300, 248, 2),
                             (5, 777, 192, 5), (64, 1000, 264, 2), (33, 4097, 128, 1),
                             (9, 1000, 64, 1)]:
        tokens = next(t for t in SHORT_RING_KB if t >= m)
        x = torch.randn(entries, m, k, device="cuda").to(dtype)
        w = torch.randn(entries, n, k, device="cuda").to(dtype)
        a, b = product_or_batch(x, w)
        names = [e["name"] for e in skinny_tma_launches(a, b)]
        assert len(names) == 1, (m, n, k, entries, names)
        ring = re.search(r"Ring<[^,<>]+, (\d+), (\d+)>", names[0])
        assert int(ring.group(1)) == tokens, names[0]
        kb = int(ring.group(2))
        short = entries > 1 and k <= 256
        expected = [SHORT_RING_KB[tokens]] if short else [96, 192]
        assert kb in expected, (m, n, k, entries, names[0])
        check_against_float64(a, b, "skinny_tma")
    x = random_matrix(33, 128, dtype, "cuda")
    v = random_matrix(128, 1000, dtype, "cuda")  # row-major [K, N]: the N-major rings
    names = [e["name"] for e in skinny_tma_launches(x, v)]
    assert len(names) == 1 and re.search(r"Ring<[^,<>]+, 64, (96|192)>, false>", names[0]), names
    assert_matches_reference(x, v, "skinny_tma")


def chain_of(x0, weights, algorithm):
    """A chain of products where each call reads the previous call's output: x0 @ w0.mT, that
    @ w1.mT, and on (weights [N, K], or batches of them); the chain's run() gives x0 and every
    output."""
    def run():
        outs = [x0]
        for w in weights:
            outs.append(mmv.matmul(outs[-1], w.mT, algorithm))
        return outs
    return run


def assert_chain_matches_float64(outs, weights):
    """Every step of a chain (chain_of) matches the float64 product of its own input, within the
    dtype's tolerance (tolerance_for)."""
    for step, (x, w, y) in enumerate(zip(outs, weights, outs[1:])):
        error = relative_error(y, x.double() @ w.double().mT)
        tolerance = tolerance_for(y.dtype, y.device)
        assert error <= tolerance, f"step {step}: relative error {error:.3e} > {tolerance:.1e}"


def assert_chain_replays(chain, x0, weights):
    """A CUDA graph of the chain, replayed after x0 takes new random values, matches float64 at
    every step."""
    graph, outs = capture_graph(chain)
    x0.copy_(torch.randn_like(x0))
    graph.replay()
    torch.cuda.synchronize()
    assert_chain_matches_float64(outs, weights)


@pytest.mark.parametrize("algorithm, dtype", [
    param for param in ALGORITHM_DTYPES if param.values[1] != torch.float16])
@pytest.mark.parametrize("m", [16, 64])
def test_chain_of_dependent_calls(algorithm, dtype, m):
    """Launches that start while the kernel before them finishes (programmatic dependent launch:
    skinny_tma's split launches and its 16-bit unsplit ones whose blocks fill the SMs evenly,
    skinny's 16-bit ones from 9 tokens on sm_90a) wait for it before reading x; so does skinny's
    pass that adds K splits, started early on sm_90a. Here each call reads the previous call's
    output, eagerly and replayed from a CUDA graph, and every step matches the float64 product of
    its own input. The weights of 1024 rows leave few blocks, so their K is split (skinny_tma adds
    its splits inside the cluster; skinny in that pass, whose output the next call reads), on
    GPUs with more SMs than skinny's 64 blocks of 16 rows; skinny_tma's 128 blocks of the
    8192-row weight fill one place on each of 132 SMs but 4."""
    torch.manual_seed(0)
    m = rows_for(algorithm, m)
    shapes = [(4096, 4096), (1024, 4096), (4096, 1024), (1024, 4096), (4096, 1024),
              (8192, 4096), (4096, 8192)]
    weights = [random_matrix(n, k, dtype, "cuda") * 0.02 for n, k in shapes]
    x0 = random_matrix(m, 4096, dtype, "cuda")
    chain = chain_of(x0, weights, algorithm)
    assert_chain_matches_float64(chain(), weights)  # also the warm-up outside the capture
    if algorithm == "skinny":
        sms = sm_count()
        names = [e["name"] for e in launched_kernels(chain)]
        splits_added = 2 if sms > 1024 // 16 else 0
        assert sum("sum_splits_kernel" in name for name in names) == splits_added, names
    assert_chain_replays(chain, x0, weights)


@pytest.mark.skipif(not gpu_available() or "skinny_tma" not in mmv.algorithms("cuda"),
                    reason="needs a GPU that lists skinny_tma")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("m, head", [(8, 64), (24, 64), (32, 128), (64, 64)])
def test_chain_of_dependent_batches(dtype, m, head):
    """skinny_tma's 16-bit batches of short K-contiguous entries (q @ k^T over heads of 64 up to
    32 tokens, of 128 at 17-32) start while the launch before them finishes, and wait for it
    before reading x (at 64 tokens they do not start early). Here each call of a chain of
    [32, m, head] @ [32, head, head] batches reads the previous call's output, eagerly and
    replayed from a CUDA graph, and every step matches the float64 product of its own input."""
    torch.manual_seed(0)
    keys = [torch.randn(32, head, head, device="cuda", dtype=dtype) * head ** -0.5
            for _ in range(4)]
    x0 = torch.randn(32, m, head, device="cuda", dtype=dtype)
    chain = chain_of(x0, keys, "skinny_tma")
    assert_chain_matches_float64(chain(), keys)  # also the warm-up outside the capture
    tokens = next(t for t in SHORT_RING_KB if t >= m)
    ring = rf"Ring<[^,<>]+, {tokens}, {SHORT_RING_KB[tokens]}>"
    names = [e["name"] for e in launched_kernels(chain) if "skinny_tma_kernel" in e["name"]]
    assert len(names) == len(keys) and all(re.search(ring, n) for n in names), names
    assert_chain_replays(chain, x0, keys)


def decode_weight(n, k, dtype, layout):
    """A weight for x @ w on the GPU: nn.Linear's w [N, K] read K-contiguous (w.t()), or one
    stored row-major [K, N] with its rows padded to 16 bytes, as TMA addresses them."""
    return (random_matrix(n, k, dtype, "cuda").t() if layout == "k-contiguous"
            else random_matrix(k, n, dtype, "cuda", "padded-row"))


@pytest.mark.skipif(not gpu_available() or "skinny_tma" not in mmv.algorithms("cuda"),
                    reason="needs a GPU that lists skinny_tma")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", ["k-contiguous", "row-major"])
def test_wide_weights_loop_over_row_blocks(dtype, layout):
    """16-bit single products whose 64-row blocks pass two per SM, up to three, run one block per
    SM in the deep ring, each looping over every sms-th row block: on N just past 2 x 64 rows
    per SM and just under 3 x 64 (the last row block partial), K off a stage and long, tokens off
    each tile count, a weight [N, K] read K-contiguous or stored row-major [K, N], against
    float64. Up to two blocks per SM and past three, a block per row block."""
    torch.manual_seed(0)
    sms = sm_count()
    for n, k, m in [(2 * 64 * sms + 1, 4104, 1), (2 * 64 * sms + 1, 72, 9),
                    (3 * 64 * sms - 37, 1000, 17), (3 * 64 * sms - 37, 4096, 64),
                    (2 * 64 * sms, 1000, 8), (2 * 64 * sms + 64, 264, 33),
                    (3 * 64 * sms + 1, 1000, 8)]:
        x = torch.randn(m, k, device="cuda").to(dtype)
        w = decode_weight(n, k, dtype, layout)
        launches = skinny_tma_launches(x, w)
        loops = 2 * sms < -(-n // 64) <= 3 * sms
        assert len(launches) == 1, (n, k, m, launches)
        grid, name = tuple(launches[0]["args"]["grid"]), launches[0]["name"]
        assert grid == ((sms, 1, 1) if loops else (-(-n // 64), 1, 1)), (n, k, m, grid)
        assert not loops or re.search(r"Ring<[^,<>]+, \d+, 192>", name), name
        assert_matches_reference(x, w, "skinny_tma")


@pytest.mark.skipif(not gpu_available() or "skinny_tma" not in mmv.algorithms("cuda"),
                    reason="needs a GPU that lists skinny_tma")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_loops_over_row_blocks_in_a_chain(dtype):
    """A loop over row blocks starts while the launch before it finishes, and the launch after it
    starts early too: in a chain where each call reads the previous call's output (a K split, the
    loop, a K split again), eagerly and replayed from a CUDA graph, every step matches the float64
    product of its own input."""
    torch.manual_seed(0)
    n = 2 * 64 * sm_count() + 8
    shapes = [(4096, 1024), (n, 4096), (1024, n)]
    weights = [random_matrix(rows, k, dtype, "cuda") * k ** -0.5 for rows, k in shapes]
    x0 = random_matrix(8, 1024, dtype, "cuda")
    chain = chain_of(x0, weights, "skinny_tma")
    assert_chain_matches_float64(chain(), weights)
    assert_chain_replays(chain, x0, weights)


@pytest.mark.skipif(not gpu_available() or "skinny_tma" not in mmv.algorithms("cuda"),
                    reason="needs a GPU that lists skinny_tma")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", ["k-contiguous", "row-major"])
def test_unsplit_row_blocks_start_at_their_own_k(dtype, layout):
    """Unsplit 16-bit products up to 16 tokens stream each row block's k from its own stage round
    to the start, so K's partial last stage comes in the middle of most blocks' streams: K off a
    stage (and of one stage), row blocks outnumbering K's stages, a grid of a block per row block
    and the loop over them, against float64."""
    torch.manual_seed(0)
    sms = sm_count()
    for n, k, m in [(2 * 64 * sms, 1000, 1), (2 * 64 * sms - 5, 4104, 16), (2 * 64 * sms, 72, 7),
                    (2 * 64 * sms + 100, 1000, 9), (4 * 64 * sms + 3, 2056, 16)]:
        x = torch.randn(m, k, device="cuda").to(dtype)
        w = decode_weight(n, k, dtype, layout)
        launches = skinny_tma_launches(x, w)
        assert len(launches) == 1 and launches[0]["args"]["grid"][1] == 1, (n, k, m, launches)
        assert_matches_reference(x, w, "skinny_tma")
