"""Non-finite inputs: one rule for every backend, independent of tile sizes.

The rule (docs/backends.md, "NaN and inf"):

* a query row that holds a NaN or an inf gives a NaN output row;
* a key or value position that holds a NaN or an inf makes NaN the output of
  every query that may see it, and of no other: hidden positions never leak
  into visible outputs (a softmax weight of exactly 0 times NaN would be NaN);
* a query that may see nothing still gives 0.

Without this, a NaN query gave NaN in eager and flash but 0 in SDPA, and a
NaN value that no query may see poisoned every row (in flash, only the rows
whose tile met it). The kernels run on cleaned inputs (non-finite entries set
to 0) and the rows the rule names are set to NaN afterwards.

The check costs one sum over each of q, k and v and, when everything is
finite (the usual case), nothing else. The plain KV cache on the CPU checks
each write instead and vouches for its buffers (:func:`vouch`), so a decode
step sums its one new query, not the whole cache, in every layer. Under ``torch.compile`` it is skipped, so that the
compiled graph has no data-dependent branch; compiled code gets the kernel's
own behaviour.

Shapes: B = batch, H = query heads, Hkv = kv heads, Tq / Tk = lengths, D = head_dim.
"""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass

import torch

from attnlab.functional.visibility import Visibility

_ROWS = 512  # queries per block when finding who sees a bad position: memory O(512 * Tk), not O(Tq * Tk)


@dataclass(frozen=True)
class NonFinite:
    """Where the inputs were not finite: bad query rows (B, H, Tq), bad key/value positions (B, Hkv, Tk)."""

    bad_q: torch.Tensor
    bad_kv: torch.Tensor


# Tensors vouched for, by identity (a copy or an unpickled tensor is another object, never vouched for): id(t) ->
# (a weak reference to t, the version counter it had then). An entry goes when its tensor does; an id that a new
# tensor reuses finds a reference to another (dead) object, never its own. A plain dict: a decode step asks it
# four times a layer, and torch's WeakIdKeyDictionary made a reference at every question.
_VOUCHED: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}


def _forget(key: int, ref: weakref.ref[torch.Tensor]) -> None:
    if _VOUCHED.get(key, (None, 0))[0] is ref:
        del _VOUCHED[key]


def vouch(t: torch.Tensor) -> None:
    """Say that ``t`` holds only finite numbers as it is now (a cache that checked each write to its buffer):
    :func:`clean` skips its sum until ``t`` or a view of it is written in place again (its version counter
    moves). Inference tensors keep no version, so they are never vouched for; a write that moves no version
    (through ``.data``, or another library's view of the memory) is not seen."""
    if torch.compiler.is_compiling() or t.is_inference():
        return
    key = id(t)
    held = _VOUCHED.get(key)
    if held is not None and held[0]() is t:
        _VOUCHED[key] = (held[0], t._version)
    else:
        _VOUCHED[key] = (weakref.ref(t, functools.partial(_forget, key)), t._version)


def _vouched_as_is(t: torch.Tensor) -> bool:
    held = _VOUCHED.get(id(t))
    return held is not None and held[1] == t._version and held[0]() is t


def vouched(t: torch.Tensor) -> bool:
    """Whether ``t``, or the tensor it is a view of in the same dtype (a cache's filled slots, a slice of its
    buffer), was vouched for (:func:`vouch`) and not written in place since: a view shares its base's version
    counter, and a part of a tensor that holds only finite numbers holds only finite numbers."""
    if t.is_inference():
        return False
    base = t._base  # read as another dtype (view(torch.float16)), finite bits may be inf: never taken from a base
    if base is not None and base.dtype == t.dtype and _vouched_as_is(base):
        return True
    return _vouched_as_is(t)


def clean(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, NonFinite | None]:
    """q, k, v with non-finite entries zeroed, and where they were; the inputs themselves when all are finite."""
    if torch.compiler.is_compiling():
        return q, k, v, None
    # A NaN or inf anywhere makes the sum non-finite, so a finite sum proves every entry finite: one cheap
    # reduction per tensor instead of isfinite's compare-and-abs passes. (A finite overflow only sends us
    # to the exact check below.) A cache's buffers that it vouched for are not summed again.
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    total = q.sum(dtype=acc)
    for t in (k, v):
        if not vouched(t):
            total = total + t.sum(dtype=acc)
    if math.isfinite(float(total.detach())):  # one read of the sum: fewer ops than isfinite's compare-and-abs
        return q, k, v, None
    fin_q, fin_k, fin_v = torch.isfinite(q), torch.isfinite(k), torch.isfinite(v)
    if bool(fin_q.all() & fin_k.all() & fin_v.all()):
        return q, k, v, None
    bad = NonFinite(bad_q=~fin_q.all(dim=-1), bad_kv=~(fin_k.all(dim=-1) & fin_v.all(dim=-1)))
    zero = lambda t, fin: torch.where(fin, t, torch.zeros((), dtype=t.dtype, device=t.device))
    return zero(q, fin_q), zero(k, fin_k), zero(v, fin_v), bad


def apply_rule(out: torch.Tensor, vis: Visibility, bad: NonFinite) -> torch.Tensor:
    """Set to NaN the rows of out (B, H, Tq, Dv) that the rule names; dead rows stay 0."""
    b, h, tq, _ = out.shape
    groups = h // bad.bad_kv.shape[1]
    bad_kv = bad.bad_kv.repeat_interleave(groups, dim=1)  # (B, H, Tk): query head i reads kv head i // groups
    nan_rows = torch.zeros(b, h, tq, dtype=torch.bool, device=out.device)
    for i0 in range(0, tq, _ROWS):
        i1 = min(i0 + _ROWS, tq)
        allowed, bias = vis.tile(i0, i1, 0, vis.tk)
        visible = torch.ones(1, 1, i1 - i0, vis.tk, dtype=torch.bool, device=out.device)
        if allowed is not None:
            visible = visible & allowed
        if bias is not None:
            visible = visible & ~torch.isneginf(bias)
        sees_bad = (visible & bad_kv[:, :, None, :]).any(dim=-1)  # (B, H, bq)
        alive = visible.any(dim=-1)  # (.., bq): the row may see something
        nan_rows[:, :, i0:i1] = (sees_bad | bad.bad_q[:, :, i0:i1]) & alive
    return out.masked_fill(nan_rows[..., None], float("nan"))
