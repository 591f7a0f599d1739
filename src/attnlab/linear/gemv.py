"""One token's product with a weight, by a loop that torch.compile writes for it (issue 37).

A decode step multiplies one token's vector by every weight, so it is bound
by how fast the weights stream from memory. The BLAS routines behind
``F.linear`` treat that product as a small matrix product; on some CPUs they
stream a weight well below memory's rate, and for bfloat16 and int8 weights
they convert the whole weight before they multiply. Written as what it is,

    out[n, o] = sum_i x[n, i] * weight[o, i] * scale[o] + bias[o]

and handed to ``torch.compile``, Inductor makes one loop over the weight's
rows that reads each weight once, widens it (bfloat16, int8) to float32 in
registers and sums in float32. On the machine of ``docs/benchmarks.md`` it
streams bfloat16 and int8 weights several times faster than the BLAS.

:func:`gemv` is that product; :func:`readable_gemv` is the same sum written
plainly, the path it is tested against. Each shape gets its own loop,
compiled on its first call in a process (about a second; Inductor keeps it
on disk for later processes) and called without torch.compile's guards, so
a call costs microseconds. Within the rows the loop serves, a row's numbers
never depend on the other rows of the call (tested bitwise); more rows go to
a matrix product, whose numbers differ from the loop's by float rounding. :func:`why_no_gemv` says why the loop cannot be built here
(torch.compile needs a C++ compiler), or nothing: where it cannot,
``set_layout("auto")`` and ``quantize("int8")`` never choose it, and asking
for it by name is refused with the reason.

Shapes: N = rows (tokens), in / out = the weight's features.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnlab.linear import inductor
from attnlab.linear.inductor import define_cpu_op, refuse_gradient

# At most this many rows go through the loop, which reads the weight once per row; more go to a matrix product.
# Measured on the machine of docs/benchmarks.md, against oneDNN (float) and dequantize-then-oneDNN (int8), on
# weights streamed from memory: the loop was faster up to 2 float rows and up to 8 int8 rows.
FLOAT_ROWS = 2
INT8_ROWS = 8
GEMV_DTYPES = (torch.float32, torch.bfloat16, torch.int8)  # the weights it reads


def readable_gemv(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """(N, in) x (out, in) -> (N, out) in float32 then ``x``'s dtype: each weight widened, times its row's
    ``scale`` (int8 weights), plus ``bias``; the readable path :func:`gemv` is tested against."""
    full = weight.float() if scale is None else weight.float() * scale.float()[:, None]  # (out, in)
    out = F.linear(x.float(), full, None if bias is None else bias.float())
    return out.to(x.dtype)


def _loop(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """The sum as Inductor fuses it: (N, 1, in) * (1, out, in), summed over in, in float32."""
    products = x.float()[:, None, :] * weight.float()[None, :, :]  # (N, out, in): never formed, the loop's body
    out = products.sum(-1)  # (N, out)
    if scale is not None:
        out = out * scale.float()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


Spec = tuple[object, ...]


def _canonical(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor with its strides written as a fresh tensor's (a row cut from a batch, (1, in) with
    the batch's row stride, is the same memory): one compiled loop serves every such view."""
    if not t.is_contiguous() or 1 not in t.shape:  # contiguous without a size-1 dimension: its strides are fresh
        return t
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.append(step)
        step *= size
    fresh = tuple(reversed(strides))
    return t if t.stride() == fresh else t.as_strided(t.shape, fresh, t.storage_offset())


def kernel_spec(tensors: tuple[torch.Tensor | None, ...]) -> Spec:
    """What a compiled kernel is specialized to: each tensor's shape, strides, dtype and device (None where absent),
    and the threads it was built for. A kernel is only ever called with tensors of its own spec: no guard."""
    laid: list[object] = []
    for t in tensors:  # a loop, not a generator: asked at every product of a decode step
        laid.append(None if t is None else (tuple(t.shape), t.stride(), t.dtype, t.device))
    laid.append(torch.get_num_threads())
    return tuple(laid)


def _kernel(spec: Spec, tensors: tuple[torch.Tensor | None, ...]) -> Callable[..., torch.Tensor]:
    """The loop compiled by Inductor for ``spec``."""
    given = [t is not None for t in tensors]

    def body(*present: torch.Tensor) -> torch.Tensor:
        it = iter(present)
        x, weight, scale, bias = (next(it) if has else None for has in given)
        assert x is not None and weight is not None  # always given
        return _loop(x, weight, scale, bias)

    return inductor.compiled(spec, body, [t for t in tensors if t is not None])


def gemv(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """(N, in) x (out, in) -> (N, out): :func:`readable_gemv`'s numbers to float rounding, by the compiled loop
    (under an enclosing torch.compile on the CPU, the graph calls it as the op ``attnlab::gemv``; under
    torch.export, the loop's plain ops). ``scale``: int8 weights' (out,).
    For inference on the CPU with a few rows (:data:`FLOAT_ROWS`, :data:`INT8_ROWS`); the caller checks
    (:func:`gemv_applies`)."""
    _check(x, weight, scale, bias)
    wants_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, scale, bias))
    if wants_grad:  # differentiated: the loop's own ops, which autograd follows
        return _loop(x, weight, scale, bias)
    if torch.compiler.is_compiling():
        if x.device.type != "cpu" or _exporting():  # the loop's own ops: for another device's compiler, or for
            return _loop(x, weight, scale, bias)  # an exported program, which must not need attnlab to run
        # One opaque op in the graph, run by the loop compiled on its own. Traced inline, Inductor fused the norm
        # or activation before the product into the loop's body and recomputed it for every weight row, and the
        # compiled step's products ran slower than the loop's own (tests/test_gemv.py counts the op).
        return torch.ops.attnlab.gemv(x, weight, scale, bias)
    return compiled_gemv(x, weight, scale, bias)


def _exporting() -> bool:
    """Whether torch.export traces this call. A torch that cannot say (before 2.6) counts as exporting: its
    compiled graphs get plain ops, never an attnlab op an exported program would need attnlab to run."""
    is_exporting = getattr(torch.compiler, "is_exporting", None)  # torch 2.6 and later
    return bool(is_exporting()) if is_exporting is not None else True


def compiled_gemv(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    """:func:`gemv`'s product by the loop compiled for these tensors' spec, for a caller that has checked the call
    itself (inference on the CPU, shapes :func:`gemv` takes, :func:`gemv_applies`), outside torch.compile (inside,
    :func:`gemv` puts the op attnlab::gemv in the graph): a decode step's layouts."""
    tensors = (_canonical(x), _canonical(weight), scale, bias)
    spec = kernel_spec(tensors)
    kernel = inductor.KERNELS.get((spec, False)) or _kernel(spec, tensors)  # made once; later calls look it up
    out: torch.Tensor = kernel(*(t for t in tensors if t is not None))
    return out


def _gemv_op(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    refuse_gradient("gemv", x, weight, scale, bias)
    return compiled_gemv(x, weight, scale, bias)


def _gemv_op_shape(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None
) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])  # (N, out), contiguous like the loop's own


# :func:`gemv` as an op of a torch.compile graph (inference only), run by the loop compiled for its tensors
define_cpu_op("gemv", "(Tensor x, Tensor weight, Tensor? scale, Tensor? bias) -> Tensor", _gemv_op, _gemv_op_shape)


def _check(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None) -> None:
    """Refuse what the loop's broadcasting would take silently: shapes that F.linear refuses, a scale missing
    from an int8 weight or given to a float one."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"gemv multiplies x (N, in) by a weight (out, in), got x {tuple(x.shape)} and weight "
            f"{tuple(weight.shape)}: reshape x to (-1, {weight.shape[-1]})"
        )
    if (weight.dtype == torch.int8) != (scale is not None):
        given = "no scale" if scale is None else f"a scale {tuple(scale.shape)}"
        raise ValueError(
            f"gemv got a {weight.dtype} weight and {given}: pass scale (out,) with an int8 weight, none with a "
            "float one"
        )
    for name, t in (("scale", scale), ("bias", bias)):
        if t is not None and tuple(t.shape) != (weight.shape[0],):
            raise ValueError(
                f"gemv's {name} must be ({weight.shape[0]},), one a row of the weight, got {tuple(t.shape)}"
            )


def gemv_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`gemv` may serve this product: a few rows (:data:`FLOAT_ROWS`, or :data:`INT8_ROWS` for
    an int8 weight), on the CPU, weights it reads, no gradient wanted, and torch.compile working here."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        return False  # F.linear's own error, as for any linear
    if x.shape[0] > rows_for(weight) or x.shape[0] == 0 or x.shape[1] == 0:
        return False
    if traced():
        return False  # a tracer would not see the compiled kernel run: the plain ops, for it to record
    if x.device.type != "cpu" or weight.device.type != "cpu" or weight.dtype not in GEMV_DTYPES:
        return False
    if type(x) is not torch.Tensor or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        return False
    return not why_no_gemv()


def traced() -> bool:
    """Whether a tracer records this call (torch.jit.trace, fx's symbolic trace, a dispatch mode), which would not
    see a compiled kernel run: such calls take the plain ops."""
    return torch.jit.is_tracing() or torch.fx._symbolic_trace.is_fx_symbolic_tracing() or _dispatch_mode()


def _dispatch_mode() -> bool:
    """Whether a Python dispatch mode (make_fx, FakeTensorMode, a profiler of ops) is active."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode() is not None


def rows_for(weight: torch.Tensor) -> int:
    """How many rows at most :func:`gemv` serves for this weight's dtype."""
    return INT8_ROWS if weight.dtype == torch.int8 else FLOAT_ROWS


@functools.cache
def why_no_gemv() -> str:
    """Why torch.compile cannot serve the loop here, in one line; "" where it builds and runs it. Tried once per
    process, on tiny products of each kind checked against :func:`readable_gemv`."""
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(1, 16, generator=generator), torch.randn(8, 16, generator=generator)
    q, scale = torch.randint(-127, 128, (8, 16), generator=generator, dtype=torch.int8), torch.rand(8) + 0.5
    try:
        with torch.no_grad():
            got = [gemv(x, weight), gemv(x, q, scale)]
    except Exception as error:  # no C++ compiler, an unsupported platform: the reason, in one line
        first = (str(error).splitlines() or [""])[0][:200]
        return f"torch.compile cannot build the loop here ({type(error).__name__}: {first})"
    want = [readable_gemv(x, weight), readable_gemv(x, q, scale)]
    if not all(torch.allclose(a, b, rtol=1e-5, atol=1e-4) for a, b in zip(got, want, strict=True)):
        return "torch.compile's loop here disagrees with the readable product"
    return ""
