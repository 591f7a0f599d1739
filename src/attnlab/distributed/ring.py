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

Who may attend is a :class:`Visibility` per block, on global positions, the padding at -1. ``layout="zigzag"`` cuts the
sequence into 2P chunks and gives rank r chunks r and 2P-1-r, so every rank
does the same causal work; ``"contiguous"`` gives rank r the r-th P-th.

Shapes: B = batch, H = query heads, Hkv = key/value heads, T = global length,
Tl = local length (T / P, padded), D = head dim, P = processes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from attnlab._checks import check_scale, check_window
from attnlab.functional.blocks import Running, merge
from attnlab.functional.eager import accumulation_dtype, repeat_kv
from attnlab.functional.flash import DEFAULT_BLOCK, flash_backward, flash_forward
from attnlab.functional.mods import MaskMod, ScoreMod
from attnlab.functional.visibility import Visibility

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
    dims = list(x.shape)[:8] + [-1] * (8 - min(x.dim(), 8))  # a fixed-size record on every rank, whatever x is
    shape = {"dims": x.dim(), **{f"shape[{i}]": n for i, n in enumerate(dims)}, "length": length}
    _agree({**shape, "dtype": _DTYPES.index(x.dtype) if x.dtype in _DTYPES else 9}, group, x.device, "gather_sequence")
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=group)
    padded = x.shape[dim] * size
    order = torch.cat([sequence_positions(padded, r, size, layout, x.device) for r in range(size)])
    full = torch.empty_like(torch.cat(parts, dim=dim))
    full.index_copy_(dim, order, torch.cat(parts, dim=dim))
    return full.narrow(dim, 0, length)


def every_rank(flag: bool, group: Any = None, device: torch.device | None = None) -> list[bool]:
    """Each rank's ``flag``, by rank (one small all_gather): a check that fails on one rank can fail on all."""
    _, size = _world(group)
    mine = torch.tensor([int(flag)], device=device)
    every = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(every, mine, group=group)
    return [bool(t.item()) for t in every]


_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _agree(values: dict[str, int], group: Any, device: torch.device, what: str) -> None:
    """Every rank must hold the same ``values``: compared with one small all_gather, so that a disagreement is a
    ValueError on every rank, naming each rank's values, never a hang, a C++ abort or a silent wrong answer."""
    _, size = _world(group)
    mine = torch.tensor(list(values.values()), dtype=torch.long, device=device)  # nccl: on the GPU
    every = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(every, mine, group=group)
    if len({tuple(t.tolist()) for t in every}) > 1:
        names = list(values)
        differ = [n for i, n in enumerate(names) if len({int(t[i]) for t in every}) > 1]
        shown = "; ".join(
            f"rank {r}: " + ", ".join(f"{n}={_shown(n, int(t[names.index(n)]))}" for n in differ)
            for r, t in enumerate(every)
        )
        raise ValueError(f"{what} needs the same {', '.join(differ)} on every rank; got {shown}")


def _shown(name: str, value: int) -> str:
    if name == "dtype":
        return str(_DTYPES[value]) if 0 <= value < len(_DTYPES) else "another dtype"
    if name == "layout":
        return repr(LAYOUTS[value])
    if value == -1 and name in ("window", "seq_len"):
        return "None"
    return str(value)


def _check_shapes(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any, settings: dict[str, int] | None = None
) -> None:
    """Every rank must hold the same shapes, dtype and settings (``settings``), checked by one collective."""
    values = {f"{name} shape[{i}]": n for name, t in (("q", q), ("k", k), ("v", v)) for i, n in enumerate(t.shape)}
    values["dtype"] = _DTYPES.index(q.dtype) if q.dtype in _DTYPES else len(_DTYPES)
    _agree({**values, **(settings or {})}, group, q.device, "ring attention")


def _block_visibility(
    q_pos: torch.Tensor, k_pos: torch.Tensor, options: _Options, batch: int, heads: int
) -> Visibility:
    """Local queries against one block of keys, at global positions; the padding sits at -1, so it sees nothing
    and is seen by nobody: it adds nothing to any output or gradient."""
    return Visibility(
        q_pos=q_pos,
        k_pos=k_pos,
        causal=options.causal,
        window=options.window,
        mask_mod=options.mask_mod,
        score_mod=options.score_mod,
        batch=batch,
        heads=heads,
    )


@dataclass(frozen=True)
class _Options:
    """What every block of one ring call shares."""

    scale: float
    causal: bool
    window: int | None
    mask_mod: Any
    score_mod: Any
    group: Any
    stats: RingStats | None
    device: torch.device


QUERY_CHUNK = 4 * DEFAULT_BLOCK  # queries per kernel call: the partial output that a merge holds stays this small


def _exchange(
    send: list[torch.Tensor], into: list[torch.Tensor], rank: int, size: int, options: _Options, *, backward: bool
) -> list[Any]:
    """Start sending ``send`` to rank + 1 and receiving the same shapes from rank - 1 into ``into``; the requests.

    Both sides post in the same order, and each pair of ranks delivers in order, so two exchanges in flight at
    once (the backward's block and its gradients) never cross."""
    to, source, group = (rank + 1) % size, (rank - 1) % size, options.group
    if group is not None:
        to, source = dist.get_global_rank(group, to), dist.get_global_rank(group, source)
    ops = [dist.P2POp(dist.isend, t, to, group) for t in send]
    ops += [dist.P2POp(dist.irecv, r, source, group) for r in into]
    if options.stats is not None:
        sent = sum(t.numel() * t.element_size() for t in send)
        if backward:
            options.stats.backward_bytes += sent
        else:
            options.stats.forward_bytes += sent
    return dist.batch_isend_irecv(ops)


def _kernel_options(vis: Visibility, options: _Options) -> dict[str, Any]:
    """The flash kernel's settings for one block, forward and backward alike (its tiles classified once)."""
    return {
        "scale": options.scale,
        "dropout_p": 0.0,
        "seed": 0,
        "block_q": DEFAULT_BLOCK,
        "block_k": DEFAULT_BLOCK,
        "kinds": vis.tile_kinds(DEFAULT_BLOCK, DEFAULT_BLOCK),
    }


def _wait(requests: list[Any] | None) -> None:
    for request in requests or ():
        request.wait()


def _buffer(like: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(like, memory_format=torch.contiguous_format)


def _spare(tensors: list[torch.Tensor], exchanges: int) -> list[list[torch.Tensor]]:
    """Receive buffers shaped like ``tensors``: two, which the block in hand and the one arriving take turns in,
    or one when there is a single exchange."""
    count = min(2, exchanges)
    return [[_buffer(t) for t in tensors] for _ in range(count)]


MIN_PIECE = 4  # tokens: a smaller piece costs more in messages than it saves in memory


def piece_bounds(local: int, size: int) -> list[tuple[int, int]]:
    """How the forward cuts each travelling block: (start, end) of each piece, the same on every rank.

    Rank r receives, each tick, at most one piece from each of the P - 1 blocks still on the way and holds
    them one tick more (computed while the next ones arrive) before forwarding them: about 2P - 1 pieces in
    hand. 4 (2P - 1) pieces a block keep that near a quarter of one block, whatever P: the forward's memory
    stays near 1/P of one process instead of doubling it with a whole block in hand and one arriving.
    A short block is cut in fewer pieces, none under MIN_PIECE tokens.
    """
    count = max(1, min(local // MIN_PIECE, 4 * (2 * size - 1)))
    edges = [round(i * local / count) for i in range(count + 1)]
    return [(a, b) for a, b in itertools.pairwise(edges) if b > a]


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
            flat_send = [x for piece in send for x in piece]
            requests = _exchange(flat_send, [x for piece in into for x in piece], rank, size, options, backward=False)
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
                requests = _exchange(block, buffers[step % 2], rank, size, options, backward=True)
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
                _wait(_exchange(grads, arriving, rank, size, options, backward=True))
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
        causal=is_causal or window is not None,
        window=window,
        mask_mod=mask_mod,
        score_mod=score_mod,
        group=group,
        stats=stats,
        device=q.device,
    )
    # every tensor the score_mod declares or reads gets its share of the gradient (a global's too)
    trained = Visibility(q_pos=q_pos, k_pos=q_pos, score_mod=score_mod).trained_tensors()
    out: torch.Tensor = _Ring.apply(q, k, v, q_pos, options, *trained)
    return out
