"""The same hooks on the book's own models (the pip package ``llms-from-scratch``), by module replacement.

``attnlab.hf.use(book_model, ...)`` gives each attention module of the book's ``GPTModel`` (chapter 4, whose
``trf_blocks[i].att`` is chapter 3's ``MultiHeadAttention``), ``Llama3Model`` and ``Qwen3Model`` (their
``GroupedQueryAttention``) a forward of its own: the module's own projections, QK-norm and RoPE (the book's
``apply_rope`` from the module's own file), then one attnlab call (``attnlab.hf.bridge.attend``) in place of its
``queries @ keys.T``, mask and softmax, with the book's mask as the call's mask. The weights and the state dict
are the book's, untouched; ``undo()`` gives each module back its class's forward.

Shapes: b = batch, T = num_tokens, H = num_heads, G = num_kv_groups, D = head_dim.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from attnlab.hf.bridge import Settings, attend, for_layer, put, settings_of

# (module, class) of the book's attention this replaces, and which forward it gets
KINDS = {
    ("llms_from_scratch.ch03", "MultiHeadAttention"): "mha",
    ("llms_from_scratch.llama3", "GroupedQueryAttention"): "gqa",
    ("llms_from_scratch.qwen3", "GroupedQueryAttention"): "gqa",
}


def book_attention(model: torch.nn.Module) -> list[torch.nn.Module] | None:
    """The book model's attention modules in layer order, or None when ``model`` is not one of the book's models
    this can hook (a KV-cache variant, whose forward takes a cache, is not)."""
    blocks = getattr(model, "trf_blocks", None)
    if not isinstance(blocks, torch.nn.Module):
        return None
    found = [getattr(block, "att", None) for block in blocks.children()]
    if not found or any(m is None or (type(m).__module__, type(m).__name__) not in KINDS for m in found):
        return None
    return [m for m in found if m is not None]


def _mha_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """Chapter 3's MultiHeadAttention.forward, its attention one attnlab call."""
    b, num_tokens, _ = x.shape
    queries = self.W_query(x).view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)  # (b, H, T, D)
    keys = self.W_key(x).view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)  # (b, H, T, D)
    values = self.W_value(x).view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)  # (b, H, T, D)
    allowed = ~self.mask.bool()[:num_tokens, :num_tokens]  # the book's mask hides with True: (T, T)
    context_vec = _attend(self, queries, keys, values, allowed, self.dropout.p if self.training else 0.0)
    context_vec = context_vec.transpose(1, 2).reshape(b, num_tokens, self.d_out)  # (b, T, d_out)
    return self.out_proj(context_vec)


def _gqa_forward(self: Any, x: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The book's Llama 3 / Qwen3 GroupedQueryAttention.forward, its attention one attnlab call (the kv groups
    are read as they are, not repeated)."""
    b, num_tokens, _ = x.shape
    queries = self.W_query(x).view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)  # (b, H, T, D)
    keys = self.W_key(x).view(b, num_tokens, self.num_kv_groups, self.head_dim).transpose(1, 2)  # (b, G, T, D)
    values = self.W_value(x).view(b, num_tokens, self.num_kv_groups, self.head_dim).transpose(1, 2)  # (b, G, T, D)
    if getattr(self, "q_norm", None) is not None:  # Qwen3's QK-norm
        queries, keys = self.q_norm(queries), self.k_norm(keys)
    apply_rope = sys.modules[type(self).__module__].apply_rope  # the book's own RoPE for this model
    queries, keys = apply_rope(queries, cos, sin), apply_rope(keys, cos, sin)
    allowed = ~mask[:num_tokens, :num_tokens]  # (T, T)
    context_vec = _attend(self, queries, keys, values, allowed, 0.0)
    context_vec = context_vec.transpose(1, 2).reshape(b, num_tokens, self.d_out)  # (b, T, d_out)
    return self.out_proj(context_vec)


def _attend(
    self: Any, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor, dropout: float
) -> torch.Tensor:
    settings = settings_of(self)
    layer: int = self._attnlab_layer
    return attend(
        queries,
        keys,
        values,
        settings=settings,
        layer=layer,
        mask=allowed,
        causal=False,  # the book's mask says it all
        scale=self.head_dim**-0.5,
        dropout=dropout,
        mask_mod=for_layer(settings.mask_mod, layer),
        score_mod=for_layer(settings.score_mod, layer),
    )


FORWARDS: dict[str, Callable[..., torch.Tensor]] = {"mha": _mha_forward, "gqa": _gqa_forward}


def hook(modules: list[torch.nn.Module], settings: Settings) -> list[tuple[torch.nn.Module, Settings | None]]:
    """Give each module attnlab's forward and ``settings``; returns what ``unhook`` needs to put them back."""
    for layer, module in enumerate(modules):
        kind = KINDS[(type(module).__module__, type(module).__name__)]
        setattr(module, "_attnlab_layer", layer)  # noqa: B010 - plain attributes of a module of the book's
        setattr(module, "forward", types.MethodType(FORWARDS[kind], module))  # noqa: B010 - the instance's own
    return put(modules, settings)


def unhook(before: list[tuple[torch.nn.Module, Settings | None]]) -> None:
    """Put back what ``hook`` changed: the class's forward where the module had it, or the earlier settings."""
    for module, settings in before:
        put([module], settings)
        if settings is None:
            for name in ("forward", "_attnlab_layer"):
                module.__dict__.pop(name, None)
