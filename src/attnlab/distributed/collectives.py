"""Every collective the ring makes: the sequence's shards, the checks every rank agrees on, the exchanges.

``layout="zigzag"`` cuts a sequence into 2P chunks and gives rank r chunks r and
2P-1-r, so every rank does the same causal work; ``"contiguous"`` gives rank r
the r-th P-th. A check that every rank holds the same shapes and settings is one
small all_gather, so a disagreement is an error on every rank, never a hang. A
block travels to rank r + 1 with ``batch_isend_irecv``, whole or in pieces
(:func:`piece_bounds`).

Shapes: P = processes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist

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
    chunks = (rank, 2 * size - 1 - rank)  # zigzag: an early chunk and its mirror, so causal work is even
    return torch.cat([torch.arange(n * c, (n + 1) * c, device=device) for n in chunks])


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


def _exchange(
    send: list[torch.Tensor],
    into: list[torch.Tensor],
    rank: int,
    size: int,
    group: Any,
    stats: RingStats | None,
    *,
    backward: bool,
) -> list[Any]:
    """Start sending ``send`` to rank + 1 and receiving the same shapes from rank - 1 into ``into``; the requests.

    Both sides post in the same order, and each pair of ranks delivers in order, so two exchanges in flight at
    once (the backward's block and its gradients) never cross."""
    to, source = (rank + 1) % size, (rank - 1) % size
    if group is not None:
        to, source = dist.get_global_rank(group, to), dist.get_global_rank(group, source)
    ops = [dist.P2POp(dist.isend, t, to, group) for t in send]
    ops += [dist.P2POp(dist.irecv, r, source, group) for r in into]
    if stats is not None:
        sent = sum(t.numel() * t.element_size() for t in send)
        if backward:
            stats.backward_bytes += sent
        else:
            stats.forward_bytes += sent
    return dist.batch_isend_irecv(ops)


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
