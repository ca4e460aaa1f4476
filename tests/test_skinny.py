"""The skinny rung (LLM decode, M <= 64): correctness over sizes that cross its 16-column blocks,
its 8-token tiles and its k steps, the four layouts, misaligned views, the split-K pass,
determinism, CUDA graphs, its refusal of M > 64 and the `auto` choice."""
from __future__ import annotations

import pytest
import torch

import torch_mm_variants as mmv
from conftest import assert_matches_reference, gpu_available, random_matrix

pytestmark = pytest.mark.skipif(
    not gpu_available() or "skinny" not in mmv.algorithms("cuda"),
    reason="needs a CUDA build and an sm_80+ GPU")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = [("row", "col"), ("row", "row"), ("col", "col"), ("col", "row")]  # first: x @ w.t()


def sizes() -> list[tuple[int, int, int]]:
    """(M, N, K) varying one dimension at a time, plus a few corners; N >= 2112 gives every SM a
    block (no split of K), smaller N splits K over blocks."""
    ms, ns, ks = [1, 2, 7, 16, 33, 64], [1, 7, 129, 1000], [1, 7, 129, 1000, 4097]
    return ([(m, 129, 1000) for m in ms] + [(16, n, 1000) for n in ns]
            + [(7, 129, k) for k in ks]
            + [(1, 1, 1), (64, 1000, 4097), (3, 4103, 1000), (64, 2500, 129)])


def weight_view(n, k, dtype, offset=0, pad=0):
    """b = w.t() for a weight w [n, k] that starts `offset` elements into its storage, rows `pad`
    elements apart beyond k."""
    storage = torch.randn(n, k + pad + offset, device="cuda").to(dtype)
    return storage[:, offset:offset + k].t()


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"{l[0]}-{l[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sizes_and_layouts(dtype, layout):
    torch.manual_seed(0)
    for m, n, k in sizes():
        a = random_matrix(m, k, dtype, "cuda", layout[0])
        b = random_matrix(k, n, dtype, "cuda", layout[1])
        assert_matches_reference(a, b, "skinny")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_misaligned_and_strided_views(dtype):
    torch.manual_seed(0)
    for m, n, k in [(1, 300, 1000), (16, 129, 4097), (33, 2200, 77)]:
        x_storage = torch.randn(m * (k + 5) + 3, device="cuda").to(dtype)
        misaligned_x = x_storage[1:1 + m * (k + 5)].view(m, k + 5)[:, 2:2 + k]
        for a in [random_matrix(m, k, dtype, "cuda"), misaligned_x,
                  random_matrix(m, k, dtype, "cuda", "sliced")]:
            for b in [weight_view(n, k, dtype, offset=1), weight_view(n, k, dtype, pad=3),
                      weight_view(n, k, dtype, offset=8, pad=8),
                      random_matrix(k, n, dtype, "cuda", "sliced"),
                      random_matrix(k, 2 * n, dtype, "cuda")[:, ::2]]:
                assert_matches_reference(a, b, "skinny")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_deterministic(dtype):
    torch.manual_seed(0)
    for m, n, k in [(16, 129, 4097), (7, 4103, 1000), (64, 300, 2000)]:  # split K, then not
        a, b = random_matrix(m, k, dtype, "cuda"), weight_view(n, k, dtype)
        first = mmv.matmul(a, b, "skinny")
        assert torch.equal(first, mmv.matmul(a, b, "skinny"))


def test_cuda_graph_capture():
    torch.manual_seed(0)
    a = random_matrix(8, 4096, torch.bfloat16, "cuda")
    b_split = weight_view(256, 4096, torch.bfloat16)  # few blocks: K split, a second pass
    b_whole = weight_view(4100, 4096, torch.bfloat16)
    expected = [mmv.matmul(a, b, "skinny") for b in (b_split, b_whole)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside the capture
        [mmv.matmul(a, b, "skinny") for b in (b_split, b_whole)]
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [mmv.matmul(a, b, "skinny") for b in (b_split, b_whole)]
    a.copy_(random_matrix(8, 4096, torch.bfloat16, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    for out, b, before in zip(outs, (b_split, b_whole), expected):
        assert torch.equal(out, mmv.matmul(a, b, "skinny")) and not torch.equal(out, before)


def test_more_than_64_rows_is_refused():
    a, b = torch.randn(65, 32, device="cuda"), torch.randn(32, 16, device="cuda")
    with pytest.raises(RuntimeError,
                       match=r"algorithm 'skinny' cannot take these inputs: .*M <= 64"):
        mmv.matmul(a, b, "skinny")
    assert mmv.auto_choice(a, b) != "skinny"
    assert mmv.matmul(a[:64], b, "skinny").shape == (64, 16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [1, 8, 16])
def test_auto_picks_skinny_for_decode(m, dtype):
    x = random_matrix(m, 4096, dtype, "cuda")
    w = random_matrix(4096, 4096, dtype, "cuda")
    assert mmv.auto_choice(x, w.t()) == "skinny"
    assert_matches_reference(x, w.t(), "auto")
