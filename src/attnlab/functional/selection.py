"""Top-k selection of keys: DeepSeek Sparse Attention's lightning indexer and the keys each query then reads.

The indexer (DeepSeek-V3.2; GLM-5) scores every key a query may see with small heads of its own:

    I(t, s) = sum over indexer heads j of  w_j(x_t) * ReLU(q_j(t) . k(s) * scale)

(``index_scores``; the paper's eq. 1, with transformers' softmax scale on the dot product), and the query's
main attention reads only the ``k`` keys of highest score among those it may see (``top_k``). A selection is
a restriction of who may attend, so it is expressed as a :class:`Visibility`, which every backend reads:

* readable (:func:`restricted`): the call's Visibility with a mask of the chosen slots: attention over every
  key, the others hidden; what transformers does, and what the fast form is tested against;
* fast (:func:`gathered` with :func:`gather_keys`): each query becomes a row of its own that holds only its
  chosen keys, gathered by the selection's indices, with their positions (-1 where fewer than ``k`` were
  visible); the kernel never scores a key it was not given. :func:`keys_read` counts what such a gather read,
  from the positions it produced.

The selection itself is not differentiable (it is an index), so the language-model loss sends the indexer no
gradient. As in the paper, the indexer trains apart (:func:`indexer_loss`): on each query's chosen keys, by the KL
divergence from the main attention's weights there (summed over its heads, L1-normalised, detached) to the softmax
of the indexer's scores.

Shapes: B = batch, H = query heads, Hk = key heads, Hi / Di = indexer heads / head size, Tq = queries,
S = key slots, K = keys chosen a query (at most ``k``), D = a key's width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attnlab._checks import check_positive_int
from attnlab.functional.visibility import Visibility


def index_scores(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, *, scale: float) -> torch.Tensor:
    """The lightning indexer's score of every (query, key slot): (B, Tq, S) in float32.

    Args:
        q: the indexer's queries (B, Tq, Hi, Di); k: its keys (B, S, Di), one head for all; weights: each
            query's weight per indexer head (B, Tq, Hi); scale: on each dot product, before the ReLU.
    """
    dots = torch.einsum("bthd,bsd->bths", q.float(), k.float()) * scale  # (B, Tq, Hi, S)
    return torch.einsum("bth,bths->bts", weights.float(), torch.relu(dots))  # (B, Tq, S)


@dataclass(frozen=True)
class Selection:
    """The key slots each query reads: ``indices`` (B, Tq, K), -1 where fewer than ``k`` keys were visible."""

    indices: torch.Tensor
    k: int


def check_selectable(vis: Visibility) -> None:
    """Refuse what a selection cannot read (a layer calls this before it writes its cache): a float mask or a
    score_mod (a selection reads who may attend, not how scores move) and a restriction that differs by head (one
    selection serves every head of a query)."""
    if vis.bias is not None or vis.score_mod is not None:
        raise ValueError(
            "top-k selection reads who may attend, and this call also moves scores (a float mask or a score_mod); "
            "pass a bool mask (True = may attend) and no score_mod to an indexed layer"
        )
    if vis.allowed is not None or vis.mask_mod is not None:
        if vis.depends_on_batch_and_head()[1]:
            raise ValueError(
                "one top-k selection serves every head of a query, and this mask differs by head: pass a mask "
                "broadcast over heads (B, 1, Tq, Tk)"
            )


def visible_slots(vis: Visibility, batch: int) -> torch.Tensor | None:
    """Which slots each query may see (B, Tq, S), from the call's bound Visibility; None where it hides none."""
    check_selectable(vis)
    allowed, _ = vis.dense()
    if allowed is None:
        return None
    allowed = allowed.reshape((1,) * (4 - allowed.dim()) + tuple(allowed.shape))  # (B|1, H|1, Tq|1, S|1)
    return allowed[:, 0].expand(batch, vis.tq, vis.tk)  # (B, Tq, S)


def top_k(scores: torch.Tensor, vis: Visibility, k: int) -> Selection:
    """The ``k`` visible slots of highest score per query (all visible ones where fewer are), as in DSA.

    Args:
        scores: (B, Tq, S), the indexer's; vis: the call's Visibility, bound to the S slots' positions.
    """
    check_positive_int("index_topk", k, limit=2**31)
    if vis.k_pos is None:
        raise ValueError("a selection reads a Visibility bound to its keys' positions (for_keys, or from_lengths)")
    b, tq, s = scores.shape
    if (tq, s) != (vis.tq, vis.tk):
        raise ValueError(f"scores of shape {tuple(scores.shape)} do not match a call of Tq={vis.tq}, S={vis.tk}")
    visible = visible_slots(vis, b)
    hidden = torch.full_like(scores, float("-inf"))
    masked = scores if visible is None else torch.where(visible, scores, hidden)  # (B, Tq, S)
    best, indices = masked.topk(min(k, s), dim=-1)  # (B, Tq, K)
    return Selection(torch.where(best > float("-inf"), indices, -1), k)  # a hidden slot is never chosen


def chosen_mask(selection: Selection, slots: int) -> torch.Tensor:
    """The selection as a bool mask (B, 1, Tq, S): True on each query's chosen slots."""
    idx = selection.indices
    b, tq, _ = idx.shape
    mask = torch.zeros(b, tq, slots + 1, dtype=torch.bool, device=idx.device)  # slot S: where -1 lands
    mask.scatter_(2, torch.where(idx >= 0, idx, slots), True)
    return mask[:, None, :, :slots]  # (B, 1, Tq, S)


def restricted(vis: Visibility, selection: Selection) -> Visibility:
    """The readable form: the call's Visibility, every key still there, all but the chosen ones hidden."""
    assert vis.k_pos is not None  # bound: the selection's slots are its columns
    return vis.restrict(mask=chosen_mask(selection, vis.tk))


def gathered(vis: Visibility, selection: Selection) -> Visibility:
    """The fast form's Visibility: B * Tq rows of one query each, over its K gathered slots at their positions
    (-1: nothing chosen there, hidden as an empty slot is)."""
    assert vis.k_pos is not None
    idx = selection.indices
    b, tq, kk = idx.shape
    k_pos = vis.k_pos.expand(b, vis.tk)  # (S,) or (B, S) -> (B, S)
    picked = k_pos.gather(1, idx.clamp(min=0).reshape(b, tq * kk)).reshape(b, tq, kk)  # (B, Tq, K)
    picked = torch.where(idx >= 0, picked, -1)
    q_pos = vis.q_pos.expand(b, tq).reshape(b * tq, 1)  # (B * Tq, 1)
    return Visibility(q_pos=q_pos, k_pos=picked.reshape(b * tq, kk), causal=vis.causal, window=vis.window)


def gather_keys(keys: torch.Tensor, selection: Selection) -> torch.Tensor:
    """Each query's chosen keys: keys (B, Hk, S, D) -> (B * Tq, Hk, K, D); a slot of -1 reads slot 0, hidden by
    its position in :func:`gathered`."""
    idx = selection.indices
    b, tq, kk = idx.shape
    hk, d = keys.shape[1], keys.shape[3]
    flat = idx.clamp(min=0).reshape(b, 1, tq * kk, 1).expand(b, hk, tq * kk, d)  # (B, Hk, Tq * K, D)
    picked = keys.gather(2, flat).view(b, hk, tq, kk, d)  # (B, Hk, Tq, K, D)
    return picked.transpose(1, 2).reshape(b * tq, hk, kk, d)  # (B * Tq, Hk, K, D)


def per_query(q: torch.Tensor) -> torch.Tensor:
    """Queries (B, H, Tq, D) as rows of one query each, (B * Tq, H, 1, D), the layout :func:`gathered` reads."""
    b, h, tq, d = q.shape
    return q.transpose(1, 2).reshape(b * tq, h, 1, d)  # (B, Tq, H, D) -> (B * Tq, H, 1, D)


def per_batch(out: torch.Tensor, batch: int) -> torch.Tensor:
    """The rows of :func:`per_query` back: (B * Tq, H, 1, Dv) -> (B, H, Tq, Dv)."""
    rows, h, _, dv = out.shape
    return out.view(batch, rows // batch, h, dv).transpose(1, 2)  # (B, Tq, H, Dv) -> (B, H, Tq, Dv)


def keys_read(rows: Visibility) -> torch.Tensor:
    """How many keys a gather read: the filled slots of the gathered Visibility's positions (a 0-dim tensor)."""
    assert rows.k_pos is not None
    return (rows.k_pos >= 0).sum()


def chosen_scores(
    q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, selection: Selection, *, scale: float
) -> torch.Tensor:
    """:func:`index_scores` on each query's chosen slots alone: (B, Tq, K) in float32, 0 where nothing was chosen.
    The indexer's loss reads these with their gradient, so that training keeps K scores a query, not S.

    Args:
        q: the indexer's queries (B, Tq, Hi, Di); k: its keys (B, S, Di); weights: (B, Tq, Hi); selection: (B, Tq, K).
    """
    idx = selection.indices
    b, tq, kk = idx.shape
    picked = k.gather(1, idx.clamp(min=0).reshape(b, tq * kk, 1).expand(-1, -1, k.shape[-1]))  # (B, Tq * K, Di)
    picked = picked.view(b, tq, kk, -1)  # (B, Tq, K, Di)
    dots = torch.einsum("bthd,btkd->bthk", q.float(), picked.float()) * scale  # (B, Tq, Hi, K)
    scores = torch.einsum("bth,bthk->btk", weights.float(), torch.relu(dots))  # (B, Tq, K)
    return scores.masked_fill(idx < 0, 0.0)


def indexer_loss(scores: torch.Tensor, attended: torch.Tensor, selection: Selection) -> torch.Tensor:
    """DeepSeek-V3.2's objective for its indexer (the paper's sparse stage), over each query's chosen keys S_t:

        KL( p_t || softmax(I_t) )   on S_t,  p_t = the main attention's weights on S_t summed over its heads, / their sum

    averaged over the queries that chose a key and gave it weight (the paper sums over tokens; a mean keeps one
    scale at any batch and length). A 0-dim float32 tensor, with a gradient to ``scores`` alone.

    Args:
        scores: the indexer's scores of the chosen slots (B, Tq, K) (:func:`chosen_scores`), with their gradient;
            attended: the main attention's weight on each (B, Tq, K), summed over heads (detached here);
            selection: the chosen slots (B, Tq, K), -1 for none.
    """
    idx = selection.indices
    if attended.shape != idx.shape or scores.shape != idx.shape:
        raise ValueError(
            f"scores {tuple(scores.shape)} and attended weights {tuple(attended.shape)} must both be the "
            f"selection's {tuple(idx.shape)}"
        )
    chosen = idx >= 0  # (B, Tq, K)
    p = attended.detach().float().masked_fill(~chosen, 0.0)
    mass = p.sum(dim=-1, keepdim=True)  # (B, Tq, 1)
    live = chosen.any(dim=-1, keepdim=True) & (mass > 0)  # a query that chose nothing, or gave it no weight: no term
    if not bool(live.any()):
        return scores.sum() * 0.0  # no query to learn from: a loss of 0, still in the indexer's graph
    logits = scores.masked_fill(~chosen, float("-inf")).masked_fill(~live, 0.0)  # a dead row's softmax stays finite
    log_q = F.log_softmax(logits, dim=-1).masked_fill(~chosen, 0.0)  # log softmax(I) on S_t; 0 off it
    p = p / mass.clamp_min(torch.finfo(p.dtype).tiny)  # L1-normalised on S_t
    kl = (torch.xlogy(p, p) - p * log_q).sum(dim=-1)  # (B, Tq); 0 log 0 = 0 off S_t
    return kl[live[..., 0]].mean()
