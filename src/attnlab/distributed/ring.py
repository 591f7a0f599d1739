"""Ring attention: each process holds a shard of the sequence; key/value blocks travel around the ring.

With P processes, rank r holds its queries and one block of keys and values.
At step s it attends its queries to the block that started on rank r - s
(with attnlab's flash kernel, which returns each row's log-sum-exp), while the
block moves on to rank r + 1 with ``batch_isend_irecv``; the partial results
merge by their log-sum-exp, ``lse = logaddexp(lse_a, lse_b); out = out_a * exp(lse_a - lse) +
out_b * exp(lse_b - lse)``, with the flash backend's own running softmax (``functional/blocks.py``).
In the forward pass the blocks travel in pieces (``piece_bounds``), pipelined, so
a rank holds a few pieces in flight instead of a whole block in hand and another
arriving: its memory stays within about 1.2x of 1/P of one process. The
backward pass walks the ring again with whole blocks: each block carries its own
key and value gradients, which arrive back at their owner after the last step.

Who may attend is a :class:`Visibility` per block, on global positions, the padding at -1; how the sequence is
cut over the ranks (``layout``), and every message, is ``distributed/collectives.py``'s.

Shapes: B = batch, H = query heads, Hkv = key/value heads, T = global length,
Tl = local length (T / P, padded), D = head dim, P = processes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from attnlab._checks import check_scale, check_window
from attnlab.distributed.collectives import (
    LAYOUTS,
    Layout,
    RingStats,
    _buffer,
    _check_shapes,
    _chunks,
    _exchange,
    _spare,
    _wait,
    _world,
    piece_bounds,
    sequence_positions,
)
from attnlab.functional.blocks import Running, merge
from attnlab.functional.eager import accumulation_dtype, repeat_kv
from attnlab.functional.flash_passes import DEFAULT_BLOCK, flash_backward, flash_forward
from attnlab.functional.mods import MaskMod, ScoreMod
from attnlab.functional.visibility import Visibility


def _block_visibility(
    q_pos: torch.Tensor, k_pos: torch.Tensor, options: _Options, batch: int, heads: int
) -> Visibility:
    """Local queries against one block of keys, at global positions; the padding sits at -1, so it sees nothing
    and is seen by nobody: it adds nothing to any output or gradient."""
    return Visibility(q_pos=q_pos, k_pos=k_pos, batch=batch, heads=heads, **options.rules)


@dataclass(frozen=True)
class _Options:
    """What every block of one ring call shares."""

    scale: float
    rules: dict[str, Any]  # who may attend, as Visibility takes it: causal, window, mask_mod, score_mod
    group: Any
    stats: RingStats | None


QUERY_CHUNK = 4 * DEFAULT_BLOCK  # queries per kernel call: the partial output that a merge holds stays this small


def _kernel_options(vis: Visibility, options: _Options) -> dict[str, Any]:
    """The flash kernel's settings for one block, forward and backward alike (its tiles classified once)."""
    tiles = {"block_q": DEFAULT_BLOCK, "block_k": DEFAULT_BLOCK, "kinds": vis.tile_kinds(DEFAULT_BLOCK, DEFAULT_BLOCK)}
    return {"scale": options.scale, "dropout_p": 0.0, "seed": 0, **tiles}


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        options: _Options,
        *params: torch.Tensor,  # the score_mod's learnable tensors: inputs, so they get gradients
    ) -> torch.Tensor:
        """Blocks travel in pieces, pipelined: at tick t rank r sends its own piece t and forwards what it
        received at tick t - 1 (the piece of the block from rank r - d that has made d hops), receives the
        pieces one hop behind, and meanwhile computes what it received at t - 1. Every rank posts the same
        pieces in the same order (by hops), so the exchanges match without any negotiation."""
        rank, size = _world(options.group)
        b, h, tl, _ = q.shape
        groups = h // k.shape[1]
        state = Running.start(b, h, tl, v.shape[-1], dtype=accumulation_dtype(q.dtype), device=q.device)

        def fold(kb: torch.Tensor, vb: torch.Tensor, k_pos: torch.Tensor) -> None:
            kb, vb = repeat_kv(kb, groups), repeat_kv(vb, groups)  # (B, H, piece, D)
            for c0 in range(0, tl, QUERY_CHUNK):
                c1 = min(c0 + QUERY_CHUNK, tl)
                vis = _block_visibility(q_pos[c0:c1], k_pos, options, b, h)
                part, part_lse = flash_forward(q[:, :, c0:c1], kb, vb, vis, **_kernel_options(vis, options))
                merge(state.rows(c0, c1), part, part_lse)  # by log-sum-exp, in place

        pieces = piece_bounds(tl, size)
        held: list[list[torch.Tensor]] = []  # received last tick, hops 1, 2, ...: computed now, forwarded now
        for tick in range(len(pieces) + size - 2 if size > 1 else 0):
            send = []
            if tick < len(pieces):  # this rank's own piece starts its journey
                p0, p1 = pieces[tick]
                send.append([k[:, :, p0:p1].contiguous(), v[:, :, p0:p1].contiguous(), q_pos[p0:p1].contiguous()])
            # held is in order of hops made, from max(1, tick - pieces + 1); a piece goes on while under P - 1 hops
            first = max(1, tick - len(pieces) + 1)
            send += [piece for hops, piece in enumerate(held, start=first) if hops < size - 1]
            into = []  # arriving this tick: piece tick - (d - 1) of the block from rank r - d, for each d under way
            for hops in range(1, size):
                j = tick - (hops - 1)
                if 0 <= j < len(pieces):
                    p0, p1 = pieces[j]
                    into.append([_buffer(k[:, :, p0:p1]), _buffer(v[:, :, p0:p1]), _buffer(q_pos[p0:p1])])
            flat_send, flat_into = [x for piece in send for x in piece], [x for piece in into for x in piece]
            requests = _exchange(flat_send, flat_into, rank, size, options.group, options.stats, backward=False)
            if tick == 0:
                fold(k, v, q_pos)  # this rank's own block, while the first pieces travel
            for piece in held:
                fold(*piece)
            _wait(requests)
            del send, flat_send
            held = into
        if size == 1:
            fold(k, v, q_pos)
        for piece in held:
            fold(*piece)
        del held
        out, lse = state.finish()  # lse +inf where nothing is seen: the kernels' contract
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, q_pos, out, lse, *params)
        ctx.options = options
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, q_pos, out, lse, *params = ctx.saved_tensors
        options: _Options = ctx.options
        rank, size = _world(options.group)
        b, h = q.shape[:2]
        groups = h // k.shape[1]
        ad = accumulation_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=ad, device=q.device)
        dparams: list[torch.Tensor | None] = [None] * len(params)
        block = [k.contiguous(), v.contiguous(), q_pos]
        grads = [torch.zeros(k.shape, dtype=ad, device=q.device), torch.zeros(v.shape, dtype=ad, device=q.device)]
        buffers, grad_buffers = _spare(block, size - 1), _spare(grads, size if size > 1 else 0)
        for step in range(size):
            requests = None
            if step < size - 1:  # keys and values move on while their gradients are computed here
                requests = _exchange(block, buffers[step % 2], rank, size, options.group, options.stats, backward=True)
            vis = _block_visibility(q_pos, block[2], options, b, h)
            dq_part, dk_part, dv_part, dparams_part = flash_backward(
                grad_out,
                q,
                repeat_kv(block[0], groups),
                repeat_kv(block[1], groups),
                out,
                lse,
                vis,
                **_kernel_options(vis, options),
                params=tuple(params),
            )
            dq += dq_part
            bk, hk, t, d = block[0].shape
            grads[0] += dk_part.view(bk, hk, groups, t, d).sum(dim=2)  # (B, H, Tl, D) -> (B, Hkv, Tl, D)
            grads[1] += dv_part.view(bk, hk, groups, t, dv_part.shape[-1]).sum(dim=2)
            for n, g in enumerate(dparams_part):
                if g is not None:
                    seen = dparams[n]
                    dparams[n] = g if seen is None else seen + g
            if size > 1:  # the gradients follow their block; after the last step they are back with its owner
                arriving = grad_buffers[step % 2]
                _wait(_exchange(grads, arriving, rank, size, options.group, options.stats, backward=True))
                grads = arriving
            _wait(requests)
            if requests is not None:
                block = buffers[step % 2]
        return dq.to(q.dtype), grads[0].to(k.dtype), grads[1].to(v.dtype), None, None, *dparams


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
    mask_mod: MaskMod | None = None,
    score_mod: ScoreMod | None = None,
    stats: RingStats | None = None,
) -> torch.Tensor:
    """Attention over a sequence sharded across the processes of ``group``; returns this rank's (B, H, Tl, D) output.

    q (B, H, Tl, D), k and v (B, Hkv, Tl, D): this rank's shard in ``layout`` (``shard_sequence`` makes it), the same
    shapes on every rank (checked with one small collective, so a mismatch is an error everywhere, not a hang).
    ``seq_len``: the real global length when the shards were padded (the padding keys are hidden).
    ``mask_mod`` / ``score_mod`` (``attnlab.functional.mods``, FlexAttention's signatures) see global positions,
    so ``mods.document(ids)`` takes the whole sequence's (B, T) ids; a score_mod's learnable tensors get this
    rank's share of their gradient (sum it over the ranks, as for any weight).
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
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int)):
        raise ValueError(f"seq_len must be an int number of tokens (the real global length), got {seq_len!r}")
    settings = {
        "is_causal": int(is_causal),
        "window": -1 if window is None else window,
        "layout": LAYOUTS.index(layout),
        "seq_len": -1 if seq_len is None else int(seq_len),
        "mask_mod": int(mask_mod is not None),
        "score_mod": int(score_mod is not None),
    }
    _check_shapes(q, k, v, group, settings)
    length = q.shape[2] * size
    if length % _chunks(size, layout):
        raise ValueError(
            f"{size} ranks of {q.shape[2]} tokens cannot be cut into {_chunks(size, layout)} equal chunks "
            f"({layout}); shard with shard_sequence, which pads to a multiple"
        )
    if seq_len is not None and not 0 < seq_len <= length:
        raise ValueError(f"seq_len must be in [1, {length}] (the padded length over {size} ranks), got {seq_len}")
    q_pos = sequence_positions(length, rank, size, layout, q.device)
    if seq_len is not None:  # the padding past the real length: -1, an empty slot that sees and is seen by nothing
        q_pos = torch.where(q_pos < seq_len, q_pos, -1)
    options = _Options(
        scale=1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale),
        rules=dict(causal=is_causal or window is not None, window=window, mask_mod=mask_mod, score_mod=score_mod),
        group=group,
        stats=stats,
    )
    # every tensor the score_mod declares or reads gets its share of the gradient (a global's too)
    trained = Visibility(q_pos=q_pos, k_pos=q_pos, score_mod=score_mod).trained_tensors()
    out: torch.Tensor = _Ring.apply(q, k, v, q_pos, options, *trained)
    return out
