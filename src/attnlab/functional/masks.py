"""Attention masks, one convention everywhere: True = may attend.

A :class:`MaskSpec` gathers every way of restricting attention (causal,
sliding window, a boolean or additive float mask, key padding) into one
object that each backend can ask for what it needs: the dense boolean mask
and bias (eager, sdpa), or one tile of them (flash), or whether a tile is
structurally empty and can be skipped.

Causal alignment. With Tq queries and Tk keys, query i sits at absolute
position i + (Tk - Tq) when aligned bottom-right (the default): the last
query sees every key, as in cached decoding and chunked prefill. For Tq == Tk
this is the usual lower triangle, identical to SDPA's ``is_causal=True``.
Top-left alignment (query i at position i) is SDPA's behaviour for Tq != Tk;
ask for it with ``causal_align="top_left"``.

Shapes: B = batch, H = heads, Tq / Tk = query / key lengths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from attnlab._checks import check_window
from attnlab.functional.mods import MaskMod, ScoreMod, apply_score_mod, evaluate_mask

CausalAlign = Literal["bottom_right", "top_left"]
CLASSIFY_TILES = 16  # tile_kinds evaluates the masks over at most this many key tiles at a time
DEFAULT_BLOCK = 256  # the flash backend's tile, queries by keys
EMPTY, PARTIAL, FULL = 0, 1, 2  # what a tile of the score matrix is: nothing may attend, some, all


def at_least_2d(mask: torch.Tensor) -> torch.Tensor:
    """A mask as (.., Tq, Tk): a (Tk,) mask is one row (1, Tk), a 0-D mask (1, 1); broadcasting is unchanged."""
    if mask.dim() >= 2:
        return mask
    return mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))  # (Tk,) -> (1, Tk); () -> (1, 1)


def causal_mask(
    tq: int, tk: int, *, align: CausalAlign = "bottom_right", device: torch.device | None = None
) -> torch.Tensor:
    """(Tq, Tk) bool, True where query i may see key j (j <= i's position)."""
    offset = tk - tq if align == "bottom_right" else 0
    return _structural(0, tq, 0, tk, offset=offset, causal=True, window=None, device=device)


def sliding_window_mask(
    tq: int, tk: int, window: int, *, align: CausalAlign = "bottom_right", device: torch.device | None = None
) -> torch.Tensor:
    """(Tq, Tk) bool: causal, and at most the last ``window`` keys (the query's own included)."""
    check_window(window)
    offset = tk - tq if align == "bottom_right" else 0
    return _structural(0, tq, 0, tk, offset=offset, causal=True, window=window, device=device)


def padding_mask(lengths: torch.Tensor, max_len: int, *, left: bool = False) -> torch.Tensor:
    """(B, 1, 1, Tk) bool from sequence lengths: True on real tokens, False on padding.

    ``left=True`` for left-padded batches (padding first, as in batched generation).
    """
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (batch,), got shape {tuple(lengths.shape)}")
    if (lengths < 0).any() or (lengths > max_len).any():
        raise ValueError(f"lengths must lie in [0, max_len={max_len}], got {lengths.tolist()}")
    pos = torch.arange(max_len, device=lengths.device)
    keep = pos >= (max_len - lengths)[:, None] if left else pos < lengths[:, None]
    return keep[:, None, None, :]


def from_torch_mha_masks(
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    *,
    num_heads: int | None = None,
) -> torch.Tensor | None:
    """Convert ``torch.nn.MultiheadAttention`` masks to attnlab's convention.

    nn.MultiheadAttention's boolean masks say True = *masked out*; attnlab's say
    True = *may attend*, so booleans are inverted. Float masks are additive in
    both and pass through. ``key_padding_mask`` (B, Tk) becomes (B, 1, 1, Tk);
    a 3-D ``attn_mask`` (B * num_heads, Tq, Tk), one mask per head, becomes
    (B, num_heads, Tq, Tk) and needs ``num_heads``.
    Returns one mask for ``attention(mask=...)``, or None when given none.
    """
    parts: list[torch.Tensor] = []
    if attn_mask is not None:
        if attn_mask.dim() == 3:
            if num_heads is None or attn_mask.shape[0] % num_heads:
                raise ValueError(
                    f"a 3-D attn_mask is (batch * num_heads, Tq, Tk), got shape {tuple(attn_mask.shape)} "
                    f"with num_heads={num_heads}; pass the module's num_heads"
                )
            b = attn_mask.shape[0] // num_heads
            attn_mask = attn_mask.view(b, num_heads, *attn_mask.shape[1:])  # (B*H, Tq, Tk) -> (B, H, Tq, Tk)
        elif attn_mask.dim() != 2:
            raise ValueError(
                f"attn_mask must be (Tq, Tk) or (batch * num_heads, Tq, Tk), got shape {tuple(attn_mask.shape)}"
            )
        parts.append(~attn_mask if attn_mask.dtype == torch.bool else attn_mask)
    if key_padding_mask is not None:
        if key_padding_mask.dim() != 2:
            raise ValueError(f"key_padding_mask must be (batch, Tk), got shape {tuple(key_padding_mask.shape)}")
        kpm = key_padding_mask[:, None, None, :]  # (B, 1, 1, Tk)
        parts.append(~kpm if kpm.dtype == torch.bool else kpm)
    if not parts:
        return None
    if all(p.dtype == torch.bool for p in parts):
        return parts[0] if len(parts) == 1 else parts[0] & parts[1]
    float_dtype = next(p.dtype for p in parts if p.dtype != torch.bool)
    total: torch.Tensor | None = None
    for p in parts:
        if p.dtype == torch.bool:  # may attend -> 0, masked -> -inf
            p = torch.zeros(p.shape, dtype=float_dtype, device=p.device).masked_fill(~p, float("-inf"))
        total = p if total is None else total + p
    return total


def _structural(
    i0: int,
    i1: int,
    j0: int,
    j1: int,
    *,
    offset: int,
    causal: bool,
    window: int | None,
    device: torch.device | None,
) -> torch.Tensor:
    """Rows i0:i1, columns j0:j1 of the causal/window mask, (i1-i0, j1-j0) bool; query i sits at key i + offset."""
    rows = torch.arange(i0, i1, device=device)[:, None] + offset  # absolute query positions
    cols = torch.arange(j0, j1, device=device)[None, :]
    allowed = torch.ones(i1 - i0, j1 - j0, dtype=torch.bool, device=device)
    if causal:
        allowed = allowed & (cols <= rows)
    if window is not None:
        allowed = allowed & (cols > rows - window)
    return allowed


@dataclass(frozen=True)
class MaskSpec:
    """Everything that restricts attention for one call; see the module docstring.

    ``allowed`` is a bool tensor broadcastable to (B, H, Tq, Tk), True = may attend.
    ``bias`` is a float tensor broadcastable to the same, added to the scaled scores.
    ``block_q`` x ``block_k`` is the tile the program is asked about by tiled
    kernels (the flash backend); the eager and sdpa backends ask for one tile, the whole matrix.
    """

    tq: int
    tk: int
    causal: bool = False
    align: CausalAlign = "bottom_right"
    window: int | None = None
    allowed: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    block_q: int = DEFAULT_BLOCK
    block_k: int = DEFAULT_BLOCK
    mask_mod: MaskMod | None = None  # attnlab.functional.mods: evaluated on absolute positions
    score_mod: ScoreMod | None = None  # applied to the scaled scores before the bias and the masks
    batch: int = 1  # B and H of the call: the range of a mod's b and h
    heads: int = 1
    q_offset: int | None = None  # absolute position of query 0; None: aligned by ``align`` with the keys
    kv_offset: int = 0  # absolute position of key 0
    skip_tiles: bool = True  # tiled kernels skip tiles nothing may attend in (off only to measure what it saves)

    @property
    def structural(self) -> bool:
        return self.causal or self.window is not None

    @property
    def structural_needed(self) -> bool:
        """Causal/window structure that hides something (a single decoding query hides nothing)."""
        return self.structural and not self.tile_full(0, self.tq, 0, self.tk)

    @property
    def has_mods(self) -> bool:
        return self.mask_mod is not None or self.score_mod is not None

    @property
    def empty(self) -> bool:
        return not self.structural_needed and self.allowed is None and self.bias is None and not self.has_mods

    def q_start(self) -> int:
        """The absolute position of query 0."""
        if self.q_offset is not None:
            return self.q_offset
        return self.kv_offset + (self.tk - self.tq if self.align == "bottom_right" else 0)

    def offset(self) -> int:
        """Query position minus key position for query 0 and key 0: what causal and window compare."""
        return self.q_start() - self.kv_offset

    def positions(self, i0: int, i1: int, j0: int, j1: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Absolute positions of queries i0:i1 and keys j0:j1, as mods see them."""
        q_idx = torch.arange(i0, i1, device=device) + self.q_start()
        kv_idx = torch.arange(j0, j1, device=device) + self.kv_offset
        return q_idx, kv_idx

    def modify(self, scores: torch.Tensor, i0: int, i1: int, j0: int, j1: int) -> torch.Tensor:
        """``score_mod`` on scores of rows i0:i1 and columns j0:j1 (the scores themselves without one)."""
        if self.score_mod is None:
            return scores
        q_idx, kv_idx = self.positions(i0, i1, j0, j1, scores.device)
        return apply_score_mod(self.score_mod, scores, q_idx=q_idx, kv_idx=kv_idx)

    def tile_kinds(self, device: torch.device) -> dict[tuple[int, int], int]:
        """Every tile of block_q x block_k, classified once: EMPTY (skipped), PARTIAL (masked) or FULL (no mask work).

        The masks are evaluated one row of tiles at a time, over at most CLASSIFY_TILES key tiles per call of
        a mask_mod, and only over the key tiles that the causal or window structure does not already rule out.
        """
        kinds = {}
        key_blocks = [
            (bj, j0, min(j0 + self.block_k, self.tk)) for bj, j0 in enumerate(range(0, self.tk, self.block_k))
        ]
        for bi, i0 in enumerate(range(0, self.tq, self.block_q)):
            i1 = min(i0 + self.block_q, self.tq)
            live = []
            for bj, j0, j1 in key_blocks:
                if self.skip_tiles and self.structural and self.tile_skippable(i0, i1, j0, j1):
                    kinds[bi, bj] = EMPTY
                else:
                    live.append((bj, j0, j1))
            if not live:
                continue
            if self.allowed is None and self.mask_mod is None:  # causal/window alone: arithmetic, no mask to build
                kinds.update({(bi, bj): FULL if self.tile_full(i0, i1, j0, j1) else PARTIAL for bj, j0, j1 in live})
                continue
            for g in range(0, len(live), CLASSIFY_TILES):  # a bounded width: the mask of a long row is not built
                kinds.update(self._classify(bi, i0, i1, live[g : g + CLASSIFY_TILES], device))
        return kinds

    def _classify(
        self, bi: int, i0: int, i1: int, live: list[tuple[int, int, int]], device: torch.device
    ) -> dict[tuple[int, int], int]:
        """Kinds of the tiles ``live`` (neighbours in one row of tiles), from the masks evaluated on their span."""
        kinds = {}
        lo, hi = live[0][1], live[-1][2]
        allowed, _ = self.tile(i0, i1, lo, hi, device)  # (.., bq, hi - lo) or None
        if allowed is None:
            return {(bi, bj): FULL for bj, _, _ in live}
        allowed = allowed.expand(*allowed.shape[:-1], hi - lo)  # a key dim broadcast from 1, spelled out
        rows = allowed.reshape(-1, hi - lo)  # (.. * bq, width): every (broadcast) query row
        some, every = rows.any(dim=0), rows.all(dim=0)  # (width,) per key
        for bj, j0, j1 in live:
            if bool(every[j0 - lo : j1 - lo].all()):
                kinds[bi, bj] = FULL
            elif self.skip_tiles and not bool(some[j0 - lo : j1 - lo].any()):
                kinds[bi, bj] = EMPTY
            else:
                kinds[bi, bj] = PARTIAL
        return kinds

    def dense(self, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(allowed, bias) for the whole (.., Tq, Tk) score matrix; either may be None."""
        return self.tile(0, self.tq, 0, self.tk, device)

    def tile(
        self, i0: int, i1: int, j0: int, j1: int, device: torch.device
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(allowed, bias) for rows i0:i1 and columns j0:j1 only; None where unrestricted."""
        allowed = None
        if self.structural and not self.tile_full(i0, i1, j0, j1):
            allowed = _structural(
                i0, i1, j0, j1, offset=self.offset(), causal=self.causal, window=self.window, device=device
            )
        if self.allowed is not None:
            a = _slice(self.allowed, i0, i1, j0, j1)
            allowed = a if allowed is None else allowed & a
        if self.mask_mod is not None:
            q_idx, kv_idx = self.positions(i0, i1, j0, j1, device)
            m = evaluate_mask(self.mask_mod, batch=self.batch, heads=self.heads, q_idx=q_idx, kv_idx=kv_idx)
            allowed = m if allowed is None else allowed & m
        bias = _slice(self.bias, i0, i1, j0, j1) if self.bias is not None else None
        return allowed, bias

    def tile_skippable(self, i0: int, i1: int, j0: int, j1: int) -> bool:
        """True when causal/window structure hides every key of the tile from every query."""
        off = self.offset()
        first_q, last_q = i0 + off, i1 - 1 + off
        if self.causal and j0 > last_q:
            return True  # every key is in every query's future
        if self.window is not None and j1 - 1 <= first_q - self.window:
            return True  # every key is older than every query's window
        return False

    def tile_full(self, i0: int, i1: int, j0: int, j1: int) -> bool:
        """True when causal/window structure hides nothing in the tile."""
        off = self.offset()
        first_q, last_q = i0 + off, i1 - 1 + off
        ok = True
        if self.causal:
            ok = ok and j1 - 1 <= first_q
        if self.window is not None:
            ok = ok and j0 > last_q - self.window
        return ok


def _slice(m: torch.Tensor, i0: int, i1: int, j0: int, j1: int) -> torch.Tensor:
    """Rows/columns of a mask broadcastable to (.., Tq, Tk); size-1 dims stay size 1."""
    rows = slice(i0, i1) if m.shape[-2] != 1 else slice(None)
    cols = slice(j0, j1) if m.shape[-1] != 1 else slice(None)
    return m[..., rows, cols]
