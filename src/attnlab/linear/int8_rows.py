"""Many rows by the dynamic int8 kernel: each row rounded to 7 bits with its own scale and zero point, as
``quantized.linear_dynamic`` would round that row alone, the int8 x int8 products by ``torch._int_mm``, and
fbgemm's float epilogue; its readable ops beside the kernels Inductor compiles for them, each compiled kernel
used only where it gives the readable numbers bitwise (:mod:`attnlab.linear.quantized` describes the kernel).

Shapes: N = rows (B*T), R = rows padded to a power of two (R >= N), in / out = the weight's features.
"""

from __future__ import annotations

import torch

from attnlab.linear.gemv import kernel_spec, traced, why_no_gemv
from attnlab.linear.inductor import compiled

# PyTorch's ChooseQuantizationParams (quant_utils.h) snaps scales below this to it; such rows run alone.
_SMALL_SCALE = float(torch.tensor(6.1e-5, dtype=torch.float32))


def _activation_qparams(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's scale (N,) float32 and zero point (N,) int32 as ``linear_dynamic`` chooses them for that row
    alone (ChooseQuantizationParams, reduce_range: codes 0..127, the range widened to hold 0), and which rows
    (N,) bool follow that rule without its special cases (a tiny range, a non-finite value)."""
    lo, hi = torch.aminmax(flat, dim=1)  # (N,) each
    lo, hi = lo.clamp(max=0).double(), hi.clamp(min=0).double()
    scale = (hi - lo) / 127  # in double, as PyTorch does, then kept as float32
    # aminmax carries a NaN or an inf of the row into lo or hi, and so into the scale: a finite scale is a finite row
    plain = (scale >= _SMALL_SCALE) & torch.isfinite(scale.float())
    scale = torch.where(plain, scale, torch.ones_like(scale))  # the special rows: any harmless value
    from_min, from_max = -lo / scale, 127 - hi / scale  # (N,): the zero point each end asks for
    zero = torch.where(-(lo / scale).abs() < 127 - (hi / scale).abs(), from_min, from_max)
    zero = torch.round(zero.clamp(0, 127)).to(torch.int32)  # nearbyint, ties to even
    return scale.float(), zero, plain


def _rounded_rows(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(centered (N, in) int8, x_scale (N,), plain (N,)): every row rounded to 7 bits with its own scale and zero
    point, fbgemm's arithmetic step by step, less its zero point. The readable path of :func:`_round`."""
    x_scale, zero, plain = _activation_qparams(flat)
    inverse = 1.0 / x_scale  # float32, as fbgemm multiplies by it
    # fbgemm rounds fma(x, 1/scale, zero): float64 holds the product exactly, so only a tie finer than float64 differs
    codes = torch.round((flat.double() * inverse.double()[:, None] + zero[:, None]).float()).clamp_(0, 255)
    return (codes - zero[:, None]).to(torch.int8), x_scale, plain  # (N, in): x / x_scale, in -127..127


def _fma_rows(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_rounded_rows` as fbgemm computes it, in float32: the codes round x * (1 / scale) + zero, which the
    compiled kernel's C++ may contract into fbgemm's one fma (``compiled(contract=True)``), so that no float64 is
    needed; whether it did, the probe's :func:`_fma_row` tells. What :func:`_round` compiles; eager, only
    :func:`_rounded_rows` is used."""
    x_scale, zero, plain = _activation_qparams(flat)
    inverse = 1.0 / x_scale  # float32, as fbgemm multiplies by it
    # fma(x, 1/scale, zero) as addcmul: contracted, Inductor's C++ makes it one fma (written x * inverse + zero, it
    # did not, and the probe's _fma_row set that kernel aside)
    codes = torch.round(torch.addcmul(zero[:, None].float(), flat, inverse[:, None])).clamp_(0, 255)
    return (codes - zero[:, None]).to(torch.int8), x_scale, plain  # (N, in): x / x_scale, in -127..127


_ROUNDING_SAME: dict[object, bool] = {}  # per spec: whether the compiled rounding gives _rounded_rows' numbers


def _round(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_rounded_rows` of ``flat`` (N, in), its rows left padded: (codes (R, in), x_scale (R,), plain (R,)),
    R >= N, the first N rows ``flat``'s. By one kernel Inductor compiled from :func:`_fma_rows` (the readable
    rounding is about 25 small ops a product, in float64, most of a batched step's time outside its products)
    where that kernel gives the readable numbers bitwise, checked once per shape on rows of every kind, fma's ties
    among them (:func:`_probe_rows`); the rows are then padded with zeros to a power of two (each row is rounded
    on its own), so that one kernel serves every count of rows up to it, and R is that power. By the readable ops
    elsewhere (under a tracer, without a compiler, rows of fewer than 3 values), and R = N."""
    n, d_in = flat.shape
    if why_no_gemv() or traced() or type(flat) is not torch.Tensor or flat.device.type != "cpu" or d_in < 3:
        return _rounded_rows(flat)  # under 3 values a row holds only its range's ends, and no probe of an fma
    rows = max(2, 1 << (n - 1).bit_length())
    padded = torch.cat([flat, flat.new_zeros(rows - n, d_in)]) if rows > n else flat.contiguous()  # (rows, in)
    key = ("int8 rows", kernel_spec((padded,)))
    kernel = compiled(key, _fma_rows, [padded], contract=True)
    if key not in _ROUNDING_SAME:
        _ROUNDING_SAME[key] = all(_same_rounding(kernel(p), _rounded_rows(p)) for p in _probe_rows(rows, d_in))
    if not _ROUNDING_SAME[key]:
        return _rounded_rows(flat)
    codes, x_scale, plain = kernel(padded)
    return codes, x_scale, plain


def _finished(acc: torch.Tensor, x_scale: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(R, out) float32 from the int32 products ``acc`` (R, out): fbgemm's epilogue, float(acc) times the
    multiplier x_scale * scale rounded to float32 first, plus the bias in one fma. The readable path of
    :func:`_finish`."""
    multiplier = x_scale[:, None] * scale[None, :]  # (R, out), rounded to float32 first, as fbgemm does
    if bias is None:
        return acc.float() * multiplier
    return torch.addcmul(bias, acc.float(), multiplier)  # fbgemm's fma(float(acc), multiplier, bias)


_FINISH_SAME: dict[object, bool] = {}  # per spec: whether the compiled epilogue gives _finished's numbers


def _finish(acc: torch.Tensor, x_scale: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """:func:`_finished`, by one kernel Inductor compiled for a power of two of rows (R, out) (the readable
    epilogue is three passes over (R, out): a cast, a product and the addcmul), where it gives the readable
    numbers bitwise, checked once per shape on values whose fma and separate product and sum differ in every
    element (:func:`_probe_products`); by the readable ops elsewhere."""
    rows = acc.shape[0]
    exotic = why_no_gemv() or traced() or type(acc) is not torch.Tensor or acc.device.type != "cpu"
    if exotic or rows < 2 or rows & (rows - 1):
        return _finished(acc, x_scale, scale, bias)
    given = [t for t in (acc, x_scale, scale, bias) if t is not None]
    key = ("int8 epilogue", kernel_spec((acc, x_scale, scale, bias)))
    fn = _finished if bias is not None else lambda a, s, w: _finished(a, s, w, None)
    kernel = compiled(key, fn, given, contract=True)  # its a * b + c one fma, as addcmul's and fbgemm's
    if key not in _FINISH_SAME:
        probes = _probe_products(rows, acc.shape[1], bias is not None)
        _FINISH_SAME[key] = all(torch.equal(kernel(*p), fn(*p)) for p in probes)
    if not _FINISH_SAME[key]:
        return _finished(acc, x_scale, scale, bias)
    out: torch.Tensor = kernel(*given)
    return out


def _probe_products(rows: int, out: int, bias: bool) -> list[list[torch.Tensor]]:
    """Inputs of :func:`_finished` for (rows, out): seeded ones over wide ranges, and ones whose every element is
    4097 x (4097 / 2^24) - (1 + 2^-11): 2^-24 by one fma, 0 by a product rounded before the sum."""
    generator = torch.Generator().manual_seed(0)
    acc = torch.randint(-(2**31), 2**31 - 1, (rows, out), dtype=torch.int32, generator=generator)
    x_scale = torch.rand(rows, generator=generator) * 10.0 ** torch.randint(-8, 2, (rows,), generator=generator)
    scale, shift = torch.rand(out, generator=generator) * 1e-2, torch.randn(out, generator=generator) * 1e3
    tie_acc, tie_x = torch.full((rows, out), 4097, dtype=torch.int32), torch.full((rows,), 4097 * 2.0**-24)
    probes = [[acc, x_scale, scale, shift], [tie_acc, tie_x, torch.ones(out), torch.full((out,), -(1 + 2.0**-11))]]
    return [p if bias else p[:3] for p in probes]


def _same_rounding(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> bool:
    """Bitwise the same scales and plain rows, and the same codes in the plain rows (the others run alone, and a
    NaN's cast to int8 is whatever the machine makes of it)."""
    (codes, x_scale, plain), (want_codes, want_scale, want_plain) = got, want
    same = torch.equal(plain, want_plain) and torch.equal(x_scale, want_scale)
    return same and torch.equal(codes[plain], want_codes[plain])


def _probe_rows(n: int, d_in: int) -> list[torch.Tensor]:
    """Batches (n, d_in) in which every kind of row stands at every place: rows of several ranges, all positive,
    all negative, fma's ties, constant (a tiny range), zero, and with a NaN or an inf (not plain)."""
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(8, d_in, generator=generator) * torch.tensor([0.01, 1.0, 4.0, 1.0, 1.0, 1.0, 1.0, 1.0])[:, None]
    base[3], base[4] = base[3].abs(), -base[4].abs()
    base[5, 0::2], base[5, 1::2] = 0.5 + 2**-20, -1.5 - 2**-20
    base[5, :2] = torch.tensor([-64.0, 63.0])[: min(2, d_in)]
    base[6], base[7] = 0.25, 0.0
    nan, inf = base[1].clone(), base[2].clone()
    nan[0], inf[-1] = float("nan"), float("inf")
    kinds = torch.cat([base, nan[None], inf[None], _fma_row(d_in)[None]])  # (11, d_in)
    return [kinds[(torch.arange(n) + j) % len(kinds)] for j in range(len(kinds))]  # each (n, d_in)


def _fma_row(d_in: int) -> torch.Tensor:
    """A row (d_in,) whose values, but for the two that set its range, round to another code by fbgemm's one fma,
    fma(x, 1 / scale, zero), than with x * (1 / scale) rounded to float32 before the zero point is added: found by
    searching the floats around each of the row's ties (a compiled rounding whose C++ did not contract differs
    from the readable numbers on them)."""
    lo, hi = -50.0, 77.3
    x_scale, zero, _ = _activation_qparams(torch.tensor([[lo, hi]]))
    inverse, z = float((1.0 / x_scale)[0]), float(zero[0])
    ties = torch.arange(-40, 70, dtype=torch.float64) + 0.5 - z  # (K,): where x * inverse + zero = k + 0.5
    bits = (ties / inverse).float().view(torch.int32)[:, None] + torch.arange(-64, 65, dtype=torch.int32)  # (K, 129)
    x = bits.view(torch.float32).flatten()  # the floats around each tie, by their last bits
    x = x[(x > lo) & (x < hi)]
    by_fma = torch.round((x.double() * inverse + z).float())
    rounded_first = torch.round(x * torch.tensor(inverse) + torch.tensor(z))
    found = x[by_fma != rounded_first]
    fill = found.repeat(-(-d_in // max(1, len(found)))) if len(found) else torch.zeros(d_in)
    return torch.cat([torch.tensor([lo, hi]), fill])[:d_in]


def _per_row(
    flat: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (N, out), plain (N,)): every row rounded with its own scale and zero point, fbgemm's arithmetic
    step by step; the rows ``plain`` is False for are to be run alone."""
    n = flat.shape[0]
    centered, x_scale, plain = _round(flat)  # (R, in), (R,), (R,): R >= N rows, the padding after N
    acc = centered.new_empty(centered.shape[0], weight_int8.shape[0], dtype=torch.int32)  # (R, out)
    # (N, in) @ (in, out) -> int32, exact; the padded rows are never written, and their outputs are dropped
    torch._int_mm(centered[:n], weight_int8.t(), out=acc[:n])
    return _finish(acc, x_scale, scale, bias)[:n], plain[:n]
