"""Eviction: keep a budget of tokens, chosen by the attention they get (H2O) or will get (SnapKV).

* ``policy="h2o"`` (Zhang et al., 2023, "Heavy-Hitter Oracle"): every key
  accumulates the attention it receives, summed over queries and heads; once
  the cache holds more than ``budget`` tokens, it keeps the latest ``recent``
  and the ``budget - recent`` heavy hitters among the rest. Memory stays at
  ``budget`` tokens for any length.
* ``policy="snapkv"`` (Li et al., 2024): when a prompt longer than ``budget``
  arrives, the attention of its last ``observe`` queries (the observation
  window), summed over heads and smoothed over neighbouring keys (average
  pooling, ``pool`` = 7), picks the ``budget - observe`` earlier tokens worth
  keeping; the window itself is kept. It compresses the prompt only, as the
  paper does: generated tokens are all kept.

The statistics: no fused backend returns attention weights (sdpa, flash and
flex give only the output), so the cache computes them itself, with the eager
backend's math over the same keys and the same ``Visibility`` (score mods
included), reported to no Recorder: ``attnlab.Attention`` calls
:meth:`EvictingCache.observe` after attending.
That pass costs about one more attention per layer; for a decode step it is
one row of scores.

One choice per layer and sequence, shared by the layer's heads: H2O and
SnapKV choose per head, but a ``Visibility`` holds one set of key positions
per row, and per-head positions would need one per head. Every row keeps the
same number of tokens, so the buffers stay rectangular.

Shapes: B = batch, H = heads, Hkv = kv heads, D = head_dim, T = new tokens, S = tokens held.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab._checks import check_positive_int
from attnlab.cache.base import Capabilities, LayerCache
from attnlab.functional.eager import attention_weights
from attnlab.functional.sigmoid import Normalization
from attnlab.functional.visibility import Visibility

POLICIES = ("h2o", "snapkv")


class EvictingCache(LayerCache):
    """At most ``budget`` tokens (H2O), or a prompt compressed to ``budget`` (SnapKV), per layer and sequence.

    Args:
        batch_size, num_kv_heads, head_dim: the shape it stores.
        budget: tokens kept.
        policy: "h2o" or "snapkv".
        recent: H2O's latest tokens always kept (default budget // 2).
        observe: SnapKV's observation window, the prompt's last queries (default min(16, budget // 2)).
        pool: SnapKV's smoothing over neighbouring keys (odd; 7).
        dtype, device: of the buffers.
    """

    capabilities = Capabilities(observes=True)
    why_no_crop = (
        "a refused guess may already have evicted a key (each token it takes pushes the least-weighted one out), "
        "and the key is gone: speculative decoding needs a cache that keeps every token ('plain')"
    )

    def __init__(
        self,
        *,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        budget: int,
        policy: str = "h2o",
        recent: int | None = None,
        observe: int | None = None,
        pool: int = 7,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(batch_size=batch_size, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype)
        check_positive_int("budget", budget, limit=2**27)
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if budget < 2:
            raise ValueError(f"budget must keep at least 2 tokens (the latest and one more), got {budget}")
        recent = budget // 2 if recent is None else recent
        observe = min(16, budget // 2) if observe is None else observe
        for name, value in (("recent", recent), ("observe", observe)):
            check_positive_int(name, value, limit=2**27)
            if value >= budget:
                raise ValueError(f"{name} ({value}) must be below budget ({budget}): the rest is chosen by attention")
        if isinstance(pool, bool) or not isinstance(pool, int) or pool < 1 or pool % 2 == 0:
            raise ValueError(f"pool must be an odd int >= 1 (a window centred on each key), got {pool!r}")
        self.budget, self.policy, self.recent, self.observe_window, self.pool = budget, policy, recent, observe, pool
        empty = torch.zeros(batch_size, num_kv_heads, 0, head_dim, dtype=dtype, device=device)
        # buffers that grow and shrink (reassigned, still buffers): they follow .to() and count in buffers()
        self.register_buffer("keys", empty, persistent=False)  # (B, Hkv, S, D)
        self.register_buffer("values", empty.clone(), persistent=False)
        self.register_buffer("positions", torch.zeros(batch_size, 0, dtype=torch.long, device=device), persistent=False)
        self.register_buffer("scores", torch.zeros(batch_size, 0, device=device), persistent=False)  # attention got
        self.keys: torch.Tensor
        self.values: torch.Tensor
        self.positions: torch.Tensor
        self.scores: torch.Tensor
        self.seen = 0  # tokens written so far
        self.evicted: list[list[int]] = [[] for _ in range(batch_size)]  # positions let go, per sequence

    def next_positions(self, t: int) -> torch.Tensor:
        return self.seen + torch.arange(t, device=self.positions.device)

    _begun: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, list[list[int]]] | None = None

    def begin(self) -> bool:
        """A pass starts: every write here makes new tensors (a concatenation, a gather), so keeping the ones
        held now (no copy) is all :meth:`undo` needs."""
        self._begun = (self.keys, self.values, self.positions, self.scores, self.seen, [list(e) for e in self.evicted])
        return True

    def undo(self) -> None:
        if self._begun is not None:
            self.keys, self.values, self.positions, self.scores, self.seen, self.evicted = self._begun
        self._begun = None

    def commit(self) -> None:
        self._begun = None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append k, v (B, Hkv, T, D); return every token held, (B, Hkv, S, D), and positions (B, S)."""
        self.check(k, v)
        t = k.shape[2]
        new = self.next_positions(t).expand(self.batch_size, t)  # (B, T)
        self.keys = torch.cat([self.keys, k], dim=2)
        self.values = torch.cat([self.values, v], dim=2)
        self.positions = torch.cat([self.positions, new], dim=1)
        self.scores = torch.cat([self.scores, self.scores.new_zeros(self.batch_size, t)], dim=1)
        self.seen += t
        return self.keys, self.values, self.positions

    @torch.no_grad()
    def observe(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        *,
        visibility: Visibility,
        scale: float | None = None,
        normalize: Normalization = "softmax",
    ) -> None:
        """After attention: weigh the keys by the attention of ``queries`` (B, H, T, D), then evict.

        ``visibility``, ``scale`` and ``normalize`` ("softmax", or "sigmoid": each weight its own sigmoid): what
        attention used. The weights are the eager backend's, told to no Recorder (a user recording the model
        sees its own steps once).
        """
        b, h, _, d = queries.shape
        bound = visibility.bound_to(b, h, queries.device)
        scale = d**-0.5 if scale is None else scale
        weights = attention_weights(queries, keys, bound, scale=scale, normalize=normalize)  # (B, H, T, S)
        if self.policy == "h2o":
            self.scores += weights.float().sum(dim=(1, 2))
            if self.keys.shape[2] > self.budget:
                self._keep(self._h2o())
        elif self.keys.shape[2] > self.budget and queries.shape[2] > 1:  # snapkv: a prompt to compress
            self._keep(self._snapkv(weights))

    def _h2o(self) -> torch.Tensor:
        """(B, budget) indices: the latest ``recent``, and the heaviest hitters of the rest."""
        s = self.keys.shape[2]
        heavy = self.scores[:, : s - self.recent]  # (B, S - recent): the candidates
        top = heavy.topk(self.budget - self.recent, dim=1).indices
        latest = torch.arange(s - self.recent, s, device=top.device).expand(self.batch_size, -1)
        return torch.cat([top, latest], dim=1)

    def _snapkv(self, weights: torch.Tensor) -> torch.Tensor:
        """(B, budget) indices: the observation window, and what its queries attend most before it."""
        s, w = self.keys.shape[2], min(self.observe_window, weights.shape[2])
        votes = weights[:, :, -w:, : s - w].float().sum(dim=(1, 2))  # (B, S - w): the window's attention
        smooth = F.avg_pool1d(votes[:, None], self.pool, stride=1, padding=self.pool // 2)[:, 0]  # (B, S - w)
        # a key no query of the call may see (a row's left padding) goes first: smoothing lends it its neighbours'
        hidden = weights[:, :, :, : s - w].sum(dim=(1, 2)) == 0  # (B, S - w)
        smooth = smooth.masked_fill(hidden, -torch.inf)
        top = smooth.topk(self.budget - w, dim=1).indices
        window = torch.arange(s - w, s, device=top.device).expand(self.batch_size, -1)
        return torch.cat([top, window], dim=1)

    def _keep(self, index: torch.Tensor) -> None:
        """Keep the tokens at ``index`` (B, budget), in order of position; record the others as evicted."""
        index = index.sort(dim=1).values
        gone = torch.ones_like(self.positions, dtype=torch.bool).scatter(1, index, False)
        for b in range(self.batch_size):
            self.evicted[b].extend(self.positions[b][gone[b]].tolist())
        per_head = index[:, None, :, None].expand(-1, self.num_kv_heads, -1, self.head_dim)  # (B, Hkv, budget, D)
        self.keys = self.keys.gather(2, per_head)
        self.values = self.values.gather(2, per_head)
        self.positions = self.positions.gather(1, index)
        self.scores = self.scores.gather(1, index)
