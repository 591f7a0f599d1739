"""``LatentAttention``: multi-head latent attention (MLA; DeepSeek-V2, V3), in an expanded and an absorbed form.

Each token's keys and values come from one latent c = RMSNorm(W_DKV x)[:R] of ``kv_lora_rank`` = R values,
and each head's query and key have a part without position (``qk_nope_head_dim`` = N) and a RoPE part
(``qk_rope_head_dim`` = P) whose key k_pe = RoPE(W_KR x) is one head shared by all. Per head h, with
W_UK^h (N x R) and W_UV^h (V x R) the rows of ``kv_b_proj``:

    expanded:  k_h = [W_UK^h c, k_pe],  v_h = W_UV^h c,  out_h = softmax(q_h . k_h * scale) v_h
    absorbed:  q~_h = W_UK^h^T q_nope_h,  score = ([q~_h, q_pe_h] . [c, k_pe]) * scale,
               out_h = W_UV^h (softmax(score) c)

The two are equal (tested); the absorbed form attends over [c, k_pe] as the keys of a single kv head and over c
as its values, so its cache (:class:`attnlab.cache.LatentCache`) holds R + P values per token and layer (576
for DeepSeek-V3) whatever the number of heads. Without a cache the expanded form runs; with one, the absorbed.

Queries come from x directly (``q_proj``) or through their own low-rank latent (``q_a_proj``, ``q_a_layernorm``,
``q_b_proj``, when ``q_lora_rank`` is set). DeepSeek rotates interleaved pairs (2i, 2i+1) (``rope_interleave``):
here the RoPE parts are de-interleaved first, then turned in the rotate-half layout, the same angles. Kimi Linear's
MLA turns nothing (``rope=False``): the P dimensions and the shared k_pe stay, as a part of every key that no
position changes, and the layer sees no positions at all.

Shapes: B = batch, T = tokens, S = keys, H = heads, R = kv_lora_rank, N, P, V as above.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from attnlab._checks import check_positive_int
from attnlab.cache import Cache, LayerState
from attnlab.cache.latent import LatentCache
from attnlab.cache.paged import PagedLatentCache, PagedRows
from attnlab.functional.attention import attention
from attnlab.functional.mods import MaskMod, ScoreMod
from attnlab.functional.registry import Backend, check_backend
from attnlab.functional.rotary import RopeScaling, RotaryEmbedding, apply_rotary
from attnlab.functional.visibility import Visibility
from attnlab.nn.attention import Attention, ForwardArgs, SharedKV


class LatentAttention(Attention):
    """Multi-head latent attention; ``Attention``'s checks, visibility and call, its own projections and cache."""

    def __init__(
        self,
        *,
        d_in: int,
        num_heads: int,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None = None,
        rope_base: float = 10000.0,
        rope_scaling: RopeScaling | None = None,
        rope_interleave: bool = True,
        rope: bool = True,
        window: int | None = None,
        scale: float | None = None,
        backend: Backend = "auto",
    ) -> None:
        nn.Module.__init__(self)  # Attention's own fused projection is not built: MLA projects its own way
        for name, value in (("d_in", d_in), ("num_heads", num_heads), ("kv_lora_rank", kv_lora_rank)):
            check_positive_int(name, value, limit=2**20)
        for name, value in (("qk_nope_head_dim", qk_nope_head_dim), ("qk_rope_head_dim", qk_rope_head_dim)):
            check_positive_int(name, value, limit=2**16)
        check_positive_int("v_head_dim", v_head_dim, limit=2**16)
        if q_lora_rank is not None:
            check_positive_int("q_lora_rank", q_lora_rank, limit=2**20)
        check_backend(backend)
        if not isinstance(rope, bool):
            raise TypeError(f"rope must be a bool (False: Kimi Linear's MLA, which turns no dimension), got {rope!r}")
        h, n, p, v, r = num_heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, kv_lora_rank
        self.settings: dict[str, Any] = {}  # not for the ring: ContextParallelAttention copies Attention's settings
        self.d_in = self.d_out = d_in
        self.num_heads, self.num_kv_heads, self.head_dim = h, 1, r + p  # the absorbed form: one kv head of R + P
        self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = r, n, p, v
        self.dropout, self.is_causal, self.window = 0.0, True, window
        self.scale = float(scale) if scale is not None else (n + p) ** -0.5
        self.backend: Backend = backend
        self.rope_interleave = rope_interleave
        self.sinks = self.q_norm = self.k_norm = None
        if q_lora_rank is None:
            self.q_proj: nn.Linear | None = nn.Linear(d_in, h * (n + p), bias=False)
            self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        else:
            self.q_proj = None
            self.q_a_proj = nn.Linear(d_in, q_lora_rank, bias=False)
            self.q_a_layernorm = nn.RMSNorm(q_lora_rank, eps=1e-6)  # DeepSeek's latent norms: eps 1e-6 always
            self.q_b_proj = nn.Linear(q_lora_rank, h * (n + p), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d_in, r + p, bias=False)
        self.kv_a_layernorm = nn.RMSNorm(r, eps=1e-6)
        self.kv_b_proj = nn.Linear(r, h * (n + v), bias=False)
        self.out_proj = nn.Linear(h * v, d_in, bias=False)
        # None: the P dimensions are a part of the key without position (Kimi Linear's MLA)
        self.rotary = RotaryEmbedding(head_dim=p, base=rope_base, scaling=rope_scaling) if rope else None

    @property
    def dtype(self) -> torch.dtype:
        return self.kv_a_layernorm.weight.dtype  # a norm stays float when the linears are int8

    @property
    def device(self) -> torch.device:
        return self.kv_a_layernorm.weight.device

    def layer_state(self) -> LayerState:
        """What this layer keeps: one latent [c, k_pe] a token, kv_lora_rank + qk_rope_head_dim values (its first
        kv_lora_rank the values), for every head: the latent cache, plain or in 8 or 4 bits ("int8", "int4",
        with their ``group_size`` knob). ``attnlab.cache.ModelCache.build`` refuses other caches by name."""
        return LayerState(
            kind="latent",
            kv_heads=1,
            head_dim=self.kv_lora_rank + self.qk_rope_head_dim,
            value_dim=self.kv_lora_rank,
            window=self.window,
            rotary=self.rotary,
            dtype=self.dtype,
            device=self.device,
        )

    def _turn(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RoPE on the rope part (B, heads, T, P), de-interleaved first when the checkpoint pairs (2i, 2i+1); as
        it is on a layer without RoPE."""
        if self.rotary is None:
            return x
        if self.rope_interleave:
            x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)  # (.., P): pairs (2i, 2i+1) as (i, i + P/2)
        cos, sin = self.rotary(positions, dtype=x.dtype)
        return apply_rotary(x, cos, sin)

    def query_latent(self, x: torch.Tensor) -> torch.Tensor:
        """The queries' own latent q_a_layernorm(q_a_proj(x)) (B, T, q_lora_rank); DSA's indexer reads it too."""
        if self.q_a_proj is None or self.q_a_layernorm is None:
            raise ValueError("this layer projects its queries from x directly (q_lora_rank=None): it has no latent")
        latent: torch.Tensor = self.q_a_layernorm(self.q_a_proj(x))
        return latent

    def project(
        self, x: torch.Tensor, positions: torch.Tensor, *, q_latent: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q_nope (B, H, T, N), q_pe (B, H, T, P) turned, and the latents [c, k_pe] (B, 1, T, R + P); ``q_latent``:
        the queries' latent where the caller has made it already (:meth:`query_latent`)."""
        b, t, _ = x.shape
        h, n, r = self.num_heads, self.qk_nope_head_dim, self.kv_lora_rank
        if self.q_proj is not None:
            q = self.q_proj(x)
        else:
            assert self.q_b_proj is not None
            q = self.q_b_proj(self.query_latent(x) if q_latent is None else q_latent)
        q = q.view(b, t, h, -1).transpose(1, 2)  # (B, H, T, N + P)
        q_nope, q_pe = q[..., :n], self._turn(q[..., n:], positions)
        kv = self.kv_a_proj_with_mqa(x)  # (B, T, R + P)
        c, k_pe = self.kv_a_layernorm(kv[..., :r]), kv[..., r:]
        k_pe = self._turn(k_pe[:, None], positions)  # (B, 1, T, P): one head for all
        return q_nope, q_pe, torch.cat((c[:, None], k_pe), dim=-1)  # (B, 1, T, R + P)

    def _w(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK (H, N, R) and W_UV (H, V, R): kv_b_proj's rows, head by head."""
        layer: Any = self.kv_b_proj  # nn.Linear, or its int8 form (GPT.quantize), whose float weight is rebuilt
        weight = layer.dequantized() if hasattr(layer, "dequantized") else layer.weight  # (H * (N + V), R)
        w = weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w[:, : self.qk_nope_head_dim], w[:, self.qk_nope_head_dim :]

    def expanded(
        self, q_nope: torch.Tensor, q_pe: torch.Tensor, latents: torch.Tensor, *, visibility: Visibility
    ) -> torch.Tensor:
        """Per-head keys and values from the latents (B, 1, S, R + P): the form of the paper and of transformers."""
        b, _, s, _ = latents.shape
        h, n = self.num_heads, self.qk_nope_head_dim
        kv = self.kv_b_proj(latents[:, 0, :, : self.kv_lora_rank]).view(b, s, h, -1).transpose(1, 2)  # (B, H, S, N+V)
        k_pe = latents[..., self.kv_lora_rank :].expand(b, h, s, self.qk_rope_head_dim)  # (B, H, S, P)
        keys, values = torch.cat((kv[..., :n], k_pe), dim=-1), kv[..., n:]  # (B, H, S, N + P), (B, H, S, V)
        queries = torch.cat((q_nope, q_pe), dim=-1)  # (B, H, T, N + P)
        context = attention(queries, keys, values, visibility=visibility, scale=self.scale, backend=self.backend)
        return self.merge_heads(context)

    def absorbed(
        self, q_nope: torch.Tensor, q_pe: torch.Tensor, latents: torch.Tensor, *, visibility: Visibility
    ) -> torch.Tensor:
        """W_UK folded into the queries, W_UV into the output: attention over the latents themselves."""
        w_uk, w_uv = self._w()
        q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)  # (B, H, T, R)
        queries = torch.cat((q_latent, q_pe), dim=-1)  # (B, H, T, R + P)
        # The values are c, the latents' first R values. They are handed over as the whole latents [c, k_pe], and
        # the context's last P values dropped: keys and values of one width take PyTorch's fused CPU kernel, where
        # values of R would fall to its math path, which copies the keys out to every head at each step
        # (tests/test_families.py: the fused kernel runs, and the form equals the expanded one).
        context = attention(queries, latents, latents, visibility=visibility, scale=self.scale, backend=self.backend)
        context = context[..., : self.kv_lora_rank]  # (B, H, T, R + P) -> (B, H, T, R)
        return self.merge_heads(torch.einsum("bhtr,hvr->bhtv", context, w_uv))  # (B, H, T, V) -> (B, T, E)

    def merge_heads(self, context_vec: torch.Tensor, *, gate: torch.Tensor | None = None) -> torch.Tensor:
        if gate is not None:
            raise ValueError("latent attention has no output gate (DeepSeek's has none): pass no gate")
        b, _, t, _ = context_vec.shape
        return self.out_proj(context_vec.transpose(1, 2).reshape(b, t, self.num_heads * self.v_head_dim))

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cache: Cache | None = None,
        document_ids: torch.Tensor | None = None,
        mask_mod: MaskMod | None = None,
        score_mod: ScoreMod | None = None,
        visibility: Visibility | None = None,
        shared: dict[int | None, SharedKV] | None = None,
    ) -> torch.Tensor:
        """As :meth:`Attention.forward`: the expanded form without a cache, the absorbed one over a latent cache.
        No KV sharing: ``shared`` is refused."""
        if shared is not None:
            raise ValueError("latent attention keeps its own latents; KV sharing (shared=) is for softmax layers")
        given = ForwardArgs(mask, positions, cache, document_ids, mask_mod, score_mod, visibility)
        visibility, positions = self._prepare(x, given)  # everything checked: nothing is written before this
        if cache is not None and not _holds_latents(cache):
            raise TypeError(
                "a latent attention layer keeps a LatentCache or PagedLatentCache (ModelCache.build from its "
                f"layer_state()), got {type(cache).__name__}"
            )
        q_nope, q_pe, latents = self.project(x, positions)
        if cache is None:
            return self.expanded(q_nope, q_pe, latents, visibility=visibility)
        latents, _, key_pos = cache.update(latents, latents[..., : self.kv_lora_rank])
        return self.absorbed(q_nope, q_pe, latents, visibility=visibility.for_keys(key_pos))

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, num_heads={self.num_heads}, kv_lora_rank={self.kv_lora_rank}, "
            f"qk_nope_head_dim={self.qk_nope_head_dim}, qk_rope_head_dim={self.qk_rope_head_dim}, "
            f"v_head_dim={self.v_head_dim}, rope={self.rotary is not None}, window={self.window}, "
            f"backend={self.backend!r}"
        )


def _holds_latents(cache: Cache) -> bool:
    """A cache of MLA's latents: its own, or one in paged blocks (whole, or some of its rows)."""
    paged = cache.cache if isinstance(cache, PagedRows) else cache
    return isinstance(cache, LatentCache) or isinstance(paged, PagedLatentCache)
