"""The attention zoo: every kind of attention after chapter 3, each one setting of the same small decoder.

The chapter ends with multi-head attention (MHA): every head has its own queries, keys and values, and the KV
cache keeps every head's keys and values for every token. What came after changes attention itself, mostly to
keep less, or to see further:

======================  ===========================================================================
``mha``                 the chapter's: 4 heads, each with its keys and values
``gqa``, ``mqa``        grouped-query: 2 key/value heads shared by the 4 query heads (Llama 3); 1 (PaLM)
``mla``                 multi-head latent attention (DeepSeek-V2/V3): the cache keeps one latent per token
``sliding``             every layer sees only its last ``WINDOW`` tokens (Mistral)
``local-global``        3 sliding layers to 1 full (Gemma 3's 5:1, in 4 layers)
``banded``              sliding and full layers in turn (gpt-oss)
``sinks``               a learned sink logit per head (gpt-oss): a row may give its attention to nothing
``qk-norm``             RMSNorm on each head's queries and keys (Qwen3, Gemma 3, OLMo 2)
``gated``               an output gate, sigmoid(gate(x)), on each head's context vector (Qwen3-Next)
``linear``              linear attention (Katharopoulos et al.): a state of fixed size, no softmax
``deltanet``            Gated DeltaNet (Yang et al.): a state written by the delta rule, with a decay
``hybrid``              3 Gated DeltaNet layers to 1 gated full layer (Qwen3-Next)
``hybrid-conv``         the hybrid with Qwen3.5's short convolution of 4 taps before each delta rule
``kda``                 Kimi Delta Attention (Kimi Linear): the delta rule with a decay per key channel
``kv-share``            KV sharing (Gemma 4): the last 2 layers read layer 1's keys and values, caching none
``moba``                MoBA (Kimi): each query reads its own block of 16 keys and the 2 whose mean key suits it
``nsa``                 NSA (DeepSeek): compressed, selected and sliding branches mixed by gates
``dsa``                 DeepSeek Sparse Attention (V3.2, GLM-5): mla whose queries read the ``DSA_TOPK`` keys a
                        lightning indexer scores highest
``compressed``          DeepSeek-V4's compressed layers: a window of ``V4_WINDOW``, then compressed-sparse (blocks
                        of 4 pooled, the indexer's top ``V4_TOPK``) and heavily compressed (blocks of 16) in turn
======================  ===========================================================================

Every variant is the same decoder (``attnlab.models.GPT``: 4 layers of 64 dimensions, 4 heads, RoPE, bytes
in, ``BASE``) with a few ``GPTConfig`` fields changed, and the same number of parameters within 5%: a variant
that adds or saves weights in attention gets an MLP that much narrower or wider (:func:`zoo_config`).

Shapes: E = emb_dim, F = the MLP's width.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.models.block_spec import SparseBlocks
from attnlab.models.config import GPTConfig
from attnlab.models.gpt import count_parameters
from attnlab.models.locate import zoo_models
from attnlab.models.v4_spec import DeepseekV4Spec

WINDOW = 32  # the sliding layers' window: a quarter of the training sequence
SEQ_LEN = 128  # tokens per training sequence
BUDGET = 0.05  # every variant's parameters within 5% of mha's
DSA_TOPK = 32  # dsa's keys a query: a quarter of the training sequence, so selection acts in training
V4_WINDOW, V4_TOPK = 16, 8  # compressed: every layer's window; the compressed-sparse layers' entries a query

BASE = GPTConfig(
    vocab_size=256,
    context_length=4096,  # RoPE has no table to outgrow: decoding is measured at a long context
    emb_dim=64,
    n_heads=4,
    n_layers=4,
    drop_rate=0.0,
    rope=True,
)


@dataclass(frozen=True)
class Variant:
    """One kind of attention: what it is (en, zh), whose it is, and the GPTConfig fields it changes."""

    name: str
    what: str
    what_zh: str
    models: str
    changes: dict[str, Any]


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("mha", "multi-head attention, the chapter's", "多头注意力（本章）", "GPT-2", {}),
        Variant(
            "gqa",
            "grouped-query: 2 key/value heads for 4 query heads",
            "分组查询：4 个查询头共享 2 个键值头",
            "Llama 3, Qwen3",
            {"n_kv_heads": 2},
        ),
        Variant(
            "mqa",
            "multi-query: 1 key/value head for all",
            "多查询：所有查询头共享 1 个键值头",
            "PaLM, Falcon",
            {"n_kv_heads": 1},
        ),
        Variant(
            "mla",
            "multi-head latent attention: one latent a token",
            "多头潜在注意力：每个词元缓存一个潜在向量",
            "DeepSeek-V2/V3",
            {"kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16},
        ),
        Variant(
            "sliding",
            f"sliding window of {WINDOW} on every layer",
            f"每层滑动窗口 {WINDOW}",
            "Mistral 7B",
            {"window": WINDOW},
        ),
        Variant(
            "local-global",
            "3 sliding layers to 1 full",
            "3 个滑动窗口层配 1 个全局层",
            "Gemma 3 (5:1)",
            {"window": WINDOW, "layer_types": ("sliding", "sliding", "sliding", "full")},
        ),
        Variant(
            "banded",
            "sliding and full layers in turn",
            "滑动窗口层与全局层交替",
            "gpt-oss",
            {"window": WINDOW, "layer_types": ("sliding", "full", "sliding", "full")},
        ),
        Variant("sinks", "a learned sink logit per head", "每个头一个可学习的汇点 logit", "gpt-oss", {"sinks": True}),
        Variant(
            "qk-norm",
            "RMSNorm on queries and keys",
            "对查询和键做 RMSNorm",
            "Qwen3, Gemma 3, OLMo 2",
            {"qk_norm": True},
        ),
        Variant("gated", "an output gate on each head", "每个头的输出门控", "Qwen3-Next", {"attn_output_gate": True}),
        Variant(
            "linear",
            "linear attention: a state, no softmax",
            "线性注意力：固定大小的状态，没有 softmax",
            "Katharopoulos et al. 2020",
            {"layer_types": ("linear",) * 4},
        ),
        Variant(
            "deltanet",
            "Gated DeltaNet: the delta rule, with a decay",
            "门控 DeltaNet：delta 规则加衰减",
            "Qwen3-Next, Kimi Linear",
            {"layer_types": ("delta",) * 4},
        ),
        Variant(
            "hybrid",
            "3 Gated DeltaNet layers to 1 gated full layer",
            "3 个门控 DeltaNet 层配 1 个带门控的全局层",
            "Qwen3-Next",
            {"layer_types": ("delta", "delta", "delta", "full"), "attn_output_gate": True},
        ),
        Variant(
            "hybrid-conv",
            "the hybrid with a short convolution of 4 taps before each delta rule",
            "混合模型，每个 delta 规则之前加 4 个抽头的短卷积",
            "Qwen3.5",
            {"layer_types": ("delta", "delta", "delta", "full"), "attn_output_gate": True, "conv_kernel": 4},
        ),
        Variant(
            "kda",
            "Kimi Delta Attention: a decay per key channel",
            "Kimi Delta Attention：每个键通道各自衰减",
            "Kimi Linear",
            {"layer_types": ("kda",) * 4, "conv_kernel": 4},
        ),
        Variant(
            "kv-share",
            "the last 2 layers read layer 1's keys and values",
            "最后 2 层读取第 1 层的键和值",
            "Gemma 4",
            {"kv_shared_layers": 2},
        ),
        Variant(
            "moba",
            "MoBA: each query reads its own block of 16 and the 2 best by mean key",
            "MoBA：每个查询读取自己的 16 词元块，以及按平均键最合适的另外 2 块",
            "Kimi (Moonshot AI)",
            {"layer_types": ("moba",) * 4, "sparse_blocks": SparseBlocks(block=16, top_k=3)},
        ),
        Variant(
            "nsa",
            "NSA: compressed, selected and sliding branches, mixed by gates",
            "NSA：压缩、选择与滑动窗口三个分支，由门控混合",
            "DeepSeek (Yuan et al. 2025)",
            {"layer_types": ("nsa",) * 4, "n_kv_heads": 2, "sparse_blocks": SparseBlocks(slide=WINDOW)},
        ),
        Variant(
            "dsa",
            f"mla whose queries read the {DSA_TOPK} keys a lightning indexer scores highest",
            f"MLA，每个查询只读闪电索引器打分最高的 {DSA_TOPK} 个键",
            "DeepSeek-V3.2, GLM-5",
            {"kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "q_lora_rank": 32}
            | {"index_topk": DSA_TOPK, "index_heads": 4, "index_head_dim": 16},
        ),
        Variant(
            "compressed",
            f"a window of {V4_WINDOW}, then blocks of 4 (the indexer's top {V4_TOPK}) and of 16 (all) in turn",
            f"窗口 {V4_WINDOW}，外加交替的压缩稀疏层（每 4 个词元一个条目，取索引器前 {V4_TOPK} 个）与重度压缩层（每 16 个一个，全读）",
            "DeepSeek-V4",
            {
                "window": V4_WINDOW,
                "deepseek_v4": DeepseekV4Spec(
                    layer_kinds=("compressed_sparse", "heavily_compressed") * 2,
                    sparse_block=4,
                    heavy_block=16,
                    index_topk=V4_TOPK,
                    index_heads=4,
                    index_head_dim=16,
                    q_lora_rank=32,
                    rope_dim=8,
                    o_groups=2,
                    o_lora_rank=32,
                    hc_mult=1,  # one residual stream: the zoo compares attention, not hyper-connections
                    hc_sinkhorn_iters=3,
                ),
                # V4's feed-forward is its mixture: one routed expert and the shared one, sized to mha's parameters
                "num_experts": 1,
                "num_experts_per_tok": 1,
                "moe_intermediate_size": 80,
            },
        ),
    )
}


def zoo_config(name: str, *, base: GPTConfig = BASE) -> GPTConfig:
    """Variant ``name`` of ``base``, its MLP width set so that it has mha's parameters within ``BUDGET``.

    The parameter count is linear in the MLP width F (two E x F matrices and F biases a layer), so two counts
    give the F that matches: the nearest multiple of 8.
    """
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; the zoo holds {list(VARIANTS)}")
    target = count_parameters(base)
    config = base.with_(**VARIANTS[name].changes)
    width = base.ff_dim
    at_width, wider = (
        count_parameters(config.with_(hidden_dim=width)),
        count_parameters(config.with_(hidden_dim=width + 8)),
    )
    per_unit = (wider - at_width) / 8  # 0 where the MLP is not the width's (compressed: V4's experts, sized in it)
    matched = max(8, round((width + (target - at_width) / per_unit) / 8) * 8) if per_unit else 4 * base.emb_dim
    config = config.with_(hidden_dim=None if matched == 4 * base.emb_dim else matched)
    got = count_parameters(config)
    if abs(got - target) > BUDGET * target:  # a variant whose attention outweighs the whole MLP
        raise ValueError(f"variant {name!r} has {got:,} parameters against mha's {target:,}, beyond {BUDGET:.0%}")
    return config


def zoo_model(name: str) -> Path:
    """``zoo:NAME``'s folder, checked: a variant of the zoo that a zoo run saved, or an error that says which
    command saves it there (``attnlab zoo NAME``, with ``--out`` where ATTNLAB_ZOO points)."""
    if name not in VARIANTS:
        raise ValueError(
            f"--model zoo:{name}: the zoo has no variant {name!r}; it holds {', '.join(VARIANTS)} (a folder named "
            f"'zoo:{name}' is read as ./zoo:{name})"
        )
    run = os.environ.get("ATTNLAB_ZOO")
    if run and Path(run).exists() and not Path(run).is_dir():
        raise ValueError(f"ATTNLAB_ZOO={run!r} is a file; set it to the --out folder of a zoo run")
    where = zoo_models() / name
    if not (where / "config.json").is_file():
        out = f" --out {run}" if run else ""
        raise ValueError(
            f"--model zoo:{name}: no trained model in {str(where.resolve())!r}; train it with attnlab zoo {name} "
            f"--minutes 2{out} (every zoo run saves its models in --out/models), or set ATTNLAB_ZOO to the --out "
            "folder of the run that trained it"
        )
    return where
