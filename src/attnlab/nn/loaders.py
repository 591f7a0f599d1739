"""Build ``attnlab.Attention`` from the implementations people already use.

Each loader copies weights into the fused QKV layout (rows: W_query, W_key,
W_value) and sets the options that make the outputs agree; the tests check
that they do, to 1e-5 in float32.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn as nn

from attnlab.book.multihead import MultiHeadAttention
from attnlab.nn.attention import Attention


def _load(
    attn: Attention,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    out_weight: torch.Tensor,
    out_bias: torch.Tensor | None,
) -> Attention:
    expected = tuple(attn.qkv.weight.shape)
    if tuple(qkv_weight.shape) != expected:
        raise ValueError(
            f"QKV weight of shape {tuple(qkv_weight.shape)} does not fit {expected}; check the head counts"
        )
    with torch.no_grad():
        attn.qkv.weight.copy_(qkv_weight)
        if attn.qkv.bias is not None and qkv_bias is not None:
            attn.qkv.bias.copy_(qkv_bias)
        attn.out_proj.weight.copy_(out_weight)
        if attn.out_proj.bias is not None and out_bias is not None:
            attn.out_proj.bias.copy_(out_bias)
    return attn.to(qkv_weight.dtype)


def from_book(mha: MultiHeadAttention, **options: object) -> Attention:
    """From the chapter's ``MultiHeadAttention`` (causal, same heads and dropout); ``options`` override."""
    if not isinstance(mha, MultiHeadAttention):
        raise TypeError(f"expected attnlab.book.MultiHeadAttention, got {type(mha).__name__}")
    has_bias = mha.W_query.bias is not None
    settings = dict(
        d_in=mha.d_in,
        d_out=mha.d_out,
        num_heads=mha.num_heads,
        qkv_bias=has_bias,
        dropout=mha.dropout.p,
        is_causal=True,
    )
    attn = Attention(**{**settings, **options})  # type: ignore[arg-type]
    weight = torch.cat([mha.W_query.weight, mha.W_key.weight, mha.W_value.weight], dim=0)  # (3*d_out, d_in)
    bias = torch.cat([mha.W_query.bias, mha.W_key.bias, mha.W_value.bias]) if has_bias else None
    return _load(attn, weight, bias, mha.out_proj.weight, mha.out_proj.bias)


def from_torch_mha(mha: nn.MultiheadAttention, *, is_causal: bool = False, **options: object) -> Attention:
    """From ``torch.nn.MultiheadAttention`` used for self-attention.

    Its in_proj_weight already stacks W_q, W_k, W_v. Remember the layouts:
    nn.MultiheadAttention takes (T, B, E) unless batch_first=True; attnlab
    takes (B, T, E). Convert its boolean masks with
    ``attnlab.functional.from_torch_mha_masks`` (its True means masked out).
    """
    if not isinstance(mha, nn.MultiheadAttention):
        raise TypeError(f"expected torch.nn.MultiheadAttention, got {type(mha).__name__}")
    if not mha._qkv_same_embed_dim or mha.in_proj_weight is None:
        raise ValueError("only self-attention with kdim == vdim == embed_dim can be converted")
    if mha.bias_k is not None or mha.add_zero_attn:
        raise ValueError("add_bias_kv and add_zero_attn have no equivalent in attnlab.Attention")
    attn = Attention(
        d_in=mha.embed_dim,
        num_heads=mha.num_heads,
        qkv_bias=mha.in_proj_bias is not None,
        out_bias=mha.out_proj.bias is not None,
        dropout=mha.dropout,
        is_causal=is_causal,
        **options,
    )  # type: ignore[arg-type]
    return _load(attn, mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight, mha.out_proj.bias)


def from_hf_gpt2(
    state_dict: Mapping[str, torch.Tensor],
    *,
    num_heads: int,
    attn_pdrop: float = 0.0,
    prefix: str = "",
    **options: object,
) -> Attention:
    """From the state dict of a Hugging Face ``GPT2Attention`` (c_attn, c_proj).

    GPT-2's Conv1D stores its weight as (in, out) and computes x @ W + b, the
    transpose of nn.Linear's (out, in): the weights are transposed here.
    """
    c_attn_w = state_dict[f"{prefix}c_attn.weight"]  # (E, 3E), Conv1D layout
    embed_dim = c_attn_w.shape[0]
    if c_attn_w.shape[1] != 3 * embed_dim:
        raise ValueError(f"c_attn.weight should be (E, 3E), got {tuple(c_attn_w.shape)}; is this cross-attention?")
    attn = Attention(d_in=embed_dim, num_heads=num_heads, qkv_bias=True, dropout=attn_pdrop, is_causal=True, **options)  # type: ignore[arg-type]
    return _load(
        attn,
        c_attn_w.T,
        state_dict[f"{prefix}c_attn.bias"],
        state_dict[f"{prefix}c_proj.weight"].T,
        state_dict[f"{prefix}c_proj.bias"],
    )


def from_hf_llama(
    state_dict: Mapping[str, torch.Tensor],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int | None = None,
    rope_theta: float = 10000.0,
    prefix: str = "",
    **options: object,
) -> Attention:
    """From the state dict of a Hugging Face ``LlamaAttention`` (q/k/v/o_proj), with GQA and RoPE.

    Only the default RoPE (no rope_scaling) is reproduced.
    """
    q_w = state_dict[f"{prefix}q_proj.weight"]  # (H*D, hidden)
    hidden = q_w.shape[1]
    head_dim = head_dim if head_dim is not None else hidden // num_heads
    has_bias = f"{prefix}q_proj.bias" in state_dict
    attn = Attention(
        d_in=hidden,
        d_out=hidden,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        qkv_bias=has_bias,
        out_bias=f"{prefix}o_proj.bias" in state_dict,
        is_causal=True,
        rope=True,
        rope_base=rope_theta,
        **options,
    )  # type: ignore[arg-type]
    weight = torch.cat([state_dict[f"{prefix}{n}_proj.weight"] for n in "qkv"], dim=0)  # ((H+2Hkv)*D, hidden)
    bias = torch.cat([state_dict[f"{prefix}{n}_proj.bias"] for n in "qkv"]) if has_bias else None
    return _load(attn, weight, bias, state_dict[f"{prefix}o_proj.weight"], state_dict.get(f"{prefix}o_proj.bias"))
