"""Compressed attention's blocks (DeepSeek-V4): every ``m`` tokens become one entry, visible once its block closes.

A compressor projects each token to values ``c`` and gate logits ``z`` (per channel), adds a learned bias per place
in the block, and turns each block w of ``m`` tokens into one entry:

    entry_w = sum over the block's slots j of softmax_j(z_j + bias_j) * c_j        (per channel; then an RMSNorm)

In V4's compressed-sparse layers (``overlap``) each token gives two series, a (its first D channels, for the
next block) and b (its last D, for its own): entry w pools block w-1's a and block w's b, 2m slots, stride m, so
neighbouring entries overlap. Block 0 has no block before it: its a-slots count for nothing (weight 0). In the
heavily compressed layers the blocks do not overlap. Entry w is turned by RoPE at its block's first position
w * m (:func:`entry_positions`) and is *visible* to a query at position t only when its block has closed,
t >= (w + 1) * m - 1 (:func:`closing_positions`): a causal visibility over its last token's position.

* readable (:func:`compress_readable`): one block at a time, as the formula says;
* fast (:func:`compress`): every block of a span at once, the two series laid side by side; tested equal.

:func:`turn_pairs` is V4's RoPE: the trailing R channels of a head turn on interleaved pairs (2i, 2i+1).

Shapes: B = batch, T = tokens, m = block, n = blocks, D = an entry's width, C = D (no overlap) or 2D (overlap),
R = rotated channels, H = heads.
"""

from __future__ import annotations

import torch

from attnlab._checks import check_positive_int


def check_block(block: object) -> int:
    """A compression block: an int of at least 2 tokens (one token a block would compress nothing)."""
    if isinstance(block, bool) or not isinstance(block, int) or not 2 <= block <= 2**16:
        raise ValueError(
            f"compress_block must be an int in [2, 65536], the tokens pooled into one entry; got {block!r}"
        )
    return block


def closing_positions(first: int, n: int, block: int, device: torch.device | None = None) -> torch.Tensor:
    """The position of the last token of entries first..first+n-1, (n,): where each becomes visible."""
    return (torch.arange(first, first + n, device=device) + 1) * block - 1


def entry_positions(first: int, n: int, block: int, device: torch.device | None = None) -> torch.Tensor:
    """The position RoPE turns entries first..first+n-1 at: their block's first token, (n,)."""
    return torch.arange(first, first + n, device=device) * block


def compress_readable(
    kv: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, *, block: int, overlap: bool
) -> torch.Tensor:
    """The readable form: kv, gate (B, n * m, C) from a block boundary (its first block with nothing before it),
    bias (m, C) -> the n entries (B, n, D), each pooled on its own."""
    b, t, c = kv.shape
    width = c // 2 if overlap else c
    entries = []
    for w in range(t // block):
        here = slice(w * block, (w + 1) * block)
        values, logits = kv[:, here, c - width :], gate[:, here, c - width :] + bias[:, c - width :]  # (B, m, D)
        if overlap and w > 0:  # block w-1's first series joins this entry's slots
            before = slice((w - 1) * block, w * block)
            values = torch.cat((kv[:, before, :width], values), dim=1)  # (B, 2m, D)
            logits = torch.cat((gate[:, before, :width] + bias[:, :width], logits), dim=1)
        weights = torch.softmax(logits.float(), dim=1).to(values.dtype)  # over the slots, per channel
        entries.append((weights * values).sum(dim=1))  # (B, D)
    return torch.stack(entries, dim=1) if entries else kv.new_zeros(b, 0, width)  # (B, n, D)


def compress(kv: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, *, block: int, overlap: bool) -> torch.Tensor:
    """The fast form of :func:`compress_readable`: every block of the span in one softmax over its slots."""
    b, t, c = kv.shape
    n = t // block
    kv = kv[:, : n * block].reshape(b, n, block, c)  # (B, n, m, C)
    gate = gate[:, : n * block].reshape(b, n, block, c) + bias  # (B, n, m, C)
    if not overlap:
        weights = torch.softmax(gate.float(), dim=2).to(kv.dtype)
        return (weights * kv).sum(dim=2)  # (B, n, D)
    d = c // 2
    values = kv.new_zeros(b, n, 2 * block, d)  # slots: block w-1's first series, then block w's second
    logits = gate.new_full((b, n, 2 * block, d), float("-inf"))  # block 0's first half: weight 0
    values[:, :, block:], logits[:, :, block:] = kv[..., d:], gate[..., d:]
    values[:, 1:, :block], logits[:, 1:, :block] = kv[:, :-1, :, :d], gate[:, :-1, :, :d]
    weights = torch.softmax(logits.float(), dim=2).to(kv.dtype)  # (B, n, 2m, D)
    return (weights * values).sum(dim=2)  # (B, n, D)


def turn_pairs(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, *, inverse: bool = False
) -> torch.Tensor:
    """V4's RoPE: the last R = 2 * len(inv_freq) channels of x (..., T, Dh) turn by position (T,) or (B, T), on
    pairs (2i, 2i + 1); ``inverse`` turns back (V4 turns the attention's output back at the query's position).
    x is (B, T, Dh) or (B, H, T, Dh); the turn is computed in float32."""
    check_positive_int("rotated pairs", inv_freq.numel(), limit=2**16)
    r = 2 * inv_freq.numel()
    angles = positions.float()[..., None] * inv_freq.float()  # (T, R/2) or (B, T, R/2)
    if x.dim() == 4 and angles.dim() == 3:
        angles = angles[:, None]  # (B, 1, T, R/2): every head at its query's angles
    cos, sin = angles.cos(), angles.sin()
    if inverse:
        sin = -sin
    kept, turned = x[..., :-r], x[..., -r:].float()
    even, odd = turned[..., 0::2], turned[..., 1::2]  # (..., T, R/2) each
    pairs = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1)  # (..., T, R/2, 2)
    return torch.cat((kept, pairs.flatten(-2).to(x.dtype)), dim=-1)  # (..., T, Dh)
