"""Ring attention: each process holds a shard of the sequence; key/value blocks travel around the ring.

With P processes, rank r holds its queries and one block of keys and values.
At step s it attends its queries to the block that started on rank r - s
(with attnlab's flash kernel, which returns each row's log-sum-exp), while the
block moves on to rank r + 1 with ``batch_isend_irecv``; the partial results
merge by their log-sum-exp in the stable form
``lse = logaddexp(lse_a, lse_b); out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse)``.
The backward pass walks the ring again: each block carries its own key and
value gradients, which arrive back at their owner after the last step.

Causal and window masks use global positions. ``layout="zigzag"`` cuts the
sequence into 2P chunks and gives rank r chunks r and 2P-1-r, so every rank
does the same causal work; ``"contiguous"`` gives rank r the r-th P-th.

Shapes: B = batch, H = query heads, Hkv = key/value heads, T = global length,
Tl = local length (T / P, padded), D = head dim, P = processes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from attnlab._checks import check_scale, check_window
from attnlab.functional.eager import accumulation_dtype, repeat_kv
from attnlab.functional.flash import flash_backward, flash_forward
from attnlab.functional.masks import DEFAULT_BLOCK, MaskSpec

Layout = Literal["zigzag", "contiguous"]
LAYOUTS = ("zigzag", "contiguous")


@dataclass
class RingStats:
    """What one rank sent around the ring (``ring_attention(..., stats=RingStats())`` fills it)."""

    forward_bytes: int = 0
    backward_bytes: int = 0


def _world(group: Any) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("ring attention needs torch.distributed initialized (dist.init_process_group, or torchrun)")
    return dist.get_rank(group), dist.get_world_size(group)


def _chunks(size: int, layout: Layout) -> int:
    """How many chunks a sequence is cut into over ``size`` ranks."""
    return 2 * size if layout == "zigzag" else size


def padded_length(length: int, size: int, layout: Layout) -> int:
    """``length`` rounded up to a multiple of the chunks: what ``shard_sequence`` pads to (divide by P per rank)."""
    n = _chunks(size, layout)
    return -(-length // n) * n


def sequence_positions(
    length: int, rank: int, size: int, layout: Layout, device: torch.device | None = None
) -> torch.Tensor:
    """The global positions of rank ``rank``'s shard of a sequence padded to ``length`` (a multiple of the chunks)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    c = length // _chunks(size, layout)
    if layout == "contiguous":
        return torch.arange(rank * c, (rank + 1) * c, device=device)
    first, second = rank, 2 * size - 1 - rank
    return torch.cat(
        [
            torch.arange(first * c, (first + 1) * c, device=device),
            torch.arange(second * c, (second + 1) * c, device=device),
        ]
    )


def shard_sequence(x: torch.Tensor, dim: int = 2, *, group: Any = None, layout: Layout = "zigzag") -> torch.Tensor:
    """This rank's shard of a full tensor along ``dim``, padded with zeros to a multiple of the chunks (2P or P)."""
    rank, size = _world(group)
    length = x.shape[dim]
    padded = padded_length(length, size, layout)
    if padded != length:
        pad = [0, 0] * (x.dim() - 1 - (dim % x.dim())) + [0, padded - length]
        x = torch.nn.functional.pad(x, pad)
    index = sequence_positions(padded, rank, size, layout, x.device)
    return x.index_select(dim, index)


def gather_sequence(
    x: torch.Tensor, dim: int = 2, *, length: int, group: Any = None, layout: Layout = "zigzag"
) -> torch.Tensor:
    """The full tensor back from every rank's shard (all_gather), in sequence order, cut to ``length``."""
    rank, size = _world(group)
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=group)
    padded = x.shape[dim] * size
    order = torch.cat([sequence_positions(padded, r, size, layout, x.device) for r in range(size)])
    full = torch.empty_like(torch.cat(parts, dim=dim))
    full.index_copy_(dim, order, torch.cat(parts, dim=dim))
    return full.narrow(dim, 0, length)


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any, size: int) -> None:
    """Every rank must hold the same shapes: compared with one small all_gather, so a mismatch raises everywhere."""
    mine = torch.tensor([*q.shape, *k.shape, *v.shape], dtype=torch.long)
    every = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(every, mine, group=group)
    shapes = {tuple(t.tolist()) for t in every}
    if len(shapes) > 1:
        raise ValueError(
            "ring attention needs the same q, k, v shapes on every rank; got "
            + "; ".join(f"rank {r}: q {tuple(t[:4].tolist())}, k {tuple(t[4:8].tolist())}" for r, t in enumerate(every))
        )


def _block_spec(
    q_pos: torch.Tensor, k_pos: torch.Tensor, *, causal: bool, window: int | None, length: int | None
) -> MaskSpec:
    """The mask of local queries against one block of keys, from global positions (padding keys hidden)."""

    def mask_mod(b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
        qp, kp = q_pos[qi], k_pos[ki]
        ok = kp >= 0
        if length is not None:
            ok = ok & (kp < length)
        if causal:
            ok = ok & (qp >= kp)
        if window is not None:
            ok = ok & (qp - kp < window)
        return ok

    needs_mask = causal or window is not None or length is not None
    return MaskSpec(tq=len(q_pos), tk=len(k_pos), mask_mod=mask_mod if needs_mask else None, q_offset=0)


def _exchange(tensors: list[torch.Tensor], rank: int, size: int, group: Any) -> tuple[list[torch.Tensor], list[Any]]:
    """Start sending ``tensors`` to rank + 1 and receiving the same shapes from rank - 1; returns (buffers, requests)."""
    send_to, recv_from = (rank + 1) % size, (rank - 1) % size
    received = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]  # gloo needs contiguous
    ops = [
        dist.P2POp(dist.isend, t.contiguous(), dist.get_global_rank(group, send_to) if group else send_to, group)
        for t in tensors
    ]
    ops += [
        dist.P2POp(dist.irecv, r, dist.get_global_rank(group, recv_from) if group else recv_from, group)
        for r in received
    ]
    return received, dist.batch_isend_irecv(ops)


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        scale: float,
        causal: bool,
        window: int | None,
        length: int | None,
        group: Any,
        stats: RingStats | None,
    ) -> torch.Tensor:
        rank, size = _world(group)
        groups = q.shape[1] // k.shape[1]
        ad = accumulation_dtype(q.dtype)
        out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=ad, device=q.device)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=ad, device=q.device)
        block = [k, v, q_pos]  # the travelling block: keys, values and their global positions
        for step in range(size):
            pending = _exchange(block, rank, size, group) if step < size - 1 else None  # overlaps the compute below
            if pending is not None and stats is not None:
                stats.forward_bytes += sum(t.numel() * t.element_size() for t in block)
            spec = _block_spec(q_pos, block[2], causal=causal, window=window, length=length)
            part, part_lse = flash_forward(
                q,
                repeat_kv(block[0], groups),
                repeat_kv(block[1], groups),
                spec,
                scale=scale,
                dropout_p=0.0,
                seed=0,
                block_q=DEFAULT_BLOCK,
                block_k=DEFAULT_BLOCK,
                kinds=spec.tile_kinds(q.device),
            )
            part_lse = part_lse.to(ad).masked_fill(torch.isposinf(part_lse), float("-inf"))  # nothing seen: no weight
            merged = torch.logaddexp(lse, part_lse)
            safe = merged.masked_fill(torch.isneginf(merged), 0.0)
            out = out * torch.exp(lse - safe)[..., None] + part.to(ad) * torch.exp(part_lse - safe)[..., None]
            lse = merged
            if pending is not None:
                received, requests = pending
                for request in requests:
                    request.wait()
                block = received
        lse = lse.masked_fill(torch.isneginf(lse), float("inf"))  # the kernels' contract: +inf where nothing is seen
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, q_pos, out, lse)
        ctx.scale, ctx.causal, ctx.window, ctx.length, ctx.group = scale, causal, window, length, group
        ctx.stats = stats
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, q_pos, out, lse = ctx.saved_tensors
        rank, size = _world(ctx.group)
        groups = q.shape[1] // k.shape[1]
        ad = accumulation_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=ad, device=q.device)
        block = [
            k,
            v,
            q_pos,
            torch.zeros(k.shape, dtype=ad, device=q.device),
            torch.zeros(v.shape, dtype=ad, device=q.device),
        ]
        for _ in range(size):
            kb, vb, kpos, dk, dv = block
            spec = _block_spec(q_pos, kpos, causal=ctx.causal, window=ctx.window, length=ctx.length)
            dq_part, dk_part, dv_part, _ = flash_backward(
                grad_out,
                q,
                repeat_kv(kb, groups),
                repeat_kv(vb, groups),
                out,
                lse,
                spec,
                scale=ctx.scale,
                dropout_p=0.0,
                seed=0,
                block_q=DEFAULT_BLOCK,
                block_k=DEFAULT_BLOCK,
                kinds=spec.tile_kinds(q.device),
            )
            dq += dq_part
            b, h, t, d = dk_part.shape
            dk = dk + dk_part.view(b, h // groups, groups, t, d).sum(dim=2)  # (B, H, Tl, D) -> (B, Hkv, Tl, D)
            dv = dv + dv_part.view(b, h // groups, groups, t, dv_part.shape[-1]).sum(dim=2)
            block = [kb, vb, kpos, dk, dv]
            if size > 1:  # every block moves on after each step; after the last one it is back home with its gradients
                if ctx.stats is not None:
                    ctx.stats.backward_bytes += sum(t.numel() * t.element_size() for t in block)
                received, requests = _exchange(block, rank, size, ctx.group)
                for request in requests:
                    request.wait()
                block = received
        return dq.to(q.dtype), block[3].to(k.dtype), block[4].to(v.dtype), None, None, None, None, None, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: Any = None,
    is_causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    layout: Layout = "zigzag",
    seq_len: int | None = None,
    stats: RingStats | None = None,
) -> torch.Tensor:
    """Attention over a sequence sharded across the processes of ``group``; returns this rank's (B, H, Tl, D) output.

    q (B, H, Tl, D), k and v (B, Hkv, Tl, D): this rank's shard in ``layout`` (``shard_sequence`` makes it), the same
    shapes on every rank (checked with one small collective, so a mismatch is an error everywhere, not a hang).
    ``seq_len``: the real global length when the shards were padded (the padding keys are hidden).
    ``stats``: a :class:`RingStats` that counts the bytes this rank sends, forward and backward.
    Equal to one-process ``attention()`` on the gathered sequence, forward and backward.
    """
    rank, size = _world(group)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(
                f"{name} must be a 4-D tensor (batch, heads, local tokens, head_dim), got {getattr(t, 'shape', t)}"
            )
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of kv heads ({k.shape[1]})")
    if window is not None:
        check_window(window)
    check_scale(scale)
    _check_shapes(q, k, v, group, size)
    length = q.shape[2] * size
    if length % _chunks(size, layout):
        raise ValueError(
            f"{size} ranks of {q.shape[2]} tokens cannot be cut into {_chunks(size, layout)} equal chunks "
            f"({layout}); shard with shard_sequence, which pads to a multiple"
        )
    if seq_len is not None and not 0 < seq_len <= length:
        raise ValueError(f"seq_len must be in [1, {length}] (the padded length over {size} ranks), got {seq_len}")
    q_pos = sequence_positions(length, rank, size, layout, q.device)
    scale_ = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    causal = is_causal or window is not None
    hidden = seq_len if seq_len is not None and seq_len < length else None
    out: torch.Tensor = _Ring.apply(q, k, v, q_pos, scale_, causal, window, hidden, group, stats)
    return out
