"""Weight-only int8: every linear weight stored as int8 with one float scale per output channel.

A decode step multiplies one token's vector by every weight, so its time is
the time to stream the weights; int8 streams a quarter of float32's bytes.
Quantization is symmetric per output channel (row ``o`` of ``W`` (out, in)):
``scale[o] = max |W[o]| / 127`` and ``W_int8 = round(W / scale)``, so each
weight is off by at most half a step of its own row.

Three kernels multiply by it; :func:`fastest_int8_kernel` times them on this
machine and picks one per weight shape:

* ``"dequantize"``: ``F.linear(x, W_int8 * scale)``, the readable path: exactly
  weight-only, and slow (it re-forms the float weight every call);
* ``"int8pack"``: PyTorch's weight-only ``torch._weight_int8pack_mm``, the
  same numbers as dequantize up to float rounding;
* ``"dynamic"``: the x86/fbgemm dynamic quantized linear, which also rounds
  each call's activations to 8 bits (per tensor, computed on the fly); its
  int8 x int8 products are the fastest here, at a small cost in accuracy
  that ``benchmarks/precision.py`` measures.

Shapes: B = batch, T = tokens, in / out = the weight's features.
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnlab.nn.layout import pass_seconds

Int8Kernel = Literal["dynamic", "int8pack", "dequantize"]
INT8_KERNELS: tuple[Int8Kernel, ...] = ("dynamic", "int8pack", "dequantize")
_CHOSEN: dict[tuple[int, int], Int8Kernel] = {}
STREAM_BYTES = 128 * 2**20  # int8 weights that together exceed the caches, as a decode step meets them


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_int8 (out, in), scale (out,) float32): symmetric, per output channel. A row of zeros gets scale 1."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)  # (out,)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)  # (out, in)
    return q, scale


def available_kernels() -> tuple[Int8Kernel, ...]:
    """The kernels this PyTorch build has, readable path last."""
    found: list[Int8Kernel] = []
    if {"x86", "fbgemm"} & set(torch.backends.quantized.supported_engines):
        found.append("dynamic")
    if hasattr(torch, "_weight_int8pack_mm"):
        found.append("int8pack")
    return (*found, "dequantize")


def _pack(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.ScriptObject:
    """The dynamic kernel's packed weight (and bias), from our own int8 values and scales."""
    with warnings.catch_warnings():
        # PyTorch 2.13 deprecates making quantized tensors (pytorch/pytorch#184982); the x86 dynamic linear
        # still takes its int8 weight as one, and it is the int8 kernel that streams fastest on x86 CPUs.
        # This one warning is silenced here and nowhere else; the suite runs with warnings as errors.
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel")
        qw = torch._make_per_channel_quantized_tensor(q, scale.double(), torch.zeros_like(scale, dtype=torch.long), 0)
    packed: torch.ScriptObject = torch.ops.quantized.linear_prepack(qw, None if bias is None else bias.detach().float())
    return packed


class Int8Linear(nn.Module):
    """A linear layer with an int8 weight and one scale per output channel; float32 activations in and out.

    Args:
        linear: the float32 ``nn.Linear`` to quantize (any layout).
        kernel: one of :data:`INT8_KERNELS` (:func:`fastest_int8_kernel` picks one by measuring).
    """

    weight_int8: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, *, linear: nn.Linear, kernel: Int8Kernel) -> None:
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"Int8Linear quantizes an nn.Linear, got {type(linear).__name__}")
        if linear.weight.dtype != torch.float32:
            raise TypeError(
                f"int8 quantization starts from float32 weights, got {linear.weight.dtype}; call .float() first"
            )
        if kernel not in available_kernels():
            raise ValueError(f"kernel must be one of {available_kernels()} in this PyTorch build, got {kernel!r}")
        self.in_features, self.out_features, self.kernel = linear.in_features, linear.out_features, kernel
        q, scale = quantize_rows(linear.weight)
        self.register_buffer("weight_int8", q)  # (out, in)
        self.register_buffer("scale", scale)  # (out,)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)
        self._packed = _pack(q, scale, bias) if kernel == "dynamic" else None
        self.dtype = torch.float32  # what it takes and returns

    def dequantized(self) -> torch.Tensor:
        """The float weight (out, in) these int8 values stand for."""
        return self.weight_int8.float() * self.scale[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise TypeError(f"an int8 linear takes float32 activations, got {x.dtype}")
        if self.kernel == "dynamic" and x.device.type != "cpu":
            raise ValueError(
                f"the 'dynamic' int8 kernel runs on the CPU and its packed weight stays there; got input on "
                f"{x.device}: quantize with kernel='int8pack' or 'dequantize' there"
            )
        flat = x.reshape(-1, self.in_features)  # (B, T, in) -> (B*T, in)
        if self.kernel == "dynamic":
            assert self._packed is not None
            out = torch.ops.quantized.linear_dynamic(flat, self._packed, reduce_range=True)  # bias packed in
        elif self.kernel == "int8pack":
            out = torch._weight_int8pack_mm(flat.contiguous(), self.weight_int8, self.scale)
            out = out if self.bias is None else out + self.bias
        else:
            out = F.linear(flat, self.dequantized(), self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)  # (B*T, out) -> (B, T, out)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel!r}"


def int8_stream_rates(d_in: int, d_out: int, *, repeats: int = 5) -> dict[Int8Kernel, float]:
    """GB/s of int8 weight each available kernel streams for one float32 vector through (d_out, d_in) weights:
    the median of ``repeats`` passes over copies that together exceed the caches (at most 32 copies)."""
    size = d_in * d_out
    copies = min(32, max(1, -(-STREAM_BYTES // size)))
    x = torch.randn(1, d_in)
    rates: dict[Int8Kernel, float] = {}
    with torch.no_grad():
        for kernel in available_kernels():
            layers = [Int8Linear(linear=nn.Linear(d_in, d_out, bias=False), kernel=kernel) for _ in range(copies)]
            rates[kernel] = copies * size / pass_seconds([partial(m, x) for m in layers], repeats) / 1e9
            del layers
    return rates


def fastest_int8_kernel(d_in: int, d_out: int) -> Int8Kernel:
    """The kernel that streams a (d_out, d_in) int8 weight fastest here, measured once per shape and kept."""
    key = (d_in, d_out)
    if key not in _CHOSEN:
        rates = int8_stream_rates(d_in, d_out)
        _CHOSEN[key] = max(rates, key=rates.__getitem__)
    return _CHOSEN[key]


def quantize_linears(module: nn.Module, kernel: Int8Kernel | Literal["auto"] = "auto") -> dict[str, Int8Kernel]:
    """Replace every ``nn.Linear`` inside ``module`` by an :class:`Int8Linear`, in place; the kernel each got."""
    if kernel != "auto" and kernel not in available_kernels():
        raise ValueError(f"kernel must be 'auto' or one of {available_kernels()} in this PyTorch build, got {kernel!r}")
    chosen: dict[str, Int8Kernel] = {}
    for name, sub in list(module.named_modules()):
        for child_name, child in list(sub.named_children()):
            if isinstance(child, nn.Linear):
                pick = fastest_int8_kernel(child.in_features, child.out_features) if kernel == "auto" else kernel
                setattr(sub, child_name, Int8Linear(linear=child, kernel=pick))
                chosen[f"{name}.{child_name}" if name else child_name] = pick
    return chosen
