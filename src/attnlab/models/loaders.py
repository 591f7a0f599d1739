"""Build ``attnlab.Attention`` from the implementations people already use.

Each loader reads the weights by its family's names (``families/``: the same names a whole checkpoint of that
family is read by), copies them into the fused QKV layout (rows: W_query, W_key, W_value) and sets the options
that make the outputs agree; the tests check that they do, to 1e-5 in float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from attnlab._checks import check_heads
from attnlab.book.multihead import MultiHeadAttention
from attnlab.models.families import book, gpt2, llama
from attnlab.models.families.rows import Rows
from attnlab.nn.attention import Attention

Source = torch.Tensor | Rows | None


def _load(attn: Attention, tensors: list[tuple[str, Source, torch.Tensor | None, bool]]) -> Attention:
    """Copy (source name, source tensor, module tensor, transposed) into the module, all shapes checked first.

    One error lists every tensor that does not fit, by its source name, with
    the shape expected (in the source's own layout) and the shape found.
    """
    wrong = []
    for name, src, dst, transposed in tensors:
        if src is None or dst is None:
            continue
        expected = tuple(dst.shape)[::-1] if transposed else tuple(dst.shape)
        if tuple(src.shape) != expected:
            wrong.append(f"{name}: expected {expected}, found {tuple(src.shape)}")
    if wrong:
        raise ValueError(
            f"the weights do not fit {attn.extra_repr()}: " + "; ".join(wrong) + ". Check the head counts and sizes"
        )
    with torch.no_grad():
        for _, src, dst, transposed in tensors:
            if isinstance(src, Rows) and dst is not None:
                src.copy_into(dst)
            elif isinstance(src, torch.Tensor) and dst is not None:
                dst.copy_(src.T if transposed else src)
    first = tensors[0][1]
    return attn.to(first.dtype) if first is not None else attn


def _require(state_dict: Mapping[str, torch.Tensor], keys: list[str]) -> None:
    missing = [key for key in keys if key not in state_dict]
    if missing:
        raise ValueError(f"the state dict lacks {missing}; it holds {sorted(state_dict)[:12]} (check the prefix)")


def from_book_mha(mha: MultiHeadAttention, **options: Any) -> Attention:
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
    attn = Attention(**{**settings, **options})
    theirs, origin = book.from_book_names(mha.state_dict())  # q, k and v as the rows of qkv: (3*d_out, d_in)
    ours = dict(attn.named_parameters())
    return _load(attn, [(origin[name], theirs.get(name), ours.get(name), False) for name in origin])


def from_torch_mha(mha: nn.MultiheadAttention, *, is_causal: bool = False, **options: Any) -> Attention:
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
    )
    return _load(
        attn,
        [
            ("in_proj_weight", mha.in_proj_weight, attn.qkv.weight, False),
            ("in_proj_bias", mha.in_proj_bias, attn.qkv.bias, False),
            ("out_proj.weight", mha.out_proj.weight, attn.out_proj.weight, False),
            ("out_proj.bias", mha.out_proj.bias, attn.out_proj.bias, False),
        ],
    )


def from_hf_gpt2(
    state_dict: Mapping[str, torch.Tensor],
    *,
    num_heads: int,
    attn_pdrop: float = 0.0,
    scale_attn_weights: bool = True,
    scale_attn_by_inverse_layer_idx: bool = False,
    layer_idx: int = 0,
    prefix: str = "",
    **options: Any,
) -> Attention:
    """From the state dict of a Hugging Face ``GPT2Attention`` (c_attn, c_proj).

    GPT-2's Conv1D stores its weight as (in, out) and computes x @ W + b, the
    transpose of nn.Linear's (out, in): the weights are transposed here. The
    config's scaling flags are honoured through an explicit scale: the scores
    are divided by sqrt(head_dim) only if ``scale_attn_weights``, and also by
    ``layer_idx + 1`` if ``scale_attn_by_inverse_layer_idx`` (as in
    ``GPT2Attention``; pass the block's index).
    """
    _require(state_dict, [f"{prefix}{n}" for n in ("c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias")])
    c_attn_w = state_dict[f"{prefix}c_attn.weight"]  # (E, 3E), Conv1D layout
    embed_dim = c_attn_w.shape[0]
    if c_attn_w.dim() != 2 or c_attn_w.shape[1] != 3 * embed_dim:
        raise ValueError(f"c_attn.weight should be (E, 3E), got {tuple(c_attn_w.shape)}; is this cross-attention?")
    check_heads(embed_dim, num_heads)
    if isinstance(layer_idx, bool) or not isinstance(layer_idx, int) or layer_idx < 0:
        raise ValueError(f"layer_idx must be an int >= 0 (the block's index), got {layer_idx!r}")
    scale = (embed_dim // num_heads) ** -0.5 if scale_attn_weights else 1.0
    if scale_attn_by_inverse_layer_idx:
        scale /= layer_idx + 1
    attn = Attention(
        d_in=embed_dim,
        num_heads=num_heads,
        qkv_bias=True,
        dropout=attn_pdrop,
        is_causal=True,
        scale=scale,
        **options,
    )
    ours = dict(attn.named_parameters())
    names = gpt2.attention_names(prefix, "")
    return _load(attn, [(theirs, state_dict[theirs], ours[name], t) for theirs, name, t in names])


def from_hf_llama(
    state_dict: Mapping[str, torch.Tensor],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int | None = None,
    rope_theta: float = 10000.0,
    prefix: str = "",
    **options: Any,
) -> Attention:
    """From the state dict of a Hugging Face ``LlamaAttention`` (q/k/v/o_proj), with GQA and RoPE.

    Only the default RoPE (no rope_scaling) is reproduced.
    """
    _require(state_dict, [f"{prefix}{n}_proj.weight" for n in "qkvo"])
    q_w = state_dict[f"{prefix}q_proj.weight"]  # (H*D, hidden)
    hidden = q_w.shape[1]
    if head_dim is None:
        check_heads(hidden, num_heads)
        head_dim = hidden // num_heads
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
    )
    ours = dict(attn.named_parameters())
    sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]  # rows of q, k, v in qkv
    tensors: list[tuple[str, Source, torch.Tensor | None, bool]] = []
    for theirs, name in llama.attention_names(
        prefix, "", qkv_bias=has_bias, out_bias=f"{prefix}o_proj.bias" in state_dict
    ):
        pieces = ours[name].split(sizes) if len(theirs) == 3 else (ours[name],)  # views of the fused weight
        tensors += [(key, state_dict.get(key), piece, False) for key, piece in zip(theirs, pieces, strict=True)]
    return _load(attn, tensors)
