"""DeepSeek-V4's manifold-constrained hyper-connections (mHC): the residual is ``hc_mult`` streams, not one.

Before each sublayer (attention, then the MLP) a :class:`HyperConnection` reads the N streams (RMS-normed,
flattened, one linear map ``fn`` plus ``base``, each of its three parts times its ``scale``) and gives

    pre  = sigmoid(.) + eps        (N,):   the sublayer's input is sum_j pre_j * stream_j
    post = 2 * sigmoid(.)          (N,):   stream i gets post_i * the sublayer's output
    comb = Sinkhorn(softmax(.))    (N, N): stream i also gets sum_j comb_ji * stream_j (rows and columns near 1)

The first block spreads the embedding into N equal streams; the last one's :class:`HyperHead` collapses them
with a ``pre`` of its own before the final norm. :class:`HyperBlock` holds the two connections of a block.

Shapes: B = batch, T = tokens, N = streams, E = emb_dim.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


def _flat_normed(streams: torch.Tensor, eps: float) -> torch.Tensor:
    """(B, T, N, E) -> (B, T, N * E), RMS-normed without a weight, in float32."""
    flat = streams.flatten(2).float()  # (B, T, N * E)
    return flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps)


def sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """(.., N, N) made near doubly stochastic: its columns, then rows and columns ``iters - 1`` times, divided by
    their sums."""
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


class HyperConnection(nn.Module):
    """pre, post and comb from the N streams (see the module's docstring); transformers' names (fn, base, scale)."""

    def __init__(self, *, n: int, emb_dim: int, iters: int, hc_eps: float, norm_eps: float) -> None:
        super().__init__()
        self.n, self.iters, self.hc_eps, self.norm_eps = n, iters, hc_eps, norm_eps
        self.fn = nn.Parameter(torch.zeros((2 + n) * n, n * emb_dim))
        self.base = nn.Parameter(torch.zeros((2 + n) * n))
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, streams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, N, E) -> post (B, T, N), comb (B, T, N, N), the sublayer's input (B, T, E)."""
        n = self.n
        mixed = F.linear(_flat_normed(streams, self.norm_eps), self.fn.float())  # (B, T, (2 + N) * N)
        pre, post, comb = mixed.split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = self.base.split([n, n, n * n])
        pre = torch.sigmoid(pre * self.scale[0] + pre_b) + self.hc_eps
        post = 2 * torch.sigmoid(post * self.scale[1] + post_b)
        comb = comb.view(*comb.shape[:-1], n, n) * self.scale[2] + comb_b.view(n, n)  # (B, T, N, N)
        comb = sinkhorn(comb.softmax(dim=-1) + self.hc_eps, self.iters, self.hc_eps)
        return post, comb, (pre[..., None] * streams).sum(dim=2).to(streams.dtype)


class HyperHead(nn.Module):
    """The last collapse of the streams: (B, T, N, E) -> (B, T, E), by a ``pre`` of its own (fn, base, scale)."""

    def __init__(self, *, n: int, emb_dim: int, hc_eps: float, norm_eps: float) -> None:
        super().__init__()
        self.hc_eps, self.norm_eps = hc_eps, norm_eps
        self.fn = nn.Parameter(torch.zeros(n, n * emb_dim))
        self.base = nn.Parameter(torch.zeros(n))
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, streams: torch.Tensor) -> torch.Tensor:
        mixed = F.linear(_flat_normed(streams, self.norm_eps), self.fn.float())  # (B, T, N)
        pre = torch.sigmoid(mixed * self.scale + self.base) + self.hc_eps
        return (pre[..., None] * streams).sum(dim=2).to(streams.dtype)


class HyperBlock(nn.Module):
    """A block's two connections (``attn``, ``ffn``); the first block spreads (B, T, E) into N streams, the last
    one collapses them (``head``)."""

    def __init__(
        self, *, n: int, emb_dim: int, iters: int, hc_eps: float, norm_eps: float, first: bool, last: bool
    ) -> None:
        super().__init__()
        self.n, self.first = n, first
        self.attn = HyperConnection(n=n, emb_dim=emb_dim, iters=iters, hc_eps=hc_eps, norm_eps=norm_eps)
        self.ffn = HyperConnection(n=n, emb_dim=emb_dim, iters=iters, hc_eps=hc_eps, norm_eps=norm_eps)
        self.head = HyperHead(n=n, emb_dim=emb_dim, hc_eps=hc_eps, norm_eps=norm_eps) if last else None

    @staticmethod
    def mix(streams: torch.Tensor, out: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
        """Stream i: post_i * out + sum_j comb_ji * stream_j, (B, T, N, E)."""
        return post[..., None] * out[:, :, None] + comb.transpose(-1, -2) @ streams

    def forward(
        self,
        x: torch.Tensor,
        attention: Callable[[torch.Tensor], torch.Tensor],
        mlp: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """x (B, T, E) on the first block, (B, T, N, E) after; ``attention`` and ``mlp`` the block's sublayers
        with their norms. (B, T, N, E) out, or (B, T, E) from the last block."""
        if self.first:
            x = x[:, :, None].expand(-1, -1, self.n, -1)  # (B, T, E) -> (B, T, N, E)
        post, comb, collapsed = self.attn(x)
        x = self.mix(x, attention(collapsed), post, comb)
        post, comb, collapsed = self.ffn(x)
        x = self.mix(x, mlp(collapsed), post, comb)
        return x if self.head is None else self.head(x)
