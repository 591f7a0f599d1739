"""Qwen3.5-MoE (text) checkpoints: ``Qwen3_5MoeForCausalLM``, model_type "qwen3_5_moe_text", and the text model of
the multimodal ``Qwen3_5MoeForConditionalGeneration`` folders the hub publishes (model_type "qwen3_5_moe").

Qwen3.5's layers (``qwen3_5.py``: Gated DeltaNet with its convolution, gated softmax layers, zero-centred norms,
partial RoPE), read and written by that file's functions, with a mixture of experts in place of every layer's MLP:

- a router (``mlp.gate``, ``ff.gate``): the softmax of its scores over ``num_experts`` experts, the best
  ``num_experts_per_tok`` kept and renormalized to sum to 1 (always: the config has no ``norm_topk_prob``);
- the experts, each a SwiGLU of ``moe_intermediate_size``, stored one by one (``mlp.experts.e.{gate,up,down}_proj``,
  the names transformers writes: it fuses them into ``gate_up_proj`` and ``down_proj`` on load and splits them
  back on save, conversion_mapping.py's "qwen2_moe" entry);
- one shared expert on every token (``mlp.shared_expert``, a SwiGLU of ``shared_expert_intermediate_size``), its
  output scaled per token by sigmoid(``mlp.shared_expert_gate``(x)), one number a token.

Every layer is sparse: transformers' class reads no ``mlp_only_layers``, ``decoder_sparse_step`` or
``norm_topk_prob``, so a config that sets them otherwise describes a model that class does not build, and is
refused by name; ``router_aux_loss_coef`` and ``output_router_logits`` serve training and are not read. A hub
folder's vision tower (``model.visual.*``) is not loaded; a model read from one is not saved back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from attnlab.models.config import GPTConfig
from attnlab.models.families import llama, qwen3_5

MODEL_TYPES = ("qwen3_5_moe_text", "qwen3_5_moe")
# settings of other Qwen MoE configs that Qwen3_5MoeForCausalLM does not read: the values that describe the model
# it builds anyway, and what that model does
UNREAD: dict[str, tuple[tuple[object, ...], str]] = {
    "mlp_only_layers": ((None, []), "experts on every layer"),
    "decoder_sparse_step": ((None, 1), "experts on every layer"),
    "norm_topk_prob": ((None, True), "the chosen experts' weights renormalized to sum to 1"),
    "attn_output_gate": ((None, True), "an output gate on every softmax layer"),
}
from_hf = qwen3_5.from_hf  # the same names as Qwen3.5's, the experts named by qwen3_5._mlp_names


def config_from_hf(raw: dict[str, Any], where: Path) -> GPTConfig:
    """The decoder's config for a qwen3_5_moe_text config.json or a qwen3_5_moe wrapper's text_config, refused from
    the config alone where it sets what the class does not read."""
    text = qwen3_5.text_of(raw, where)
    for key, (values, built) in UNREAD.items():
        if text.get(key) not in values:
            raise ValueError(
                f"{str(where / 'config.json')!r}: {key}={text[key]!r} is not read by Qwen3_5MoeForCausalLM, which "
                f"builds {built} whatever it says; attnlab reads the model that class builds, not this one: drop "
                f"{key} from config.json if the weights are of that model"
            )
    experts = llama.need(text, "moe_intermediate_size", where)
    return GPTConfig(
        **qwen3_5.fields(raw, where, {**text, "intermediate_size": experts}),  # no dense MLP: every layer's experts
        num_experts=llama.need(text, "num_experts", where),
        num_experts_per_tok=llama.need(text, "num_experts_per_tok", where),
        moe_intermediate_size=experts,
        norm_topk_prob=True,
        n_shared_experts=1,
        shared_expert_dim=llama.need(text, "shared_expert_intermediate_size", where),
        shared_expert_gate=True,
        family=raw["model_type"],
    )


def holds(config: GPTConfig) -> bool:
    """Whether ``Qwen3_5MoeForCausalLM`` holds this config exactly."""
    return (
        config.family in MODEL_TYPES
        and qwen3_5.lays_out(config)
        and config.num_experts > 0
        and config.norm_topk_prob
        and config.router == "softmax"
        and not config.dense_layers
        and config.n_shared_experts == 1
        and config.shared_expert_gate
    )


def to_hf(state: dict[str, torch.Tensor], config: GPTConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model's tensors under ``Qwen3_5MoeForCausalLM``'s names (``qwen3_5.tensors``: refused for a model read
    from a wrapper) and its config.json."""
    return qwen3_5.tensors(state, config), hf_config(config)


def hf_config(config: GPTConfig) -> dict[str, Any]:
    """config.json for ``Qwen3_5MoeForCausalLM`` (what :func:`config_from_hf` reads back): Qwen3.5's, with the
    experts' fields in place of the dense MLP's width."""
    dense = qwen3_5.hf_config(config)
    return {
        **{k: v for k, v in dense.items() if k not in ("intermediate_size", "attnlab")},
        "model_type": "qwen3_5_moe_text",
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "num_experts": config.num_experts,
        "num_experts_per_tok": config.num_experts_per_tok,
        "moe_intermediate_size": config.moe_intermediate_size or config.ff_dim,
        "shared_expert_intermediate_size": config.shared_expert_dim or config.moe_intermediate_size or config.ff_dim,
        "attnlab": dense["attnlab"],
    }
