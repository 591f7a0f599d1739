"""The flash passes: tiled attention with an online softmax, forward and backward, in plain PyTorch.

FlashAttention-2 (Dao, 2023), algorithm 1 forward and 2 backward, written for
clarity: the (Tq, Tk) score matrix is never materialized. Each block of
queries walks over blocks of keys keeping a running row max m, running sum l
and an unnormalized accumulator; the result is acc / l, and the row's
log-sum-exp m + log(l) is kept for the backward pass, which recomputes each
tile's probabilities instead of storing them. Forward and backward both use
O(T * D) memory plus one (block_q, block_k) tile per head (the forward joins up
to SPAN_TILES neighbouring tiles of one kind into one matmul).

EMPTY tiles (``Visibility.tile_kinds``) are skipped, FULL ones get no mask work,
PARTIAL ones are masked. A ``score_mod`` runs on each tile; the backward replays
it under autograd to carry the gradient through it, to the scores and to its
learnable tensors. Dropout masks are drawn per tile from a generator seeded by
(seed, tile), so the backward pass regenerates them. The ring
(``distributed/ring.py``) calls these passes block by block.

Shapes: B = batch, H = heads, Tq / Tk = query / key lengths, D / Dv = head dims,
bq / bk = block sizes.
"""

from __future__ import annotations

import torch

from attnlab.functional.blocks import Running, attend_block, merge
from attnlab.functional.eager import accumulation_dtype
from attnlab.functional.visibility import EMPTY, FULL, PARTIAL, Visibility

DEFAULT_BLOCK = 256  # the tile, queries by keys


def _keep_mask(seed: int, i: int, j: int, shape: tuple[int, ...], p: float, device: torch.device) -> torch.Tensor:
    """The dropout keep-mask of tile (i, j): the same every time it is asked for."""
    gen = torch.Generator(device=device)
    gen.manual_seed((seed * 1_000_003 + i * 65_537 + j) % (2**63))
    return torch.rand(shape, generator=gen, device=device) >= p


def _mask(s: torch.Tensor, vis: Visibility, kind: int, i0: int, i1: int, j0: int, j1: int) -> torch.Tensor:
    """Bias and mask one tile of (modified) scores in place; a FULL tile needs no mask work."""
    if kind == PARTIAL:
        allowed, bias = vis.tile(i0, i1, j0, j1)
    else:  # a FULL tile: nothing hidden, at most a float mask to add
        allowed, bias = None, vis.tile_bias(i0, i1, j0, j1)
    if bias is not None:
        s += bias.to(s.dtype)
    if allowed is not None and kind == PARTIAL:
        s.masked_fill_(~allowed, float("-inf"))
    return s


def _scores(
    qi_scaled: torch.Tensor, kj: torch.Tensor, vis: Visibility, kind: int, i0: int, i1: int, j0: int, j1: int
) -> torch.Tensor:
    """Modified, biased, masked scores of one tile from pre-scaled queries, (B, H, bq, bk), a fresh tensor."""
    s = vis.modify(qi_scaled @ kj.transpose(-2, -1), i0, i1, j0, j1, scratch=True)  # the tile's own scores
    return _mask(s, vis, kind, i0, i1, j0, j1)


def _blocks(n: int, size: int) -> list[tuple[int, int, int]]:
    return [(idx, start, min(start + size, n)) for idx, start in enumerate(range(0, n, size))]


SPAN_TILES = 8  # the forward joins up to this many neighbouring key tiles of one kind into one matmul

# PyTorch's fused CPU flash kernel: (q, k, v, dropout_p, is_causal, *, attn_mask, scale) -> (out, lse), the
# log-sum-exp natural and float32 for half inputs. Its is_causal is top-left: row r sees columns c <= r.
_FUSED_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FUSED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


FUSED_BLOCK = 1024  # the fused kernel tiles inside; it is given rectangles of up to this many queries and keys


def _fused_blocks(
    vis: Visibility, block_q: int, block_k: int, kinds: dict[tuple[int, int], int]
) -> tuple[int, int, dict[tuple[int, int], int]]:
    """Larger blocks for the fused kernel when, at that size, every tile is still one it computes (FULL or a
    causal diagonal): it holds no tile of scores, and per call it runs faster on larger rectangles (at
    T = 4096, causal, 256-query blocks cost 1.12x one whole call and 1024-query blocks 1.0x on a 2-core
    CPU). Otherwise the given blocks, where the tiles it cannot compute are walked here."""
    big_q, big_k = max(block_q, FUSED_BLOCK), max(block_k, FUSED_BLOCK)
    if (big_q, big_k) == (block_q, block_k):
        return block_q, block_k, kinds
    big = vis.tile_kinds(big_q, big_k)
    for (bi, bj), kind in big.items():
        if kind == PARTIAL:
            i0, j0 = bi * big_q, bj * big_k
            if not vis.tile_is_aligned_causal(i0, min(i0 + big_q, vis.tq), j0, min(j0 + big_k, vis.tk)):
                return block_q, block_k, kinds
    return big_q, big_k, big


def _fusable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, vis: Visibility, dropout_p: float) -> bool:
    """Whether whole FULL spans and causal diagonal tiles may go to the fused CPU kernel: on the CPU, with no
    score_mod or float mask (which change scores inside a tile), no dropout (drawn per tile, as the backward
    redraws it), equal head dims, and a dtype it takes."""
    return (
        q.device.type == "cpu"
        and q.dtype in _FUSED_DTYPES
        and q.dtype == k.dtype == v.dtype
        and q.shape[-1] == v.shape[-1]
        and vis.score_mod is None
        and vis.bias is None
        and dropout_p == 0.0
        and not torch.compiler.is_compiling()
    )


def _spans(
    bi: int, key_blocks: list[tuple[int, int, int]], kinds: dict[tuple[int, int], int], longest: int = SPAN_TILES
) -> list[tuple[int, list[tuple[int, int, int]], int, int]]:
    """Runs of neighbouring key tiles of the same kind for query block ``bi``: (kind, tiles, j0, j1), EMPTY left out.

    Fewer, larger matmuls: a causal query block sees all its earlier key tiles FULL, so they go in a few
    spans, with memory of at most ``longest`` tiles (still O(T) in all).
    """
    spans: list[tuple[int, list[tuple[int, int, int]], int, int]] = []
    for tile in key_blocks:
        kind = kinds[bi, tile[0]]
        if kind == EMPTY:
            continue
        if spans and spans[-1][0] == kind and spans[-1][3] == tile[1] and len(spans[-1][1]) < longest:
            last = spans[-1]
            spans[-1] = (kind, [*last[1], tile], last[2], tile[2])
        else:
            spans.append((kind, [tile], tile[1], tile[2]))
    return spans


def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    vis: Visibility,
    *,
    scale: float,
    dropout_p: float,
    seed: int,
    block_q: int,
    block_k: int,
    kinds: dict[tuple[int, int], int],
    fused: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, Tq, Dv) in q's dtype, lse (B, H, Tq)). Dead rows: out 0, lse +inf.

    ``fused``: spans the fused CPU kernel can compute exactly (see :func:`_fusable`) go to it, whole; the
    rest, and everything when False, walk the tiles here. Both fold into the same running max, sum and
    accumulator, so a query block may mix them.
    """
    b, h, tq, _ = q.shape
    tk, dv = k.shape[2], v.shape[-1]
    ad = accumulation_dtype(q.dtype)
    out = torch.empty(b, h, tq, dv, dtype=q.dtype, device=q.device)
    lse = torch.empty(b, h, tq, dtype=ad, device=q.device)
    fused = fused and _fusable(q, k, v, vis, dropout_p)
    if fused:
        block_q, block_k, kinds = _fused_blocks(vis, block_q, block_k, kinds)
    for bi, i0, i1 in _blocks(tq, block_q):
        qi: torch.Tensor | None = None  # the scaled queries, made when a tile is walked here
        state = Running.start(b, h, i1 - i0, dv, dtype=ad, device=q.device)  # m = -inf, l = 0, acc = 0
        # fused, a span of FULL tiles costs one call however long: it never holds a tile of scores
        for kind, tiles, j0, j1 in _spans(bi, _blocks(tk, block_k), kinds, len(kinds) if fused else SPAN_TILES):
            diagonal = kind == PARTIAL and vis.tile_is_aligned_causal(i0, i1, j0, j1)
            if fused and (kind == FULL or diagonal):
                part, part_lse = _FUSED_CPU(
                    q[:, :, i0:i1], k[:, :, j0:j1], v[:, :, j0:j1], 0.0, diagonal, scale=scale
                )  # (B, H, bq, Dv), (B, H, bq): every row sees at least one key, so part_lse is finite
                merge(state, part.to(ad), part_lse)  # the span folds in as one score part_lse carrying the value part
                continue
            if qi is None:
                qi = q[:, :, i0:i1].to(ad) * scale  # scaling q once is cheaper than scaling every tile
            s = _scores(qi, k[:, :, j0:j1].to(ad), vis, kind, i0, i1, j0, j1)  # (B, H, bq, span)
            keep = None
            if dropout_p > 0.0:  # each tile's own mask, as the backward draws it tile by tile
                keep = torch.cat(
                    [_keep_mask(seed, bi, bj, (*s.shape[:-1], t1 - t0), dropout_p, q.device) for bj, t0, t1 in tiles],
                    dim=-1,
                )  # (B, H, bq, span)
            attend_block(state, s, v[:, :, j0:j1].to(ad), keep=keep, dropout_p=dropout_p)
            del s, keep  # the next span's scores need not sit beside this one's
        part, part_lse = state.finish()
        out[:, :, i0:i1], lse[:, :, i0:i1] = part.to(q.dtype), part_lse
    return out, lse


def flash_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    vis: Visibility,
    *,
    scale: float,
    dropout_p: float,
    seed: int,
    block_q: int,
    block_k: int,
    kinds: dict[tuple[int, int], int],
    params: tuple[torch.Tensor, ...] = (),
    grad_lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor | None]]:
    """dq, dk, dv (and the gradients of the score_mod's learnable ``params``) by recomputing each tile.
    ``grad_lse``: the gradient reaching the row log-sum-exp too (a learned sink reads it): since d lse / d s = p,
    it joins each score's gradient as p * grad_lse, which is delta lowered by grad_lse."""
    tq, tk = q.shape[2], k.shape[2]
    ad = accumulation_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=ad, device=q.device)
    dk = torch.zeros(k.shape, dtype=ad, device=q.device)
    dv = torch.zeros(v.shape, dtype=ad, device=q.device)
    dparams: list[torch.Tensor | None] = [None] * len(params)
    delta = (grad_out.to(ad) * out.to(ad)).sum(dim=-1)  # (B, H, Tq): rowsum(dO * O)
    if grad_lse is not None:
        delta = delta - torch.nan_to_num(grad_lse.to(ad), posinf=0.0, neginf=0.0)  # dead rows: p = 0 anyway
    for bi, i0, i1 in _blocks(tq, block_q):
        qi, doi = q[:, :, i0:i1].to(ad), grad_out[:, :, i0:i1].to(ad)
        qi_scaled = qi * scale
        lse_i, delta_i = lse[:, :, i0:i1, None], delta[:, :, i0:i1, None]
        for bj, j0, j1 in _blocks(tk, block_k):
            kind = kinds[bi, bj]
            if kind == EMPTY:
                continue
            kj, vj = k[:, :, j0:j1].to(ad), v[:, :, j0:j1].to(ad)
            raw = qi_scaled @ kj.transpose(-2, -1)  # (B, H, bq, bk)
            if vis.score_mod is not None:  # keep the mod's graph: its derivative carries ds back to raw and params
                with torch.enable_grad():
                    raw.requires_grad_(True)
                    modified = vis.modify(raw, i0, i1, j0, j1)
                s = modified.detach().clone()
            else:
                s = raw
            p = _mask(s, vis, kind, i0, i1, j0, j1).sub_(lse_i).exp_()  # (B, H, bq, bk)
            dp = doi @ vj.transpose(-2, -1)  # dL/d(dropped P)
            if dropout_p > 0.0:
                keep = _keep_mask(seed, bi, bj, p.shape, dropout_p, q.device) / (1.0 - dropout_p)
                dv[:, :, j0:j1] += (p * keep).transpose(-2, -1) @ doi
                dp = dp * keep
            else:
                dv[:, :, j0:j1] += p.transpose(-2, -1) @ doi
            ds = p * (dp - delta_i)  # softmax backward: d loss / d (modified score)
            if vis.score_mod is not None:
                # the vector-Jacobian product with ds, as the gradient of a sum: the same numbers, and torch does
                # not load its symbolic-shape machinery (sympy, about 2 s) for a scalar root
                with torch.enable_grad():
                    root = (modified * ds).sum()
                # retain_graph: a tensor the mod reads may hang on a graph of the caller's (temperature = w * 2),
                # which every tile and every layer passes through again
                grads = torch.autograd.grad(root, (raw, *params), allow_unused=True, retain_graph=bool(params))
                ds = grads[0]
                for n, g in enumerate(grads[1:]):
                    seen = dparams[n]
                    if g is not None:
                        dparams[n] = g if seen is None else seen + g
            dq[:, :, i0:i1] += (ds @ kj) * scale
            dk[:, :, j0:j1] += (ds.transpose(-2, -1) @ qi) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dparams
