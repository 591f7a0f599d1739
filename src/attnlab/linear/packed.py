"""A weight reordered once into oneDNN's own blocked format and kept beside it: the "packed" layout (issue 37).

oneDNN's inner product (the "onednn" layout) takes a plain (out, in) weight,
but its bfloat16 kernels read weights in a blocked order of their own: pairs
of neighbouring inputs side by side, as the CPU's bfloat16 dot-product
instructions (AVX-512 BF16, AMX) take them, in blocks of outputs.
``torch.ops.mkldnn._reorder_linear_weight`` makes that order once (what
torch.compile's CPU backend does for frozen weights), and the product reads
it as it is. Given the plain weight, the same product reads a bfloat16
weight well short of twice as fast as a float32 one, which half the bytes
would allow; over the packed copy, faster (``benchmarks/stream_rates.py``
times every layout; its run on the machine of ``docs/benchmarks.md`` is
there). oneDNN reorders bfloat16 only on CPUs with AVX-512 (BW, VL, DQ):
elsewhere the layout is not offered for bfloat16.

The packed copy is kept beside the weight, not in its place: the parameter
stays a plain tensor that every other path reads (a gradient, a checkpoint,
the readable product, another device), at the cost of a second copy of the
weights' memory, as the dynamic int8 kernel keeps its packed weight. The
copy is derived from the weight: each call checks the weight's version
counter and storage, and packs again after an in-place edit, a
``load_state_dict``, a ``.to()`` or a new storage. A weight made under
``torch.inference_mode`` keeps no version, so its edits cannot be seen: it
is multiplied unpacked, never from a copy that may be stale. What no version
counter sees, neither does the copy: a write through ``weight.data`` (a
tensor with a counter of its own), numpy or DLPack. After such a write, call
``set_layout("packed")`` again, which packs every weight anew (as for the
dynamic int8 kernel, and the KV cache's vouch in ``attnlab.functional.finite``).

Under ``torch.compile`` the product is one opaque op, ``attnlab::packed_linear``,
which finds the copy when it runs, so a compiled step never holds a copy
from the time it was traced.

Shapes: N = rows (tokens), in / out = the weight's features.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from attnlab.linear.inductor import define_cpu_op, refuse_gradient

# weight -> (what it was packed from: version, address, shape, strides, dtype; the packed copy; the storage it
# was packed from, held so that no new storage can take its address while the copy is kept)
_PACKED: WeakIdKeyDictionary = WeakIdKeyDictionary()


PACKED_DTYPES = (torch.float32, torch.bfloat16)


def _can_reorder(dtype: torch.dtype) -> bool:
    mkldnn = torch.ops.mkldnn
    if not torch.backends.mkldnn.is_available():
        return False
    if not all(hasattr(mkldnn, op) for op in ("_reorder_linear_weight", "_linear_pointwise")):
        return False
    return dtype != torch.bfloat16 or bool(mkldnn._is_mkldnn_bf16_supported())


# facts of the build and the CPU, asked at every product: found once, at import (a dict torch.compile reads)
_REORDERS = {dtype: _can_reorder(dtype) for dtype in PACKED_DTYPES}


def packing_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this PyTorch build and CPU can reorder a ``dtype`` weight for oneDNN's inner product (the "packed"
    layout): float32 wherever oneDNN is built in, bfloat16 only where oneDNN has its AVX-512 path."""
    return _REORDERS.get(dtype, False)


def _source(weight: torch.Tensor) -> tuple[object, ...]:
    return (weight._version, weight.data_ptr(), tuple(weight.shape), weight.stride(), weight.dtype)


def reorder(weight: torch.Tensor) -> torch.Tensor:
    """A new copy of ``weight`` (out, in) in oneDNN's blocked format for one row at a time: an opaque tensor
    that only oneDNN's inner product reads."""
    with torch.no_grad():
        copy: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 1)
    return copy


def packed_copy(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` (out, in) in oneDNN's blocked format for one row at a time (a decode step; more rows read it
    too), packed now if it never was or the weight changed since; None for a weight whose edits cannot be seen
    (an inference tensor keeps no version), which is then multiplied unpacked."""
    if weight.is_inference():
        return None
    source = _source(weight)
    kept = _PACKED.get(weight)
    if kept is None or kept[0] != source:
        copy = reorder(weight)
        _PACKED[weight] = (source, copy, weight.untyped_storage())
        return copy
    packed: torch.Tensor = kept[1]
    return packed


def forget(weight: torch.Tensor) -> None:
    """Drop ``weight``'s packed copy, if it has one (a layout other than "packed" was set)."""
    _PACKED.pop(weight, None)


def product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(N, in) x (out, in) -> (N, out) by oneDNN's inner product over the packed copy (unpacked where there is
    none). The caller has checked that oneDNN serves it: the CPU, inference, one float dtype throughout."""
    packed = packed_copy(weight)
    dense = None if bias is None else bias.contiguous()  # the op reads a bias as dense: a strided one reads wrong
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
        x, weight.contiguous() if packed is None else packed, dense, "none", [], ""
    )
    return out


def _packed_op_shape(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])  # (N, out)


def _packed_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    refuse_gradient("packed_linear", x, weight, bias)
    return product(x, weight, bias)


# :func:`product` as an op of a torch.compile graph (inference only), which finds the packed copy when it runs
define_cpu_op("packed_linear", "(Tensor x, Tensor weight, Tensor? bias) -> Tensor", _packed_op, _packed_op_shape)
