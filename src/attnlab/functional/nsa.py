"""Native Sparse Attention's compressed branch and its choice of blocks (Yuan et al. 2025, "Native Sparse
Attention: Hardware-Aligned and Natively Trainable Sparse Attention").

NSA reads three branches per query and mixes them by gates (``attnlab.nn.nsa``):

* compressed (the paper's eq. 7-8): the keys and values of each block of ``l`` tokens, blocks starting every
  ``d`` tokens, summarised into one entry each (:func:`compress`); an entry is visible to a query once its
  block has closed (its last token at or before the query), and the query attends over those entries
  (:func:`compressed_attention`, which also returns the attention weights p_cmp);
* selected (eq. 9-12): the tokens of ``n`` blocks of ``l'`` tokens, chosen by p_cmp summed over the heads of a
  GQA group (eq. 10: one choice a group, so a group reads one set of keys). The paper assumes l <= l', d | l
  and d | l' (refused otherwise, :func:`check_nsa`); its eq. 9 sums p_cmp over entries near each selection
  block with its own indexing; here a selection block scores the entries that overlap it, each once, which is
  eq. 9's p_slc = p_cmp where l = l' = d. The query's first block and its two local ones (its own, causal inside
  it, and the one before) are always taken within the ``n``, as the paper's experiments do ("including fixed
  activating the 1 initial block and 2 local blocks", section 4.1) (:func:`nsa_select`); the blocks are read
  through ``attnlab.functional.sparse_blocks`` like MoBA's;
* sliding: the last ``w`` tokens (attnlab's windowed attention).

The compression here is a learned linear map over a block's ``l`` keys (or values) after a learned intra-block
position embedding is added: entry = sum_j W_j (k_j + P_j), with W (l, D, D) initialised to I / l and P to 0, so
a fresh layer mean-pools (the paper's phi is "a learnable MLP with intra-block position encoding").

Shapes: B = batch, H = query heads, Hk = key heads, G = H / Hk, Tq = queries, S = key slots, D = head size,
C = compressed entries, N = selection blocks, K = blocks chosen.
"""

from __future__ import annotations

import torch

from attnlab._checks import check_positive_int
from attnlab.functional.attention import attention
from attnlab.functional.sparse_blocks import distinct_keys, slot_offsets, top_blocks
from attnlab.functional.visibility import Visibility


def check_nsa(*, compress_block: int, stride: int, select_block: int, select_n: int, window: int, context: int) -> None:
    """Refuse sizes NSA cannot use, naming them: each positive; the stride dividing both block sizes and the
    compressed block no longer than the selection block (the paper's assumptions); at least 3 blocks chosen (the
    first and the two local ones are always among them) and no more than a context holds."""
    for name, value in (
        ("compress_block", compress_block),
        ("stride", stride),
        ("select_block", select_block),
        ("select_n", select_n),
        ("window", window),
    ):
        check_positive_int(name, value, limit=2**20)
    for name, size in (("compress_block", compress_block), ("select_block", select_block)):
        if size % stride:
            raise ValueError(
                f"stride={stride} must divide {name}={size}: a selection block's score is read off the compressed "
                "entries that start inside it, every stride tokens"
            )
    if compress_block > select_block:
        raise ValueError(
            f"compress_block={compress_block} is longer than select_block={select_block}: NSA scores a selection "
            "block from the compressed entries inside it (the paper assumes l <= l'); choose compress_block <= "
            "select_block"
        )
    blocks = -(-context // select_block)
    if not 3 <= select_n <= blocks:
        raise ValueError(
            f"select_n={select_n} blocks a query: it counts the first block and the two local ones, so at least 3, "
            f"and a context of {context} tokens holds {blocks} blocks of select_block={select_block}: choose "
            f"3 <= select_n <= {blocks}"
        )


def compress(
    x: torch.Tensor, k_pos: torch.Tensor, weight: torch.Tensor, position: torch.Tensor, *, block: int, stride: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every closed block's entry, (B, Hk, C, D), and the position of its last token (B, C), -1 where a row
    does not hold the whole block.

    Args:
        x: keys or values (B, Hk, S, D) at the row positions ``k_pos`` (B, S); weight: (l, D, D); position: (l, D).
    """
    b, hk, s, d = x.shape
    count = max(0, (s - block) // stride + 1)
    starts = torch.arange(count, device=x.device) * stride  # (C,)
    pos = starts[:, None] + torch.arange(block, device=x.device)  # (C, l)
    slots = pos + slot_offsets(k_pos)[:, None, None]  # (B, C, l)
    held = k_pos.gather(1, slots.clamp(max=s - 1).reshape(b, -1)).view(b, count, block)  # (B, C, l)
    whole = ((slots < s) & (held == pos)).all(-1)  # (B, C)
    index = slots.clamp(max=s - 1).reshape(b, 1, count * block, 1).expand(b, hk, count * block, d)
    blocks = x.gather(2, index).view(b, hk, count, block, d)  # (B, Hk, C, l, D)
    entries = torch.einsum("bhcld,led->bhce", blocks + position, weight)  # sum_j W_j (k_j + P_j)
    return entries, torch.where(whole, starts + block - 1, -1)


def compressed_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, ends: torch.Tensor, q_pos: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query over the entries whose block closed at or before it: (context (B, H, Tq, D), weights
    (B, H, Tq, C)); a query before the first closed block reads nothing (0).

    The entries stand at their last token's position, so "closed" is causal over those positions.
    """
    if keys.shape[2] == 0:  # no block closed anywhere: every weight and context is 0
        b, h, tq, _ = q.shape
        return q.new_zeros(b, h, tq, values.shape[-1]), q.new_zeros(b, h, tq, 0)
    vis = Visibility(q_pos=q_pos, k_pos=ends, causal=True)
    return attention(q, keys, values, visibility=vis, scale=scale, backend="eager", return_weights=True)


def nsa_select(
    weights: torch.Tensor,
    q_pos: torch.Tensor,
    slots: int,
    *,
    kv_heads: int,
    compress_block: int,
    stride: int,
    select_block: int,
    select_n: int,
) -> torch.Tensor:
    """The ``select_n`` blocks of ``select_block`` each key group reads per query: block ids (B, Hk, Tq, K),
    -1 where fewer were there to take.

    Args:
        weights: the compressed branch's (B, H, Tq, C); q_pos: (B, Tq); slots: S, the keys held.
    """
    b, h, tq, c = weights.shape
    grouped = weights.detach().view(b, kv_heads, h // kv_heads, tq, c).sum(2)  # (B, Hk, Tq, C): one choice a group
    n = -(-slots // select_block)
    first = torch.arange(c, device=weights.device)[:, None] * stride  # (C, 1): each entry's first position
    j = torch.arange(n, device=weights.device)  # (N,)
    overlap = (first <= (j + 1) * select_block - 1) & (first + compress_block - 1 >= j * select_block)  # (C, N)
    scores = grouped @ overlap.to(grouped.dtype)  # (B, Hk, Tq, N)
    own = (q_pos // select_block)[:, None, :, None]  # (B, 1, Tq, 1)
    forced = ((j == 0) | (j == own) | (j == own - 1)) & (j <= own) & (own >= 0)
    return top_blocks(scores, forced, j < own, select_n)


def nsa_keys_read(picked: torch.Tensor, ends: torch.Tensor, q_pos: torch.Tensor, *, window: int) -> torch.Tensor:
    """The keys each query's three branches drew on between them, (B, Tq), a key counted once however many heads
    or branches read it: the keys under the entries it sees (the compression reads every key of a closed block:
    with the stride dividing the block, those are positions 0 to its latest entry's end e), its window's keys
    after e, and its selected keys (``picked`` (B, R, Tq, M), from the gather) after e and before the window.

    Args:
        picked: the selected branch's gathered positions, -1 for none; ends: each entry's last position (B, C),
            -1 where not whole; q_pos: (B, Tq), -1 for a query that reads nothing; window: the sliding branch's.
    """
    seen = (ends[:, None, :] >= 0) & (ends[:, None, :] <= q_pos[:, :, None])  # (B, Tq, C)
    e = torch.where(seen, ends[:, None, :], -1).amax(dim=-1) if ends.shape[1] else torch.full_like(q_pos, -1)
    near = q_pos - torch.maximum(q_pos - window, e)  # (B, Tq): the window's keys after e, (max(q - w, e), q]
    beyond = (picked > e[:, None, :, None]) & (picked <= (q_pos - window)[:, None, :, None])  # (B, R, Tq, M)
    counted = (e + 1) + near + distinct_keys(torch.where(beyond, picked, -1))
    return torch.where(q_pos >= 0, counted, 0)
