"""Batched products through mm_variants::bmm (torch_mm_variants.matmul with a 3-D a): per-entry
and shared b, every algorithm, odd sizes, gradients, opcheck and torch.compile."""
from __future__ import annotations

import re

import pytest
import torch

import torch_mm_variants as mmv
from conftest import (TOLERANCE, algorithm_dtype_params, dtype_params, assert_gradients_match,
                      capture_graph, check_bmm, devices, gemv_short_k, gemv_takes, gpu_available,
                      product_kernels, random_matrix, relative_error, skinny_short_rows, sm_count,
                      sm90a_available, split_kernels)


@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params())
def test_batches(device, algorithm, dtype):
    torch.manual_seed(0)
    for batch, m, n, k in [(3, 5, 7, 9), (2, 33, 17, 65), (4, 1, 3, 1)]:  # M * N odd: padded
        a = torch.randn(batch, m, k, device=device).to(dtype)
        b = torch.randn(batch, k, n, device=device).to(dtype)
        check_bmm(a, b, algorithm)
        transposed = lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)  # noqa: E731
        check_bmm(transposed(a), transposed(b), algorithm)
        check_bmm(a, b[0], algorithm)  # shared b
        w = torch.randn(n, k, device=device).to(dtype)
        check_bmm(a, w.t(), algorithm)  # shared nn.Linear weight, read in place


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


needs_skinny = pytest.mark.skipif(not gpu_available() or "skinny" not in mmv.algorithms("cuda"),
                                  reason="needs a GPU that lists skinny")


# The kernels of the skinny rungs' batched launches (rungs 10 and 12).
SKINNY_KERNELS = ("skinny_kernel", "short_rows_kernel", "k_major_kernel", "short_k_kernel",
                  "n_major_kernel")


@pytest.mark.cuda
@needs_skinny
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_decode_batches_run_in_one_launch(dtype):
    """Batches of a few tokens against each entry's own matrix, as attention's products are at
    decode (q @ k^T with k read K-contiguous, p @ v with v row-major), run in one launch of a
    skinny rung's batched kernel under auto (rung 12's for float32 where it takes one entry, on
    float32 q @ k^T where its short-K kernel takes the batch's rows, and on float32 p @ v at 9-16
    tokens, a launch for each group of 8; else rung 10's, whose short-rows kernel takes 16-bit
    q @ k^T where skinny_short_rows says so), at every count of token tiles, and so inside a CUDA
    graph."""
    torch.manual_seed(0)
    keys = torch.randn(24, 1000, 128, device="cuda", dtype=dtype)
    values = torch.randn(24, 1000, 128, device="cuda", dtype=dtype)
    entries, rows, head = keys.shape
    for m in [1, 2, 3, 8, 9, 17, 33, 64]:
        queries = torch.randn(24, m, 128, device="cuda", dtype=dtype)
        scores = torch.randn(24, m, 1000, device="cuda", dtype=dtype)
        for a, b in [(queries, keys.transpose(1, 2)), (scores, values)]:
            names = product_kernels(lambda: mmv.matmul(a, b))
            choice, one_entry = mmv.auto_choice(a, b), mmv.auto_choice(a[0], b[0])
            short_rows = (b is not values and dtype == torch.float32
                          and gemv_short_k(m, entries * rows, head, dtype))
            groups = b is values and dtype == torch.float32 and 8 < m <= 16
            gemv = one_entry == "skinny_gemv" or short_rows or groups
            expected = "skinny_gemv" if gemv else "skinny"
            assert choice == expected, (m, mmv.explain_auto(a, b), one_entry)
            launches = 2 if groups else 1
            assert len(names) == launches, (m, names)
            assert all(any(k in name for k in SKINNY_KERNELS) for name in names), (m, names)
            if b is not values and dtype != torch.float32:
                short = skinny_short_rows(m, entries * rows, head)
                assert ("short_rows_kernel" in names[0]) == short, (m, names)
            check_bmm(a, b, "auto")
    a, b = queries, keys.transpose(1, 2)
    graph, out = capture_graph(lambda: mmv.matmul(a, b))
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, mmv.matmul(a, b))


@pytest.mark.cuda
@pytest.mark.skipif(not gpu_available() or "skinny_gemv" not in mmv.algorithms("cuda"),
                    reason="needs a GPU that lists skinny_gemv")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrow_expert_batches_count_their_rows_together(dtype):
    """16-bit batches of nn.Linear weights (experts) at 1-2 tokens go to skinny_gemv under auto
    where all their entries' rows together are 4-16 per SM and K >= 1024, as a single weight of
    that many rows does, though one entry alone is too narrow for it; else to skinny."""
    torch.manual_seed(0)
    sms = sm_count()
    for entries, n, k, m in [(8, 128, 4096, 1), (16, 64, 1024, 2), (8, 128, 4096, 3),
                             (8, 128, 1000, 1), (4, 64, 4096, 1), (16, 256, 1024, 1),
                             (3, 200, 1032, 2)]:
        a = torch.randn(entries, m, k, device="cuda", dtype=dtype)
        w = torch.randn(entries, n, k, device="cuda", dtype=dtype)
        rows = entries * n
        gemv = m <= 2 and k >= 1024 and 4 * sms <= rows <= 16 * sms
        if not 4 * sms <= n <= 16 * sms:  # one entry alone stays off skinny_gemv
            assert mmv.auto_choice(a[0], w[0].t()) != "skinny_gemv", (entries, n, k, m)
        choice = mmv.auto_choice(a, w.mT)
        assert choice == ("skinny_gemv" if gemv else "skinny"), (entries, n, k, m, choice)
        assert len(product_kernels(lambda: mmv.matmul(a, w.mT))) == 1, (entries, n, k, m)
        check_bmm(a, w.mT, "auto")


@pytest.mark.cuda
@needs_skinny
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_large_decode_entries_keep_the_choice_for_one_entry(dtype):
    """Entries of 9-64 tokens against row-major matrices of 16 MB or more run entry by entry
    where auto's choice for one entry is a rung without a batched kernel (rung 11 on Hopper); up
    to 8 tokens, and against smaller matrices, they run batched: bf16 on rung 10, float32 at 9-16
    tokens on rung 12 (gemv_takes), a launch for each group of 8 tokens."""
    torch.manual_seed(0)
    for k, n, m in [(4096, 4096, 8), (4096, 4096, 16), (4096, 1024, 16), (2048, 1024, 16),
                    (2048, 1024, 24)]:
        a = torch.randn(2, m, k, device="cuda", dtype=dtype)
        b = torch.randn(2, k, n, device="cuda", dtype=dtype)
        one_entry = mmv.auto_choice(a[0], b[0])
        large = m > 8 and k * n * dtype.itemsize >= 16 << 20
        per_entry = large and one_entry == "skinny_tma"
        gemv = gemv_takes(m, n, k, dtype, row_major=True, tma_reads_it=sm90a_available(),
                          entries=2)
        batched = "skinny_gemv" if gemv else "skinny"
        assert mmv.auto_choice(a, b) == (one_entry if per_entry else batched), (k, n, m)
        one_launch = len(product_kernels(lambda: mmv.matmul(a[0], b[0])))
        launches = len(product_kernels(lambda: mmv.matmul(a, b)))
        batched_launches = 2 if gemv and m > 8 else 1
        assert launches == (2 * one_launch if per_entry else batched_launches), (k, n, m)
        check_bmm(a, b, "auto")


@pytest.mark.cuda
@needs_skinny
@pytest.mark.parametrize("algorithm", ["skinny", "skinny_gemv"])
def test_batches_past_the_grids_limit_take_more_launches(algorithm):
    """gridDim.z takes at most 65535 entries: rungs 10 and 12 launch the rest after them."""
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
        assert torch.equal(run(), run())
        graph, out = capture_graph(run)
        a.copy_(torch.randn_like(a))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, run())


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
    and a shared one (whose gradient gathers every entry's)."""
    torch.manual_seed(0)
    a = torch.randn(2, 17, 33, device=device).to(dtype)
    for b in [torch.randn(2, 33, 9, device=device).to(dtype), random_matrix(33, 9, dtype, device)]:
        assert_gradients_match(algorithm, a[0], b if b.dim() == 2 else b[0],
                               lambda x, y: mmv.matmul(x, y, algorithm), torch.matmul, [a, b])


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
