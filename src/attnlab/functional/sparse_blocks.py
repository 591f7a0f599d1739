"""Block-sparse attention: each query reads a few blocks of keys, chosen by a score of the whole block.

MoBA (Lu et al. 2025, "MoBA: Mixture of Block Attention for Long-Context LLMs") splits the keys into blocks of
``block`` positions. Each query scores every block wholly before its own by q . mean(keys of the block), always
reads its own block (causal inside it), and reads the best others, ``top_k`` blocks in all: the reference code
(MoonshotAI/MoBA's moba_naive.py) sets the own block's gate to +inf before its top-k, and its efficient form
takes top_k - 1 past blocks beside the own one (:func:`moba_select`). The gate is unscaled (it only ranks). Attention runs over the union of the chosen blocks.
With ``top_k`` at least the blocks of the past, the union is the whole past: full causal attention.

A choice of blocks is a restriction of who may attend, so it is expressed as a :class:`Visibility`:

* readable (:func:`chosen_visibility`): every key there, the keys outside the chosen blocks hidden by a mask;
* fast (:func:`block_slots`, :func:`gather_rows`, :func:`rows_visibility`): each query (one head, or one group
  of heads, at a time) becomes a row of its own holding only its chosen blocks' keys, gathered by the slots the
  choice names; the kernel never scores another. From the gathered positions it returns, :func:`keys_read`
  counts what the gather read (a key a row and query) and :func:`distinct_keys` the keys each query's rows read
  between them (a key counted once however many heads read it, as a dense layer's meter counts).

Positions here are a row's own token positions (0 at its first real token): keys (B, S) with -1 where a slot
holds nothing (left padding, an empty cache slot), and each row's held keys at consecutive slots from its first
(:func:`slot_offsets`), as a plain or paged cache returns them. NSA (``attnlab.functional.nsa``) chooses its
blocks otherwise and reads them through the same helpers.

Shapes: B = batch, H = query heads, Hk = key heads, R = rows that choose (H, or Hk where a group chooses
together), Tq = queries, S = key slots, D = head size, L = tokens a block, N = blocks, K = blocks chosen a query,
M = K * L keys gathered a query.
"""

from __future__ import annotations

import torch

from attnlab._checks import check_positive_int
from attnlab.functional.attention import attention
from attnlab.functional.visibility import Visibility
from attnlab.observe import is_recording, record


def check_blocks(block: int, top_k: int, context: int, *, names: tuple[str, str] = ("block", "top_k")) -> int:
    """Refuse a block size of 0 or less and a ``top_k`` over the blocks a ``context`` holds; the block count."""
    check_positive_int(names[0], block, limit=2**20)
    check_positive_int(names[1], top_k, limit=2**20)
    blocks = -(-context // block)
    if top_k > blocks:
        raise ValueError(
            f"{names[1]}={top_k} blocks a query, but a context of {context} tokens holds {blocks} blocks of "
            f"{names[0]}={block}: choose {names[1]} <= {blocks}"
        )
    return blocks


def slot_offsets(k_pos: torch.Tensor) -> torch.Tensor:
    """Each row's slot of position 0, (B,): its held keys sit at consecutive slots from there."""
    slots = torch.arange(k_pos.shape[-1], device=k_pos.device)
    return torch.where(k_pos >= 0, slots - k_pos, -1).amax(-1).clamp(min=0)  # (B,)


def block_means(keys: torch.Tensor, k_pos: torch.Tensor, block: int, blocks: int) -> torch.Tensor:
    """The mean key of each block of ``block`` positions, (B, Hk, N, D); a block holding no key: 0."""
    b, hk, _, d = keys.shape
    ids = torch.where(k_pos >= 0, k_pos // block, blocks).clamp(max=blocks)  # (B, S): slot N gathers the empty
    index = ids[:, None, :, None].expand(b, hk, -1, d)  # (B, Hk, S, D)
    sums = keys.new_zeros(b, hk, blocks + 1, d).scatter_add(2, index, keys)  # (B, Hk, N + 1, D)
    counts = torch.zeros(b, blocks + 1, dtype=keys.dtype, device=keys.device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=keys.dtype))  # (B, N + 1)
    return sums[:, :, :blocks] / counts[:, None, :blocks, None].clamp(min=1)


def top_blocks(scores: torch.Tensor, forced: torch.Tensor, allowed: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` blocks of highest score per (row, query) among ``allowed`` ones, every ``forced`` one first:
    block ids (B, R, Tq, K), -1 where fewer were allowed.

    Args:
        scores: (B, R, Tq, N); forced, allowed: bool, broadcastable to it.
    """
    ranked = torch.where(forced, float("inf"), torch.where(allowed, scores.float(), float("-inf")))
    best, ids = ranked.topk(min(k, scores.shape[-1]), dim=-1)  # (B, R, Tq, K)
    return torch.where(best > float("-inf"), ids, -1)


def moba_select(
    q: torch.Tensor, keys: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, *, block: int, top_k: int
) -> torch.Tensor:
    """MoBA's gate: each head's query scores each block wholly before its own by q . mean(k), and takes its own
    block and the ``top_k - 1`` best of those: block ids (B, H, Tq, K).

    Args:
        q: (B, H, Tq, D); keys: (B, Hk, S, D); q_pos (B, Tq), k_pos (B, S): the row's positions, -1 for none.
    """
    blocks = -(-keys.shape[2] // block)
    means = block_means(keys, k_pos, block, blocks)  # (B, Hk, N, D)
    means = means.repeat_interleave(q.shape[1] // keys.shape[1], dim=1)  # (B, H, N, D)
    scores = q @ means.transpose(-1, -2)  # (B, H, Tq, N)
    own = (q_pos // block)[:, None, :, None]  # (B, 1, Tq, 1): -1 for a query that sees nothing
    ids = torch.arange(blocks, device=q.device)
    return top_blocks(scores, (ids == own) & (own >= 0), ids < own, top_k)


def block_slots(
    chosen: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The slots of the chosen blocks' keys and their positions, (B, R, Tq, M) each: position -1 where a block was
    not chosen, is not held, or lies after the query (its own block's future)."""
    b, r, tq, k = chosen.shape
    s = k_pos.shape[-1]
    within = torch.arange(block, device=chosen.device)
    pos = (chosen[..., None] * block + within).reshape(b, r, tq, k * block)  # (B, R, Tq, M)
    slots = pos + slot_offsets(k_pos)[:, None, None, None]
    held = k_pos.gather(1, slots.clamp(0, s - 1).reshape(b, -1)).view(b, r, tq, k * block)  # (B, R, Tq, M)
    keep = (chosen >= 0).repeat_interleave(block, dim=-1) & (slots < s) & (held == pos)
    keep &= pos <= q_pos[:, None, :, None]
    return slots.clamp(0, s - 1), torch.where(keep, pos, -1)


def gather_rows(x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Each (row, query)'s gathered keys or values: x (B, R, S, D), slots (B, R, Tq, M) -> (B * R * Tq, 1, M, D)."""
    b, r, _, d = x.shape
    tq, m = slots.shape[2], slots.shape[3]
    index = slots.reshape(b, r, tq * m, 1).expand(b, r, tq * m, d)  # (B, R, Tq * M, D)
    return x.gather(2, index).view(b, r, tq, m, d).reshape(b * r * tq, 1, m, d)  # (B * R * Tq, 1, M, D)


def rows_visibility(q_pos: torch.Tensor, picked: torch.Tensor) -> Visibility:
    """The fast form's Visibility: B * R * Tq rows of one query, over its M gathered keys at their positions."""
    b, r, tq, m = picked.shape
    rows = q_pos[:, None, :].expand(b, r, tq).reshape(b * r * tq, 1)  # (B * R * Tq, 1)
    return Visibility(q_pos=rows, k_pos=picked.reshape(b * r * tq, m), causal=True)


def per_row(q: torch.Tensor, rows: int) -> torch.Tensor:
    """Queries (B, H, Tq, D) as (B * R * Tq, H / R, 1, D): the heads of a row that chose together side by side."""
    b, h, tq, d = q.shape
    grouped = q.view(b, rows, h // rows, tq, d).permute(0, 1, 3, 2, 4)  # (B, R, Tq, H / R, D)
    return grouped.reshape(b * rows * tq, h // rows, 1, d)


def per_head(out: torch.Tensor, batch: int, rows: int) -> torch.Tensor:
    """:func:`per_row`'s layout back: (B * R * Tq, H / R, 1, Dv) -> (B, H, Tq, Dv)."""
    n, g, _, dv = out.shape
    tq = n // (batch * rows)
    return out.view(batch, rows, tq, g, dv).permute(0, 1, 3, 2, 4).reshape(batch, rows * g, tq, dv)


def chosen_visibility(
    chosen: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, block: int, heads: int
) -> Visibility:
    """The readable form's Visibility: causal over every key, all but the chosen blocks' hidden (a mask per
    head: rows that chose for a group of heads spread to its heads)."""
    b, r, tq, _ = chosen.shape
    blocks = -(-k_pos.shape[-1] // block)
    marks = torch.zeros(b, r, tq, blocks + 1, dtype=torch.bool, device=chosen.device)
    marks.scatter_(3, torch.where(chosen >= 0, chosen, blocks), True)  # (B, R, Tq, N + 1): N takes the -1s
    ids = torch.where(k_pos >= 0, k_pos // block, blocks).clamp(max=blocks)  # (B, S)
    index = ids[:, None, None, :].expand(b, r, tq, -1)  # (B, R, Tq, S)
    mask = marks.gather(3, index).repeat_interleave(heads // r, dim=1)  # (B, H, Tq, S)
    return Visibility(q_pos=q_pos, k_pos=k_pos, causal=True, mask=mask)


def gathered_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    chosen: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    *,
    block: int,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fast form: each query over its chosen blocks' keys alone; (context (B, H, Tq, Dv), the positions each
    row and query gathered (B, R, Tq, M), -1 for none: what :func:`keys_read` and :func:`distinct_keys` count).

    Args:
        q: (B, H, Tq, D); keys, values: (B, Hk, S, D); chosen: block ids (B, R, Tq, K), R = H (a choice a head,
            MoBA's) or Hk (a choice a group of heads, NSA's).
    """
    b, r = q.shape[0], chosen.shape[1]
    slots, picked = block_slots(chosen, q_pos, k_pos, block)  # (B, R, Tq, M)
    spread = r // keys.shape[1]  # a choice a head under GQA: each head reads its group's keys
    rows = rows_visibility(q_pos, picked)
    k_rows = gather_rows(keys.repeat_interleave(spread, dim=1), slots)  # (B * R * Tq, 1, M, D)
    v_rows = gather_rows(values.repeat_interleave(spread, dim=1), slots)
    out = attention(per_row(q, r), k_rows, v_rows, visibility=rows, scale=scale, dropout_p=dropout_p)
    if is_recording():  # the slots this gather read (B, R, Tq, M), -1 for none: the views' (nn.selection_record)
        record("block_slots", torch.where(picked >= 0, slots, -1), source="gathered_attention")
    return per_head(out, b, r), picked


def keys_read(picked: torch.Tensor) -> torch.Tensor:
    """How many keys a gather read, a key a row (head or group) and query: its filled positions (a 0-dim tensor)."""
    return (picked >= 0).sum()


def distinct_keys(picked: torch.Tensor) -> torch.Tensor:
    """The keys each query's rows read between them, (B, Tq): the distinct positions of ``picked`` (B, R, Tq, M), a
    key counted once however many heads gathered it."""
    b, r, tq, m = picked.shape
    ordered = picked.permute(0, 2, 1, 3).reshape(b, tq, r * m).sort(dim=-1).values  # (B, Tq, R * M)
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[..., 1:] = ordered[..., 1:] != ordered[..., :-1]  # a position's first place in its sorted row
    return (first & (ordered >= 0)).sum(dim=-1)
