"""mm_variants::linear: activation(x @ weight^T + bias) against float64, on every algorithm,
with its errors, gradients, opcheck and torch.compile."""
from __future__ import annotations

import pytest
import torch

import torch_mm_variants as mmv
from conftest import (algorithm_dtype_params, assert_gradients_match, dtype_params,
                      assert_result, devices, random_matrix, relative_error, rows_accepted,
                      run_accepted)

ACTIVATIONS = ["none", "relu", "gelu", "gelu_tanh", "silu"]
REFERENCE = {
    "none": lambda y: y,
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda y: torch.nn.functional.gelu(y, approximate="tanh"),
    "silu": torch.nn.functional.silu,
}


def reference(x, weight, bias, activation):
    y = x.double() @ weight.double().t()
    if bias is not None:
        y = y + bias.double()
    return REFERENCE[activation](y)


def epilogue_roundings(bias, activation) -> int:
    """The roundings to the dtype of an epilogue that is not fused: the product, then the bias
    added, then the activation applied, each to the fresh output in place."""
    return 1 + (bias is not None) + (activation != "none")


def check_linear(x, weight, bias, activation, algorithm) -> bool:
    """The op against float64; returns False when the algorithm refused. Where the epilogue is
    not fused, the output is rounded to the dtype after the product, the bias and the activation
    (epilogue_roundings), and an activation that makes an output small (gelu and silu of negative
    inputs) keeps its input's error: 16-bit outputs of a few elements (one row of 37, an N of 7)
    came out up to 2.2 times bf16's tolerance over random draws. So the error is measured against
    the pre-activation output's norm, within the dtype's tolerance for each rounding."""
    rows = x.reshape(-1, x.shape[-1])
    result = run_accepted(algorithm, rows, weight.t(),
                          lambda: mmv.linear(x, weight, bias, activation, algorithm))
    if result is None:
        return False
    out, tolerance = result
    scale = reference(x, weight, bias, "none").norm().item()
    assert_result(out, reference(x, weight, bias, activation), x.dtype, x.device,
                  tolerance * epilogue_roundings(bias, activation), scale)
    return True


@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params())
def test_activations_bias_and_batch_dims(device, algorithm, dtype):
    torch.manual_seed(0)
    weight = torch.randn(37, 70, device=device).to(dtype)
    bias = torch.randn(37, device=device).to(dtype)
    checked = 0
    for activation in ACTIVATIONS:
        for x_shape in [(70,), (5, 70), (2, 3, 70)]:
            x = torch.randn(*x_shape, device=device).to(dtype)
            checked += check_linear(x, weight, bias, activation, algorithm)
            checked += check_linear(x, weight, None, activation, algorithm)
    assert checked > 0, f"{algorithm} refused every shape"


def fused_params() -> list:
    """(device, algorithm, dtype) for the rungs that fuse the epilogue into their store, as the
    registry says (e.g. simd_packed and parallel; on a GPU, tensor_core and wgmma)."""
    return dtype_params([(d, name) for d in devices() for name in mmv.algorithms(d)
                         if mmv._C.algorithm_fuses_epilogue(d, name)])


# (M, N, K): each of the edge sizes 1, 7, 63, 65, 127, 129 once in every position, and several
# tiles of the tensor-core rungs in both dimensions; the last three have the 16-byte aligned rows
# that wgmma's TMA copies need (its other shapes run rung 8), with an N that TMA can store (a
# multiple of 8) or not.
EDGE_SHAPES = [(1, 7, 63), (7, 63, 65), (63, 65, 127), (65, 127, 129), (127, 129, 1),
               (129, 1, 7), (300, 520, 200), (136, 264, 72), (200, 100, 64)]


def test_registry_reports_the_fused_rungs():
    """fused_params comes from the registry: the CPU's fusing rungs are in it, the others not."""
    fused = {name for name in mmv.algorithms("cpu") if mmv._C.algorithm_fuses_epilogue("cpu", name)}
    assert fused == {"simd_packed", "parallel"}
    assert not any(mmv._C.algorithm_runs_batches("cpu", name) for name in mmv.algorithms("cpu"))


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("device,algorithm,dtype", fused_params())
def test_fused_epilogue_edges_and_layouts(device, algorithm, dtype, activation):
    """The fused store at edge sizes, with and without a bias (one that is misaligned, too). Weight
    "row" is nn.Linear's own [N, K] layout, which tensor_core fuses; an x or weight in another
    layout takes its unfused path; "offset" operands take its element-by-element copies."""
    torch.manual_seed(0)
    for m, n, k in EDGE_SHAPES:
        bias = random_matrix(1, n, dtype, device, "row")[0]
        for x_layout in ["row", "col", "offset"]:
            for w_layout in ["row", "col", "offset"]:
                check_linear(random_matrix(m, k, dtype, device, x_layout),
                             random_matrix(n, k, dtype, device, w_layout), bias, activation,
                             algorithm)
        x, weight = random_matrix(m, k, dtype, device), random_matrix(n, k, dtype, device)
        check_linear(x, weight, None, activation, algorithm)
        misaligned_bias = random_matrix(1, n, dtype, device, "offset")[0]
        check_linear(x, weight, misaligned_bias, activation, algorithm)


@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params())
def test_relu_keeps_nan(device, algorithm, dtype):
    """relu(NaN) is NaN, as in torch.relu, whether the rung fuses it into its stores or not: a
    diverging layer must not look healthy. Rows of 72 elements are 16-byte aligned, so the TMA
    rung takes them too."""
    torch.manual_seed(0)
    weight = torch.randn(37, 72, device=device).to(dtype)
    x = torch.randn(5, 72, device=device).to(dtype)
    x[1, 3] = float("nan")
    result = run_accepted(algorithm, x, weight.t(),
                          lambda: mmv.linear(x, weight, None, "relu", algorithm))
    assert result is not None, f"{algorithm} refused 5 rows"  # every rung takes 16 or more
    assert torch.isnan(result[0][1]).all()
    assert not torch.isnan(result[0][[0, 2, 3, 4]]).any()


@pytest.mark.parametrize("device", devices())
def test_relu_gradient_where_the_unit_is_off_is_zero(device):
    """Even for an infinite output gradient, as torch.relu's backward gives: it selects, not
    multiplies (inf * 0 would be NaN)."""
    x = torch.tensor([[-1.0, 2.0]], device=device, requires_grad=True)
    w = torch.tensor([[1.0, 0.0]], device=device)
    mmv.linear(x, w, None, "relu").backward(torch.tensor([[float("inf")]], device=device))
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("device", devices())
def test_larger_and_transposed_inputs(device):
    torch.manual_seed(0)
    x = torch.randn(300, 130, device=device).t()[:, :129]  # [130, 129] view with strides
    weight = torch.randn(257, 129, device=device)
    bias = torch.randn(257, device=device)
    for activation in ACTIVATIONS:
        check_linear(x, weight, bias, activation, "auto")


@pytest.mark.parametrize("device", devices())
def test_empty_dimensions(device):
    weight, bias = torch.randn(4, 0, device=device), torch.randn(4, device=device)
    out = mmv.linear(torch.randn(3, 0, device=device), weight, bias, "relu")
    assert torch.equal(out, torch.relu(bias).expand(3, 4))
    assert mmv.linear(torch.randn(0, 5, device=device), torch.randn(4, 5, device=device)).shape == (0, 4)


def test_errors():
    x, w = torch.randn(2, 3), torch.randn(4, 3)
    with pytest.raises(RuntimeError, match=r"unknown activation 'tanh'; valid: none, relu, gelu"):
        mmv.linear(x, w, None, "tanh")
    with pytest.raises(RuntimeError, match=r"bias must have shape \[4\], got \[3\]"):
        mmv.linear(x, w, torch.randn(3))
    with pytest.raises(RuntimeError, match=r"expected bias to have the dtype of weight"):
        mmv.linear(x, w, torch.randn(4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=r"x and weight shapes cannot be multiplied \(\[2, 3\] and \[5, 4\]\^T\)"):
        mmv.linear(x, torch.randn(5, 4))
    with pytest.raises(RuntimeError, match=r"weight must be a matrix"):
        mmv.linear(x, torch.randn(3))
    with pytest.raises(RuntimeError, match=r"expected x and weight to have the same dtype"):
        mmv.linear(x, w.double())


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("algorithm", ["parallel", "tiled"])  # fused and unfused epilogue
def test_gradcheck(activation, algorithm):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    fn = lambda x, w, b: mmv.linear(x, w, b, activation, algorithm)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, b), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(fn, (x, w, b))


@pytest.mark.parametrize("device,algorithm,dtype", algorithm_dtype_params(with_auto=True))
def test_gradient_values(device, algorithm, dtype):
    """The gradients of x, weight and bias against float64, on every algorithm and dtype: with a
    bias and gelu (the fused epilogue, its pre-activation recomputed in the backward pass), and
    with neither; 17 rows, or as many as the rung takes. Through gelu the tolerance is twice the
    dtype's: where the epilogue is not fused, the slope is taken at the pre-activation rounded to
    the dtype, whose error gelu's curvature passes on (bf16's bias gradient, a sum of the
    slopes, came out up to 1.4 times its tolerance over random draws)."""
    torch.manual_seed(0)
    rows = rows_accepted(algorithm, 17, 33, 9, dtype, device)
    x, weight = random_matrix(rows, 33, dtype, device), random_matrix(9, 33, dtype, device)
    bias = torch.randn(9, device=device).to(dtype)
    assert assert_gradients_match(algorithm, x, weight.t(),
                                  lambda *p: mmv.linear(*p, activation="gelu", algorithm=algorithm),
                                  lambda *p: reference(*p, "gelu"), [x, weight, bias],
                                  roundings=2), f"{algorithm} refused {rows} rows"
    assert assert_gradients_match(algorithm, x, weight.t(),
                                  lambda *p: mmv.linear(*p, algorithm=algorithm),
                                  lambda *p: reference(*p, None, "none"), [x, weight])


@pytest.mark.parametrize("device", devices())
def test_opcheck(device):
    x = torch.randn(3, 6, 5, device=device, requires_grad=True)
    w = torch.randn(4, 5, device=device, requires_grad=True)
    b = torch.randn(4, device=device, requires_grad=True)
    for activation in ["none", "gelu"]:
        torch.library.opcheck(torch.ops.mm_variants.linear.default, (x, w, b, activation, "auto"))
        torch.library.opcheck(torch.ops.mm_variants.linear.default, (x, w, None, activation, "auto"))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph(device, dynamic):
    torch._dynamo.reset()
    layer = mmv.Linear(16, 8, activation="silu").to(device)
    compiled = torch.compile(layer, fullgraph=True, dynamic=dynamic)
    for batch in [3, 7]:
        x = torch.randn(batch, 16, device=device)
        assert relative_error(compiled(x), reference(x, layer.weight, layer.bias, "silu")) < 1e-5


def gradients(fn, x, weight, bias, grad):
    """(y, dx, dweight, dbias) of fn(x, weight, bias) against the upstream gradient `grad`."""
    leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
    y = fn(*leaves)
    return (y, *torch.autograd.grad(y, leaves, grad))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu"])
def test_16_bit_activation_gradients_are_torchs(activation, dtype):
    """The activation's gradient in 16 bits is computed as PyTorch computes its own, in float32:
    the gradients of x, weight and bias against float64 are within a quarter of F.linear + the
    activation's errors (16-bit steps had doubled them), and a pre-activation of 1000, whose
    cube overflows float16, gives finite gradients."""
    torch.manual_seed(0)
    x, weight = torch.randn(128, 256) * 3, torch.randn(64, 256) / 16
    x[0], weight[0] = 125.0, 1.0 / 32  # one pre-activation of 1000
    bias, grad = torch.randn(64), torch.randn(128, 64)
    act = REFERENCE[activation]
    exact = gradients(lambda *p: act(torch.nn.functional.linear(*p)),
                      *(t.double() for t in (x, weight, bias, grad)))
    inputs = [t.to(dtype) for t in (x, weight, bias, grad)]
    ours = gradients(lambda *p: mmv.linear(*p, activation=activation), *inputs)
    theirs = gradients(lambda *p: act(torch.nn.functional.linear(*p)), *inputs)
    for mine, torchs, ref in zip(ours[1:], theirs[1:], exact[1:]):
        assert torch.isfinite(mine).all()
        assert relative_error(mine, ref) <= 1.25 * relative_error(torchs, ref)


def test_linear_module_activation_matches_torch():
    torch.manual_seed(0)
    layer = mmv.Linear(10, 6, activation="gelu_tanh")
    x = torch.randn(4, 10)
    expected = torch.nn.functional.gelu(torch.nn.functional.linear(x, layer.weight, layer.bias),
                                        approximate="tanh")
    assert relative_error(layer(x), expected.double()) < 1e-5
    assert "activation='gelu_tanh'" in repr(layer)


def test_layer_scripts_like_nn_linear():
    """torch.jit.script compiles a Linear (with or without a bias, made or swapped in) as it does
    nn.Linear, and the scripted layer computes what the eager one does."""
    torch.manual_seed(0)
    layers = [mmv.Linear(10, 6, activation="gelu", algorithm="parallel"),
              mmv.Linear(10, 6, bias=False),
              mmv.swap_linear(torch.nn.Sequential(torch.nn.Linear(10, 6), torch.nn.ReLU()))]
    x = torch.randn(3, 4, 10)
    for layer in layers:
        scripted = torch.jit.script(layer)
        assert torch.equal(scripted(x), layer(x))
    expected = torch.nn.functional.gelu(torch.nn.functional.linear(x, layers[0].weight,
                                                                   layers[0].bias))
    assert relative_error(torch.jit.script(layers[0])(x), expected.double()) < 1e-5


def test_unknown_algorithm_is_refused_when_the_layer_is_made():
    """Linear, Linear.from_linear, swap_linear and a later assignment refuse a name that no device
    registers at once, listing the valid names, rather than at the first forward."""
    message = r"unknown algorithm 'fastest'; valid algorithms in this build: auto, naive, "
    with pytest.raises(ValueError, match=message) as refused:
        mmv.Linear(4, 3, algorithm="fastest")
    assert all(name in str(refused.value) for name in mmv.algorithms("cpu"))
    with pytest.raises(ValueError, match=message):
        mmv.Linear.from_linear(torch.nn.Linear(4, 3), algorithm="fastest")
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    with pytest.raises(ValueError, match=message):
        mmv.swap_linear(model, algorithm="fastest")
    assert all(type(layer) is torch.nn.Linear for layer in model)  # no layer half swapped
    layer = mmv.Linear(4, 3, algorithm="tiled")
    with pytest.raises(ValueError, match=message):
        layer.algorithm = "fastest"
    assert layer.algorithm == "tiled"


def test_unknown_activation_is_refused_when_the_layer_is_made():
    """As with algorithms: Linear and a later assignment refuse an activation that
    mm_variants::linear does not apply, listing the valid ones, and the layer keeps its own."""
    message = r"unknown activation 'tanh'; valid activations: none, relu, gelu, gelu_tanh, silu"
    with pytest.raises(ValueError, match=message):
        mmv.Linear(4, 3, activation="tanh")
    layer = mmv.Linear(4, 3, activation="relu")
    with pytest.raises(ValueError, match=message):
        layer.activation = "tanh"
    assert layer.activation == "relu" and "activation='relu'" in repr(layer)


def test_layer_takes_any_registered_algorithm():
    """Every name of the registry is taken, a GPU's too when the build has CUDA kernels, even on a
    machine without a GPU (the layer may move to one later); the op refuses it where it cannot
    run. A CPU-only build registers no GPU names, so there they are refused at once."""
    for name in ["auto", *mmv.algorithms("cpu")]:
        layer = mmv.Linear(4, 3, algorithm=name)
        assert layer.algorithm == name and layer(torch.randn(2, 4)).shape == (2, 3)
    if not mmv.has_cuda():
        with pytest.raises(ValueError, match="unknown algorithm 'tensor_core'"):
            mmv.Linear(4, 3, algorithm="tensor_core")
        return
    layer = mmv.Linear(4, 3, algorithm="tensor_core")
    with pytest.raises(RuntimeError, match="unknown algorithm 'tensor_core' for cpu"):
        layer(torch.randn(2, 4))
