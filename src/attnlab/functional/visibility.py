"""Who may attend, and what each score becomes: one object, built once, read by every backend.

A :class:`Visibility` starts from positions: each query's absolute position
``q_pos`` (Tq,) or (B, Tq) and each key's ``k_pos`` (Tk,) or (B, Tk), where
-1 marks a slot that holds nothing (an empty cache slot, a ring shard's
padding): such a key is never seen, and such a query sees nothing. On the
positions it composes the restrictions:

* ``causal``: key position <= query position;
* ``window``: causal, and query - key < window (the query's own key included);
* a bool mask (True = may attend) and a float mask (added to the scores);
* a ``mask_mod(b, h, q_idx, kv_idx)`` called with absolute positions;

and it carries the ``score_mod(score, b, h, q_idx, kv_idx)``. This module is the
only place where causal, window, padding, documents and positions are
interpreted. Each backend asks it for what it needs: eager the whole grid
(:meth:`dense`), flash each tile's kind and mask (:meth:`tile_kinds`, :meth:`tile`),
sdpa a dense mask or its ``is_causal``, flex a block mask. Every answer is
computed once and kept on the object, as FlexAttention's ``BlockMask`` is built
once and shared by the layers of a model: a ``GPT`` builds one per forward pass
(one per decode step) and every layer reads it.

When the positions are ranges (``from_lengths``), tiles are classified by
arithmetic; otherwise from the bounds of each tile's positions, which is exact
for positions that increase along the sequence and safe (PARTIAL) for any.

>>> v = Visibility.from_lengths(3, 5, causal=True)   # 3 queries after 2 cached keys: bottom-right
>>> v.dense()[0][0, 0].int()
tensor([[1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1]], dtype=torch.int32)

Shapes: B = batch, H = heads, Tq / Tk = query / key lengths, bq / bk = tile sizes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from attnlab._checks import check_window
from attnlab.functional.mods import (
    MaskMod,
    ScoreMod,
    and_masks,
    apply_score_mod,
    chain_scores,
    evaluate_mask,
    mod_name,
    score_mod_tensors,
    sees_future,
)

T = TypeVar("T")
EMPTY, PARTIAL, FULL = 0, 1, 2  # what a tile of the score matrix is: nothing may attend, some, all
CLASSIFY_TILES = 16  # tile_kinds evaluates masks over at most this many key tiles at a time
_BIG = 2**62  # a bound no position reaches
KEEP_TILE_BYTES = 64 * 2**20  # tile masks kept per Visibility; past it they are evaluated again when asked
CHECK_ELEMENTS = 2**22  # check_mods evaluates the mods on at most this many (b, h, q, kv) cells at a time


def _positions(name: str, pos: object) -> torch.Tensor:
    if (
        not isinstance(pos, torch.Tensor)
        or pos.dim() not in (1, 2)
        or pos.is_floating_point()
        or pos.dtype == torch.bool
    ):
        got = f"shape {tuple(pos.shape)} {pos.dtype}" if isinstance(pos, torch.Tensor) else type(pos).__name__
        raise ValueError(
            f"{name} must be an integer tensor (T,) or (batch, T) of positions, -1 for an empty slot; got {got}"
        )
    return pos.long()


def _split_mask(mask: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(bool part, float part) of one mask, at least 2-D: a (Tk,) mask is one row (1, Tk)."""
    if mask is None:
        return None, None
    if mask.dim() < 2:
        mask = mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))  # (Tk,) -> (1, Tk); () -> (1, 1)
    return (mask, None) if mask.dtype == torch.bool else (None, mask)


def _join(a: T | None, b: T | None, combine: Callable[[T, T], T]) -> T | None:
    """Two optional restrictions as one: either alone, or both combined."""
    return b if a is None else a if b is None else combine(a, b)


def _slice(m: torch.Tensor, i0: int, i1: int, j0: int, j1: int) -> torch.Tensor:
    """Rows i0:i1 and columns j0:j1 of a mask broadcastable to (.., Tq, Tk); size-1 dims stay size 1."""
    rows = slice(i0, i1) if m.shape[-2] != 1 else slice(None)
    cols = slice(j0, j1) if m.shape[-1] != 1 else slice(None)
    return m[..., rows, cols]


def at_slots(mask: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """A mask over key positions (.., Tq|1, P) read at each slot's position: (S,) positions, or (B, S) per sequence
    (a paged or evicting cache), gathered row by row. An empty slot (-1) reads position 0; its position hides it."""
    if mask.shape[-1] == 1:
        return mask
    slots = k_pos.clamp(min=0)
    if slots.dim() == 1:
        return mask[..., slots]  # (.., Tq|1, S)
    full = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (B|1, H|1, Tq|1, P)
    b, s = slots.shape
    if full.shape[0] not in (1, b):
        raise ValueError(f"a mask for a batch of {full.shape[0]} cannot follow the key positions of {b} sequences")
    _, h, tq, p = full.shape
    index = slots[:, None, None, :].expand(b, h, tq, s)  # (B, H|1, Tq|1, S)
    return full.expand(b, h, tq, p).gather(3, index)


class Visibility:
    """Which keys each query may see, and what its score becomes; see the module docstring.

    Args:
        q_pos: absolute query positions, (Tq,) or (B, Tq); -1 for a query that sees nothing.
        k_pos: absolute key positions, (Tk,) or (B, Tk); -1 for an empty slot. None: the keys are
            not known yet (a cache returns them); :meth:`for_keys` binds them.
        causal, window: hide the future; and keys ``window`` or more positions back (implies causal).
        mask: bool (True = may attend) or float (added to the scaled scores), broadcastable to
            (B, H, Tq, Tk), its columns the keys as given.
        mask_mod, score_mod: FlexAttention's signatures (``attnlab.functional.mods``), called with
            absolute positions (an empty slot's -1 reads as 0; it is hidden anyway).
        batch, heads: the range of a mod's ``b`` and ``h``; ``attention()`` fills them from q.
    """

    def __init__(
        self,
        *,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor | None = None,
        causal: bool = False,
        window: int | None = None,
        mask: torch.Tensor | None = None,
        mask_mod: MaskMod | None = None,
        score_mod: ScoreMod | None = None,
        batch: int | None = None,
        heads: int | None = None,
    ) -> None:
        if not isinstance(causal, bool):
            raise TypeError(f"is_causal must be a bool, got {causal!r}")
        if window is not None:
            check_window(window)
        for name, mod in (("mask_mod", mask_mod), ("score_mod", score_mod)):
            if mod is not None and not callable(mod):
                raise TypeError(f"{name} must be a function (see attnlab.functional.mods), got {type(mod).__name__}")
        if mask_mod is not None and sees_future(mask_mod) and (causal or window is not None):
            rule = "is_causal=True" if window is None else f"window={window} (causal within it)"
            raise ValueError(
                f"mask_mod {mod_name(mask_mod)} shows queries keys after them, which {rule} hides: the two are "
                "ANDed, so the mod would change nothing. Drop is_causal (the mod says who sees what), or use "
                "mods.lookback(window) for a window's reach without causal (docs/mods.md, 'A model's own mask "
                "and yours')"
            )
        self.q_pos = _positions("q_pos", q_pos)
        self.k_pos = None if k_pos is None else _positions("k_pos", k_pos)
        self.causal = causal or window is not None
        self.window = window
        self.allowed, self.bias = _split_mask(mask)
        self.mask_mod, self.score_mod = mask_mod, score_mod
        self.batch, self.heads = batch, heads
        self.q_start: int | None = None  # set when q_pos is the range q_start, q_start + 1, ... (arithmetic paths)
        self.k_start: int | None = None
        self._kept: dict[Any, Any] = {}  # every answer, computed once

    # ---- building ----

    @classmethod
    def from_lengths(
        cls,
        tq: int,
        tk: int,
        *,
        q_start: int | None = None,
        k_start: int = 0,
        device: torch.device | str | None = None,
        **restrictions: Any,
    ) -> Visibility:
        """Queries and keys at consecutive positions: keys ``k_start ..``, queries ending where the keys end
        (bottom-right, as after a cache) unless ``q_start`` says where they start."""
        for name, value in (("q_start", q_start), ("k_start", k_start)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**40):
                raise ValueError(f"{name} must be a position, an int in [0, 2**40), got {value!r}")
        q0 = k_start + tk - tq if q_start is None else q_start
        causal = bool(restrictions.get("causal")) or restrictions.get("window") is not None
        q_pos = torch.arange(q0, q0 + tq, device=device)
        if q0 < 0:  # more queries than keys: causal, the first Tq - Tk sit before every key and see nothing
            q_pos = q_pos.clamp(min=-1) if causal else torch.arange(tq, device=device)
        made = cls(q_pos=q_pos, k_pos=torch.arange(k_start, k_start + tk, device=device), **restrictions)
        made.q_start, made.k_start = (None if causal else 0) if q0 < 0 else q0, k_start
        return made

    def _copy(self, **changes: Any) -> Visibility:
        made = Visibility.__new__(Visibility)
        made.__dict__.update({**self.__dict__, "_kept": {}, **changes})
        return made

    def restrict(
        self, *, mask: torch.Tensor | None = None, mask_mod: MaskMod | None = None, score_mod: ScoreMod | None = None
    ) -> Visibility:
        """A new Visibility that also applies ``mask`` (bool: and; float: add), ``mask_mod`` (and) and ``score_mod``
        (after the one it has)."""
        allowed, bias = _split_mask(mask)
        return self._copy(
            allowed=_join(self.allowed, allowed, operator.and_),
            bias=_join(self.bias, bias, operator.add),
            mask_mod=_join(self.mask_mod, mask_mod, and_masks),
            score_mod=_join(self.score_mod, score_mod, chain_scores),
        )

    def for_keys(self, k_pos: torch.Tensor) -> Visibility:
        """This visibility bound to the key positions a cache returned, (S,) with -1 for an empty slot.

        Unbound, a mask's key columns are positions 0, 1, ...; bound, they are moved onto the slots. The first
        call keeps its result; a later call with equal positions (the next layer's cache) returns the same
        object, so its masks and tiles are not computed again. Under torch.compile each call binds anew.
        """
        if self.k_pos is not None:
            raise ValueError("this Visibility already has its key positions; for_keys binds an unbound one")
        k_pos = _positions("k_pos", k_pos)
        kept: Visibility | None = self._kept.get("keys")
        if kept is not None and kept.k_pos is not None and not torch.compiler.is_compiling():
            if kept.k_pos is k_pos or (kept.k_pos.shape == k_pos.shape and bool(torch.equal(kept.k_pos, k_pos))):
                return kept
        move = lambda m: m if m is None else at_slots(m, k_pos)  # (.., Tq|1, positions) -> (.., Tq|1, S)
        bound = self._copy(k_pos=k_pos, k_start=None, allowed=move(self.allowed), bias=move(self.bias))
        self._kept["keys"] = bound
        return bound

    def check_mods(self) -> None:
        """Evaluate the mask_mod and score_mod on every (query, key position) pair this call may ask, once,
        raising what a backend would raise: what ``Attention`` does before a cache is written, whose keys'
        positions are not known yet (every key a query may see lies at a position from 0 to the last query's)."""
        if not self.has_mods or torch.compiler.is_compiling():
            return
        self.keep("mods_checked", self._check_mods)

    def _check_mods(self) -> bool:
        q_pos = self.q_pos.clamp(min=0)  # an empty query reads 0, as the backends read it
        batch, heads = self.batch or 1, self.heads or 1
        if self.k_pos is not None:
            keys = self.k_pos.clamp(min=0)
        else:
            keys = torch.arange(int(q_pos.max()) + 1 if q_pos.numel() else 1, device=q_pos.device)
        width = keys.shape[-1]
        rows = max(1, CHECK_ELEMENTS // max(1, batch * heads * width))  # queries a pass: bounded memory
        grid = lambda p: p if p.dim() == 1 else p[:, None, :, None]  # (T,), or (B, T) -> (B, 1, T, 1)
        kv = keys if keys.dim() == 1 else keys[:, None, None, :]  # (S,), or (B, S) -> (B, 1, 1, S)
        with torch.no_grad():  # a check: no graph through a learnable mod
            for i in range(0, max(self.tq, 1), rows):
                q = grid(q_pos[..., i : i + rows])
                if self.mask_mod is not None:
                    evaluate_mask(self.mask_mod, batch=batch, heads=heads, q_idx=q, kv_idx=kv)
                if self.score_mod is not None:
                    n = q.shape[2] if q.dim() == 4 else q.shape[0]
                    scores = torch.zeros(batch, heads, n, width, device=q.device)  # (B, H, rows, S)
                    apply_score_mod(self.score_mod, scores, q_idx=q, kv_idx=kv, scratch=True)
        return True

    def bound_to(self, batch: int, heads: int, device: torch.device) -> Visibility:
        """This object for a call of ``batch`` x ``heads`` on ``device``: itself when it was built for it (then it
        keeps its answers across calls), else a copy that is kept too."""
        if self.batch is not None and (self.batch, self.heads) != (batch, heads):
            raise ValueError(
                f"this Visibility was built for batch={self.batch}, heads={self.heads}, but the call has "
                f"batch={batch}, heads={heads}; build it with the call's sizes"
            )
        if self.batch == batch and self.heads == heads and self.q_pos.device == device:
            return self
        key = ("bound", batch, heads, device)
        if key not in self._kept:
            moved = {k: getattr(self, k) for k in ("q_pos", "k_pos", "allowed", "bias")}
            moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in moved.items()}
            self._kept[key] = self._copy(batch=batch, heads=heads, **moved)
        bound: Visibility = self._kept[key]
        return bound

    # ---- what it is ----

    @property
    def tq(self) -> int:
        return self.q_pos.shape[-1]

    @property
    def tk(self) -> int:
        assert self.k_pos is not None, "the key positions are not bound yet (for_keys)"
        return self.k_pos.shape[-1]

    @property
    def has_mods(self) -> bool:
        return self.mask_mod is not None or self.score_mod is not None

    def keep(self, key: Any, build: Callable[[], Any]) -> Any:
        """``build()`` once per key; a result that carries a graph (a learnable mod's) is rebuilt each time,
        so one backward pass never meets another's freed graph."""
        if key in self._kept:
            return self._kept[key]
        value = build()
        tensors = value if isinstance(value, tuple) else (value,)
        if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
            self._kept[key] = value
        return value

    def structure_hides_nothing(self) -> bool:
        """True when causal, window and empty slots hide no key from any query (one decoding query over its keys).
        Under torch.compile, where positions cannot be read, it answers False (the mask is then built)."""
        return self.keep("hides_nothing", lambda: self._bounds_kind(0, self.tq, 0, self.tk) == FULL)

    def hides_nothing(self) -> bool:
        """True when nothing restricts the call: no structure that hides, no mask, no mod."""
        return self.allowed is None and self.bias is None and not self.has_mods and self.structure_hides_nothing()

    def is_plain_causal(self) -> bool:
        """Only causal, queries and keys starting at one position (SDPA's ``is_causal=True``, top-left)."""
        return (
            self.causal
            and self.window is None
            and self.allowed is None
            and self.bias is None
            and not self.has_mods
            and self.q_start is not None
            and self.q_start == self.k_start
        )

    def tile_is_aligned_causal(self, i0: int, i1: int, j0: int, j1: int) -> bool:
        """True when, within this tile, query row r sees key column c exactly when c <= r and nothing else
        restricts: SDPA's top-left ``is_causal`` on the tile. Only causal (and a window that hides nothing in
        the tile), and the tile's queries and keys are consecutive positions starting at one position (a
        causal diagonal tile, a zigzag shard's too)."""
        if not self.causal or self.allowed is not None or self.bias is not None or self.has_mods:
            return False
        if self.k_pos is None or i1 <= i0 or j1 <= j0 or torch.compiler.is_compiling():
            return False
        if self.q_start is not None and self.k_start is not None:
            start = self.q_start + i0
            window_hides = self.window is not None and (self.q_start + i1 - 1) - (self.k_start + j0) >= self.window
            return start == self.k_start + j0 and not window_hides
        return bool(self.keep(("aligned", i0, i1, j0, j1), lambda: self._aligned(i0, i1, j0, j1)))

    def _aligned(self, i0: int, i1: int, j0: int, j1: int) -> bool:
        assert self.k_pos is not None
        qp, kp = self.q_pos[..., i0:i1], self.k_pos[..., j0:j1]  # (T,) or (B, T)
        start = qp[..., :1]
        steps = lambda p: torch.arange(p.shape[-1], device=p.device)
        runs = bool((start >= 0).all() and (qp == start + steps(qp)).all() and (kp == start + steps(kp)).all())
        # consecutive from one start: the widest gap is the last query's over the first key, (i1 - i0 - 1)
        return runs and (self.window is None or i1 - i0 - 1 < self.window)

    def trained_tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensors that need gradients through the score_mod: the ones it declares and the ones it reads."""
        return self.keep(
            "trained", lambda: tuple(score_mod_tensors(self.score_mod, *self._probe_positions(), self.q_pos.device))
        )

    def _probe_positions(self) -> tuple[int, int]:
        if self.q_start is not None and self.k_start is not None:
            return self.q_start, self.k_start
        if torch.compiler.is_compiling():
            return 0, 0
        k = self.k_pos if self.k_pos is not None else self.q_pos
        return max(int(self.q_pos.max()), 0), max(int(k.max()), 0)

    # ---- the structure: causal, window, empty slots ----

    def _structure(self, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        """May query position qp see key position kp: broadcast positions in, bool out. The one predicate."""
        ok = (kp >= 0) & (qp >= 0)
        if self.causal:
            ok = ok & (kp <= qp)
        if self.window is not None:
            ok = ok & (qp - kp < self.window)
        return ok

    def _grid(self, i0: int, i1: int, j0: int, j1: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Query positions (B|1, 1, bq, 1) and key positions (B|1, 1, 1, bk) of a tile."""
        assert self.k_pos is not None
        qp, kp = self.q_pos[..., i0:i1], self.k_pos[..., j0:j1]
        return qp.reshape(-1, 1, i1 - i0, 1), kp.reshape(-1, 1, 1, j1 - j0)  # (T,) or (B, T) -> 4-D

    def _bounds(self, pos: torch.Tensor, block: int) -> tuple[list[int], list[int], list[bool], list[bool]]:
        """Per block of ``block`` positions: min and max of the filled ones, whether any is empty, whether all are."""
        n = pos.shape[-1]
        pad = -n % block
        p = torch.nn.functional.pad(pos.reshape(-1, n), (0, pad), value=-1).reshape(-1, (n + pad) // block, block)
        filled = p >= 0  # (B|1, nb, block); the padding reads as empty and is cut from the last block below
        lo = torch.where(filled, p, _BIG).amin(dim=(0, 2))
        hi = torch.where(filled, p, -_BIG).amax(dim=(0, 2))
        real = torch.ones_like(filled[0])
        if pad:
            real[-1, block - pad :] = False
        some_empty = (~filled & real).any(dim=2).any(dim=0)
        all_empty = ~(filled & real).any(dim=2).any(dim=0)
        return lo.tolist(), hi.tolist(), some_empty.tolist(), all_empty.tolist()

    def _structure_kinds(self, block_q: int, block_k: int) -> list[list[int]]:
        """Each tile's kind under causal, window and empty slots alone, [row of tiles][column of tiles]."""
        assert self.k_pos is not None
        nq, nk = -(-self.tq // block_q), -(-self.tk // block_k)
        if self.q_start is not None and self.k_start is not None:  # ranges: arithmetic, nothing read from a tensor
            q = [(self.q_start + i * block_q, self.q_start + min((i + 1) * block_q, self.tq) - 1) for i in range(nq)]
            k = [(self.k_start + j * block_k, self.k_start + min((j + 1) * block_k, self.tk) - 1) for j in range(nk)]
            return [[self._kind(ql, qh, kl, kh, False, False) for kl, kh in k] for ql, qh in q]
        q_lo, q_hi, q_some, q_all = self._bounds(self.q_pos, block_q)
        k_lo, k_hi, k_some, k_all = self._bounds(self.k_pos, block_k)
        return [
            [
                EMPTY if q_all[i] or k_all[j] else self._kind(q_lo[i], q_hi[i], k_lo[j], k_hi[j], q_some[i], k_some[j])
                for j in range(nk)
            ]
            for i in range(nq)
        ]

    def _kind(self, q_lo: int, q_hi: int, k_lo: int, k_hi: int, q_empty: bool, k_empty: bool) -> int:
        """A tile's kind from the bounds of its filled positions and whether it holds empty ones."""
        if self.causal and k_lo > q_hi:
            return EMPTY  # every key lies in every query's future
        if self.window is not None and q_lo - k_hi >= self.window:
            return EMPTY  # every key is older than every query's window
        full = not (q_empty or k_empty)
        if self.causal:
            full = full and k_hi <= q_lo
        if self.window is not None:
            full = full and q_hi - k_lo < self.window
        return FULL if full else PARTIAL

    def _bounds_kind(self, i0: int, i1: int, j0: int, j1: int) -> int:
        """The structure's kind of one rectangle (the whole grid, for the backends' shortcuts)."""
        if not self.causal and self.q_start is not None and self.k_start is not None:
            return FULL
        if torch.compiler.is_compiling() and (self.q_start is None or self.k_start is None):
            return PARTIAL
        if i1 <= i0 or j1 <= j0:
            return FULL
        if (i0, i1, j0, j1) == (0, self.tq, 0, self.tk) and (self.q_start is None or self.k_start is None):
            whole = self._whole_kind()
            if whole is not None:
                return whole
        return self._structure_kinds(max(i1 - i0, 1), max(j1 - j0, 1))[0][0]

    def _whole_kind(self) -> int | None:
        """The whole grid's kind from its positions' extremes, four numbers read at once, where no slot is empty
        (a decode step over a cache filled up to its length: asked once a step); None where one is, for
        :meth:`_structure_kinds` to say. What the blocks' bounds find for one block, in 3 aten ops instead of 40."""
        assert self.k_pos is not None
        if self.k_pos.device != self.q_pos.device:
            return None  # read apart, by the blocks' bounds
        q_lo, q_hi = torch.aminmax(self.q_pos)
        k_lo, k_hi = torch.aminmax(self.k_pos)
        ql, qh, kl, kh = torch.stack((q_lo, q_hi, k_lo, k_hi)).tolist()  # ints: positions are integer tensors
        return None if ql < 0 or kl < 0 else self._kind(ql, qh, kl, kh, False, False)

    # ---- what the backends read ----

    def tile(
        self, i0: int, i1: int, j0: int, j1: int, *, structure: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(allowed, bias) for query rows i0:i1 and key columns j0:j1, each broadcastable to (B, H, bq, bk),
        None where nothing restricts. ``structure=False`` leaves out causal/window/empty slots (a FULL tile).

        A tile's mask is kept (up to KEEP_TILE_BYTES in all), so the layers that share this object, and the
        backward pass, evaluate a mask_mod once per tile, not once per layer.
        """
        bias = self.tile_bias(i0, i1, j0, j1)
        key = ("tile", i0, i1, j0, j1, structure)
        if key in self._kept:
            return self._kept[key], bias
        allowed = self._tile_mask(i0, i1, j0, j1, structure)
        size = allowed.numel() if allowed is not None else 0
        if self._kept.get("tile_bytes", 0) + size <= KEEP_TILE_BYTES:
            self._kept[key] = allowed
            self._kept["tile_bytes"] = self._kept.get("tile_bytes", 0) + size
        return allowed, bias

    def tile_bias(self, i0: int, i1: int, j0: int, j1: int) -> torch.Tensor | None:
        """The float mask of a tile alone (a FULL tile needs nothing else), or None."""
        return _slice(self.bias, i0, i1, j0, j1) if self.bias is not None else None

    def _tile_mask(self, i0: int, i1: int, j0: int, j1: int, structure: bool) -> torch.Tensor | None:
        allowed = None
        qp, kp = self._grid(i0, i1, j0, j1)
        if structure:
            allowed = self._structure(qp, kp)  # (B|1, 1, bq, bk)
        if self.allowed is not None:
            allowed = _join(allowed, _slice(self.allowed, i0, i1, j0, j1), operator.and_)
        if self.mask_mod is not None:
            m = evaluate_mask(
                self.mask_mod,
                batch=self.batch or 1,
                heads=self.heads or 1,
                q_idx=qp.clamp(min=0),
                kv_idx=kp.clamp(min=0),
            )
            allowed = _join(allowed, m, operator.and_)
        return allowed

    def dense(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(allowed, bias) for the whole (.., Tq, Tk) grid, kept; the structure left out when it hides nothing."""
        return self.keep(
            "dense", lambda: self.tile(0, self.tq, 0, self.tk, structure=not self.structure_hides_nothing())
        )

    def modify(
        self,
        scores: torch.Tensor,
        i0: int,
        i1: int,
        j0: int,
        j1: int,
        *,
        scratch: bool = False,
        head_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``score_mod`` on scores (B, H, bq, bk) of rows i0:i1 and columns j0:j1 (the scores themselves without one).
        ``scratch``: the scores are a fresh tensor nobody else reads, so an in-place mod may write into them.
        ``head_ids``: which heads dim 1 holds, when it holds only some (the mod sees their own indices)."""
        if self.score_mod is None:
            return scores
        qp, kp = self._grid(i0, i1, j0, j1)
        return apply_score_mod(
            self.score_mod, scores, q_idx=qp.clamp(min=0), kv_idx=kp.clamp(min=0), scratch=scratch, head_ids=head_ids
        )

    def tile_kinds(self, block_q: int, block_k: int) -> dict[tuple[int, int], int]:
        """Every block_q x block_k tile classified once and kept: EMPTY (skipped), PARTIAL (masked) or FULL.

        The structure classifies by bounds; a mask or mask_mod is then evaluated one row of tiles at a time,
        over at most CLASSIFY_TILES key tiles per call, and only where the structure left the tile alive.
        """
        return self.keep(("kinds", block_q, block_k), lambda: self._tile_kinds(block_q, block_k))

    def _tile_kinds(self, block_q: int, block_k: int) -> dict[tuple[int, int], int]:
        structure = self._structure_kinds(block_q, block_k)
        kinds: dict[tuple[int, int], int] = {}
        for bi, row in enumerate(structure):
            i0, i1 = bi * block_q, min((bi + 1) * block_q, self.tq)
            live = []
            for bj, kind in enumerate(row):
                j0, j1 = bj * block_k, min((bj + 1) * block_k, self.tk)
                if kind == EMPTY or (self.allowed is None and self.mask_mod is None):
                    kinds[bi, bj] = kind
                else:
                    live.append((bj, j0, j1))
            for g in range(0, len(live), CLASSIFY_TILES):  # a bounded width: the mask of a long row is not built
                kinds.update(self._classify(bi, i0, i1, live[g : g + CLASSIFY_TILES]))
        return kinds

    def _classify(self, bi: int, i0: int, i1: int, live: list[tuple[int, int, int]]) -> dict[tuple[int, int], int]:
        """Kinds of the tiles ``live`` (neighbours in one row of tiles), from the masks evaluated on their span."""
        lo, hi = live[0][1], live[-1][2]
        allowed, _ = self.tile(i0, i1, lo, hi)
        assert allowed is not None
        allowed = allowed.expand(*allowed.shape[:-1], hi - lo)  # a key dim broadcast from 1, spelled out
        rows = allowed.reshape(-1, hi - lo)  # (.. * bq, width): every (broadcast) query row
        some, every = rows.any(dim=0), rows.all(dim=0)  # (width,) per key
        kinds = {}
        for bj, j0, j1 in live:
            if bool(every[j0 - lo : j1 - lo].all()):
                kinds[bi, bj] = FULL
            elif not bool(some[j0 - lo : j1 - lo].any()):
                kinds[bi, bj] = EMPTY
            else:
                kinds[bi, bj] = PARTIAL
        return kinds

    # ---- flex: the same predicate as a mask_mod over padded call indices ----

    def flex_mods(self, tq: int, tk: int) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor] | None]:
        """(mask_mod, score_mod) over the indices of a call padded to tq x tk (the padding is hidden)."""
        assert self.k_pos is not None
        pad = torch.nn.functional.pad
        q_pos = pad(self.q_pos, (0, tq - self.tq), value=-1)  # (.., tq): padded queries see nothing
        k_pos = pad(self.k_pos, (0, tk - self.tk), value=-1)
        per_row = q_pos.dim() == 2 or k_pos.dim() == 2
        b_, h_ = self.batch or 1, self.heads or 1
        allowed = self.allowed.expand(b_, h_, self.tq, self.tk) if self.allowed is not None else None
        bias = self.bias.expand(b_, h_, self.tq, self.tk) if self.bias is not None else None
        last_q, last_k, user_mask, user_score = self.tq - 1, self.tk - 1, self.mask_mod, self.score_mod

        def at(b: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if not per_row:
                return q_pos[qi], k_pos[ki]
            qp = q_pos[b, qi] if q_pos.dim() == 2 else q_pos[qi]
            return qp, (k_pos[b, ki] if k_pos.dim() == 2 else k_pos[ki])

        def mask_mod(b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
            qp, kp = at(b, qi, ki)
            ok = self._structure(qp, kp)
            qc, kc = qi.clamp(max=last_q), ki.clamp(max=last_k)  # the padding asks as the last real index
            if allowed is not None:
                ok = ok & allowed[b, h, qc, kc]
            if user_mask is not None:
                ok = ok & user_mask(b, h, qp.clamp(min=0), kp.clamp(min=0))
            return ok

        if user_score is None and bias is None:
            return mask_mod, None

        def score_mod(
            score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor
        ) -> torch.Tensor:
            qp, kp = at(b, qi, ki)
            if user_score is not None:
                score = user_score(score, b, h, qp.clamp(min=0), kp.clamp(min=0))
            if bias is not None:
                score = score + bias[b, h, qi.clamp(max=last_q), ki.clamp(max=last_k)].to(score.dtype)
            return score

        return mask_mod, score_mod

    def depends_on_batch_and_head(self) -> tuple[bool, bool]:
        """Whether what hides a key differs across the batch and across heads, read off broadcast shapes."""
        by_batch = self.q_pos.dim() == 2 or (self.k_pos is not None and self.k_pos.dim() == 2)
        by_head = False
        if self.allowed is not None:
            shape = (1,) * (4 - self.allowed.dim()) + tuple(self.allowed.shape)  # (B|1, H|1, Tq|1, Tk|1)
            by_batch, by_head = by_batch or shape[0] > 1, shape[1] > 1
        if self.mask_mod is not None:  # one query and one key show which indices the mod broadcasts over
            q0, k0 = self._probe_positions()
            one = evaluate_mask(
                self.mask_mod,
                batch=self.batch or 1,
                heads=self.heads or 1,
                q_idx=torch.tensor([q0], device=self.q_pos.device),
                kv_idx=torch.tensor([k0], device=self.q_pos.device),
            )
            shape = (1,) * (4 - one.dim()) + tuple(one.shape)
            by_batch, by_head = by_batch or shape[0] > 1, by_head or shape[1] > 1
        return by_batch, by_head

    def __repr__(self) -> str:
        parts = [f"Tq={self.tq}", f"Tk={self.tk if self.k_pos is not None else '?'}"]
        if self.causal:
            parts.append("causal")
        if self.window is not None:
            parts.append(f"window={self.window}")
        if self.allowed is not None:
            parts.append(f"mask{tuple(self.allowed.shape)}")
        if self.bias is not None:
            parts.append(f"bias{tuple(self.bias.shape)}")
        for name in ("mask_mod", "score_mod"):
            mod = getattr(self, name)
            if mod is not None:
                parts.append(f"{name}={mod_name(mod)}")
        return f"Visibility({', '.join(parts)})"
