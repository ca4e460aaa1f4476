"""Batched products through mm_variants::bmm (torch_mm_variants.matmul with a 3-D a): per-entry
and shared b, every algorithm, odd sizes, gradients, opcheck and torch.compile."""
from __future__ import annotations

import re

import pytest
import torch

import torch_mm_variants as mmv
from conftest import (TOLERANCE, algorithm_dtype_params, dtype_params, assert_gradients_match,
                      capture_graph, check_bmm, devices, gemv_takes, gpu_available,
                      product_kernels, random_matrix, relative_error, rows_accepted,
                      SKINNY_RUNG_KERNELS, skinny_short_rows, sm_count, split_kernels,
                      tma_batch_takes)


@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params())
def test_batches(device, algorithm, dtype):
    torch.manual_seed(0)
    checked = 0
    for batch, m, n, k in [(3, 5, 7, 9), (2, 33, 17, 65), (4, 1, 3, 1)]:  # M * N odd: padded
        a = torch.randn(batch, m, k, device=device).to(dtype)
        b = torch.randn(batch, k, n, device=device).to(dtype)
        checked += check_bmm(a, b, algorithm)
        transposed = lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)  # noqa: E731
        checked += check_bmm(transposed(a), transposed(b), algorithm)
        checked += check_bmm(a, b[0], algorithm)  # shared b
        w = torch.randn(n, k, device=device).to(dtype)
        checked += check_bmm(a, w.t(), algorithm)  # shared nn.Linear weight, read in place
    assert checked > 0, f"{algorithm} refused every batch"


def batched_params() -> list:
    """(device, algorithm, dtype) for the rungs that run a batch in one launch, as the registry
    says (tensor_core on a GPU), and for the CPU's parallel rung, which runs it entry by entry,
    as a check of the same inputs."""
    rungs = [("cpu", "parallel")] + [(d, name) for d in devices() for name in mmv.algorithms(d)
                                     if mmv._C.algorithm_runs_batches(d, name)]
    return dtype_params(rungs)


def batch_operand(batch, rows, cols, dtype, device, layout):
    """A [batch, rows, cols] tensor whose entries are row-major ("row"), column-major ("col"),
    one element into the storage, so no entry is 16-byte aligned ("offset"), one element apart,
    so that entry 0 is aligned and the next ones are not ("gap"), or neither row- nor
    column-major ("strided"); "shared" is a 2-D [rows, cols] for every entry, "shared_col" its
    transposed view (an nn.Linear weight's w.t()), "expanded" a 2-D tensor expanded to the batch
    (batch stride 0)."""
    randn = lambda *shape: torch.randn(*shape, device=device).to(dtype)  # noqa: E731
    if layout == "row":
        return randn(batch, rows, cols)
    if layout == "col":
        return randn(batch, cols, rows).transpose(1, 2)
    if layout == "offset":
        return randn(batch * rows * cols + 1)[1:].view(batch, rows, cols)
    if layout == "gap":
        return randn(batch, rows * cols + 1)[:, :rows * cols].view(batch, rows, cols)
    if layout == "strided":
        return randn(batch, rows, 2 * cols)[:, :, ::2]
    if layout == "shared":
        return randn(rows, cols)
    if layout == "shared_col":
        return randn(cols, rows).t()
    if layout == "expanded":
        return randn(rows, cols).expand(batch, rows, cols)
    raise ValueError(layout)


# (batch, M, N, K): each of the edge sizes 1, 7, 63, 65, 127, 129 once in every position, one
# entry alone, aligned leading dimensions (for "gap"), and several tiles in both dimensions.
BATCH_SHAPES = [(3, 1, 7, 63), (3, 7, 63, 65), (3, 63, 65, 127), (3, 65, 127, 129),
                (3, 127, 129, 1), (3, 129, 1, 7), (1, 65, 63, 127), (3, 64, 64, 64),
                (2, 300, 520, 200)]
A_LAYOUTS = ["row", "col", "offset", "gap", "strided"]
B_LAYOUTS = A_LAYOUTS + ["shared", "shared_col", "expanded"]


@pytest.mark.parametrize("a_layout", A_LAYOUTS)
@pytest.mark.parametrize("device,algorithm,dtype", batched_params())
def test_batch_layouts_and_edges(device, algorithm, dtype, a_layout):
    """Every entry layout of a against every per-entry or shared b, at edge sizes."""
    torch.manual_seed(0)
    for batch, m, n, k in BATCH_SHAPES:
        for b_layout in B_LAYOUTS:
            check_bmm(batch_operand(batch, m, k, dtype, device, a_layout),
                      batch_operand(batch, k, n, dtype, device, b_layout), algorithm)


@pytest.mark.cuda
@pytest.mark.skipif(not gpu_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tf32", [False, True])
def test_auto_runs_a_batch_of_small_entries_in_one_launch(dtype, tf32):
    """Entries too small to fill the GPU run in one launch of the batched kernel, not in auto's
    choice for one entry (on Hopper wgmma, a launch per entry), and explain_auto says so."""
    if tf32 and dtype != torch.float32:
        pytest.skip("TF32 is float32's setting")
    torch.manual_seed(0)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        a = torch.randn(16, 200, 96, device="cuda", dtype=dtype)
        b = torch.randn(16, 96, 300, device="cuda", dtype=dtype)
        names = product_kernels(lambda: mmv.matmul(a, b))
        decision = mmv.explain_auto(a, b)
        one_entry = mmv.auto_choice(a[0], b[0])
        assert len(names) == 1 and decision["algorithm"] == "tensor_core", (names, decision)
        assert decision["reason"] == ("heuristic" if one_entry == "tensor_core" else "batched")
        check_bmm(a, b, "auto")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def assert_repeats_and_replays(run, a):
    """run() gives the same bits on every call, and a CUDA graph of it, replayed after a's values
    change, gives what run() gives then."""
    assert torch.equal(run(), run())
    graph, out = capture_graph(run)
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, run())


needs_skinny = pytest.mark.skipif(not gpu_available() or "skinny" not in mmv.algorithms("cuda"),
                                  reason="needs a GPU that lists skinny")


# The kernels of the skinny rungs' batched launches (rungs 10-12).
SKINNY_KERNELS = tuple(k for kernels in SKINNY_RUNG_KERNELS.values() for k in kernels)


def expected_decode_batch(a, b, row_major: bool) -> str:
    """The skinny rung `auto` runs a batch of decode products a [B, M, K] @ b on, as the rungs'
    rules say (16-byte aligned entries): skinny_gemv where gemv_takes says so, skinny_tma where
    tma_batch_takes does, else skinny."""
    entries, m, k = a.shape
    n = b.shape[-1]
    tma = "skinny_tma" in mmv.algorithms("cuda")
    if gemv_takes(m, n, k, a.dtype, row_major, tma_reads_it=tma, entries=entries):
        return "skinny_gemv"
    dtype = a.dtype
    return "skinny_tma" if tma and tma_batch_takes(m, n, k, dtype, row_major) else "skinny"


@pytest.mark.cuda
@needs_skinny
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_decode_batches_run_in_one_launch(dtype):
    """Batches of a few tokens against each entry's own matrix, as attention's products are at
    decode (q @ k^T with k read K-contiguous, p @ v with v row-major over 300 and 1100 positions),
    run in one launch of a skinny rung's batched kernel under auto (expected_decode_batch: on
    sm_90a skinny_tma's for float32 past the tokens skinny_gemv takes, for 16-bit p @ v over
    K >= 512, and for 16-bit q @ k^T over heads of 128 past 8 tokens and of 64 past 16, where
    the short-K ring's batches of 17-32 tokens start early; on other GPUs float32 p @ v at 9-16
    tokens takes skinny_gemv, a launch for each group of 8), at every count of token tiles, and
    so inside a CUDA graph. Elsewhere 16-bit q @ k^T takes skinny's short-rows kernel
    where skinny_short_rows says so."""
    torch.manual_seed(0)
    keys = [torch.randn(24, 1000, head, device="cuda", dtype=dtype) for head in (128, 64)]
    values = [torch.randn(24, rows, 128, device="cuda", dtype=dtype) for rows in (300, 1100)]
    tma = "skinny_tma" in mmv.algorithms("cuda")
    for m in [1, 2, 3, 5, 8, 9, 16, 17, 32, 33, 64]:
        products = [(torch.randn(24, m, key.shape[2], device="cuda", dtype=dtype),
                     key.transpose(1, 2), False) for key in keys] + [
            (torch.randn(24, m, v.shape[1], device="cuda", dtype=dtype), v, True) for v in values]
        for a, b, row_major in products:
            names = product_kernels(lambda: mmv.matmul(a, b))
            expected = expected_decode_batch(a, b, row_major)
            assert mmv.auto_choice(a, b) == expected, (m, b.shape, mmv.explain_auto(a, b))
            groups = expected == "skinny_gemv" and m > 8
            assert not (groups and tma), (m, b.shape)
            assert len(names) == (2 if groups else 1), (m, names)
            assert all(any(k in name for k in SKINNY_KERNELS) for name in names), (m, names)
            if expected == "skinny" and not row_major and dtype != torch.float32:
                short = skinny_short_rows(m, 24 * 1000, a.shape[2])
                assert ("short_rows_kernel" in names[0]) == short, (m, names)
            check_bmm(a, b, "auto")
    for a, b, _ in products:
        assert_repeats_and_replays(lambda: mmv.matmul(a, b), a)


@pytest.mark.cuda
@pytest.mark.skipif(not gpu_available() or "skinny_gemv" not in mmv.algorithms("cuda"),
                    reason="needs a GPU that lists skinny_gemv")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrow_expert_batches_count_their_rows_together(dtype):
    """16-bit batches of nn.Linear weights (experts) at 1-2 tokens go to skinny_gemv under auto
    where all their entries' rows together are 4-16 per SM and K >= 1024, as a single weight of
    that many rows does, though one entry alone is too narrow for it; else to skinny (or
    skinny_tma, where tma_batch_takes says so)."""
    torch.manual_seed(0)
    sms = sm_count()
    for entries, n, k, m in [(8, 128, 4096, 1), (16, 64, 1024, 2), (8, 128, 4096, 3),
                             (8, 128, 1000, 1), (4, 64, 4096, 1), (16, 256, 1024, 1),
                             (3, 200, 1032, 2), (8, 512, 512, 3), (4, 1024, 384, 5)]:
        a = torch.randn(entries, m, k, device="cuda", dtype=dtype)
        w = torch.randn(entries, n, k, device="cuda", dtype=dtype)
        rows = entries * n
        gemv = m <= 2 and k >= 1024 and 4 * sms <= rows <= 16 * sms
        if not 4 * sms <= n <= 16 * sms:  # one entry alone stays off skinny_gemv
            assert mmv.auto_choice(a[0], w[0].t()) != "skinny_gemv", (entries, n, k, m)
        choice = mmv.auto_choice(a, w.mT)
        tma = "skinny_tma" in mmv.algorithms("cuda") and tma_batch_takes(m, n, k, dtype, False)
        expected = "skinny_gemv" if gemv else ("skinny_tma" if tma else "skinny")
        assert choice == expected, (entries, n, k, m, choice)
        assert len(product_kernels(lambda: mmv.matmul(a, w.mT))) == 1, (entries, n, k, m)
        check_bmm(a, w.mT, "auto")


@pytest.mark.cuda
@needs_skinny
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_decode_batches_against_large_matrices_run_in_one_launch(dtype):
    """Entries of 8-24 tokens against matrices of 1024-4096 columns and K of 2048-4096, row-major
    (p @ v over long contexts) or nn.Linear weights (experts), 8-32 MB each, run in one launch
    under auto (expected_decode_batch): on sm_90a skinny_tma's batched kernel where it takes them,
    which a launch per entry took before; elsewhere skinny's or skinny_gemv's (float32 at 9-16
    tokens a launch for each group of 8)."""
    torch.manual_seed(0)
    for k, n, m, row_major in [(4096, 4096, 8, True), (4096, 4096, 16, True),
                               (4096, 1024, 16, True), (2048, 1024, 16, True),
                               (2048, 1024, 24, True), (4096, 4096, 16, False),
                               (4096, 2048, 9, False)]:
        a = torch.randn(2, m, k, device="cuda", dtype=dtype)
        b = (torch.randn(2, k, n, device="cuda", dtype=dtype) if row_major else
             torch.randn(2, n, k, device="cuda", dtype=dtype).mT)
        expected = expected_decode_batch(a, b, row_major)
        assert mmv.auto_choice(a, b) == expected, (k, n, m, row_major)
        launches = len(product_kernels(lambda: mmv.matmul(a, b)))
        assert launches == (2 if expected == "skinny_gemv" and m > 8 else 1), (k, n, m)
        check_bmm(a, b, "auto")


@pytest.mark.cuda
@pytest.mark.skipif(not gpu_available() or "skinny_tma" not in mmv.algorithms("cuda"),
                    reason="needs a GPU that lists skinny_tma")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_skinny_tma_runs_a_batch_in_one_launch(dtype):
    """skinny_tma takes a bmm batch in one launch of its kernel, the entries along the grid and
    along the third dimension of its TMA maps: K-contiguous and row-major entries, a weight the
    entries share, K split over clusters (two entries of a long K) or not, 1-128 tokens, an
    entry's edges past N and K (each entry's own zeros), tokens whose entries overlap (copied
    apart). It matches float64, gives the same bits on every run, and replays from a CUDA graph.
    Weights whose entries TMA cannot address (one element apart, or overlapping) go to skinny's
    batched kernel up to 64 tokens, and past them entry by entry."""
    torch.manual_seed(0)
    randn = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype)  # noqa: E731
    cases = [(randn(5, 3, 200), randn(5, 72, 200).mT),   # K-contiguous, N and K off the boxes
             (randn(4, 17, 1030), randn(4, 1030, 136)),  # row-major, p @ v
             (randn(2, 64, 16384), randn(2, 64, 16384).mT),  # K split over clusters
             (randn(3, 100, 520), randn(3, 520, 64)),  # past rung 10's 64 tokens
             (randn(6, 5, 640)[:, :, :320], randn(320, 96)),  # a shared row-major weight
             (randn(3, 128, 256), randn(1, 256, 40).expand(3, 256, 40))]
    for a, b in cases:
        run = lambda: mmv.matmul(a, b, "skinny_tma")  # noqa: E731
        names = product_kernels(run)
        assert len(names) == 1 and "skinny_tma_kernel" in names[0], (a.shape, b.shape, names)
        check_bmm(a, b, "skinny_tma")
        assert_repeats_and_replays(run, a)
    overlapping_tokens = randn(40, 200).as_strided((3, 8, 200), (800, 200, 1))  # copied apart
    keys = randn(3, 72, 200).mT
    names = product_kernels(lambda: mmv.matmul(overlapping_tokens, keys, "skinny_tma"))
    assert len(names) == 1 and "skinny_tma_kernel" in names[0], names
    check_bmm(overlapping_tokens, keys, "skinny_tma")
    gap = batch_operand(3, 520, 64, dtype, "cuda", "gap")  # entry 1 starts one element in
    overlapping = randn(3 * 520 * 64).as_strided((3, 520, 64), (100 * 64, 64, 1))
    for b in (gap, overlapping):
        for m, expected in [(40, ["skinny"]), (100, ["skinny_tma"] * 3)]:
            a = randn(3, m, 520)
            names = product_kernels(lambda: mmv.matmul(a, b, "skinny_tma"))
            kernels = ["skinny_tma" if "skinny_tma" in name else "skinny" for name in names]
            assert kernels == expected, (m, names)
            check_bmm(a, b, "skinny_tma")


@pytest.mark.cuda
@needs_skinny
@pytest.mark.parametrize("algorithm", ["skinny", "skinny_tma", "skinny_gemv"])
def test_batches_past_the_grids_limit_take_more_launches(algorithm):
    """gridDim.z takes at most 65535 entries: rungs 10-12 launch the rest after them."""
    if algorithm not in mmv.algorithms("cuda"):
        pytest.skip(f"this GPU does not list {algorithm}")
    torch.manual_seed(0)
    a = torch.randn(65537, 3, 8, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(65537, 8, 5, device="cuda", dtype=torch.bfloat16)
    assert len(product_kernels(lambda: mmv.matmul(a, b, algorithm))) == 2
    check_bmm(a, b, algorithm)


@pytest.mark.cuda
@needs_skinny
@pytest.mark.parametrize("algorithm", ["skinny", "skinny_gemv"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_batches_of_few_blocks_split_k(algorithm, dtype):
    """A batch whose entries' blocks, all together, are fewer than the SMs (p @ v at decode over a
    few sequences, 8 x [4096, 128] at one token; two entries of a long K against 64 rows each)
    splits K over them: one launch of the batched kernel, then one pass that adds every entry's
    splits in order. It matches float64, gives the same bits on every run, and replays from a
    CUDA graph. A batch whose blocks fill the SMs (64 x [512, 1024]) does not split."""
    torch.manual_seed(0)
    values = torch.randn(8, 4096, 128, device="cuda", dtype=dtype)  # row-major [K, N]
    weights = torch.randn(2, 64, 16384, device="cuda", dtype=dtype)  # nn.Linear [N, K]
    for a, b, splits in [(torch.randn(8, 1, 4096, device="cuda", dtype=dtype), values, 1),
                         (torch.randn(2, 2, 16384, device="cuda", dtype=dtype), weights.mT, 1),
                         (torch.randn(64, 1, 512, device="cuda", dtype=dtype),
                          torch.randn(64, 512, 1024, device="cuda", dtype=dtype), 0)]:
        run = lambda: mmv.matmul(a, b, algorithm)  # noqa: E731
        assert len(split_kernels(run)) == splits, (a.shape, b.shape)
        assert len(product_kernels(run)) == 1, (a.shape, b.shape)
        check_bmm(a, b, algorithm)
        assert_repeats_and_replays(run, a)


@pytest.mark.parametrize("device", devices())
def test_batch_against_a_shared_b_runs_as_one_product(device):
    """Against a shared b (2-D, or 3-D of batch stride 0), a batch whose entries' rows follow one
    another at one stride (contiguous, or one row each in any layout) is one product of all its
    rows: auto chooses for that product, as explain_auto reports, and the result is that
    product's, bit for bit. Entries stored apart choose on their first entry, as before."""
    torch.manual_seed(0)
    w = torch.randn(40, 24, device=device)
    contiguous = torch.randn(4, 5, 24, device=device)
    one_row = torch.randn(24, 6, device=device).t().unsqueeze(1)  # [6, 1, 24], rows 1 apart
    for a, rows in [(contiguous, contiguous.reshape(20, 24)), (one_row, one_row[:, 0])]:
        for b in [w.t(), w.t().expand(a.shape[0], 24, 40)]:
            assert mmv.explain_auto(a, b)["bucket"] == mmv.explain_auto(rows, w.t())["bucket"]
            out = mmv.matmul(a, b)
            assert out.shape == (a.shape[0], a.shape[1], 40) and out.is_contiguous()
            assert torch.equal(out, mmv.matmul(rows, w.t()).view_as(out))
    apart = torch.randn(4, 6, 24, device=device)[:, :5]  # entries 6 rows apart
    assert mmv.explain_auto(apart, w.t())["bucket"] == mmv.explain_auto(apart[0], w.t())["bucket"]
    check_bmm(apart, w.t(), "auto")


@pytest.mark.cuda
@pytest.mark.skipif(not gpu_available() or "skinny_gemv" not in mmv.algorithms("cuda"),
                    reason="needs a GPU that lists skinny_gemv")
def test_named_rung_runs_a_batch_as_one_product_where_it_takes_its_rows():
    """skinny_gemv takes up to 16 rows: 4 entries of 2 or 4 tokens against a shared weight are
    one product of 8 or 16 rows (the 2-D product's kernels: one, or one for each group of 8
    tokens); 4 entries of 5 tokens run as a batch, in one launch of its batched kernel."""
    torch.manual_seed(0)
    w = torch.randn(300, 256, device="cuda")
    for tokens, one_product in [(2, True), (4, True), (5, False)]:
        a = torch.randn(4, tokens, 256, device="cuda")
        names = product_kernels(lambda: mmv.matmul(a, w.t(), "skinny_gemv"))
        if one_product:
            expected = product_kernels(lambda: mmv.matmul(a.view(-1, 256), w.t(), "skinny_gemv"))
            assert names == expected, names
        else:
            assert len(names) == 1 and re.search(r", true, [1248]>\(", names[0]), names  # BATCHED
        check_bmm(a, w.t(), "skinny_gemv")


@pytest.mark.parametrize("device", devices())
def test_empty(device):
    empty_batch = mmv.matmul(torch.randn(0, 3, 4, device=device), torch.randn(0, 4, 5, device=device))
    assert empty_batch.shape == (0, 3, 5)
    out = mmv.matmul(torch.randn(2, 3, 0, device=device), torch.randn(2, 0, 5, device=device))
    assert torch.equal(out, torch.zeros(2, 3, 5, device=device))


def test_errors():
    with pytest.raises(RuntimeError, match=r"different batch sizes \(2 and 3\)"):
        mmv.matmul(torch.randn(2, 3, 4), torch.randn(3, 4, 5))
    with pytest.raises(RuntimeError, match=r"shapes cannot be multiplied \(\[2, 3, 4\] and \[2, 5, 6\]\)"):
        mmv.matmul(torch.randn(2, 3, 4), torch.randn(2, 5, 6))
    with pytest.raises(RuntimeError, match=r"b must be \[B, K, N\] or a shared \[K, N\], got a 1-D"):
        mmv.matmul(torch.randn(2, 3, 4), torch.randn(4))
    # An empty batch runs nothing but is checked as any other.
    with pytest.raises(RuntimeError, match="same dtype"):
        mmv.matmul(torch.randn(0, 3, 4), torch.randn(0, 4, 5, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="unsupported dtype Long"):
        mmv.matmul(torch.zeros(0, 3, 4, dtype=torch.int64), torch.zeros(0, 4, 5, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="unknown algorithm 'bogus'"):
        mmv.matmul(torch.randn(0, 3, 4), torch.randn(0, 4, 5), "bogus")


@pytest.mark.parametrize("shared", [False, True])
def test_gradcheck(shared):
    a = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(*(() if shared else (3,)), 5, 2, dtype=torch.float64, requires_grad=True)
    fn = lambda a, b: mmv.matmul(a, b, "parallel")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (a, b), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(fn, (a, b))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("wanted", ["a", "b"])
def test_gradient_of_one_operand(device, shared, wanted):
    """Where only one operand requires grad (the other saved for nothing), its gradient matches
    torch.matmul's in float64, for a per-entry b and a shared one."""
    torch.manual_seed(0)
    dtype = torch.float64 if device == "cpu" else torch.float32  # no CUDA rung takes float64
    a = torch.randn(2, 5, 7, dtype=dtype, device=device)
    b = torch.randn(*(() if shared else (2,)), 7, 3, dtype=dtype, device=device)
    leaf = a if wanted == "a" else b
    grad_out = torch.randn(2, 5, 3, dtype=dtype, device=device)
    grads = []
    for product, to in ((mmv.matmul, dtype), (torch.matmul, torch.float64)):
        x = leaf.to(to, copy=True).requires_grad_()
        operands = (x, b.to(to)) if wanted == "a" else (a.to(to), x)
        grads.append(torch.autograd.grad(product(*operands), x, grad_out.to(to))[0])
    assert grads[0].shape == leaf.shape
    assert relative_error(grads[0], grads[1]) < TOLERANCE[dtype]


@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params(with_auto=True))
def test_gradient_values(device, algorithm, dtype):
    """The gradients of a and b against float64, on every algorithm and dtype, for a per-entry b
    and a shared one (whose gradient gathers every entry's); 17 rows an entry, or as many as the
    rung takes."""
    torch.manual_seed(0)
    a = torch.randn(2, rows_accepted(algorithm, 17, 33, 9, dtype, device), 33, device=device)
    a = a.to(dtype)
    for b in [torch.randn(2, 33, 9, device=device).to(dtype), random_matrix(33, 9, dtype, device)]:
        assert assert_gradients_match(algorithm, a[0], b if b.dim() == 2 else b[0],
                                      lambda x, y: mmv.matmul(x, y, algorithm), torch.matmul,
                                      [a, b]), f"{algorithm} refused {a.shape[1]} rows"


@pytest.mark.parametrize("device", devices())
def test_opcheck_and_compile(device):
    a = torch.randn(3, 6, 5, device=device, requires_grad=True)
    b = torch.randn(3, 5, 4, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.mm_variants.bmm.default, (a, b, "auto"))
    torch.library.opcheck(torch.ops.mm_variants.bmm.default, (a, b[0], "auto"))
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: mmv.matmul(a, b).relu(), fullgraph=True, dynamic=True)
    for batch in [2, 5]:
        x, y = torch.randn(batch, 7, 5, device=device), torch.randn(batch, 5, 3, device=device)
        assert relative_error(compiled(x, y), (x.double() @ y.double()).relu()) < 1e-5
