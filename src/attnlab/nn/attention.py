"""``attnlab.Attention``: the chapter's MultiHeadAttention, grown up.

One fused QKV projection, grouped-query heads, optional RoPE, a sliding
window, and a choice of backend (see ``attnlab.functional.attention``). The
book's names stay where they fit: d_in, d_out, num_heads, head_dim,
out_proj. Build it from the book's class, nn.MultiheadAttention, or Hugging
Face GPT-2 and Llama weights with the loaders in ``attnlab.nn.loaders``.

Shapes: B = batch, T = tokens, H = query heads, Hkv = kv heads, D = head_dim.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from attnlab.book._checks import check_dropout, check_positive_int
from attnlab.cache.kv import KVCache, SlidingWindowCache
from attnlab.functional.attention import BACKENDS, Backend, attention
from attnlab.functional.masks import _check_window
from attnlab.nn.rotary import RotaryEmbedding, apply_rotary


class Attention(nn.Module):
    """Multi-head self-attention with GQA, RoPE and pluggable backends.

    Args:
        d_in: input embedding size.
        num_heads: H, query heads.
        d_out: output size (defaults to d_in).
        num_kv_heads: Hkv, key/value heads; H must be a multiple. H = MHA,
            1 = MQA, in between = GQA. Defaults to H.
        head_dim: D; defaults to d_out // num_heads.
        qkv_bias: bias on the fused QKV projection.
        out_bias: bias on out_proj.
        dropout: on the attention weights, in training only, in [0, 1).
        is_causal: hide the future (bottom-right aligned with a cache).
        window: sliding-window size, or None.
        rope: apply rotary position embedding to q and k.
        rope_base: RoPE's theta.
        backend: "auto", "eager", "sdpa" or "flash".
        return_weights: forward returns (output, weights); needs eager or auto.

    Input (B, T, d_in); output (B, T, d_out).
    """

    def __init__(
        self,
        *,
        d_in: int,
        num_heads: int,
        d_out: int | None = None,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        qkv_bias: bool = False,
        out_bias: bool = True,
        dropout: float = 0.0,
        is_causal: bool = True,
        window: int | None = None,
        rope: bool = False,
        rope_base: float = 10000.0,
        backend: Backend = "auto",
        return_weights: bool = False,
    ) -> None:
        super().__init__()
        d_out = d_in if d_out is None else d_out
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        for name, value in (("d_in", d_in), ("d_out", d_out), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
            check_positive_int(name, value)
        if head_dim is None:
            if d_out % num_heads:
                raise ValueError(
                    f"d_out ({d_out}) must be divisible by num_heads ({num_heads}), or pass head_dim explicitly"
                )
            head_dim = d_out // num_heads
        check_positive_int("head_dim", head_dim)
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads}); "
                f"choose num_kv_heads among {[h for h in range(1, num_heads + 1) if num_heads % h == 0]}"
            )
        check_dropout(dropout)
        if window is not None:
            _check_window(window)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
        if return_weights and backend in ("sdpa", "flash"):
            raise ValueError(f"return_weights=True needs backend 'eager' or 'auto', got {backend!r}")

        self.d_in, self.d_out = d_in, d_out
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.dropout = float(dropout)
        self.is_causal, self.window = is_causal, window
        self.backend: Backend = backend
        self.return_weights = return_weights

        # One fused projection: rows [0, H*D) are W_query, then W_key, then W_value.
        self.qkv = nn.Linear(d_in, (num_heads + 2 * num_kv_heads) * head_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(num_heads * head_dim, d_out, bias=out_bias)
        self.rotary = RotaryEmbedding(head_dim=head_dim, base=rope_base) if rope else None

    def split_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project x (B, T, d_in) into q (B, H, T, D), k and v (B, Hkv, T, D)."""
        b, t, _ = x.shape
        h, h_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        queries, keys, values = self.qkv(x).split([h * d, h_kv * d, h_kv * d], dim=-1)
        queries = queries.view(b, t, h, d).transpose(1, 2)  # (B, H, T, D)
        keys = keys.view(b, t, h_kv, d).transpose(1, 2)  # (B, Hkv, T, D)
        values = values.view(b, t, h_kv, d).transpose(1, 2)  # (B, Hkv, T, D)
        return queries, keys, values

    def make_cache(self, *, batch_size: int, max_len: int) -> KVCache | SlidingWindowCache:
        """A cache that fits this module: its kv heads, head_dim, dtype and device.

        With a sliding window, a ring buffer of ``window`` positions (``max_len``
        is then only a bound on nothing: the ring never fills); else a static
        cache of ``max_len`` positions.
        """
        kw = dict(
            batch_size=batch_size,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            dtype=self.qkv.weight.dtype,
            device=self.qkv.weight.device,
        )
        if self.window is not None:
            return SlidingWindowCache(window=self.window, **kw)  # type: ignore[arg-type]
        return KVCache(max_len=max_len, **kw)  # type: ignore[arg-type]

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cache: KVCache | SlidingWindowCache | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend over x (B, T, d_in), optionally after the tokens held in ``cache``.

        Args:
            mask: bool (True = may attend) or additive float, broadcastable to
                (B, H, T, Tk), where Tk counts cached and new tokens; e.g. a key
                padding mask (B, 1, 1, Tk). With a SlidingWindowCache, give it
                over all Tk positions seen; the held ones are picked out.
            positions: token positions for RoPE, (T,) or (B, T); default the
                next T positions (0..T-1 without a cache).
            cache: a KVCache or SlidingWindowCache from :meth:`make_cache`; it
                is updated in place. The causal mask is aligned bottom-right,
                so the new tokens see every cached one.

        Returns:
            (B, T, d_out), or (output, weights (B, H, T, Tk)) with return_weights.
        """
        self._check_input(x)
        t = x.shape[1]
        if cache is not None:
            self._check_cache(cache)
        if positions is not None and (positions.dim() not in (1, 2) or positions.shape[-1] != t):
            raise ValueError(f"positions must be (T,) or (B, T) with T={t}, got shape {tuple(positions.shape)}")
        queries, keys, values = self.split_qkv(x)
        if self.rotary is not None:
            if positions is None:
                positions = cache.next_positions(t) if cache is not None else torch.arange(t, device=x.device)
            cos, sin = self.rotary(positions, dtype=queries.dtype)
            queries, keys = apply_rotary(queries, cos, sin), apply_rotary(keys, cos, sin)
        if cache is not None:
            seen = cache.length + t
            keys, values, key_positions = cache.update(keys, values)
            if mask is not None and isinstance(cache, SlidingWindowCache) and mask.shape[-1] == seen != keys.shape[2]:
                mask = mask[..., key_positions]  # the columns of the positions the ring still holds
        return self.attend(queries, keys, values, mask=mask)

    def _check_cache(self, cache: object) -> None:
        if not isinstance(cache, (KVCache, SlidingWindowCache)):
            raise TypeError(f"cache must be a KVCache or SlidingWindowCache, got {type(cache).__name__}")
        if isinstance(cache, SlidingWindowCache) and cache.window != self.window:
            raise ValueError(
                f"a SlidingWindowCache(window={cache.window}) drops keys that Attention(window={self.window}) "
                "still needs; use make_cache() to get the matching cache"
            )

    def attend(
        self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, *, mask: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention and out_proj on projected (and rotated) q (B, H, Tq, D), k, v (B, Hkv, Tk, D)."""
        b, _, t, _ = queries.shape
        result = attention(
            queries,
            keys,
            values,
            mask=mask,
            is_causal=self.is_causal,
            window=self.window,
            dropout_p=self.dropout if self.training else 0.0,
            backend=self.backend,
            return_weights=self.return_weights,  # type: ignore[call-overload]
        )
        context_vec, weights = result if self.return_weights else (result, None)
        context_vec = context_vec.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)  # (B, T, H*D)
        out = self.out_proj(context_vec)
        return (out, weights) if weights is not None else out

    def _check_input(self, x: object) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor (batch, tokens, d_in), got {type(x).__name__}")
        if x.dim() != 3:
            hint = "; for one sequence use x.unsqueeze(0)" if x.dim() == 2 else ""
            raise ValueError(f"expected input (batch, tokens, d_in) with 3 dims, got shape {tuple(x.shape)}{hint}")
        if x.shape[-1] != self.d_in:
            raise ValueError(
                f"the last dimension of the input must be d_in={self.d_in}, got {x.shape[-1]} (shape {tuple(x.shape)})"
            )
        if x.dtype != self.qkv.weight.dtype:
            raise TypeError(
                f"input dtype {x.dtype} differs from the module's {self.qkv.weight.dtype}; "
                f"use x.to({self.qkv.weight.dtype}) or module.to({x.dtype})"
            )

    def extra_repr(self) -> str:
        return (
            f"d_in={self.d_in}, d_out={self.d_out}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, is_causal={self.is_causal}, window={self.window}, "
            f"rope={self.rotary is not None}, backend={self.backend!r}"
        )
