"""The eager backend: the chapter's explicit math, batched, masked and grouped.

matmul -> scale -> mask -> softmax -> dropout -> @ V, each step a line, each
reported to the Recorder (``attnlab.observe``). The only backend that forms
per-head weights, and the reference every fast path is tested against.
Supports double backward (it is plain autograd).

Shapes: B = batch, H = query heads, Hkv = key/value heads, G = H // Hkv,
Tq / Tk = query / key lengths, D = head_dim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from attnlab.functional.sinks import kept_share, logsumexp_with_sinks, sink_share
from attnlab.functional.visibility import Visibility
from attnlab.observe import record


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Scores and softmax of half-precision inputs in float32; float32 and float64 in themselves."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, Hkv, T, D) -> (B, Hkv * groups, T, D): each kv head serves ``groups`` query heads."""
    if groups == 1:
        return x
    b, h_kv, t, d = x.shape
    x = x[:, :, None].expand(b, h_kv, groups, t, d)  # (B, Hkv, G, T, D)
    return x.reshape(b, h_kv * groups, t, d)  # (B, H, T, D)


def dead_rows(allowed: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor | None:
    """(.., Tq, 1) True where a query may attend to nothing; None when no row can be empty.

    A key is open when the boolean mask allows it and the float mask is not
    -inf there; a row is dead when no key is open. Computed on the masks' own
    broadcast shape, not the scores', so it costs little.
    """
    if allowed is None and bias is None:
        return None
    if bias is None:
        assert allowed is not None
        open_keys = allowed
    else:
        open_keys = ~torch.isneginf(bias) if allowed is None else allowed & ~torch.isneginf(bias)
    return ~open_keys.any(dim=-1, keepdim=True)


def eager_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    vis: Visibility,
    *,
    scale: float,
    dropout_p: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel contract: (context (B, H, Tq, Dv) in q's dtype, lse (B, H, Tq)).

    lse is each row's log-sum-exp of its scaled, masked scores (+inf on a row
    that may see nothing), in the accumulation dtype, as the flash backend
    returns it. The weights go to the Recorder. The (B, H, Tq, Tk) scores are
    scaled and masked in place, as the book masks them, so the path holds two
    score-sized tensors, not five. A row left with nothing, by the masks or by
    a score_mod that made its every score -inf, gets weights of 0.

    ``sinks`` (H,): learned sinks (gpt-oss, :mod:`attnlab.functional.sinks`), counted in this softmax: the
    weights, the context and the Recorder's "attn_weights" are what the softmax gave the keys (rows summing to 1
    minus the sink's share), and the share goes to the Recorder as "sink_weight" (B, H, Tq), first. lse stays
    the scores' own.
    """
    groups = q.shape[1] // k.shape[1]
    v = repeat_kv(v, groups)  # (B, H, Tk, Dv)
    compute = accumulation_dtype(q.dtype)
    attn_scores = _masked_scores(q, k, vis, scale=scale, note=record)
    attn_weights, lse = _softmax_rows(attn_scores, vis)
    if sinks is not None:  # the softmax over [scores, sink]: the keys keep sigmoid(lse - sink) of each row
        record("sink_weight", sink_share(lse, sinks), source="attention")
        attn_weights = attn_weights * kept_share(lse, sinks)[..., None]  # (B, H, Tq, Tk)
    record("attn_weights", attn_weights, source="attention")
    if dropout_p > 0.0:
        attn_weights = F.dropout(attn_weights, p=dropout_p, training=True)
        record("dropped_weights", attn_weights, source="attention")
    context_vec = attn_weights @ v.to(compute)  # (B, H, Tq, Dv)
    record("context_vec", context_vec, source="attention")
    return context_vec.to(q.dtype), lse


def _masked_scores(
    q: torch.Tensor, k: torch.Tensor, vis: Visibility, *, scale: float, note: Callable[..., None]
) -> torch.Tensor:
    """Scores (B, H, Tq, Tk) in the accumulation dtype, scaled, score-modded and masked; each step to ``note``."""
    k = repeat_kv(k, q.shape[1] // k.shape[1])  # (B, H, Tk, D)
    compute = accumulation_dtype(q.dtype)
    attn_scores = q.to(compute) @ k.to(compute).transpose(-2, -1)  # (B, H, Tq, Tk)
    note("attn_scores", attn_scores, source="attention")
    attn_scores.mul_(scale)  # Vaswani et al. 2017, eq. 1: QK^T / sqrt(d_k)
    note("scaled_scores", attn_scores, source="attention")
    if vis.score_mod is not None:  # on the whole (B, H, Tq, Tk) grid; autograd reaches its learnable tensors
        attn_scores = vis.modify(attn_scores, 0, vis.tq, 0, vis.tk)
        note("modified_scores", attn_scores, source="attention")
    allowed, bias = vis.dense()  # built once per Visibility: every layer that shares it reads the same masks
    # In place where the scores are ours alone; a score_mod's backward may need the tensor it returned.
    fill = torch.Tensor.masked_fill if vis.score_mod is not None else torch.Tensor.masked_fill_
    if bias is not None:
        attn_scores = attn_scores + bias.to(compute)
    if allowed is not None:
        attn_scores = fill(attn_scores, ~allowed, float("-inf"))
    note("masked_scores", attn_scores, source="attention")
    return attn_scores


def _softmax_rows(attn_scores: torch.Tensor, vis: Visibility) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights and lse (B, H, Tq) of masked scores; a row with nothing to see gets weights 0 and lse +inf.

    Such a row is set to 0 before the logsumexp and the softmax, not after: their backward on a row of -inf
    multiplies the upstream gradient by exp(-inf - -inf) = NaN, which a 0 upstream does not cancel (0 * NaN),
    and an added float mask (unlike masked_fill) passes that NaN on to q, k and the mask.
    """
    allowed, bias = vis.dense()
    dead = None
    if allowed is not None or bias is not None or vis.score_mod is not None:
        # (B, H, Tq, 1): by mask or by a score_mod's -inf alike; read off the scores, no gradient through it
        dead = torch.isneginf(attn_scores.detach().amax(dim=-1, keepdim=True))
        # in place where nothing keeps the scores for its backward (no gradient, no score_mod)
        in_place = vis.score_mod is None and not attn_scores.requires_grad
        fill = torch.Tensor.masked_fill_ if in_place else torch.Tensor.masked_fill
        attn_scores = fill(attn_scores, dead, 0.0)  # softmax of zeros, then weights of zero: no NaN either way
    lse = torch.logsumexp(attn_scores, dim=-1)  # (B, H, Tq)
    attn_weights = torch.softmax(attn_scores, dim=-1)
    if dead is not None:
        lse = lse.masked_fill(dead[..., 0], float("inf"))
        attn_weights = attn_weights.masked_fill(dead, 0.0)
    return attn_weights, lse


def attention_weights(
    q: torch.Tensor, k: torch.Tensor, vis: Visibility, *, scale: float, normalize: str = "softmax"
) -> torch.Tensor:
    """The weights (B, H, Tq, Tk) the eager backend forms, told to no Recorder: for a cache that weighs its keys
    by the attention they get (``attnlab.cache.EvictingCache``) while a user records the model's own steps.
    ``normalize="sigmoid"``: each weight the sigmoid of its score, as a sigmoid layer gives them
    (``attnlab.functional.sigmoid``), 0 where hidden."""
    with torch.no_grad():
        scores = _masked_scores(q, k, vis, scale=scale, note=lambda *a, **kw: None)  # (B, H, Tq, Tk)
        return torch.sigmoid(scores) if normalize == "sigmoid" else _softmax_rows(scores, vis)[0]


def head_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    vis: Visibility,
    *,
    scale: float,
    heads: Sequence[int],
    lse: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """The weights (B, len(heads), Tq, Tk) of the chosen query heads alone, exactly as this backend forms them,
    while the layer itself ran a fused kernel: only these heads' scores are formed.

    With ``lse`` (B, H, Tq), the row log-sum-exp a fused kernel returned (flash), each weight is
    exp(score - lse) and the rows need no second pass; without it, the chosen heads' softmax. With ``sinks``
    (H,), learned sinks (gpt-oss), the sink is counted in each row's softmax: the weights are what it gave the
    keys, summing to 1 minus the sink's share (:mod:`attnlab.functional.sinks`). A row that sees nothing gets
    weights of 0, as here. ``vis`` is the call's bound Visibility (its masks and mods, applied to each chosen
    head under its own index).
    """
    ids = torch.tensor(list(heads), dtype=torch.long, device=q.device)
    compute = accumulation_dtype(q.dtype)
    with torch.no_grad():
        q_h = q.index_select(1, ids)  # (B, h, Tq, D)
        k_h = k.index_select(1, ids // (q.shape[1] // k.shape[1]))  # each chosen head's key/value head (B, h, Tk, D)
        scores = (q_h.to(compute) @ k_h.to(compute).transpose(-2, -1)).mul_(scale)  # (B, h, Tq, Tk), scaled in place
        scores = vis.modify(scores, 0, vis.tq, 0, vis.tk, scratch=True, head_ids=ids)
        allowed, bias = vis.dense()  # (B|1, H|1, Tq, Tk) each, or None
        pick = lambda m: m.index_select(1, ids) if m.dim() == 4 and m.shape[1] > 1 else m
        if bias is not None:
            scores = scores + pick(bias).to(compute)
        if allowed is not None:  # in place from here: one (B, h, Tq, Tk) buffer, however many heads are chosen
            scores.masked_fill_(~pick(allowed), float("-inf"))
        if lse is None:
            row = torch.logsumexp(scores, dim=-1, keepdim=True)  # (B, h, Tq, 1); -inf on a dead row
        else:
            row = lse.index_select(1, ids).to(compute)[..., None]  # (B, h, Tq, 1); +inf on a dead row
        dead = ~torch.isfinite(row)
        row = row.masked_fill(dead, 0.0)
        if sinks is not None:  # each row's softmax also counts exp(sink): exp(score - log(exp(lse) + exp(sink)))
            row = logsumexp_with_sinks(row, sinks.index_select(0, ids))
        return scores.sub_(row).exp_().masked_fill_(dead, 0.0)
