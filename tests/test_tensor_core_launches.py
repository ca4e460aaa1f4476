"""Which kernels the tensor-core rung launches, read from the profiler: linear's bias and activation
fused into its one kernel for nn.Linear's layout (and ATen's epilogue after the plain kernel for
other layouts), and a bmm batch in one launch, or one per 65535 entries past gridDim.y's limit.
The results themselves are checked in test_linear.py and test_bmm.py."""
from __future__ import annotations

import pytest
import torch

import torch_mm_variants as mmv
from conftest import TOLERANCE, assert_result, gpu_capability

ALGORITHM = "tensor_core"

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(gpu_capability() < (8, 0),
                       reason="needs a CUDA build and a GPU of compute capability 8.0 or newer"),
]


@pytest.fixture(autouse=True)
def no_poison(poison_outputs):
    """Output poisoning fills outputs with NaN by a kernel of its own; only the op's count here."""
    mmv._C.set_poison_outputs(False)


def kernel_names(fn) -> list[str]:
    """The names of the CUDA kernels that fn() launches, in order."""
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [e.name for e in sorted(kernels, key=lambda e: e.time_range.start)]


def tensor_core_kernels(names: list[str]) -> list[str]:
    return [name for name in names if "tensor_core_kernel" in name]


def aten_elementwise_kernels(names: list[str]) -> list[str]:
    """ATen's pointwise kernels, which an unfused bias or activation launches."""
    return [name for name in names if "elementwise_kernel" in name]


@pytest.mark.parametrize("activation", ["none", "relu", "gelu", "gelu_tanh", "silu"])
def test_linear_fuses_bias_and_activation_into_one_kernel(activation):
    torch.manual_seed(0)
    x = torch.randn(2, 50, 96, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(72, 96, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(72, device="cuda", dtype=torch.bfloat16)
    names = kernel_names(lambda: mmv.linear(x, weight, bias, activation, ALGORITHM))
    launched = tensor_core_kernels(names)
    assert len(launched) == 1 and "BiasActivation" in launched[0], names
    assert not aten_elementwise_kernels(names), names


def test_linear_other_layouts_apply_the_epilogue_after_the_plain_kernel():
    torch.manual_seed(0)
    x = torch.randn(50, 96, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(96, 72, device="cuda", dtype=torch.bfloat16).t()  # w.t() row-major
    bias = torch.randn(72, device="cuda", dtype=torch.bfloat16)
    names = kernel_names(lambda: mmv.linear(x, weight, bias, "gelu", ALGORITHM))
    launched = tensor_core_kernels(names)
    assert len(launched) == 1 and "NoEpilogue" in launched[0], names
    assert aten_elementwise_kernels(names), names


@pytest.mark.parametrize("shared_b", [False, True])
def test_bmm_runs_a_batch_in_one_launch(shared_b):
    """A batch whose entries' rows do not follow one another (here a is a transposed view)
    runs on the batched kernel, against its own b per entry or a shared one."""
    torch.manual_seed(0)
    a = torch.randn(40, 6, 96, device="cuda", dtype=torch.bfloat16).transpose(0, 1)
    b = torch.randn(*(() if shared_b else (6,)), 96, 24, device="cuda", dtype=torch.bfloat16)
    names = kernel_names(lambda: mmv.matmul(a, b, ALGORITHM))
    launched = tensor_core_kernels(names)
    assert len(launched) == 1 and "BatchStrides" in launched[0], names


def test_bmm_against_a_shared_b_runs_its_rows_as_one_product():
    """Entries whose rows follow one another against a shared b are one product of B * M rows:
    one launch of the single product's kernel."""
    torch.manual_seed(0)
    a = torch.randn(6, 40, 96, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(96, 24, device="cuda", dtype=torch.bfloat16)
    names = kernel_names(lambda: mmv.matmul(a, b, ALGORITHM))
    launched = tensor_core_kernels(names)
    assert len(launched) == 1 and "SingleEntry" in launched[0], names


def test_bmm_beyond_the_grid_limit_takes_one_launch_per_65535_entries():
    torch.manual_seed(0)
    batch = 2 * 65535 + 3
    a = torch.randn(batch, 2, 8, device="cuda", dtype=torch.float16)
    b = torch.randn(batch, 8, 8, device="cuda", dtype=torch.float16)
    names = kernel_names(lambda: mmv.matmul(a, b, ALGORITHM))
    launched = tensor_core_kernels(names)
    assert len(launched) == 3 and all("BatchStrides" in name for name in launched), names
    # Each entry on its own, with poisoning on: a launch that skips or repeats a few entries (the
    # third one has 3) would hide in the error of the whole batch.
    mmv._C.set_poison_outputs(True)
    out, ref = mmv.matmul(a, b, ALGORITHM), a.double() @ b.double()
    assert_result(out, ref, a.dtype, a.device, TOLERANCE[a.dtype])
    errors = (out.double() - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)
    worst = int(errors.argmax())
    assert errors[worst] <= TOLERANCE[a.dtype], f"entry {worst}: relative error {errors[worst]:.3e}"
