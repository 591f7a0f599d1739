"""Weight-only int8: every linear weight stored as int8 with one float scale per output channel.

A decode step multiplies one token's vector by every weight, so its time is
the time to stream the weights; int8 streams a quarter of float32's bytes.
Quantization is symmetric per output channel (row ``o`` of ``W`` (out, in)):
``scale[o] = max |W[o]| / 127`` and ``W_int8 = round(W / scale)``, so each
weight is off by at most half a step of its own row.

Four kernels multiply by it; :func:`attnlab.linear.int8_choice.fastest_int8_kernel`
times them on this machine and picks one per weight shape:

* ``"dequantize"``: ``F.linear(x, W_int8 * scale)``, the readable path: exactly
  weight-only, and slow (it re-forms the float weight every call);
* ``"int8pack"``: PyTorch's weight-only ``torch._weight_int8pack_mm``, the
  same numbers as dequantize up to float rounding;
* ``"gemv"``: weight-only too: a decode step's few rows by a loop that
  torch.compile writes (:mod:`attnlab.linear.gemv`: each int8 weight read once,
  widened and scaled in registers), more rows (a prompt) by dequantizing the
  weight and oneDNN's product; dequantize's numbers to float rounding, and
  within the loop's rows a row's numbers never depend on the other rows of
  the call (past them, the product's differ from the loop's by rounding);
* ``"dynamic"``: the x86/fbgemm dynamic quantized linear, which also rounds
  the activations to 7 bits on the fly, each token (row) with its own scale
  and zero point, so a token's output never depends on the other tokens of
  the call (issue 30): a prompt, a batch, a speculative check and a decode
  step give each token the same numbers. One row (a decode step) goes to
  ``quantized.linear_dynamic`` itself; several rows are rounded here with
  the scale and zero point it would choose for each row alone (by one kernel
  Inductor compiles per width and power of two of rows, on first use, in
  float32 with its product and sum contracted into fbgemm's fma, checked
  bitwise against the readable ops before it is used), multiplied with
  ``torch._int_mm`` and finished with its float epilogue (one more such
  kernel, checked the same way), bitwise what it gives row by row (checked
  once per process; where it is not, the rows run one by one). Its int8 x int8 products are the fastest here, at a small
  cost in accuracy that ``benchmarks/precision.py`` measures. Its packed
  weight is derived from ``weight_int8``, ``scale`` and ``bias``: it is
  packed again when any of them changes (``load_state_dict``, an in-place
  edit, a new tensor).

A prompt's rows (more than :data:`~attnlab.linear.gemv.INT8_ROWS`, the most a
decode step's loop takes) go where ``prompt`` says: ``"dequantized"``, the
kernel's own many-row path above (``quantize(kernel=...)`` named: that kernel's
numbers throughout), or ``"dynamic"``, the dynamic kernel's int8 x int8
products, each row rounded on its own (what ``quantize("int8")``'s "auto"
chooses where the build has that kernel: a weight-only prompt dequantizes every
weight at every call and then multiplies in float32, slower than float32 itself;
the int8 products ran 3.5x faster than it here, issue 58). A decode step's rows
keep the one-row kernel chosen for the weight.

Shapes: B = batch, T = tokens, N = rows (B*T), in / out = the weight's features.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnlab.linear.gemv import INT8_ROWS, gemv, gemv_applies, why_no_gemv
from attnlab.linear.int8_rows import _fma_row, _per_row
from attnlab.linear.products import _transformed, onednn_linear

Int8Kernel = Literal["dynamic", "int8pack", "gemv", "dequantize"]
INT8_KERNELS: tuple[Int8Kernel, ...] = ("dynamic", "int8pack", "gemv", "dequantize")
PromptPath = Literal["dequantized", "dynamic"]  # a prompt's rows: the kernel's own path, or int8 x int8 products
SLICE_BYTES = 8 * 2**20  # the gemv kernel's float slice of a weight, for many rows


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_int8 (out, in), scale (out,) float32): symmetric, per output channel. A row of zeros gets scale 1."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)  # (out,)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)  # (out, in)
    return q, scale


def _built_in() -> list[Int8Kernel]:
    """The kernels this PyTorch build has as ops (no compiling needed)."""
    found: list[Int8Kernel] = []
    if {"x86", "fbgemm"} & set(torch.backends.quantized.supported_engines):
        found.append("dynamic")
    if hasattr(torch, "_weight_int8pack_mm"):
        found.append("int8pack")
    return found


def available_kernels() -> tuple[Int8Kernel, ...]:
    """The kernels this PyTorch build and machine have, readable path last ("gemv" where its loop builds)."""
    gemv_here: list[Int8Kernel] = [] if why_no_gemv() else ["gemv"]
    return (*_built_in(), *gemv_here, "dequantize")


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


_ROWS_MATCH: dict[str, bool] = {}  # per quantized engine: whether _per_row gives linear_dynamic's numbers here


def _rows_match_alone() -> bool:
    """Whether :func:`_per_row` gives, bitwise, what ``linear_dynamic`` gives each row alone with this engine:
    checked once per process on seeded rows of every kind (an odd width, a bias, all-positive, all-negative,
    near-ties that only fbgemm's fma rounds as it does)."""
    engine = torch.backends.quantized.engine
    if engine not in _ROWS_MATCH:
        generator = torch.Generator().manual_seed(0)
        linear = torch.nn.utils.skip_init(nn.Linear, 100, 37)  # no draw from the global generator
        with torch.no_grad():
            linear.weight.copy_(torch.randn(37, 100, generator=generator))
            linear.bias.copy_(torch.randn(37, generator=generator))
        layer = Int8Linear(linear=linear, kernel="dynamic")
        x = torch.randn(24, 100, generator=generator) * torch.rand(24, 1, generator=generator) * 4  # (N, in)
        x[1], x[2] = x[1].abs(), -x[2].abs()
        x[3, 0::2], x[3, 1::2], x[3, :2] = 0.5 + 2**-20, -1.5 - 2**-20, torch.tensor([-64.0, 63.0])  # fma's ties
        x[4] = _fma_row(100)  # values only one fma rounds as fbgemm does
        got, plain = _per_row(x, layer.weight_int8, layer.scale, layer.bias)
        _ROWS_MATCH[engine] = bool(plain.all()) and torch.equal(got, layer._alone(x))
    return _ROWS_MATCH[engine]


def _repack_after_load(module: nn.Module, incompatible_keys: object) -> None:
    """A load_state_dict post hook: the packed weight is built again from what was loaded (also into tensors
    made under torch.inference_mode, which keep no version to compare)."""
    assert isinstance(module, Int8Linear)  # registered by Int8Linear alone
    module._packed_from = ()


class Int8Linear(nn.Module):
    """A linear layer with an int8 weight and one scale per output channel; float32 activations in and out.

    Args:
        linear: the float32 ``nn.Linear`` to quantize (any layout).
        kernel: one of :data:`INT8_KERNELS` (:func:`fastest_int8_kernel` picks one by measuring).
        prompt: where a call of more rows than a decode step's goes: ``"dequantized"`` (the kernel's own path)
            or ``"dynamic"`` (the dynamic kernel's int8 x int8 products, each row rounded on its own).
    """

    weight_int8: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, *, linear: nn.Linear, kernel: Int8Kernel, prompt: PromptPath = "dequantized") -> None:
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"Int8Linear quantizes an nn.Linear, got {type(linear).__name__}")
        if linear.weight.dtype != torch.float32:
            raise TypeError(
                f"int8 quantization starts from float32 weights, got {linear.weight.dtype}; call .float() first"
            )
        _check_kernel(kernel)
        if prompt not in ("dequantized", "dynamic"):
            raise ValueError(f"prompt must be 'dequantized' or 'dynamic', got {prompt!r}")
        if prompt == "dynamic":
            _check_kernel("dynamic")
        self.in_features, self.out_features, self.kernel = linear.in_features, linear.out_features, kernel
        self.prompt = prompt
        q, scale = quantize_rows(linear.weight)
        self.register_buffer("weight_int8", q)  # (out, in)
        self.register_buffer("scale", scale)  # (out,)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)
        self._packed: torch.ScriptObject | None = None  # the dynamic kernel's
        self._packed_from: tuple[object, ...] = ()  # what it was packed from: see _sources
        self.register_load_state_dict_post_hook(_repack_after_load)
        if kernel == "dynamic":
            self.packed()  # now, so that a decode step never waits for it
        self.dtype = torch.float32  # what it takes and returns

    def dequantized(self) -> torch.Tensor:
        """The float weight (out, in) these int8 values stand for."""
        return self.weight_int8.float() * self.scale[:, None]

    def _sources(self) -> tuple[object, ...]:
        """weight_int8, scale and bias, each with its version and storage: an in-place edit, a new tensor or a
        new storage changes one. (A tensor made under torch.inference_mode keeps no version: read as -1.)"""
        found: list[object] = []
        for t in (self.weight_int8, self.scale, self.bias):
            found += [t, -1, 0] if t is None else [t, -1 if t.is_inference() else t._version, t.data_ptr()]
        return tuple(found)

    def packed(self) -> torch.ScriptObject:
        """The dynamic kernel's packed weight, packed again whenever its sources changed since it was packed."""
        sources = self._sources()
        same = len(sources) == len(self._packed_from) and all(
            a is b if isinstance(a, torch.Tensor) or a is None else a == b
            for a, b in zip(sources, self._packed_from, strict=False)
        )
        if self._packed is None or not same:
            self._packed = _pack(self.weight_int8, self.scale, self.bias)
            self._packed_from = sources
        return self._packed

    def _alone(self, flat: torch.Tensor) -> torch.Tensor:
        """(N, in) -> (N, out): ``linear_dynamic`` on each row by itself, so each row gets its own scale."""
        packed = self.packed()
        rows = [torch.ops.quantized.linear_dynamic(row[None], packed, reduce_range=True) for row in flat]  # (1, out)
        return torch.cat(rows) if rows else flat.new_empty(0, self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise TypeError(f"an int8 linear takes float32 activations, got {x.dtype}")
        if self.kernel == "dynamic" and x.device.type != "cpu":
            raise ValueError(
                f"the 'dynamic' int8 kernel runs on the CPU and its packed weight stays there; got input on "
                f"{x.device}: quantize with kernel='int8pack' or 'dequantize' there"
            )
        flat = x.reshape(-1, self.in_features)  # (B, T, in) -> (N, in)
        if self.kernel == "dynamic" and flat.shape[0] == 1:  # a decode step: the kernel itself, bias packed in
            out = torch.ops.quantized.linear_dynamic(flat, self.packed(), reduce_range=True)
        elif self.kernel == "dynamic" or self._prompt_int8(flat):
            out = self._rows_int8(flat)
        elif self.kernel == "gemv" and self._loop_fits(flat):
            out = gemv(flat, self.weight_int8, self.scale, self.bias)
        elif self.kernel == "gemv":  # a prompt's rows, a large batch: the float weight a slice at a time
            out = self._dequantized_product(flat)
        elif self.kernel == "int8pack":
            out = torch._weight_int8pack_mm(flat.contiguous(), self.weight_int8, self.scale)
            out = out if self.bias is None else out + self.bias
        else:
            out = F.linear(flat, self.dequantized(), self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)  # (N, out) -> (B, T, out)

    def _prompt_int8(self, flat: torch.Tensor) -> bool:
        """Whether these rows go to the int8 x int8 products of :meth:`_rows_int8`: a prompt's (more than a
        decode step's loop takes) where ``prompt`` says so, on the CPU, eager (a graph keeps the kernel's own
        path: the rows' check would break it), no gradient wanted (``_int_mm`` has none)."""
        many = flat.shape[0] > INT8_ROWS and flat.device.type == "cpu"
        eager = not torch.compiler.is_compiling() and not (torch.is_grad_enabled() and flat.requires_grad)
        return self.prompt == "dynamic" and many and eager and not _transformed(flat)

    def _rows_int8(self, flat: torch.Tensor) -> torch.Tensor:
        """(N, in) -> (N, out) by the dynamic kernel's int8 x int8 products: each row rounded with its own scale
        and zero point, bitwise what ``linear_dynamic`` gives it alone (:func:`_per_row` where it was checked to
        be, else row by row)."""
        if not _rows_match_alone():
            return self._alone(flat)
        out, plain = _per_row(flat, self.weight_int8, self.scale, self.bias)
        if not bool(plain.all()):
            out[~plain] = self._alone(flat[~plain])
        return out

    def _dequantized_product(self, flat: torch.Tensor) -> torch.Tensor:
        """(N, in) -> (N, out): ``F.linear`` with :meth:`dequantized`'s weight, made a slice of output rows at a
        time, so that no float copy of the whole weight is ever held (a vocabulary's is hundreds of MB)."""
        step = max(1, SLICE_BYTES // (4 * self.in_features))
        out = flat.new_empty(flat.shape[0], self.out_features)  # (N, out)
        for o0 in range(0, self.out_features, step):
            o1 = min(o0 + step, self.out_features)
            weight = self.weight_int8[o0:o1].float() * self.scale[o0:o1, None]  # (o1 - o0, in)
            bias = None if self.bias is None else self.bias[o0:o1]
            out[:, o0:o1] = onednn_linear(flat, weight, bias)
        return out

    def _loop_fits(self, flat: torch.Tensor) -> bool:
        """Whether the gemv kernel's loop takes these rows (a decode step's few, no gradient wanted)."""
        if torch.compiler.is_compiling():
            return flat.shape[0] <= INT8_ROWS and not torch.is_grad_enabled()
        return gemv_applies(flat, self.weight_int8) and not _transformed(flat)

    def extra_repr(self) -> str:
        said = f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel!r}"
        return said + (f", prompt={self.prompt!r}" if self.prompt != "dequantized" else "")


def _check_kernel(kernel: str) -> None:
    """Refuse a kernel this PyTorch build or machine lacks, naming what it has (and why "gemv" cannot run)."""
    if kernel == "gemv":
        if why_no_gemv():
            raise RuntimeError(f"the 'gemv' kernel cannot run here: {why_no_gemv()}; use kernel='auto'")
    elif kernel not in (*_built_in(), "dequantize"):  # without compiling gemv's probe, unless refusing
        raise ValueError(f"kernel must be one of {available_kernels()} in this PyTorch build, got {kernel!r}")
