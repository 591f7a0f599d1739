"""Mask and score functions: FlexAttention's signatures, so a function moves between the two unchanged.

    mask_mod(b, h, q_idx, kv_idx) -> bool          True = may attend
    score_mod(score, b, h, q_idx, kv_idx) -> score  applied to the scaled score, before the mask

attnlab calls a mod once on broadcast index tensors: b (B, 1, 1, 1), h (1, H,
1, 1), q_idx (1, 1, Tq, 1), kv_idx (1, 1, 1, Tk), or a tile of them, so a mod
written with elementwise operations and indexing (``doc_ids[b, q_idx]``) works
as it does under FlexAttention's vmap. Positions are absolute, those of the
call's ``Visibility`` (after a cache, in a chunk, on a shard of a ring; per
sequence in a paged cache, q_idx (B, 1, Tq, 1)), so one mod serves them all.

>>> import torch
>>> mod = and_masks(causal(), document(torch.tensor([[0, 0, 1, 1]])))
>>> evaluate_mask(mod, batch=1, heads=1, q_idx=torch.arange(4), kv_idx=torch.arange(4))[0, 0].int()
tensor([[1, 0, 0, 0],
        [1, 1, 0, 0],
        [0, 0, 1, 0],
        [0, 0, 1, 1]], dtype=torch.int32)

Shapes: B = batch, H = heads, Tq / Tk = query / key lengths.
"""

from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from attnlab._checks import check_positive_int, check_window

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def mod_name(mod: object) -> str:
    """How errors name a mod: its repr for attnlab's own, the function's name otherwise."""
    if isinstance(mod, _Mod):
        return repr(mod)
    return getattr(mod, "__qualname__", None) or getattr(mod, "__name__", None) or type(mod).__name__


class _Mod(nn.Module):
    """A built-in mod: an ``nn.Module`` with FlexAttention's signature, named in errors. Its learnable tensors are
    parameters, so a model that holds it (``model.score_mod = mods.alibi(12, learnable=True)``) trains them."""

    NAME = "mod"
    is_bias = False  # score + something that does not depend on the score: sdpa can take it as a float mask
    sees_future = False  # a mask_mod meant to show a query keys after it: it takes the causal rule's place

    def __init__(self, **shown: object) -> None:
        super().__init__()
        self._shown = shown  # what repr() says

    @property
    def __signature__(self) -> inspect.Signature:
        """forward's: FlexAttention tells a mask_mod from a score_mod by counting the arguments."""
        return inspect.signature(self.forward)

    def __repr__(self) -> str:
        shown = {k: (f"tensor{tuple(v.shape)}" if isinstance(v, torch.Tensor) else v) for k, v in self._shown.items()}
        return f"{self.NAME}({', '.join(f'{k}={v}' for k, v in shown.items())})"


# ---- mask mods ----


class _Causal(_Mod):
    NAME = "causal"

    def __init__(self) -> None:
        super().__init__()

    def forward(self, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return q_idx >= kv_idx


class _SlidingWindow(_Mod):
    NAME = "sliding_window"

    def __init__(self, window: int) -> None:
        check_window(window)
        super().__init__(window=window)
        self.window = window

    def forward(self, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return (q_idx >= kv_idx) & (q_idx - kv_idx < self.window)


class _PrefixLM(_Mod):
    NAME = "prefix_lm"
    sees_future = True  # the prefix is seen whole, its later keys too

    def __init__(self, prefix_len: int | torch.Tensor) -> None:
        if isinstance(prefix_len, torch.Tensor):
            if prefix_len.dim() != 1 or prefix_len.is_floating_point():
                raise ValueError(
                    f"prefix_len must be an int or a (batch,) integer tensor, got shape {tuple(prefix_len.shape)}"
                )
        elif isinstance(prefix_len, bool) or not isinstance(prefix_len, int) or prefix_len < 0:
            raise ValueError(f"prefix_len must be an int >= 0 or a (batch,) tensor, got {prefix_len!r}")
        super().__init__(prefix_len=prefix_len)
        self.prefix_len = prefix_len

    def forward(self, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        prefix = self.prefix_len[b] if isinstance(self.prefix_len, torch.Tensor) else self.prefix_len
        return (kv_idx < prefix) | (q_idx >= kv_idx)  # the prefix sees itself whole; the rest is causal


class _Document(_Mod):
    NAME = "document"

    def __init__(self, doc_ids: torch.Tensor) -> None:
        if not isinstance(doc_ids, torch.Tensor) or doc_ids.dim() != 2 or doc_ids.is_floating_point():
            raise ValueError(
                f"doc_ids must be a (batch, seq) integer tensor, one document id per token, got "
                f"{tuple(doc_ids.shape) if isinstance(doc_ids, torch.Tensor) else type(doc_ids).__name__}"
            )
        super().__init__(doc_ids=doc_ids)
        self.doc_ids = doc_ids

    def forward(self, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return self.doc_ids[b, q_idx] == self.doc_ids[b, kv_idx]


class _Padding(_Mod):
    NAME = "padding"

    def __init__(self, lengths: torch.Tensor) -> None:
        if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1 or lengths.is_floating_point():
            raise ValueError("lengths must be a (batch,) integer tensor: the real tokens of each row")
        super().__init__(lengths=lengths)
        self.lengths = lengths

    def forward(self, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return kv_idx < self.lengths[b]


class _And(_Mod):
    def __init__(self, *mods: MaskMod) -> None:
        super().__init__()
        self.mods = mods
        self.held = nn.ModuleList([m for m in mods if isinstance(m, nn.Module)])  # their parameters are ours
        self.sees_future = any(sees_future(m) for m in mods)  # the others restrict it, as they restrict causal

    combine = staticmethod(operator.and_)  # how each further mod's answer joins the first's

    def forward(self, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        out = self.mods[0](b, h, q_idx, kv_idx)
        for mod in self.mods[1:]:
            out = self.combine(out, mod(b, h, q_idx, kv_idx))
        return out

    def __repr__(self) -> str:
        return "and_masks(" + ", ".join(mod_name(m) for m in self.mods) + ")"


class _Or(_And):
    combine = staticmethod(operator.or_)

    def __repr__(self) -> str:
        return "or_masks(" + ", ".join(mod_name(m) for m in self.mods) + ")"


class _Lookback(_SlidingWindow):
    NAME = "lookback"

    def forward(self, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        return q_idx - kv_idx < self.window  # a sliding layer's reach into the past; the future is not its to hide


def sees_future(mod: object) -> bool:
    """Whether a mask_mod declares that it shows a query keys after it (``prefix_lm``, and ``and_masks`` /
    ``or_masks`` holding one; a function of one's own by ``fn.sees_future = True``). Such a mod takes the place
    of a causal model's causal rule on a forward without a cache; every other mod restricts the model's own
    rule (AND). See docs/mods.md, "A model's own mask and yours"."""
    return getattr(mod, "sees_future", False) is True


def lookback(window: int) -> MaskMod:
    """Keys less than ``window`` positions back, the future included: a sliding layer's window without causal."""
    return _Lookback(window)


def causal() -> MaskMod:
    """Each query sees itself and the keys before it: q_idx >= kv_idx."""
    return _Causal()


def sliding_window(window: int) -> MaskMod:
    """Causal, and at most the last ``window`` keys, the query's own included."""
    return _SlidingWindow(window)


def prefix_lm(prefix_len: int | torch.Tensor) -> MaskMod:
    """The first ``prefix_len`` keys (an int, or one per batch row) are seen by every query; the rest is causal."""
    return _PrefixLM(prefix_len)


def document(doc_ids: torch.Tensor) -> MaskMod:
    """Packed sequences: a token sees only tokens of its own document; ``doc_ids`` is (B, T). Add causal() for a LM."""
    return _Document(doc_ids)


def padding(lengths: torch.Tensor) -> MaskMod:
    """Right padding: row b's keys past ``lengths[b]`` are hidden."""
    return _Padding(lengths)


def and_masks(*mods: MaskMod) -> MaskMod:
    """Attend where every mod allows it."""
    if not mods:
        raise ValueError("and_masks needs at least one mask_mod")
    return _And(*mods)


def or_masks(*mods: MaskMod) -> MaskMod:
    """Attend where any mod allows it."""
    if not mods:
        raise ValueError("or_masks needs at least one mask_mod")
    return _Or(*mods)


# ---- score mods ----


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The ALiBi paper's slopes (Press et al., 2022): 2^(-8/n), 2^(-16/n), ... for n heads a power of two;
    otherwise those of the nearest lower power of two, then every other slope of the next one."""
    check_positive_int("num_heads", num_heads)

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    lower = 2 ** math.floor(math.log2(num_heads))
    slopes = power_of_two(lower)
    if lower < num_heads:
        slopes += power_of_two(2 * lower)[0::2][: num_heads - lower]
    return torch.tensor(slopes, dtype=torch.float64)


class _Alibi(_Mod):
    NAME = "alibi"
    is_bias = True

    def __init__(self, num_heads: int, learnable: bool) -> None:
        super().__init__(num_heads=num_heads, learnable=learnable)
        slopes = alibi_slopes(num_heads).float()
        if learnable:
            self.slopes = nn.Parameter(slopes)
        else:
            self.register_buffer("slopes", slopes, persistent=False)  # follows .to(device); derived, not saved

    def forward(
        self, score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        return score + self.slopes.to(score.dtype)[h] * (kv_idx - q_idx)


class _Softcap(_Mod):
    NAME = "softcap"

    def __init__(self, cap: float) -> None:
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < math.inf:
            raise ValueError(f"cap must be a finite number > 0, got {cap!r}")
        super().__init__(cap=float(cap))
        self.cap = float(cap)

    def forward(
        self, score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        return self.cap * torch.tanh(score / self.cap)


class _RelativeBias(_Mod):
    NAME = "relative_bias"
    is_bias = True

    def __init__(self, table: torch.Tensor) -> None:
        if not isinstance(table, torch.Tensor) or table.dim() != 2 or table.shape[1] % 2 == 0:
            raise ValueError(
                "table must be (num_heads, 2 * max_distance + 1): one learnable bias per head and distance "
                f"kv_idx - q_idx in [-max_distance, max_distance], got "
                f"{tuple(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__}"
            )
        super().__init__(table=table)
        self.table = table  # an nn.Parameter registers itself; another tensor that requires grad is found by its use

    def forward(
        self, score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        reach = self.table.shape[1] // 2
        distance = (kv_idx - q_idx).clamp(-reach, reach) + reach  # farther than the table: its last entry
        return score + self.table.to(score.dtype)[h, distance]


class _Bias(_Mod):
    NAME = "bias"
    is_bias = True

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn  # an nn.Module registers itself, so its parameters are ours

    def forward(
        self, score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        return score + self.fn(b, h, q_idx, kv_idx).to(score.dtype)

    def __repr__(self) -> str:
        return f"bias({mod_name(self.fn)})"


class _Chain(_Mod):
    def __init__(self, *mods: ScoreMod) -> None:
        super().__init__()
        self.mods = mods
        self.held = nn.ModuleList([m for m in mods if isinstance(m, nn.Module)])  # their parameters are ours
        self.is_bias = all(is_bias(m) for m in mods)

    def forward(
        self, score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        for mod in self.mods:
            score = mod(score, b, h, q_idx, kv_idx)
        return score

    def __repr__(self) -> str:
        return "chain_scores(" + ", ".join(mod_name(m) for m in self.mods) + ")"


def bias(fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> ScoreMod:
    """A score_mod that adds ``fn(b, h, q_idx, kv_idx)`` to the score, declared a bias: the sdpa backend takes it
    as a float mask (a score_mod that is not declared one could change with the score, which sdpa cannot do)."""
    if not callable(fn):
        raise TypeError(f"bias(fn) needs a function fn(b, h, q_idx, kv_idx) -> bias, got {type(fn).__name__}")
    return _Bias(fn)


def chain_scores(*mods: ScoreMod) -> ScoreMod:
    """Apply each score_mod in turn; a bias when every one is."""
    if not mods:
        raise ValueError("chain_scores needs at least one score_mod")
    return _Chain(*mods)


def is_bias(mod: object) -> bool:
    """Whether a score_mod declares itself an additive bias (alibi, relative_bias, ``bias(fn)``)."""
    return getattr(mod, "is_bias", False) is True


def alibi(num_heads: int, *, learnable: bool = False) -> ScoreMod:
    """ALiBi: score + slope[h] * (kv_idx - q_idx); ``learnable=True`` lets the slopes train (``.slopes``)."""
    return _Alibi(num_heads, learnable)


def softcap(cap: float) -> ScoreMod:
    """Logit soft-capping (Gemma 2): cap * tanh(score / cap)."""
    return _Softcap(cap)


def relative_bias(table: torch.Tensor) -> ScoreMod:
    """A bias per head and distance: score + table[h, kv_idx - q_idx + max_distance], distances clamped."""
    return _RelativeBias(table)


# ---- evaluating a mod on (a tile of) the index grid ----


def index_grid(
    batch: int, heads: int, q_idx: torch.Tensor, kv_idx: torch.Tensor, *, head_ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """b (B, 1, 1, 1), h (1, H, 1, 1), q_idx (1 or B, 1, Tq, 1), kv_idx (1 or B, 1, 1, Tk): broadcast to (B, H, Tq, Tk).

    Positions come as (T,) or already on the grid, (1 or B, 1, Tq, 1) and (1 or B, 1, 1, Tk). ``head_ids``: the
    heads' own indices when the grid holds only some of a layer's heads (their weights recomputed alone).
    """
    device = q_idx.device
    b = torch.arange(batch, device=device).view(batch, 1, 1, 1)
    ids = torch.arange(heads, device=device) if head_ids is None else head_ids.to(device)
    h = ids.view(1, heads, 1, 1)
    q = q_idx if q_idx.dim() == 4 else q_idx.view(1, 1, -1, 1)  # (T,) -> (1, 1, Tq, 1)
    kv = kv_idx if kv_idx.dim() == 4 else kv_idx.view(1, 1, 1, -1)  # (T,) -> (1, 1, 1, Tk)
    return b, h, q, kv


def evaluate_mask(
    mask_mod: MaskMod, *, batch: int, heads: int, q_idx: torch.Tensor, kv_idx: torch.Tensor
) -> torch.Tensor:
    """The mod on the grid, checked: bool, broadcastable to (B, H, Tq, Tk); errors name the mod."""
    grid = index_grid(batch, heads, q_idx, kv_idx)
    target = (batch, heads, grid[2].shape[2], grid[3].shape[3])
    try:
        out = mask_mod(*grid)
    except Exception as err:  # a user's function: say whose error it is
        raise ValueError(f"mask_mod {mod_name(mask_mod)} raised {type(err).__name__}: {err}") from err
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
        got = f"dtype {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise TypeError(f"mask_mod {mod_name(mask_mod)} must return a bool tensor (True = may attend), got {got}")
    if out.dim() > 4 or not all(m in (1, t) for m, t in zip(reversed(out.shape), reversed(target), strict=False)):
        raise ValueError(
            f"mask_mod {mod_name(mask_mod)} returned shape {tuple(out.shape)}, which does not broadcast to "
            f"(batch, heads, Tq, Tk) = {target}; combine b, h, q_idx, kv_idx elementwise"
        )
    return out


def apply_score_mod(
    score_mod: ScoreMod,
    score: torch.Tensor,
    *,
    q_idx: torch.Tensor,
    kv_idx: torch.Tensor,
    scratch: bool = False,
    head_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The mod on (B, H, Tq, Tk) scores, checked: the same shape, floating point; errors name the mod. Its
    result comes back in the scores' dtype (a float64 table in a mod on float32 scores is cast back).

    The mod gets a tensor of its own: one that writes in place (``score.mul_(2)``) gives what its
    out-of-place form gives, and never changes the caller's scores. ``scratch=True``: the caller's
    scores are a fresh tensor no one else reads (no graph through them), so no copy is made.
    """
    batch, heads = score.shape[0], score.shape[1]
    given = score if scratch and not score.requires_grad else score.clone()
    try:
        out = score_mod(given, *index_grid(batch, heads, q_idx, kv_idx, head_ids=head_ids))
    except Exception as err:
        raise ValueError(f"score_mod {mod_name(score_mod)} raised {type(err).__name__}: {err}") from err
    if not isinstance(out, torch.Tensor) or not torch.is_floating_point(out):
        got = f"dtype {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise TypeError(f"score_mod {mod_name(score_mod)} must return floating-point scores, got {got}")
    if out.shape != score.shape:
        raise ValueError(
            f"score_mod {mod_name(score_mod)} returned shape {tuple(out.shape)} for scores of shape "
            f"{tuple(score.shape)}; it must return one score per score"
        )
    # cast, not refused: the built-in mods and FlexAttention (its score buffer) keep the scores' dtype too
    return out.to(score.dtype)


def score_mod_tensors(
    mod: Any, q_pos: int = 0, k_pos: int = 0, device: torch.device | None = None
) -> list[torch.Tensor]:
    """Every tensor that needs a gradient through ``mod``: those it declares (``parameters()``, as an nn.Module or
    attnlab's mods have) and those it reads however it reaches them (a closure, a global, a dict, an attribute,
    ``functools.partial``), found by calling it once on one score and walking the graph to its leaves.

    This is how every backend and the ring give a score_mod's tensors their gradient: none is left with a
    silent ``None``.
    """
    if mod is None:
        return []
    found: dict[int, torch.Tensor] = {}
    params = getattr(mod, "parameters", None)
    if callable(params):
        found.update({id(p): p for p in params() if isinstance(p, torch.Tensor) and p.requires_grad})
    try:
        with torch.enable_grad():
            grid = index_grid(1, 1, torch.tensor([q_pos], device=device), torch.tensor([k_pos], device=device))
            out = mod(torch.zeros(1, 1, 1, 1, device=device), *grid)
    except Exception:  # the real call raises, naming the mod; the probe says nothing more
        return list(found.values())
    stack = [out.grad_fn] if isinstance(out, torch.Tensor) else []
    seen: set[Any] = set()
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        leaf = getattr(fn, "variable", None)  # an AccumulateGrad node: a tensor that receives .grad
        if isinstance(leaf, torch.Tensor):
            found.setdefault(id(leaf), leaf)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return list(found.values())


# ---- packed documents ----


def check_document_ids(doc_ids: object, batch: int, length: int) -> None:
    """(B, T) integer ids, non-decreasing along each row: documents packed one after another."""
    if not isinstance(doc_ids, torch.Tensor) or doc_ids.is_floating_point() or doc_ids.dtype == torch.bool:
        raise TypeError(f"document_ids must be an integer tensor (batch, tokens), got {doc_ids!r:.80}")
    if tuple(doc_ids.shape) != (batch, length):
        raise ValueError(f"document_ids must be (batch, tokens) = {(batch, length)}, got shape {tuple(doc_ids.shape)}")
    if length > 1 and not bool((doc_ids[:, 1:] >= doc_ids[:, :-1]).all()):
        raise ValueError(
            "document_ids must not decrease along a row: packed documents lie one after another "
            "(e.g. [0, 0, 0, 1, 1, 2]); give each document its own id in order"
        )


def document_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) positions that restart at 0 where each document starts: [0, 0, 1, 1, 1] -> [0, 1, 0, 1, 2]."""
    b, t = doc_ids.shape
    index = torch.arange(t, device=doc_ids.device).expand(b, t)  # (B, T)
    starts = torch.ones(b, t, dtype=torch.bool, device=doc_ids.device)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values  # each token's document start
    return index - first


# ---- pictures, for the docs ----


def picture(
    mask_mod: MaskMod | None = None,
    score_mod: ScoreMod | None = None,
    *,
    size: int = 8,
    batch: int = 0,
    head: int = 0,
    scores: torch.Tensor | None = None,
) -> str:
    """A text picture of a mod on ``size`` x ``size`` positions (row = query, column = key): '■' may attend, '·'
    may not (as docs/backends.md draws masks); with a score_mod, its output on ``scores`` (size, size; default all 0, so a bias shows itself),
    rounded to 2 decimals, masked cells '·'."""
    q_idx = kv_idx = torch.arange(size)
    keep = torch.ones(size, size, dtype=torch.bool)
    if mask_mod is not None:
        grid = evaluate_mask(mask_mod, batch=batch + 1, heads=head + 1, q_idx=q_idx, kv_idx=kv_idx)
        keep = grid.expand(batch + 1, head + 1, size, size)[batch, head]
    if score_mod is None:
        return "\n".join(" ".join("■" if ok else "·" for ok in row) for row in keep.tolist())
    base = torch.zeros(size, size, dtype=torch.float64) if scores is None else scores.to(torch.float64)
    grid = base.expand(batch + 1, head + 1, size, size).clone()  # (B, H, T, T)
    added = apply_score_mod(score_mod, grid, q_idx=q_idx, kv_idx=kv_idx)[batch, head].detach()
    cells = [
        [f"{v:5.2f}" if ok else "    ·" for v, ok in zip(r, k, strict=True)]
        for r, k in zip(added.tolist(), keep.tolist(), strict=True)
    ]
    return "\n".join(" ".join(row) for row in cells)
