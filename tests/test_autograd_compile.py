"""The op in models and compilers: autograd, opcheck, torch.compile, torch.export and AOTInductor,
Linear and swap_linear."""
from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

import torch_mm_variants as mmv
from conftest import (algorithm_dtype_params, assert_gradients_match, child_env, devices,
                      gpu_available, random_matrix, relative_error, rows_accepted, tolerance_for)


def float64_algorithms() -> list[str]:
    """Every CPU algorithm that takes float64 (the registry's dtypes), and auto."""
    return [name for name in mmv.algorithms("cpu")
            if "Double" in mmv._C.algorithm_dtypes("cpu", name)] + ["auto"]


@pytest.mark.parametrize("algorithm", float64_algorithms())
@pytest.mark.parametrize("layout", ["row", "transposed"])
def test_gradcheck_float64(algorithm, layout):
    a = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    if layout == "transposed":
        b = torch.randn(3, 5, dtype=torch.float64).t().requires_grad_()
    assert torch.autograd.gradcheck(lambda x, y: mmv.matmul(x, y, algorithm), (a, b),
                                    check_forward_ad=True)
    assert torch.autograd.gradgradcheck(lambda x, y: mmv.matmul(x, y, algorithm), (a, b))


@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params(with_auto=True))
def test_gradient_values(device, algorithm, dtype):
    """grad_a = grad @ b^T and grad_b = a^T @ grad against float64, on every algorithm and dtype,
    for a row-major b and an nn.Linear weight's w.t(), 17 rows or as many as the rung takes."""
    torch.manual_seed(0)
    a = random_matrix(rows_accepted(algorithm, 17, 33, 9, dtype, device), 33, dtype, device)
    for layout in ["row", "col"]:
        b = random_matrix(33, 9, dtype, device, layout)
        assert assert_gradients_match(algorithm, a, b, lambda x, y: mmv.matmul(x, y, algorithm),
                                      torch.mm, [a, b]), f"{algorithm} refused {len(a)} rows"


@pytest.mark.parametrize("device", devices())
def test_forward_mode_matches_torch(device):
    """torch.func.jvp and jacfwd: the op attaches d(a @ b) = da @ b + a @ db (and linear's and
    bmm's tangents) to its output, as torch.mm does, instead of an output without a tangent."""
    torch.manual_seed(0)
    a, b = torch.randn(9, 6, device=device), torch.randn(6, 5, device=device)
    da, db = torch.randn_like(a), torch.randn_like(b)
    _, ours = torch.func.jvp(mmv.matmul, (a, b), (da, db))
    _, theirs = torch.func.jvp(torch.mm, (a, b), (da, db))
    assert relative_error(ours, theirs.double()) < 1e-5
    jac = torch.func.jacfwd(lambda x: mmv.matmul(x, b))(a)
    assert relative_error(jac, torch.func.jacfwd(lambda x: x @ b)(a).double()) < 1e-5
    x, w = torch.randn(2, 3, 6, device=device), torch.randn(4, 6, device=device)
    bias = torch.randn(4, device=device)
    tangents = tuple(torch.randn_like(t) for t in (x, w, bias))
    _, ours = torch.func.jvp(lambda *p: mmv.linear(*p, activation="gelu"), (x, w, bias), tangents)
    _, theirs = torch.func.jvp(lambda *p: nn.functional.gelu(nn.functional.linear(*p)),
                               (x, w, bias), tangents)
    assert relative_error(ours, theirs.double()) < 1e-5
    batch = torch.randn(3, 9, 6, device=device)
    _, ours = torch.func.jvp(mmv.matmul, (batch, b), (torch.ones_like(batch), db))
    _, theirs = torch.func.jvp(torch.matmul, (batch, b), (torch.ones_like(batch), db))
    assert relative_error(ours, theirs.double()) < 1e-5


@pytest.mark.parametrize("device", devices())
def test_autocast(device):
    """Under torch.autocast the ops run in the autocast dtype, as torch.mm and F.linear do:
    float32 operands are cast (a bf16 activation meets a float32 weight), float64 is left alone,
    and gradients reach the float32 parameters in float32."""
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cpu" else torch.float16
    x, bias = torch.randn(8, 32, device=device), torch.randn(16, device=device)
    w = torch.randn(16, 32, device=device, requires_grad=True)
    with torch.autocast(device, dtype=dtype):
        products = [(mmv.matmul(x.to(dtype), w.t()), torch.mm(x.to(dtype), w.t())),
                    (mmv.linear(x, w, bias, activation="relu"),
                     nn.functional.relu(nn.functional.linear(x, w, bias))),
                    (mmv.matmul(x.view(2, 4, 32), w.t()), torch.matmul(x.view(2, 4, 32), w.t()))]
        if device == "cpu":  # float64 runs on the CPU only
            doubles = torch.randn(3, 5, dtype=torch.float64)
            assert mmv.matmul(doubles, doubles.t()).dtype == torch.float64
    for ours, theirs in products:
        assert ours.dtype == theirs.dtype == dtype
        assert relative_error(ours, theirs.double()) < 1e-2
    products[1][0].float().sum().backward()
    assert w.grad.dtype == torch.float32 and w.grad.abs().sum() > 0


@pytest.mark.parametrize("device", devices())
def test_forward_mode_with_gradients_recorded(device):
    """Dual inputs that also require grad (an mmv.Linear's parameters always do): the output gets
    the tangent torch's own ops give it, and backward through the same output still matches."""
    torch.manual_seed(0)
    import torch.autograd.forward_ad as fwAD
    reference = nn.Linear(6, 4).to(device)
    layer = mmv.Linear(6, 4).to(device)
    layer.load_state_dict(reference.state_dict())
    a = torch.randn(5, 6, device=device, requires_grad=True)
    b = torch.randn(6, 3, device=device, requires_grad=True)
    x, dx, db = torch.randn(2, 5, 6, device=device), torch.randn(2, 5, 6, device=device), \
        torch.randn_like(b)
    with fwAD.dual_level():
        ours = layer(fwAD.make_dual(x, dx))
        theirs = reference(fwAD.make_dual(x, dx))
        for out, expected in [(ours, theirs), (mmv.matmul(a, fwAD.make_dual(b, db)),
                                               a @ fwAD.make_dual(b, db))]:
            got, want = fwAD.unpack_dual(out), fwAD.unpack_dual(expected)
            assert relative_error(got.primal, want.primal.double()) < 1e-5
            assert relative_error(got.tangent, want.tangent.double()) < 1e-5
        ours.sum().backward()
        theirs.sum().backward()
    for param, expected in [(layer.weight, reference.weight), (layer.bias, reference.bias)]:
        assert relative_error(param.grad, expected.grad.double()) < 1e-5


def test_forward_over_reverse():
    """A gradient taken with create_graph inside forward mode carries the tangent torch's ops give
    it: d(grad_b) = da^T @ grad_out where a is dual, and gradgradcheck's forward-over-reverse
    check (Hessian-vector products) for matmul, bmm and linear."""
    import torch.autograd.forward_ad as fwAD
    torch.manual_seed(0)
    a, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    da = torch.randn_like(a)
    tangents = []
    for product in (mmv.matmul, torch.mm):
        with fwAD.dual_level():
            a_dual = fwAD.make_dual(a.clone().requires_grad_(), da)
            leaf = b.clone().requires_grad_()
            (grad_b,) = torch.autograd.grad(product(a_dual, leaf).sum(), leaf, create_graph=True)
            tangents.append(fwAD.unpack_dual(grad_b).tangent)
    assert tangents[0] is not None
    assert relative_error(tangents[0], tangents[1]) < 1e-12
    batch = torch.randn(2, 3, 4, dtype=torch.float64)
    x, bias = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    cases = [(mmv.matmul, (a, b)), (mmv.matmul, (batch, b)), (mmv.matmul, (batch, batch.mT)),
             (lambda *p: mmv.linear(*p, activation="gelu"), (x, b.t(), bias))]
    for fn, inputs in cases:
        inputs = tuple(t.clone().requires_grad_() for t in inputs)
        assert torch.autograd.gradgradcheck(fn, inputs, check_fwd_over_rev=True)


class ProductCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the calls of each of the ops below autograd (and vmap), gradients' included:
    `products` those of matmul, `calls` all of them by name."""
    def __init__(self):
        super().__init__()
        self.calls = {}

    @property
    def products(self):
        return self.calls.get("matmul", 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, _, name = func.name().partition("::")
        if namespace == "mm_variants":
            self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device", devices())
def test_vmap_runs_batched_products(device):
    """torch.vmap over the ops matches torch's own ops, with the vmapped dimension anywhere, an
    operand shared or batched, nested, and with gradients; where a batched product can take the
    whole batch it runs as one call (mm_variants::bmm, or linear's leading dimensions) instead of
    once per entry."""
    torch.manual_seed(0)
    mm = torch.ops.mm_variants
    a, b = torch.randn(4, 3, 6, device=device), torch.randn(6, 5, device=device)
    b_batch = torch.randn(6, 4, 5, device=device)  # vmapped at dim 1
    w, w_batch = torch.randn(7, 6, device=device), torch.randn(4, 7, 6, device=device)
    bias_batch = torch.randn(4, 7, device=device)
    cases = [  # (ours, theirs, inputs, in_dims, products of the op's own batched call)
        (mmv.matmul, torch.mm, (a, b), (0, None), {"bmm": 1}),
        (mmv.matmul, torch.mm, (a[0], b_batch), (None, 1), {"bmm": 1}),
        (mmv.matmul, torch.mm, (a.transpose(0, 1), b_batch), (1, 1), {"bmm": 1}),
        (mm.bmm, torch.bmm, (torch.randn(2, 4, 3, 6, device=device),
                              torch.randn(2, 4, 6, 5, device=device)), (0, 0),
         {"bmm": 1}),
        (mm.bmm, torch.matmul, (torch.randn(2, 4, 3, 6, device=device), b),
         (0, None), {"bmm": 1}),
        (mm.bmm, torch.matmul, (torch.randn(2, 4, 3, 6, device=device),
                                 torch.randn(2, 6, 5, device=device)), (0, 0),
         {"bmm": 2}),
        (lambda x: mmv.linear(x, w, activation="relu"),
         lambda x: nn.functional.relu(nn.functional.linear(x, w)), (torch.randn(4, 2, 3, 6,
                                                                               device=device),),
         (0,), {"linear": 1}),
        (mmv.linear, nn.functional.linear, (a, w_batch, bias_batch), (0, 0, 0), {"linear": 4}),
        (mmv.linear, nn.functional.linear, (a[0], w_batch), (None, 0), {"linear": 4}),
    ]
    for ours, theirs, inputs, in_dims, calls in cases:
        with ProductCounter() as counter:
            out = torch.vmap(ours, in_dims=in_dims)(*inputs)
        assert counter.calls == calls, (in_dims, counter.calls)
        expected = torch.vmap(theirs, in_dims=in_dims)(*inputs)
        assert out.shape == expected.shape
        assert relative_error(out, expected.double()) < 1e-5
    b_stack = b_batch.movedim(1, 0)
    nested = torch.vmap(torch.vmap(mmv.matmul, in_dims=(0, None)), in_dims=(None, 0))(a, b_stack)
    assert relative_error(nested, torch.einsum("imk,jkn->jimn", a, b_stack).double()) < 1e-5
    leaf = a.clone().requires_grad_()
    torch.vmap(mmv.matmul, in_dims=(0, None))(leaf, b).sum().backward()
    assert relative_error(leaf.grad, torch.ones(4, 3, 5, device=device) @ b.t()) < 1e-5


def test_batched_gradients():
    """Gradients vmapped over many output gradients at once (jacobian(vectorize=True),
    is_grads_batched, gradcheck's batched check) match torch's, for linear and for bmm with a
    shared b, whose backward reshapes its operands to rows."""
    from torch.autograd.functional import jacobian
    torch.manual_seed(0)
    x, w = torch.randn(2, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    a = torch.randn(2, 3, 4, dtype=torch.float64)
    linear = nn.functional.linear
    for ours, theirs, point in [(lambda x: mmv.linear(x, w), lambda x: linear(x, w), x),
                                (lambda w: mmv.linear(x, w), lambda w: linear(x, w), w),
                                (lambda b: mmv.matmul(a, b), lambda b: torch.matmul(a, b), w.t())]:
        expected = jacobian(theirs, point, vectorize=True)
        assert relative_error(jacobian(ours, point, vectorize=True), expected) < 1e-12
    leaf = x.clone().requires_grad_()
    grad_outs = torch.eye(6, dtype=torch.float64).view(6, 2, 3)
    (ours,) = torch.autograd.grad(mmv.linear(leaf, w), leaf, grad_outs, is_grads_batched=True)
    assert relative_error(ours, grad_outs @ w) < 1e-12
    inputs = (a.requires_grad_(), w.t().requires_grad_())
    assert torch.autograd.gradcheck(mmv.matmul, inputs, check_batched_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: mmv.linear(x, w, activation="silu"),
                                    (x.requires_grad_(), w.requires_grad_()),
                                    check_batched_grad=True)


def test_only_needed_gradients():
    """Backward computes grad_a = grad @ b^T only, where b requires grad too but only a's gradient
    is asked for: one product forward, one backward, and b gets nothing."""
    a = torch.randn(4, 3, requires_grad=True)
    b = torch.randn(3, 2, requires_grad=True)
    with ProductCounter() as counter:
        out = mmv.matmul(a, b)
        assert counter.products == 1
        (grad_a,) = torch.autograd.grad(out.sum(), [a])
    assert counter.products == 2
    assert relative_error(grad_a, (torch.ones(4, 2) @ b.t()).double()) < 1e-6
    assert b.grad is None


@pytest.mark.parametrize("device", devices())
def test_opcheck(device):
    dtype = torch.float32
    for m, n, k in [(5, 4, 3), (1, 7, 2), (16, 8, 33)]:
        a = torch.randn(m, k, device=device, dtype=dtype, requires_grad=True)
        b = torch.randn(k, n, device=device, dtype=dtype, requires_grad=True)
        torch.library.opcheck(torch.ops.mm_variants.matmul.default, (a, b, "auto"))
        torch.library.opcheck(torch.ops.mm_variants.matmul.default, (a, b.t().contiguous().t()))


def test_gradients_are_registered_in_cpp():
    """The ops' Autograd kernels are C++ (csrc/autograd.cpp), so a call that needs no gradient
    reaches its device kernel without entering Python; one that does records a node."""
    for op in ("matmul", "linear", "bmm"):
        dump = torch._C._dispatch_dump(f"mm_variants::{op}")
        autograd = [line for line in dump.splitlines() if line.startswith("Autograd")]
        assert len(autograd) == 1 and "autograd.cpp" in autograd[0], dump
    a = torch.randn(3, 3, requires_grad=True)
    assert mmv.matmul(a, a).grad_fn is not None
    assert mmv.matmul(a.detach(), a.detach()).grad_fn is None
    with torch.no_grad():
        assert mmv.matmul(a, a).grad_fn is None


def test_fake_kernel_checks_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        out = mmv.matmul(torch.empty(6, 4), torch.empty(4, 9))
        assert out.shape == (6, 9)
        with pytest.raises(RuntimeError, match=r"shapes cannot be multiplied \(6x4 and 5x9\)"):
            mmv.matmul(torch.empty(6, 4), torch.empty(5, 9))


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 8, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def float64_twin(model: nn.Module) -> nn.Module:
    """A TwoLayer of torch's own layers in float64 with `model`'s parameters (swapped or not): the
    reference for its outputs and gradients, which the ops themselves, compiled or eager, would
    share any error with."""
    twin = TwoLayer().to(next(model.parameters()).device, torch.float64)
    twin.load_state_dict(model.state_dict())
    return twin


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph(device, dynamic):
    torch._dynamo.reset()

    def f(a, b):
        return torch.relu(mmv.matmul(a, b)) * 2

    compiled = torch.compile(f, fullgraph=True, dynamic=dynamic, backend="inductor")
    for m, n, k in [(8, 16, 32), (13, 5, 7), (40, 3, 9)]:
        a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
        expected = torch.relu(a.double() @ b.double()) * 2
        assert relative_error(compiled(a, b), expected) < tolerance_for(torch.float32, device)


@pytest.mark.parametrize("device", devices())
def test_compile_module_and_backward(device):
    torch._dynamo.reset()
    model = mmv.swap_linear(TwoLayer()).to(device)
    twin = float64_twin(model)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    tolerance = tolerance_for(torch.float32, device)
    for batch in [3, 11]:
        x = torch.randn(2, batch, 16, device=device, requires_grad=True)
        x64 = x.detach().double().requires_grad_()
        model.zero_grad()
        twin.zero_grad()
        y = compiled(x)
        y.sum().backward()
        y64 = twin(x64)
        y64.sum().backward()
        assert relative_error(y, y64) < tolerance
        assert relative_error(x.grad, x64.grad) < tolerance
        for p, p64 in zip(model.parameters(), twin.parameters()):
            assert relative_error(p.grad, p64.grad) < tolerance


def named_algorithms(device):
    """(algorithm, dtype) pairs for the compile tests: a rung that takes any operands, and on a
    GPU with the skinny rung one whose `accepts` reads sizes (at most 64 rows: the weight
    gradient's K rows are refused)."""
    pairs = [("parallel" if device == "cpu" else "naive", torch.float32)]
    if device == "cuda" and "skinny" in mmv.algorithms("cuda"):
        pairs.append(("skinny", torch.bfloat16))
    return pairs


@pytest.mark.parametrize("device", devices())
def test_compile_backward_with_named_algorithms_and_dynamic_shapes(device):
    """With dynamic shapes the backward is traced with symbolic sizes, where choosing a named
    algorithm's gradient products by reading sizes failed ("Cannot call numel() on tensor with
    symbolic sizes/strides"). Every op, with gradients checked against float64 (torch's ops); in
    bf16 within 2e-2, the gradients passing through several roundings to bf16 (measured up to
    4.6e-3 on the CPU)."""
    for algorithm, dtype in named_algorithms(device):
        tolerance = tolerance_for(dtype, device) if dtype == torch.float32 else 2e-2

        def f(x, w, b3):
            y = mmv.linear(x, w, activation="relu", algorithm=algorithm)
            return mmv.matmul(y, w, algorithm) + mmv.matmul(b3, w, algorithm).sum(0)

        def f64(x, w, b3):
            return torch.relu(x @ w.t()) @ w + (b3 @ w).sum(0)

        torch._dynamo.reset()
        compiled = torch.compile(f, dynamic=True, backend="aot_eager")
        for rows in (3, 5, 9):
            inputs = [torch.randn(*shape, device=device, dtype=dtype)
                      for shape in ((rows, 16), (16, 16), (2, rows, 16))]
            leaves = [t.clone().requires_grad_() for t in inputs]
            leaves64 = [t.double().requires_grad_() for t in inputs]
            compiled(*leaves).sum().backward()
            f64(*leaves64).sum().backward()
            for ours, theirs in zip(leaves, leaves64):
                assert relative_error(ours.grad, theirs.grad) < tolerance, algorithm


@pytest.mark.parametrize("device", devices())
def test_compiled_linear_backward_does_not_recompile_for_new_sizes(device):
    """x's gradient took x's sizes as plain integers, which pinned them with a guard: every
    new batch or sequence length compiled again, until the recompile limit sent the layer back
    to eager mode."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    layer = mmv.Linear(4, 5, activation="gelu").to(device)
    compiled = torch.compile(layer, dynamic=True, backend=counter)
    weight, bias = layer.weight.detach().double(), layer.bias.detach().double()
    for rows in range(6, 12):  # none equal to another size, which duck sizing would tie
        x = torch.randn(2, rows, 4, device=device, requires_grad=True)
        compiled(x).sum().backward()
        x64 = x.detach().double().requires_grad_()
        nn.functional.gelu(nn.functional.linear(x64, weight, bias)).sum().backward()
        assert relative_error(x.grad, x64.grad) < tolerance_for(torch.float32, device)
    assert counter.frame_count == 1


@pytest.mark.skipif(not gpu_available(), reason="CUDA graphs need a GPU")
def test_compile_reduce_overhead_replays_cuda_graphs():
    """mode="reduce-overhead" records the compiled model, ops included, in CUDA graphs and
    replays them: each replay computes from the new input, and the model's output matches its
    float64 twin at every step (within 2e-2: two layers of bf16 roundings)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = mmv.swap_linear(TwoLayer()).to("cuda", torch.bfloat16).eval()
    twin = float64_twin(model)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    def step():
        x = torch.randn(4, 7, 16, device="cuda", dtype=torch.bfloat16)
        return relative_error(compiled(x).clone(), twin(x.double()))

    with torch.no_grad():
        for warm_up in range(3):  # the first calls run eagerly and record the graph
            assert step() < 2e-2, warm_up
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            assert step() < 2e-2
    assert any(event.name == "cudaGraphLaunch" for event in prof.events()), "no graph replayed"


@pytest.mark.parametrize("device", devices())
def test_torch_export_keeps_the_ops_and_round_trips(device, tmp_path):
    """torch.export records mm_variants' ops (not a decomposition into aten's), and the saved
    program, loaded again, computes the model's output (its float64 twin's) for batch sizes it
    was not traced with."""
    model = mmv.swap_linear(TwoLayer()).to(device).eval()
    twin = float64_twin(model)
    x = torch.randn(2, 5, 16, device=device)
    program = torch.export.export(model, (x,), dynamic_shapes={"x": {1: torch.export.Dim("batch")}})
    called = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert "mm_variants.linear.default" in called
    torch.export.save(program, tmp_path / "model.pt2")
    loaded = torch.export.load(tmp_path / "model.pt2").module()
    for batch in (3, 8):
        x = torch.randn(2, batch, 16, device=device)
        assert relative_error(loaded(x), twin(x.double())) < tolerance_for(torch.float32, device)


class CallsMatmul(nn.Module):
    def forward(self, a, b):
        return mmv.matmul(a, b, "tiled")


def test_fx_symbolic_trace_records_matmul_as_one_call():
    """torch.fx.symbolic_trace records mmv.matmul as a call (its choice between the 2-D and the
    batched op reads a.dim(), which a traced value cannot answer), and the traced module runs
    both."""
    traced = torch.fx.symbolic_trace(CallsMatmul())
    called = [node.target for node in traced.graph.nodes if node.op == "call_function"]
    assert called == [mmv.matmul]
    for a, b in [(torch.randn(5, 7), torch.randn(7, 3)), (torch.randn(2, 5, 7), torch.randn(7, 3))]:
        assert relative_error(traced(a, b), a.double() @ b.double()) < 1e-6


# Exports a small MLP (swapped for ours or not), packages it with AOTInductor, loads the package
# and checks it against a float64 copy of the model made before the swap (torch's own layers) at
# two new batch sizes. Run in a child process: a torch whose AOTInductor cannot load packages on
# a machine crashes there, as torch 2.11's did on an H100 machine whatever the model held.
AOT_INDUCTOR_CHILD = """
import copy, sys, torch
from torch import nn
swapped, device, path = sys.argv[1] == "swapped", sys.argv[2], sys.argv[3]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8, bias=False))
reference = copy.deepcopy(model).to(device, torch.float64)
if swapped:
    import torch_mm_variants as mmv
    mmv.swap_linear(model)
model = model.to(device).eval()
x = torch.randn(2, 5, 16, device=device)
program = torch.export.export(model, (x,), dynamic_shapes=({1: torch.export.Dim("batch")},))
called = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
assert ("mm_variants.linear.default" in called) == swapped, called
package = torch._inductor.aoti_compile_and_package(program, package_path=path)
runner = torch._inductor.aoti_load_package(package)
for batch in (3, 8):
    x = torch.randn(2, batch, 16, device=device)
    expected = reference(x.double())
    error = ((runner(x).double() - expected).norm() / expected.norm()).item()
    assert error < 1e-5, f"relative error {error:.2e} at batch {batch}"
print("checked")
"""


def aot_inductor_child(model, device, path):
    return subprocess.run([sys.executable, "-c", AOT_INDUCTOR_CHILD, model, device, str(path)],
                          env=child_env(), capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("device", devices())
def test_aot_inductor_package_runs_the_ops(device, tmp_path):
    """An AOTInductor package of an exported model with its nn.Linear layers swapped for ours
    (compiled ahead of time, the ops called from its C++ wrapper) computes the model's output
    for new batch sizes. Skipped only where this torch's AOTInductor crashes (a signal) on the
    same model unswapped too, which would be no fault of the ops."""
    ours = aot_inductor_child("swapped", device, tmp_path / "ours.pt2")
    if ours.returncode < 0:
        plain = aot_inductor_child("plain", device, tmp_path / "plain.pt2")
        if plain.returncode < 0:
            pytest.skip("this torch's AOTInductor crashes on a plain nn.Linear model here too "
                        f"(signal {-plain.returncode})")
    assert ours.returncode == 0 and ours.stdout.split() == ["checked"], ours.stderr[-3000:]


def test_linear_matches_nn_linear():
    torch.manual_seed(0)
    reference = nn.Linear(16, 8)
    ours = mmv.Linear(16, 8, algorithm="tiled")
    ours.load_state_dict(reference.state_dict())
    x = torch.randn(2, 3, 16)
    assert relative_error(ours(x), reference(x).double()) < 1e-6
    assert ours(x).shape == (2, 3, 8)
    assert "algorithm='tiled'" in repr(ours)
    no_bias = mmv.Linear(16, 8, bias=False)
    assert no_bias.bias is None and no_bias(x).shape == (2, 3, 8)


def test_swap_linear_keeps_weights_and_output():
    torch.manual_seed(0)
    model = nn.Sequential(TwoLayer(), nn.Sequential(nn.Linear(8, 4)))
    x = torch.randn(5, 16)
    expected = model(x)
    keys = set(model.state_dict())
    weight = model[0].up.weight
    mmv.swap_linear(model, algorithm="parallel")
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 3 and all(isinstance(m, mmv.Linear) for m in linears)
    assert model[0].up.weight is weight and set(model.state_dict()) == keys
    assert relative_error(model(x), expected.double()) < 1e-6
    model(x).sum().backward()
    assert weight.grad is not None


def test_linear_from_linear_shares_parameters():
    torch.manual_seed(0)
    original = nn.Linear(6, 3)
    ours = mmv.Linear.from_linear(original, algorithm="parallel")
    assert ours.weight is original.weight and ours.bias is original.bias
    assert ours.algorithm == "parallel" and ours.activation == "none"
    x = torch.randn(4, 6)
    assert relative_error(ours(x), original(x).double()) < 1e-6


def test_linear_from_linear_keeps_an_empty_bias_slot():
    """From a bias=False layer, bias is a registered (empty) parameter as in nn.Linear: a bias can
    be registered later, and the state dict and parameters agree with nn.Linear's."""
    original = nn.Linear(4, 3, bias=False)
    ours = mmv.Linear.from_linear(original)
    assert "bias" in ours._parameters and ours.bias is None
    assert list(ours.state_dict()) == list(original.state_dict()) == ["weight"]
    ours.register_parameter("bias", nn.Parameter(torch.zeros(3)))
    assert [name for name, _ in ours.named_parameters()] == ["weight", "bias"]


def test_linear_from_linear_keeps_training_mode_and_refuses_parametrized_layers():
    """The new layer is in the source's training mode, and a weight-normed source (a weight
    computed from its parameters on every call) is refused rather than frozen at today's value."""
    torch.manual_seed(0)
    for training in (True, False):
        original = nn.Linear(4, 3).train(training)
        assert mmv.Linear.from_linear(original).training is training
    normed = nn.utils.parametrizations.weight_norm(nn.Linear(4, 3))
    with pytest.raises(ValueError, match="parametrized"):
        mmv.Linear.from_linear(normed)
    # The older hook-based forms keep a plain tensor as `weight`, recomputed before each call:
    # converted, the layer lost its weight from the state dict and its gradient.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nn.utils.weight_norm's deprecation
        hooked = [nn.utils.weight_norm(nn.Linear(4, 3)), nn.utils.spectral_norm(nn.Linear(4, 3))]
    for layer in hooked:
        with pytest.raises(ValueError, match="no Parameter"):
            mmv.Linear.from_linear(layer)


def test_linear_from_linear_keeps_what_the_source_computes():
    """A Linear source keeps its activation (it was dropped: relu layers came back without
    relu), and a subclass with its own forward, which the new layer would skip, is refused."""
    torch.manual_seed(0)
    source = mmv.Linear(4, 3, algorithm="tiled", activation="relu")
    converted = mmv.Linear.from_linear(source, algorithm="parallel")
    assert converted.activation == "relu" and converted.algorithm == "parallel"
    x = torch.randn(5, 4)
    assert torch.equal(converted(x), mmv.Linear.from_linear(source, algorithm="tiled")(x))
    assert relative_error(converted(x), torch.relu(nn.functional.linear(x, source.weight,
                                                                   source.bias)).double()) < 1e-6

    class Scaled(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 10

    with pytest.raises(ValueError, match="Scaled defines its own forward"):
        mmv.Linear.from_linear(Scaled(4, 3))
    # A subclass that keeps nn.Linear's forward converts (MultiheadAttention's out_proj).
    out_proj = nn.MultiheadAttention(4, 2).out_proj
    assert mmv.Linear.from_linear(out_proj).weight is out_proj.weight


def test_swap_linear_keeps_hooks_and_leaves_subclasses_alone():
    """A swapped layer is the same module with the same hooks; a subclass of nn.Linear (its own
    forward) and a weight-normed layer (a computed weight) keep running as they did."""
    class Scaled(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 10

    torch.manual_seed(0)
    plain, scaled = nn.Linear(6, 6), Scaled(6, 6)
    normed = nn.utils.parametrizations.weight_norm(nn.Linear(6, 3))
    model = nn.Sequential(plain, scaled, normed)
    calls = []
    plain.register_forward_hook(lambda module, inputs, output: calls.append(output.shape))
    x = torch.randn(4, 6)
    expected = model(x)
    assert mmv.swap_linear(model, algorithm="parallel") is model
    assert model[0] is plain and type(plain) is mmv.Linear and plain.algorithm == "parallel"
    assert type(scaled) is Scaled and not isinstance(scaled, mmv.Linear)
    assert not isinstance(normed, mmv.Linear)
    assert relative_error(model(x), expected.double()) < 1e-6
    assert calls == [torch.Size([4, 6])] * 2
    top = nn.Linear(6, 2)
    assert type(mmv.swap_linear(top)) is mmv.Linear


def test_swap_linear_keeps_swapped_layers_and_warns_of_instance_forwards():
    """A layer that already is a torch_mm_variants.Linear keeps its algorithm. A forward set on
    the instance (accelerate's hooks wrap the old one so) would shadow Linear.forward and keep
    running torch's kernel unnoticed: such a layer is left as it is, with a warning."""
    torch.manual_seed(0)
    chosen, hooked, plain = mmv.Linear(6, 6, algorithm="tiled"), nn.Linear(6, 6), nn.Linear(6, 2)
    old_forward = hooked.forward
    hooked.forward = lambda x: old_forward(x) * 1  # noqa: PLW0108
    model = nn.Sequential(chosen, hooked, plain)
    x = torch.randn(3, 6)
    expected = model(x)
    with pytest.warns(UserWarning, match=r"left 1 nn.Linear layer\(s\) as they are.*: 1$"):
        mmv.swap_linear(model, algorithm="parallel")
    assert chosen.algorithm == "tiled" and type(hooked) is nn.Linear
    assert type(plain) is mmv.Linear and plain.algorithm == "parallel"
    assert relative_error(model(x), expected.double()) < 1e-6


@pytest.mark.skipif(not gpu_available(), reason="needs a GPU")
def test_linear_on_gpu_16_bit():
    layer = mmv.Linear(64, 48, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(4, 10, 64, device="cuda", dtype=torch.bfloat16)
    ref = x.double() @ layer.weight.double().t() + layer.bias.double()
    assert relative_error(layer(x), ref) < 1e-2
