"""Bad input is refused with a precise message, never a crash or a wrong result; torch.compile
refuses it while tracing, with eager mode's message."""
from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_mm_variants as mmv
from conftest import gpu_available


def raises(match):
    return pytest.raises(RuntimeError, match=match)


def test_not_a_matrix():
    with raises(r"a must be a matrix, got a 3-D tensor"):  # the op; the wrapper batches 3-D
        torch.ops.mm_variants.matmul(torch.randn(2, 3, 4), torch.randn(4, 5))
    with raises(r"torch_mm_variants.matmul: a must be a matrix \[M, K\] or a batch of matrices "
                r"\[B, M, K\], got a 4-D tensor"):
        mmv.matmul(torch.randn(2, 2, 3, 4), torch.randn(4, 5))
    with raises(r"b must be a matrix, got a 1-D tensor"):
        mmv.matmul(torch.randn(2, 3), torch.randn(3))


@pytest.mark.parametrize("a_shape,a_dim,b_shape,b_dim", [
    ((3, 2, 3), 0, (3, 3), 0),  # each entry: a matrix times a vector
    ((3, 4), 0, (3, 4, 5), 0),  # a vector times a matrix
    ((3, 2, 4), 0, (2, 4, 5), None),  # a shared b of three dimensions
    ((3, 2, 2, 4), 0, (4, 5), None),  # a of three dimensions (the op itself does not batch)
    ((0, 2, 3), 0, (0, 3), 0),  # no entries: refused all the same
])
def test_vmap_refuses_like_eager(a_shape, a_dim, b_shape, b_dim):
    """Under torch.vmap, matmul refuses entries that are not two matrices with eager mode's
    message for one entry, rather than computing something else."""
    op = torch.ops.mm_variants.matmul
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    a_entry = a if a_dim is None else torch.empty(a_shape[1:])
    b_entry = b if b_dim is None else torch.empty(b_shape[1:])
    with pytest.raises(RuntimeError) as refused:
        op(a_entry, b_entry)
    with raises(re.escape(str(refused.value))):
        torch.vmap(op, in_dims=(a_dim, b_dim))(a, b)


@pytest.mark.parametrize("op,shapes,in_dims", [
    (torch.ops.mm_variants.matmul, [(3, 2, 4), (3, 5, 6)], (0, 0)),  # K differs
    (torch.ops.mm_variants.matmul, [(3, 2, 4), (5, 6)], (0, None)),
    (torch.ops.mm_variants.bmm, [(5,), (3, 4)], (0, None)),  # scalar entries
    (torch.ops.mm_variants.bmm, [(5, 2, 2, 3), (5, 3, 3, 4)], (0, 0)),  # batch sizes differ
    (torch.ops.mm_variants.bmm, [(3, 2, 2, 4), (3, 2, 5, 6)], (0, 0)),  # K differs
    (torch.ops.mm_variants.linear, [(7,), (5, 7)], (0, None)),  # scalar x: 7 of them, K = 7
    (torch.ops.mm_variants.linear, [(3, 2, 4), (5, 6)], (0, None)),  # K differs
])
def test_vmap_of_every_op_refuses_like_eager(op, shapes, in_dims):
    """Under torch.vmap, each op refuses entries with eager mode's message for one entry: not
    with the sizes of the whole batch, and not by computing something else (seven scalars x
    against a weight [5, 7] read as one row of K = 7 gave one output of 5 for 7 entries)."""
    inputs = [torch.randn(shape) for shape in shapes]
    entries = [t if d is None else t.select(d, 0) for t, d in zip(inputs, in_dims)]
    with pytest.raises(RuntimeError) as refused:
        op(*entries)
    with raises(re.escape(str(refused.value))):
        torch.vmap(op, in_dims=in_dims)(*inputs)


@pytest.mark.parametrize("value", [[[1.0, 2.0, 3.0]], 2.0, None], ids=["list", "float", "none"])
def test_non_tensor_arguments_are_refused_by_name(value):
    """The Python wrappers refuse a non-tensor argument as torch.mm does, with a TypeError that
    names the argument and what it was (the wrapper read a.dim() of it, an AttributeError; the
    op's own answer is a RuntimeError)."""
    x, w = torch.randn(2, 3), torch.randn(4, 3)
    kind = type(value).__name__

    def refused(where):
        return pytest.raises(TypeError, match=re.escape(where) + rf" must be Tensor, not {kind}$")

    with refused("torch_mm_variants.matmul(): argument 'a' (position 1)"):
        mmv.matmul(value, w.t())
    with refused("torch_mm_variants.matmul(): argument 'b' (position 2)"):
        mmv.matmul(x, value)
    with refused("torch_mm_variants.linear(): argument 'x' (position 1)"):
        mmv.linear(value, w)
    with refused("torch_mm_variants.linear(): argument 'weight' (position 2)"):
        mmv.linear(x, value)
    if value is not None:  # no bias
        with refused("torch_mm_variants.linear(): argument 'bias' (position 3)"):
            mmv.linear(x, w, value)
    with refused("torch_mm_variants.Linear.forward(): argument 'x' (position 1)"):
        mmv.Linear(3, 4)(value)


def test_objects_that_override_torch_functions_pass_the_wrappers():
    """As torch's functions do, the wrappers let an object with __torch_function__ through to the
    op, which hands the call to it."""
    class Overrides:
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return "overridden"

    assert mmv.linear(Overrides(), torch.randn(4, 3)) == "overridden"
    assert mmv.Linear(3, 4)(Overrides()) == "overridden"


def test_shapes_cannot_be_multiplied():
    with raises(r"shapes cannot be multiplied \(2x3 and 4x5\)"):
        mmv.matmul(torch.randn(2, 3), torch.randn(4, 5))


@pytest.mark.parametrize("to_layout", [torch.Tensor.to_sparse, torch.Tensor.to_sparse_csr,
                                       torch.Tensor.to_mkldnn], ids=["coo", "csr", "mkldnn"])
def test_non_strided_operands_are_refused_by_name(to_layout):
    x, w = torch.randn(3, 4), torch.randn(5, 4)
    message = r"must be a dense \(strided\) tensor, got layout .*; convert it with .to_dense\(\)"
    with raises(r"linear: weight " + message):
        mmv.linear(x, to_layout(w))
    with raises(r"linear: x " + message):
        mmv.linear(to_layout(x), w)
    with raises(r"linear: bias " + message):
        mmv.linear(x, w, to_layout(torch.randn(5)) if to_layout is not torch.Tensor.to_sparse_csr
                   else torch.randn(5).to_sparse())  # CSR needs two dimensions
    with raises(r"bmm: b " + message):
        mmv.matmul(torch.randn(2, 3, 4), to_layout(w.t().contiguous()))
    # matmul's kernels are registered per dispatch key: these layouts have keys of their own.
    with raises(r"matmul: a " + message):
        mmv.matmul(to_layout(x), w.t())
    with raises(r"matmul: b " + message):
        mmv.matmul(x, to_layout(w.t().contiguous()))
    with raises(r"matmul: a " + message):
        mmv.matmul(to_layout(x), w.t().contiguous().requires_grad_())


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=["strided", "jagged"])
def test_nested_tensors_are_refused_by_name(layout):
    """A nested tensor of either layout is refused by name by the wrappers and by the ops. A
    strided one stopped at the dispatcher's "Could not run ... 'NestedTensorCPU' backend" (or,
    with a weight that requires grad, "NestedTensorImpl doesn't support sizes"), a jagged one at
    "NotImplementedError: mm_variants.linear.default"."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the strided layout's "prototype stage" warning
        nested = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=layout)
    w = torch.randn(5, 3)
    wrapped = rf"\(\): argument 'x' \(position 1\) is a nested tensor \(layout {layout}\); " \
              r"nested tensors are not supported"
    with raises(r"torch_mm_variants\.linear" + wrapped):
        mmv.linear(nested, w)
    with raises(r"torch_mm_variants\.Linear\.forward" + wrapped):
        mmv.Linear(3, 5)(nested)  # its parameters require grad
    with raises(r"torch_mm_variants\.matmul" + wrapped.replace("'x'", "'a'")):
        mmv.matmul(nested, w.t())
    with raises(r"torch_mm_variants\.matmul\(\): argument 'b' \(position 2\) is a nested"):
        mmv.matmul(w, nested)
    # The ops' autograd kernels refuse either layout before anything reads its sizes (a jagged
    # one, a tensor subclass, would otherwise reach its own dispatch, which has no rule for them).
    op = r"is a nested tensor; nested tensors are not supported"
    with raises(r"mm_variants::matmul: a " + op):
        torch.ops.mm_variants.matmul(nested, w.t())
    with raises(r"mm_variants::bmm: a " + op):
        torch.ops.mm_variants.bmm(nested, w.t())
    with raises(r"mm_variants::linear: x " + op):
        torch.ops.mm_variants.linear(nested, w)
    with raises(r"mm_variants::linear: weight " + op):
        torch.ops.mm_variants.linear(w, nested)
    # With a gradient to record, the autograd kernel checks before its node reads any sizes.
    w.requires_grad_()
    with raises(r"mm_variants::matmul: a " + op):
        torch.ops.mm_variants.matmul(nested, w.t())
    with raises(r"mm_variants::bmm: b " + op):
        torch.ops.mm_variants.bmm(w.unsqueeze(0), nested)
    with raises(r"mm_variants::linear: x " + op):
        torch.ops.mm_variants.linear(nested, w)
    # Under inference_mode no autograd kernel runs first: a jagged operand reaches its subclass's
    # dispatch, a strided one the ops' nested-tensor registrations, and both refuse it by name.
    with torch.inference_mode():
        with raises(r"mm_variants::matmul: b " + op):
            torch.ops.mm_variants.matmul(w, nested)
        with raises(r"mm_variants::bmm: a " + op):
            torch.ops.mm_variants.bmm(nested, w.t())
        with raises(r"mm_variants::linear: weight " + op):
            torch.ops.mm_variants.linear(w, nested)
        with raises(r"mm_variants::linear: bias " + op):
            torch.ops.mm_variants.linear(w, w, nested)


# The rest of every dtype refusal: the dtypes the ops take.
SUPPORTED_DTYPES = "; supported: Float, Half, BFloat16 (and Double on the CPU)"


def test_quantized_operands_are_refused_by_name():
    """A quantized tensor has a dispatch key of its own too; each op names its dtype."""
    q = torch.quantize_per_tensor(torch.randn(3, 4), 0.1, 0, torch.qint8)
    with raises(re.escape("mm_variants::matmul: unsupported dtype QInt8" + SUPPORTED_DTYPES)):
        mmv.matmul(q, q.t())
    with raises(re.escape("mm_variants::linear: unsupported dtype QInt8" + SUPPORTED_DTYPES)):
        mmv.linear(q, q)
    with raises(re.escape("mm_variants::bmm: unsupported dtype QInt8" + SUPPORTED_DTYPES)):
        mmv.matmul(q.unsqueeze(0), q.t())


def test_different_dtypes():
    with raises(re.escape("mm_variants::matmul: expected a and b to have the same dtype, but got: "
                          "Float != Double")):
        mmv.matmul(torch.randn(2, 3), torch.randn(3, 4, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64, torch.uint8])
def test_unsupported_dtype(dtype):
    """The refusal names the dtype given, as the op's messages write it (Int, Long, ...)."""
    a = torch.ones(2, 3, dtype=dtype)
    name = mmv._C.dtype_name(dtype)
    with raises(re.escape(f"mm_variants::matmul: unsupported dtype {name}" + SUPPORTED_DTYPES)):
        mmv.matmul(a, torch.ones(3, 4, dtype=dtype))


def test_unknown_algorithm_lists_valid_ones():
    valid = ", ".join(["auto"] + mmv.algorithms("cpu"))
    with raises(rf"unknown algorithm 'fastest' for cpu; valid algorithms: {valid}"):
        mmv.matmul(torch.randn(2, 3), torch.randn(3, 4), "fastest")


def test_names_with_control_characters_are_quoted_whole():
    """A NUL in a name would end the message there; it is escaped, and the valid names follow."""
    a, b = torch.randn(2, 3), torch.randn(3, 4)
    with raises(r"unknown algorithm 'naive\\x00x\\x1b' for cpu; valid algorithms: auto, "):
        torch.ops.mm_variants.matmul(a, b, "naive\x00x\x1b")
    with raises(r"unknown activation 're\\x00lu'; valid: none, relu"):
        torch.ops.mm_variants.linear(a, b.t(), None, "re\x00lu", "auto")


@pytest.mark.skipif(not (mmv.has_cuda() and torch.cuda.is_available()), reason="needs a GPU")
def test_different_devices():
    gpu = f"cuda:{torch.cuda.current_device()}"
    message = "mm_variants::matmul: expected a and b on the same device, but found {} and {}"
    with raises(re.escape(message.format(gpu, "cpu"))):
        mmv.matmul(torch.randn(2, 3, device="cuda"), torch.randn(3, 4))
    with raises(re.escape(message.format("cpu", gpu))):
        mmv.matmul(torch.randn(2, 3), torch.randn(3, 4, device="cuda"))


@pytest.mark.skipif(not (mmv.has_cuda() and torch.cuda.is_available()), reason="needs a GPU")
def test_float64_on_cuda_is_refused_by_name():
    a = torch.randn(4, 4, device="cuda", dtype=torch.float64)
    name = mmv.algorithms("cuda")[0]
    supported = ", ".join(mmv._C.algorithm_dtypes("cuda", name))
    with raises(re.escape(f"mm_variants::matmul: algorithm '{name}' does not support dtype Double "
                          f"on cuda; it supports: {supported}")):
        mmv.matmul(a, a, name)
    with raises(re.escape(f"mm_variants::matmul: no algorithm on cuda:"
                          f"{torch.cuda.current_device()} supports dtype Double")):
        mmv.matmul(a, a)


def test_algorithms_listing():
    names = mmv.algorithms("cpu")
    assert names[:2] == ["naive", "coalescing"]
    assert mmv.algorithms(torch.device("cpu")) == names
    assert len(set(names)) == len(names) and "auto" not in names
    if not mmv.has_cuda():
        assert mmv.algorithms("cuda") == []


# ---- torch.compile refuses what eager mode refuses -------------------------------------------

matmul_op, linear_op, bmm_op = (torch.ops.mm_variants.matmul, torch.ops.mm_variants.linear,
                                torch.ops.mm_variants.bmm)


def operand(*shape, dtype=torch.float32, device="cpu"):
    """An input of a refusal case, made when the test runs (CUDA ones only on a GPU)."""
    return shape, dtype, device


def refusal(name, call, *operands):
    on_gpu = any(device != "cpu" for _, _, device in operands)
    return pytest.param(call, operands, id=name, marks=pytest.mark.skipif(
        on_gpu and not gpu_available(), reason="needs a GPU"))


F64, I64 = torch.float64, torch.int64
REFUSALS = [
    refusal("matmul-a-3d", lambda a, b: matmul_op(a, b), operand(2, 3, 4), operand(4, 5)),
    refusal("matmul-b-1d", lambda a, b: matmul_op(a, b), operand(2, 3), operand(3)),
    refusal("matmul-inner", lambda a, b: matmul_op(a, b), operand(2, 3), operand(4, 5)),
    refusal("matmul-dtypes", lambda a, b: matmul_op(a, b), operand(2, 3), operand(3, 4, dtype=F64)),
    refusal("matmul-int", lambda a, b: matmul_op(a, b), operand(2, 3, dtype=I64),
            operand(3, 4, dtype=I64)),
    refusal("matmul-unknown-algorithm", lambda a, b: matmul_op(a, b, "fastest"), operand(2, 3),
            operand(3, 4)),
    refusal("matmul-devices", lambda a, b: matmul_op(a, b), operand(2, 3),
            operand(3, 4, device="cuda")),
    refusal("matmul-cuda-double-named", lambda a, b: matmul_op(a, b, "naive"),
            operand(2, 3, dtype=F64, device="cuda"), operand(3, 4, dtype=F64, device="cuda")),
    refusal("matmul-cuda-double-auto", lambda a, b: matmul_op(a, b),
            operand(2, 3, dtype=F64, device="cuda"), operand(3, 4, dtype=F64, device="cuda")),
    refusal("linear-weight-1d", lambda x, w: linear_op(x, w), operand(2, 3), operand(3)),
    refusal("linear-x-0d", lambda x, w: linear_op(x, w), operand(), operand(4, 3)),
    refusal("linear-dtypes", lambda x, w: linear_op(x, w), operand(2, 3), operand(4, 3, dtype=F64)),
    refusal("linear-inner", lambda x, w: linear_op(x, w), operand(2, 3), operand(5, 4)),
    refusal("linear-bias-length", lambda x, w, b: linear_op(x, w, b), operand(2, 3), operand(4, 3),
            operand(3)),
    refusal("linear-bias-2d", lambda x, w, b: linear_op(x, w, b), operand(2, 3), operand(4, 3),
            operand(1, 4)),
    refusal("linear-bias-dtype", lambda x, w, b: linear_op(x, w, b), operand(2, 3), operand(4, 3),
            operand(4, dtype=F64)),
    refusal("linear-activation", lambda x, w: linear_op(x, w, None, "tanh"), operand(2, 3),
            operand(4, 3)),
    refusal("linear-unknown-algorithm", lambda x, w: linear_op(x, w, None, "none", "fastest"),
            operand(2, 3), operand(4, 3)),
    refusal("linear-int", lambda x, w: linear_op(x, w), operand(2, 3, dtype=I64),
            operand(4, 3, dtype=I64)),
    refusal("linear-devices", lambda x, w: linear_op(x, w), operand(2, 3),
            operand(4, 3, device="cuda")),
    refusal("linear-bias-device", lambda x, w, b: linear_op(x, w, b), operand(2, 3),
            operand(4, 3), operand(4, device="cuda")),
    refusal("linear-cuda-double-named", lambda x, w: linear_op(x, w, None, "none", "naive"),
            operand(2, 3, dtype=F64, device="cuda"), operand(4, 3, dtype=F64, device="cuda")),
    refusal("bmm-a-2d", lambda a, b: bmm_op(a, b), operand(2, 3), operand(3, 4)),
    refusal("bmm-b-4d", lambda a, b: bmm_op(a, b), operand(2, 2, 3), operand(1, 2, 3, 4)),
    refusal("bmm-batches", lambda a, b: bmm_op(a, b), operand(2, 2, 3), operand(3, 3, 4)),
    refusal("bmm-inner", lambda a, b: bmm_op(a, b), operand(2, 2, 3), operand(2, 4, 5)),
    refusal("bmm-dtypes", lambda a, b: bmm_op(a, b), operand(2, 2, 3), operand(3, 4, dtype=F64)),
    refusal("bmm-int", lambda a, b: bmm_op(a, b), operand(2, 2, 3, dtype=I64),
            operand(3, 4, dtype=I64)),
    refusal("bmm-unknown-algorithm", lambda a, b: bmm_op(a, b, "fastest"), operand(2, 2, 3),
            operand(3, 4)),
    refusal("bmm-empty-batch-unknown-algorithm", lambda a, b: bmm_op(a, b, "fastest"),
            operand(0, 2, 3), operand(0, 3, 4)),
    refusal("bmm-devices", lambda a, b: bmm_op(a, b), operand(2, 2, 3),
            operand(3, 4, device="cuda")),
]


def eager_refusal(call, operands):
    """The inputs, and the message with which eager mode refuses them."""
    tensors = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in operands]
    with pytest.raises(RuntimeError) as refused:
        call(*tensors)
    return tensors, str(refused.value)


@pytest.mark.parametrize("call,operands", REFUSALS)
def test_refusals_name_the_op_called(request, call, operands):
    """linear and bmm run matmul's checks of dtype and algorithm on the product they choose for,
    in their own name: a linear refused for its dtype says mm_variants::linear."""
    op = request.node.callspec.id.split("-")[0]
    assert eager_refusal(call, operands)[1].startswith(f"mm_variants::{op}: ")


@pytest.mark.parametrize("call,operands", REFUSALS)
def test_fake_kernel_refuses_like_eager(call, operands):
    tensors, message = eager_refusal(call, operands)
    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(t) for t in tensors]
        with pytest.raises(RuntimeError) as refused:
            call(*fakes)
    assert str(refused.value) == message


@pytest.mark.parametrize("call,operands", REFUSALS)
def test_compile_refuses_like_eager_while_tracing(call, operands):
    """fullgraph=True: the refusal comes from tracing (the fake kernel), not from a first run."""
    tensors, message = eager_refusal(call, operands)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError) as refused:
        torch.compile(call, fullgraph=True, backend="eager")(*tensors)
    assert message in str(refused.value)


def test_fake_kernels_refuse_mixed_devices():
    """The device checks, which eager mode reaches only with a GPU; fake CUDA tensors need none."""
    with FakeTensorMode():
        cpu, gpu = torch.empty(2, 3), torch.empty(4, 3, device="cuda")
        with raises(re.escape("mm_variants::matmul: expected a and b on the same device, but "
                              "found cpu and cuda:0")):
            mmv.matmul(cpu, gpu.t())
        with raises(re.escape("mm_variants::bmm: expected a and b on the same device, but "
                              "found cpu and cuda:0")):
            mmv.matmul(cpu.expand(5, 2, 3), gpu.t())
        with raises(re.escape("mm_variants::linear: expected x and weight on the same device, "
                              "but found cpu and cuda:0")):
            mmv.linear(cpu, gpu)
        with raises(re.escape("mm_variants::linear: expected bias on the device of weight, but "
                              "found cuda:0 and cpu")):
            mmv.linear(cpu, torch.empty(4, 3), torch.empty(4, device="cuda"))


def test_meta_tensors_skip_the_algorithm_lookup():
    """On the meta device the fake kernel is the kernel, and there are no kernels to look a name
    up in: shapes come back for a named algorithm."""
    a, b = torch.empty(3, 4, device="meta"), torch.empty(4, 5, device="meta")
    assert mmv.matmul(a, b, "naive").shape == (3, 5)
    assert mmv.linear(a, b.t(), algorithm="naive").shape == (3, 5)
    assert mmv.matmul(a.expand(2, 3, 4), b, "naive").shape == (2, 3, 5)
