"""nn.Linear on top of mm_variants::matmul, and a helper that swaps it into existing models."""
from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.nn.utils import parametrize

from . import _C
from .ops import ACTIVATIONS


def check_algorithm(name: str) -> str:
    """`name`, if it is "auto" or an algorithm registered for some device type; otherwise a
    ValueError that lists the valid names. A layer is built before it knows its device, so a name
    of another device's ladder passes here and is refused by the op on a device without it."""
    valid = ["auto", *_C.registered_algorithms()]
    if name not in valid:
        # A CPU-only build registers no CUDA rung: "unknown" means unknown to this build.
        raise ValueError(f"unknown algorithm {name!r}; valid algorithms in this build: "
                         f"{', '.join(valid)}")
    return name


def not_a_tensor(function: str, name: str, position: int, value) -> TypeError:
    """The TypeError, in torch.mm's words, for an argument `value` that is not a tensor."""
    return TypeError(f"{function}(): argument '{name}' (position {position}) must be Tensor, "
                     f"not {type(value).__name__}")


def check_tensor(function: str, name: str, position: int, value) -> None:
    """Refuses (TypeError) an argument that is not a tensor (a list, a NumPy array, a number) in
    torch.mm's words, before the wrapper reads it or the op answers with a RuntimeError. Objects
    that override torch functions (__torch_function__) pass, as torch's own functions let them.

    A nested tensor is refused by name too (RuntimeError, as the ops refuse it), here with the
    argument's position and layout, before the wrapper reads sizes a strided one does not have."""
    if not isinstance(value, torch.Tensor):
        if not hasattr(type(value), "__torch_function__"):
            raise not_a_tensor(function, name, position, value)
    elif value.is_nested:
        raise RuntimeError(f"{function}(): argument '{name}' (position {position}) is a nested "
                           f"tensor (layout {value.layout}); nested tensors are not supported "
                           "(multiply its unbind()'s tensors one by one)")


def check_matmul_operand(function: str, a) -> None:
    """Refuses an `a` that torch_mm_variants.matmul can take neither as a matrix [M, K] nor as a
    batch [B, M, K], naming both, where the op it would reach names the matrix only."""
    if isinstance(a, torch.Tensor) and a.dim() not in (2, 3):
        raise RuntimeError(f"{function}: a must be a matrix [M, K] or a batch of matrices "
                           f"[B, M, K], got a {a.dim()}-D tensor")


def check_activation(name: str) -> str:
    """`name`, if mm_variants::linear applies it; otherwise a ValueError that lists the valid
    names."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; valid activations: {', '.join(ACTIVATIONS)}")
    return name


class Linear(nn.Linear):
    """A drop-in for nn.Linear whose product runs through mm_variants::matmul.

    Same parameters and state dict as nn.Linear (weight [out_features, in_features], optional
    bias), so checkpoints load unchanged. The input may have any number of leading batch
    dimensions. The weight is read in place as weight.t(): no transposed copy is made. An
    optional activation ("relu", "gelu", "gelu_tanh", "silu") is applied with the bias, fused
    into the kernel where the kernel supports it (mm_variants::linear). An unknown `algorithm`
    or `activation` is refused (ValueError) when the layer is made or the name is assigned, not
    at its first call.

    TorchScript compiles it as it does nn.Linear (torch.jit.script). The checked setters of
    `algorithm` and `activation` stay Python's: forward reads the attributes behind them.
    """

    __jit_unused_properties__ = ["algorithm", "activation"]

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device=None, dtype=None, algorithm: str = "auto",
                 activation: str = "none") -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.algorithm = algorithm
        self.activation = activation

    @property
    def algorithm(self) -> str:
        return self._algorithm

    @algorithm.setter
    def algorithm(self, name: str) -> None:
        self._algorithm = check_algorithm(name)

    @property
    def activation(self) -> str:
        return self._activation

    @activation.setter
    def activation(self, name: str) -> None:
        self._activation = check_activation(name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():  # TorchScript checks the annotation itself
            check_tensor("torch_mm_variants.Linear.forward", "x", 1, x)
        return torch.ops.mm_variants.linear(x, self.weight, self.bias, self._activation,
                                            self._algorithm)

    def extra_repr(self) -> str:
        extra = f", activation={self.activation!r}" if self.activation != "none" else ""
        return f"{super().extra_repr()}, algorithm={self.algorithm!r}{extra}"

    @classmethod
    def from_linear(cls, linear: nn.Linear, algorithm: str = "auto") -> "Linear":
        """A Linear sharing `linear`'s parameters (no copy), in its training mode; a source that
        is a Linear itself keeps its activation.

        A layer whose weight or bias is computed from other parameters on every call is
        refused with a ValueError: a parametrized one (nn.utils.parametrizations.weight_norm),
        or one whose weight is no Parameter (the older nn.utils.weight_norm and spectral_norm,
        which recompute it in a forward pre-hook). The new layer would hold today's value, a
        frozen tensor that no optimizer updates. So is a subclass of nn.Linear with a forward
        of its own, which the new layer would not run (swap_linear leaves those as they are).
        """
        if parametrize.is_parametrized(linear) or not all(
                isinstance(p, nn.Parameter) for p in (linear.weight, linear.bias)
                if p is not None):
            raise ValueError("Linear.from_linear: the layer's weight is computed on every call "
                             "(it is parametrized, or no Parameter: e.g. weight_norm or "
                             "spectral_norm); remove that first, or keep the layer as it is")
        if type(linear).forward not in (nn.Linear.forward, Linear.forward):
            raise ValueError(f"Linear.from_linear: {type(linear).__name__} defines its own "
                             "forward, which the new layer would not run; keep the layer as "
                             "it is")
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        # Registered as nn.Linear registers them: a bias=False layer keeps an empty bias slot.
        new.register_parameter("weight", linear.weight)
        new.register_parameter("bias", linear.bias)
        new.algorithm = algorithm
        new.activation = linear.activation if isinstance(linear, Linear) else "none"
        new.train(linear.training)
        return new


def swap_linear(model: nn.Module, algorithm: str = "auto") -> nn.Module:
    """Turns, in place, every plain nn.Linear of `model` (at any depth, `model` itself included)
    into a torch_mm_variants.Linear, and returns the model.

    Each layer stays the same module object: its parameters (shared, not copied), buffers, hooks
    and state dict keys are kept; only its forward now runs through mm_variants::linear.
    Left as they are: subclasses of nn.Linear, which may define their own forward; parametrized
    layers (e.g. weight_norm, whose weight is computed on every call); layers that already are
    torch_mm_variants.Linear, which keep their algorithm (set `layer.algorithm` to change it);
    and, with a warning, layers whose forward was replaced on the instance (as accelerate's
    dispatch hooks do), which would go on running their own forward. An unknown `algorithm` is
    refused before any layer changes.
    """
    check_algorithm(algorithm)
    overridden = []
    for name, module in model.named_modules():
        if type(module) is not nn.Linear:
            continue
        if "forward" in vars(module):  # it would shadow Linear.forward after the swap
            overridden.append(name or "the model itself")
            continue
        module.__class__ = Linear
        module.algorithm, module.activation = algorithm, "none"
    if overridden:
        warnings.warn(f"swap_linear: left {len(overridden)} nn.Linear layer(s) as they are, "
                      f"whose forward is replaced on the instance (e.g. by accelerate's hooks) "
                      f"and would not run mm_variants::linear: {', '.join(overridden[:5])}"
                      f"{', ...' if len(overridden) > 5 else ''}")
    return model
