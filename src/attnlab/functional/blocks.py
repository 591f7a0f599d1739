"""Attend one block, and merge partial results by their log-sum-exp: the online softmax of flash and the ring.

A run of query rows keeps FlashAttention-2's running state (Dao, 2023, algorithm 1, lines 8-10): the row
max m of the scores seen so far, l = sum exp(score - m) and acc = sum exp(score - m) * value. A block of
keys folds in by its scores (:func:`attend_block`). A partial result worked out elsewhere, (out, lse), folds
in as one key whose score is its lse and whose value is its out (:func:`merge`): exp(lse - m) * out is
exactly that part's own acc under the max m, and exp(lse - m) its own l. So both are the same update, and
for two parts it is the stable form ``lse = logaddexp(lse_a, lse_b); out = out_a * exp(lse_a - lse) +
out_b * exp(lse_b - lse)``. At the end (:meth:`Running.finish`) out = acc / l and lse = m + log(l).

A row that has seen nothing has m = -inf and l = 0: it outputs 0 with lse = +inf, the kernels' contract,
and a part with lse = +inf (it saw nothing) folds in with weight 0.

Shapes: B = batch, H = heads, Tq = query rows, Tk = keys in the block, Dv = value dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _finite(m: torch.Tensor) -> torch.Tensor:
    """The row max with 0 for a row that has seen nothing, so that exp(-inf - m) is 0 rather than NaN."""
    return torch.where(torch.isinf(m), torch.zeros_like(m), m)


@dataclass
class Running:
    """The online softmax of a run of query rows: ``row_max`` (B, H, Tq), ``row_sum`` (B, H, Tq) and ``acc``
    (B, H, Tq, Dv), the m, l and O of FlashAttention-2's algorithm 1."""

    row_max: torch.Tensor
    row_sum: torch.Tensor
    acc: torch.Tensor

    @classmethod
    def start(cls, b: int, h: int, tq: int, dv: int, *, dtype: torch.dtype, device: torch.device) -> Running:
        """Rows that have seen nothing yet: m = -inf, l = 0, acc = 0."""
        return cls(
            row_max=torch.full((b, h, tq), float("-inf"), dtype=dtype, device=device),
            row_sum=torch.zeros(b, h, tq, dtype=dtype, device=device),
            acc=torch.zeros(b, h, tq, dv, dtype=dtype, device=device),
        )

    def rows(self, i0: int, i1: int) -> Running:
        """Rows i0 to i1, as views: what folds into them, in place, folds into this state."""
        return Running(self.row_max[:, :, i0:i1], self.row_sum[:, :, i0:i1], self.acc[:, :, i0:i1])

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(out (B, H, Tq, Dv) = acc / l, lse (B, H, Tq) = m + log(l)), in the state's dtype; a row that saw
        nothing: out 0, lse +inf."""
        dead = self.row_sum == 0
        # l's 0s become 1 before dividing and before the log, not after: under autograd a where() after them
        # would still send its zero gradient through 1 / l and d log(l) = 1 / l, and 0 * inf is NaN
        row_sum = torch.where(dead, torch.ones_like(self.row_sum), self.row_sum)
        out = self.acc / row_sum[..., None]
        lse = torch.where(dead, torch.full_like(row_sum, float("inf")), _finite(self.row_max) + row_sum.log())
        return out, lse


def attend_block(
    state: Running, s: torch.Tensor, v: torch.Tensor, *, keep: torch.Tensor | None = None, dropout_p: float = 0.0
) -> None:
    """Fold one block of keys into ``state``, in place: scores ``s`` (B, H, Tq, Tk), already scaled, modified
    and masked (-inf where hidden), and their values ``v`` (B, H, Tk, Dv), both in the state's dtype.

    ``s`` is overwritten (with the block's probabilities under the new max). ``keep``: the dropout keep-mask
    (B, H, Tq, Tk) of these weights; the weights it keeps are scaled by 1 / (1 - dropout_p). Dropout acts on
    the weights after softmax, so it changes acc and not l.
    """
    b, h, tq, tk = s.shape
    m_new = torch.maximum(state.row_max, s.amax(dim=-1))  # FA-2 alg. 1 line 9: m_new = max(m, rowmax(S))
    m_safe = _finite(m_new)
    p = s.sub_(m_safe[..., None]).exp_()  # (B, H, Tq, Tk): P = exp(S - m_new), in place: s is not needed again
    alpha = torch.exp(state.row_max - m_safe)  # rescales what was accumulated under the old max
    state.row_sum.mul_(alpha).add_(p.sum(dim=-1))  # l = exp(m - m_new) l + rowsum(P)
    if keep is not None:
        p = p * keep / (1.0 - dropout_p)
    acc = state.acc.view(b * h, tq, -1)  # (B*H, Tq, Dv): baddbmm wants 3-D
    acc.mul_(alpha.view(b * h, tq, 1)).baddbmm_(p.view(b * h, tq, tk), v.reshape(b * h, tk, -1))  # acc * alpha + P V
    state.row_max.copy_(m_new)


def merge(state: Running, part: torch.Tensor, part_lse: torch.Tensor) -> None:
    """Fold a partial result into ``state``, in place: ``part`` (B, H, Tq, Dv), normalized over the keys it saw,
    and their log-sum-exp ``part_lse`` (B, H, Tq), +inf where it saw nothing (the kernels' contract).

    The part is one key of score lse carrying the value out: exp(lse - m) out is its acc and exp(lse - m) its l.
    """
    part_lse = part_lse.to(state.row_max.dtype).masked_fill(torch.isposinf(part_lse), float("-inf"))  # weight 0
    m_new = torch.maximum(state.row_max, part_lse)
    m_safe = _finite(m_new)
    alpha, beta = (state.row_max - m_safe).exp_(), (part_lse - m_safe).exp_()  # old and new parts' weights
    state.row_sum.mul_(alpha).add_(beta)  # l = exp(m - m_new) l + exp(lse - m_new)
    state.acc.mul_(alpha[..., None]).addcmul_(part.to(state.acc.dtype), beta[..., None])  # acc likewise, by out
    state.row_max.copy_(m_new)
