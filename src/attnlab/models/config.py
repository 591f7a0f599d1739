"""GPTConfig: the book's names and defaults (chapter 4's GPT_CONFIG_124M), and the four GPT-2 sizes.

The same config describes today's decoders, in the names the book's Llama 3 and Qwen3 chapters use where they
have one (``hidden_dim``, ``head_dim``, ``qk_norm``, ``rope_base``): the norm (LayerNorm or RMSNorm, before or
after each sublayer), the MLP (GELU or gated SwiGLU), biases, QK-norm, RoPE with its scaling and partial rotation,
and a per-layer pattern of full and sliding-window attention (``layer_types``). Llama 3, Mistral, Qwen2 and Qwen3
are each one setting of these fields (``attnlab.models.families``); GPT-2 is the defaults.

>>> GPTConfig.preset("gpt2-medium").emb_dim
1024
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

from attnlab._checks import check_dropout, check_heads, check_kv_heads, check_positive_int, check_window
from attnlab.functional.registry import BACKENDS, Backend
from attnlab.functional.rotary import RopeScaling
from attnlab.models.block_spec import SparseBlocks
from attnlab.models.layer_shape import LayerShape, Resolved
from attnlab.models.presets import PRESETS, score_mod_from_name
from attnlab.models.v4_spec import DeepseekV4Spec

NORMS = ("layernorm", "rmsnorm")
PLACEMENTS = ("pre", "post", "sandwich")
MLPS = ("gelu", "swiglu", "geglu", "clamped_swiglu")
LAYER_TYPES: tuple[str, ...] = ("full", "sliding", "linear", "delta", "kda", "conv")  # softmax layers; then stateful
# (nn/recurrent, nn/kda, nn/convolution)
LAYER_TYPES += ("moba", "nsa")  # block-sparse softmax layers (nn/moba, nn/nsa), shaped by sparse_blocks
# the Hugging Face model types a config can be saved as
HYBRID_FAMILIES = (
    "qwen3_5_text",
    "qwen3_5",
    "olmo_hybrid",
    "lfm3",
    "qwen3_5_moe_text",
    "qwen3_5_moe",
)  # families whose checkpoints hold Gated DeltaNet layers and output gates
FAMILIES: tuple[str, ...] = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma3_text", "qwen3_moe", "gpt_oss")
FAMILIES += ("deepseek_v3", *HYBRID_FAMILIES, "kimi_linear", "mimo_v2_flash")
FAMILIES += ("deepseek_v32", "glm_moe_dsa")  # DeepSeek Sparse Attention
FAMILIES += ("gemma4_text", "gemma4")  # Gemma 4: its text model, and the multimodal wrapper's
FAMILIES += ("deepseek_v4",)  # compressed attention, hyper-connections, hash routing (deepseek_v4 below)
ROUTERS = ("softmax", "grouped_sigmoid")


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """The book's GPT_CONFIG_124M by default; ``tie_weights`` shares tok_emb with out_head (as GPT-2 does)."""

    vocab_size: int = 50257
    context_length: int = 1024
    emb_dim: int = 768
    n_heads: int = 12
    n_layers: int = 12
    drop_rate: float = 0.1
    qkv_bias: bool = False
    tie_weights: bool = False
    layer_norm_eps: float = 1e-5
    backend: Backend = "auto"
    # Beyond GPT-2, in the book's naming style: grouped-query heads, rotary positions instead of learned ones,
    # a sliding window, and a built-in score_mod for every layer ("alibi", "learned-alibi", "softcap:<cap>").
    n_kv_heads: int | None = None
    rope: bool = False
    rope_base: float = 10000.0
    window: int | None = None
    score_mod: str | None = None
    # Today's decoders (Llama, Mistral, Qwen): the norm and where it sits ("pre": x + f(norm(x)), GPT-2's and
    # Llama's; "post": x + norm(f(x)), OLMo 2's), the MLP ("swiglu": fc3(silu(fc1(x)) * fc2(x)), the book's
    # Llama 3 FeedForward) and its width (None: 4 * emb_dim), biases on out_proj and the MLP, head_dim when it is
    # not emb_dim // n_heads, QK-norm, RoPE's scaling and rotated dimensions, which layers slide (None: every
    # layer if window is set), and the Hugging Face family it was read from (what save_pretrained writes).
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_placement: Literal["pre", "post", "sandwich"] = "pre"
    mlp: Literal["gelu", "swiglu", "geglu", "clamped_swiglu"] = "gelu"
    hidden_dim: int | None = None
    bias: bool = True
    head_dim: int | None = None
    qk_norm: bool = False
    rope_scaling: RopeScaling | None = None
    rotary_dim: int | None = None
    layer_types: tuple[Literal["full", "sliding", "linear", "delta", "kda", "conv", "moba", "nsa"], ...] | None = None
    family: str | None = None
    # Gemma 3: "sandwich" norms (before and after each sublayer), GeGLU, embeddings times emb_scale (sqrt(emb_dim)),
    # the softmax scale (query_pre_attn_scalar ** -0.5), RoPE's theta and scaling on sliding layers, and
    # Gemma 2's softcapped logits. Mixtures of experts (Qwen3-MoE; the book's Qwen3 names): num_experts experts
    # of moe_intermediate_size, num_experts_per_tok run per token, on every layer but dense_layers.
    emb_scale: float | None = None
    attn_scale: float | None = None
    rope_local_base: float | None = None
    rope_local_scaling: RopeScaling | None = None
    final_softcap: float | None = None
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int | None = None
    norm_topk_prob: bool = True
    dense_layers: tuple[int, ...] = ()
    # gpt-oss: a learned sink logit per head, and experts whose SwiGLU is clamped (mlp="clamped_swiglu")
    sinks: bool = False
    # DeepSeek-V3: multi-head latent attention on every layer when kv_lora_rank is set (attnlab.nn.latent), and
    # its router: sigmoid scores, a correction bias that only chooses, the best topk_group of n_group groups,
    # weights times routed_scaling_factor, plus n_shared_experts always run
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False
    router: Literal["softmax", "grouped_sigmoid"] = "softmax"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    n_shared_experts: int = 0
    # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5; attnlab.nn.indexed): with index_topk set, each latent
    # attention layer's queries read the index_topk keys its lightning indexer (index_heads of index_head_dim)
    # scores highest; its RoPE on interleaved pairs with index_rope_interleave (GLM-5's)
    index_topk: int | None = None
    index_heads: int = 0
    index_head_dim: int = 0
    index_rope_interleave: bool = False
    # GLM-5's "shared" indexer layers: each reads the choice of the nearest earlier layer with an indexer of its own
    index_shared: tuple[int, ...] = ()
    # Qwen3.5-MoE: each shared expert's width when it is not moe_intermediate_size (shared_expert_intermediate_size),
    # and its output opened per token by sigmoid(shared_gate(x)) (shared_expert_gate)
    shared_expert_dim: int | None = None
    shared_expert_gate: bool = False
    # The attention zoo (attnlab zoo): Qwen3-Next's output gate on every softmax layer (each head's context vector
    # times sigmoid(gate(x))); layer_types may also name "linear" (linear attention) and "delta" (Gated DeltaNet)
    # layers, whose memory is a state of fixed size (attnlab.nn.recurrent)
    attn_output_gate: bool = False
    # Gu et al.'s sigmoid attention without normalisation on every softmax layer (attnlab.functional.sigmoid)
    attn_normalize: Literal["softmax", "sigmoid"] = "softmax"
    # Qwen3.5's Gated DeltaNet layers: their own query/key heads and size, more value heads than query/key heads
    # (each value head with its own state), and a short causal convolution of conv_kernel taps over q, k and v
    # (None: the layers' heads are n_heads of d_head, without a convolution, as the zoo's are)
    delta_heads: int | None = None
    delta_head_dim: int | None = None
    delta_value_heads: int | None = None
    delta_value_dim: int | None = None
    conv_kernel: int | None = None
    # Kimi Linear's "kda" layers (Kimi Delta Attention, attnlab.nn.kda) take their heads, head size, convolution and
    # output norm's epsilon from these delta_* fields and conv_kernel too
    # OLMo-Hybrid: its Gated DeltaNet layers' beta in [0, 2] (negative eigenvalues), their output norm's epsilon and
    # their norms' placement (pre, while its softmax layers' are post), QK-norm over all heads at once ("all"), and
    # no positions at all on a model without RoPE (nope: no learned embeddings either)
    delta_negative_eigenvalues: bool = False
    delta_norm_eps: float | None = None
    delta_norm_placement: Literal["pre", "post", "sandwich"] | None = None
    qk_norm_over: Literal["head", "all"] = "head"
    nope: bool = False
    # Gemma 4 and MiMo-V2-Flash shape each layer type on its own (attnlab.models.layer_shape): the full layers'
    # and the sliding layers' own head size, key/value heads, sinks, keys as values, RoPE. Values scaled by
    # value_scale (MiMo), RMS-normed without a weight (v_norm: Gemma 4); v_head_dim, when set without latent
    # attention, is a softmax layer's value head size (MiMo's 128 beside its 192-wide keys). KV sharing (Gemma 4):
    # the last kv_shared_layers layers compute no keys or values and read those of the last earlier layer of
    # their type (kv_source), whose MLP is twice as wide with double_wide_shared
    full_layers: LayerShape | None = None
    sliding_layers: LayerShape | None = None
    value_scale: float | None = None
    v_norm: bool = False
    kv_shared_layers: int = 0
    double_wide_shared: bool = False
    # LFM3: "conv" layers (attnlab.nn.convolution: gated short convolutions of conv_kernel taps, with conv_bias) and
    # an output gate with one opening a head on the softmax layers (attn_head_gate)
    conv_bias: bool = False
    attn_head_gate: bool = False
    # Gemma 4 (attnlab.models.per_layer, attnlab.models.moe_beside): per-layer embeddings of ple_dim a layer, a
    # mixture of num_experts experts beside every layer's MLP (moe_beside), a scalar on each layer's output
    ple_dim: int = 0
    moe_beside: bool = False
    layer_scalar: bool = False
    # DeepSeek-V4 (attnlab.models.v4_spec): its compressed layers beside the window, hyper-connections, its mixture
    deepseek_v4: DeepseekV4Spec | None = None
    # MoBA and NSA layers ("moba", "nsa" in layer_types; attnlab.models.block_spec): their blocks and choices
    sparse_blocks: SparseBlocks | None = None

    def __post_init__(self) -> None:
        check_positive_int("vocab_size", self.vocab_size)
        check_positive_int("context_length", self.context_length, limit=2**24)
        check_positive_int("emb_dim", self.emb_dim, limit=2**16)
        check_positive_int("n_layers", self.n_layers, limit=4096)
        if self.head_dim is None:
            check_heads(self.emb_dim, self.n_heads, names=("emb_dim", "n_heads"))
        else:
            check_positive_int("head_dim", self.head_dim, limit=2**12)
            check_positive_int("n_heads", self.n_heads, limit=2**12)
        check_dropout(self.drop_rate, name="drop_rate")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        if not isinstance(self.layer_norm_eps, float) or not 0 < self.layer_norm_eps < 1:
            raise ValueError(f"layer_norm_eps must be a float in (0, 1), got {self.layer_norm_eps!r}")
        if self.n_kv_heads is not None:
            check_kv_heads(self.n_heads, self.n_kv_heads)
        if not isinstance(self.rope, bool):
            raise TypeError(f"rope must be a bool, got {self.rope!r}")
        if isinstance(self.rope_base, bool) or not isinstance(self.rope_base, (int, float)) or self.rope_base <= 1:
            raise ValueError(
                f"rope_base must be a number > 1 (RoPE's theta, 10000 in the paper), got {self.rope_base!r}"
            )
        if self.window is not None:
            check_window(self.window)
        if self.score_mod is not None:
            score_mod_from_name(self.score_mod, self.n_heads)  # names the known ones when it is not one of them
        self._check_parts()

    def _check_parts(self) -> None:
        for name, value, allowed in (
            ("norm", self.norm, NORMS),
            ("norm_placement", self.norm_placement, PLACEMENTS),
            ("mlp", self.mlp, MLPS),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
        if self.delta_norm_placement not in (None, *PLACEMENTS) or self.qk_norm_over not in ("head", "all"):
            raise ValueError(
                f"delta_norm_placement must be None or one of {list(PLACEMENTS)} and qk_norm_over 'head' or 'all', "
                f"got {self.delta_norm_placement!r} and {self.qk_norm_over!r}"
            )
        if self.nope and self.rope:
            raise ValueError("nope means no positions at all, and rope=True turns q and k by theirs: choose one")
        if self.delta_norm_eps is not None and not (
            isinstance(self.delta_norm_eps, float) and 0 < self.delta_norm_eps < 1
        ):
            raise ValueError(f"delta_norm_eps must be None or a float in (0, 1), got {self.delta_norm_eps!r}")
        flags = ("bias", "qk_norm", "sinks", "norm_topk_prob", "rope_interleave", "attn_output_gate", "nope")
        for name in (
            *flags,
            "delta_negative_eigenvalues",
            "v_norm",
            "double_wide_shared",
            "conv_bias",
            "attn_head_gate",
            "moe_beside",
            "layer_scalar",
        ):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.hidden_dim is not None:
            check_positive_int("hidden_dim", self.hidden_dim, limit=2**20)
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise TypeError(f"rope_scaling must be a RopeScaling or None, got {self.rope_scaling!r}")
        if (self.rope_scaling is not None or self.rotary_dim is not None) and not self.rope:
            raise ValueError("rope_scaling and rotary_dim shape RoPE: set rope=True with them, or leave them out")
        if self.rotary_dim is not None and (
            isinstance(self.rotary_dim, bool)
            or not isinstance(self.rotary_dim, int)
            or self.rotary_dim % 2
            or not 2 <= self.rotary_dim <= self.d_head
        ):
            raise ValueError(f"rotary_dim must be an even int in [2, head_dim={self.d_head}], got {self.rotary_dim!r}")
        if self.layer_types is not None:
            if not isinstance(self.layer_types, tuple) or len(self.layer_types) != self.n_layers:
                raise ValueError(
                    f"layer_types must be a tuple of n_layers={self.n_layers} entries, got {self.layer_types!r}"
                )
            odd = sorted({t for t in self.layer_types if t not in LAYER_TYPES}, key=str)
            if odd:
                raise ValueError(f"layer_types may hold {list(LAYER_TYPES)}, got {odd}")
            if "sliding" in self.layer_types and self.window is None:
                raise ValueError("layer_types has 'sliding' layers but window is None: set window=<tokens>")
            if {"moba", "nsa"} & set(self.layer_types) and not isinstance(self.sparse_blocks, SparseBlocks):
                raise ValueError("layer_types has 'moba' or 'nsa' layers: set sparse_blocks=SparseBlocks(...)")
            if "conv" in self.layer_types and self.conv_kernel is None:
                raise ValueError("layer_types has 'conv' layers: set conv_kernel=<taps> (LFM's conv_L_cache)")
            if self.kv_lora_rank is not None and {"linear", "delta", "conv"} & set(self.layer_types):
                raise ValueError(
                    "latent attention (kv_lora_rank) is on every layer; it takes no 'linear', 'delta' or 'conv' layers"
                )
        for name in ("emb_scale", "attn_scale", "rope_local_base", "final_softcap"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
                raise ValueError(f"{name} must be None or a number > 0, got {value!r}")
        if self.rope_local_base is not None and not self.rope:
            raise ValueError("rope_local_base is RoPE's theta on sliding layers: set rope=True with it")
        if self.rope_local_scaling is not None and (
            not isinstance(self.rope_local_scaling, RopeScaling) or self.rope_local_base is None
        ):
            raise ValueError(
                f"rope_local_scaling must be a RopeScaling beside a rope_local_base, got {self.rope_local_scaling!r} "
                f"with rope_local_base={self.rope_local_base!r}"
            )
        if self.num_experts:
            check_positive_int("num_experts", self.num_experts, limit=4096)
            if isinstance(self.num_experts_per_tok, bool) or not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok must be in [1, num_experts={self.num_experts}], got {self.num_experts_per_tok!r}"
                )
            if self.moe_intermediate_size is not None:
                check_positive_int("moe_intermediate_size", self.moe_intermediate_size, limit=2**20)
        if self.shared_expert_dim is not None:
            check_positive_int("shared_expert_dim", self.shared_expert_dim, limit=2**20)
        if not isinstance(self.shared_expert_gate, bool):
            raise TypeError(f"shared_expert_gate must be a bool, got {self.shared_expert_gate!r}")
        if self.shared_expert_gate and not (self.num_experts and self.n_shared_experts):
            raise ValueError(
                f"shared_expert_gate opens a shared expert, and num_experts={self.num_experts}, n_shared_experts="
                f"{self.n_shared_experts}: set both, or leave the gate out"
            )
        if not isinstance(self.dense_layers, tuple) or any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n_layers for i in self.dense_layers
        ):
            raise ValueError(
                f"dense_layers must be a tuple of layer indices below {self.n_layers}, got {self.dense_layers!r}"
            )
        if self.kv_lora_rank is not None:
            for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                check_positive_int(name, getattr(self, name), limit=2**16)
            if self.q_lora_rank is not None:
                check_positive_int("q_lora_rank", self.q_lora_rank, limit=2**20)
            if self.rope == self.nope or (self.rope and self.qk_rope_head_dim % 2):  # nope: Kimi Linear's MLA
                raise ValueError(
                    f"latent attention rotates its qk_rope_head_dim={self.qk_rope_head_dim} dimensions: set rope=True "
                    "and an even qk_rope_head_dim, or nope=True to turn none"
                )
        if self.index_topk is not None:
            if self.kv_lora_rank is None or self.q_lora_rank is None:
                raise ValueError(
                    f"index_topk={self.index_topk} selects keys for latent attention's queries from their latent: "
                    "set kv_lora_rank and q_lora_rank with it (DeepSeek-V3.2's layers have both)"
                )
            for name, limit in (("index_topk", 2**31), ("index_heads", 2**12), ("index_head_dim", 2**16)):
                check_positive_int(name, getattr(self, name), limit=limit)
        if not isinstance(self.index_rope_interleave, bool):
            raise TypeError(f"index_rope_interleave must be a bool, got {self.index_rope_interleave!r}")
        shared = self.index_shared
        if not isinstance(shared, tuple) or any(isinstance(i, bool) or not isinstance(i, int) for i in shared):
            raise TypeError(f"index_shared must be a tuple of layer indices, got {shared!r}")
        if shared and (self.index_topk is None or 0 in shared or list(shared) != sorted(set(shared))):
            raise ValueError(
                f"index_shared={shared!r} names the layers that read an earlier layer's indexer choice: increasing "
                "layer indices past 0 (the first layer runs its own indexer), with index_topk set"
            )
        if shared and shared[-1] >= self.n_layers:
            raise ValueError(f"index_shared={shared!r} names a layer past the model's n_layers={self.n_layers}")
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {list(ROUTERS)}, got {self.router!r}")
        if self.router == "grouped_sigmoid" and (
            self.num_experts % max(self.n_group, 1) or not 1 <= self.topk_group <= self.n_group
        ):
            raise ValueError(
                f"the grouped router splits num_experts={self.num_experts} into n_group={self.n_group} groups and "
                f"keeps topk_group={self.topk_group} of them: n_group must divide it and topk_group <= n_group"
            )
        if self.family is not None and self.family not in FAMILIES:
            raise ValueError(f"family must be None or one of {list(FAMILIES)}, got {self.family!r}")
        v4 = self.deepseek_v4
        if v4 is not None and (
            not isinstance(v4, DeepseekV4Spec)
            or len(v4.layer_kinds) != self.n_layers
            or self.window is None
            or not self.num_experts
            or self.moe_intermediate_size is None
        ):
            raise ValueError(
                f"deepseek_v4 must be a DeepseekV4Spec with a kind for each of n_layers={self.n_layers} layers, beside "
                f"a window and experts (num_experts, moe_intermediate_size); got {v4!r} with window={self.window}"
            )
        for name in ("delta_heads", "delta_head_dim", "delta_value_heads", "delta_value_dim", "conv_kernel"):
            value = getattr(self, name)
            if value is not None:
                check_positive_int(name, value, limit=64 if name == "conv_kernel" else 2**16)
        if self.delta_value_heads is not None and self.delta_value_heads % (self.delta_heads or self.n_heads):
            raise ValueError(
                f"delta_value_heads={self.delta_value_heads} must be a multiple of the delta layers' query/key heads "
                f"({self.delta_heads or self.n_heads}): each of those serves as many value heads"
            )
        self._check_shapes()
        if "kda" in (self.layer_types or ()) and self.family not in (None, "kimi_linear"):
            raise ValueError(f"'kda' layers are Kimi Linear's; family={self.family!r} has none: leave family None")
        if self.attn_normalize not in ("softmax", "sigmoid"):
            raise ValueError(f"attn_normalize must be 'softmax' or 'sigmoid', got {self.attn_normalize!r}")
        if self.attn_normalize == "sigmoid" and (self.family, self.kv_lora_rank, self.sinks) != (None, None, False):
            raise ValueError(
                "attn_normalize='sigmoid' is attnlab's own (saved in its format), on its own attention layers without "
                f"sinks: family={self.family!r}, kv_lora_rank={self.kv_lora_rank}, sinks={self.sinks}; leave them out"
            )
        zoo = (
            self.attn_output_gate
            or self.attn_head_gate
            or bool({"linear", "delta", "conv"} & set(self.layer_types or ()))
        )
        if zoo and (self.family not in (None, *HYBRID_FAMILIES) or self.kv_lora_rank is not None):
            raise ValueError(
                "attn_output_gate and 'linear' or 'delta' layers are the attention zoo's (saved in attnlab's own "
                f"format); family={self.family!r} and latent attention (kv_lora_rank={self.kv_lora_rank}) have "
                "neither: leave them out"
            )

    def _check_shapes(self) -> None:
        for name in ("full_layers", "sliding_layers"):
            shape = getattr(self, name)
            if shape is not None and not isinstance(shape, LayerShape):
                raise TypeError(f"{name} must be a LayerShape or None, got {shape!r}")
            if shape is not None and shape.n_kv_heads is not None:
                check_kv_heads(self.n_heads, shape.n_kv_heads)
        if (self.full_layers or self.sliding_layers) and self.kv_lora_rank is not None:
            raise ValueError("full_layers and sliding_layers shape softmax layers; latent attention has its own")
        if self.value_scale is not None and (
            isinstance(self.value_scale, bool)
            or not isinstance(self.value_scale, (int, float))
            or not self.value_scale > 0
        ):
            raise ValueError(f"value_scale must be None or a number > 0, got {self.value_scale!r}")
        if self.kv_lora_rank is None and self.v_head_dim:
            check_positive_int("v_head_dim", self.v_head_dim, limit=2**16)
        if isinstance(self.ple_dim, bool) or not isinstance(self.ple_dim, int) or not 0 <= self.ple_dim <= 2**16:
            raise ValueError(f"ple_dim must be an int in [0, 65536] (0: no per-layer embeddings), got {self.ple_dim!r}")
        if self.moe_beside and not self.num_experts:
            raise ValueError("moe_beside puts a mixture of experts beside each MLP: set num_experts with it")
        if self.moe_beside and self.norm_placement == "post":
            raise ValueError(
                "moe_beside adds experts beside an MLP on norm2(x): use norm_placement 'pre' or 'sandwich'"
            )
        k = self.kv_shared_layers
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < self.n_layers:
            raise ValueError(
                f"kv_shared_layers must be an int in [0, n_layers={self.n_layers}): the last layers that read an "
                f"earlier layer's keys, after at least one that computes them; got {k!r}"
            )
        for layer in range(self.n_layers - k, self.n_layers):
            if self.layer_type(layer) not in ("full", "sliding"):
                raise ValueError(
                    f"layer {layer} shares keys (kv_shared_layers={k}) but is a {self.layer_type(layer)} layer"
                )
            self.kv_source(layer)  # names a type with no earlier layer to read from

    @property
    def d_head(self) -> int:
        """D, each head's size: head_dim, or emb_dim // n_heads."""
        return self.head_dim if self.head_dim is not None else self.emb_dim // self.n_heads

    @property
    def ff_dim(self) -> int:
        """The MLP's hidden width: hidden_dim, or GPT-2's 4 * emb_dim."""
        return self.hidden_dim if self.hidden_dim is not None else 4 * self.emb_dim

    def layer_rope(self, layer: int) -> tuple[float, RopeScaling | None]:
        """RoPE's theta and scaling on layer ``layer``: a sliding layer's own if the config has them."""
        if self.rope_local_base is not None and self.layer_window(layer) is not None:
            return float(self.rope_local_base), self.rope_local_scaling
        return float(self.rope_base), self.rope_scaling

    def kv_source(self, layer: int) -> int | None:
        """The layer whose keys and values layer ``layer`` reads (KV sharing: the last layer of its type before
        the shared ones), or None for a layer that computes its own."""
        first = self.n_layers - self.kv_shared_layers
        if layer < first:
            return None
        kind = self.layer_type(layer)
        earlier = [i for i in range(first) if self.layer_type(i) == kind]
        if not earlier:
            raise ValueError(
                f"layer {layer} is a {kind} layer reading an earlier {kind} layer's keys (kv_shared_layers="
                f"{self.kv_shared_layers}), and none of layers 0..{first - 1} is one"
            )
        return earlier[-1]

    def layer_shape(self, layer: int) -> Resolved:
        """Layer ``layer``'s softmax attention shape: its type's own (``full_layers``, ``sliding_layers``) over
        the model's fields."""
        own = self.sliding_layers if self.layer_window(layer) is not None else self.full_layers
        own = own or LayerShape()
        return Resolved(
            head_dim=own.head_dim or self.d_head,
            n_kv_heads=own.n_kv_heads or self.n_kv_heads or self.n_heads,
            sinks=self.sinks if own.sinks is None else own.sinks,
            keys_as_values=own.keys_as_values,
            rotary_dim=own.rotary_dim or self.rotary_dim,
            rope_proportion=own.rope_proportion,
            kv_source=self.kv_source(layer),
        )

    def layer_window(self, layer: int) -> int | None:
        """The window layer ``layer`` attends through: ``window`` on a sliding layer, None on a full one."""
        if self.layer_types is None:
            return self.window
        return self.window if self.layer_types[layer] == "sliding" else None

    def layer_type(self, layer: int) -> str:
        """What layer ``layer`` is: "full", "sliding", "linear", "delta" or "kda"."""
        if self.layer_types is None:
            return "full" if self.window is None else "sliding"
        return self.layer_types[layer]

    @property
    def shapes_layers(self) -> bool:
        """Whether a layer type has its own shape, values are scaled, normed or sized apart, or layers share keys:
        what only the families that read those settings (Gemma 4, MiMo-V2-Flash) can be saved as."""
        kept = (self.full_layers, self.sliding_layers, self.value_scale, self.v_norm, self.kv_shared_layers)
        gemma4 = (self.ple_dim, self.moe_beside, self.layer_scalar) != (0, False, False)  # Gemma 4's own parts
        return kept != (None, None, None, False, 0) or gemma4 or (self.kv_lora_rank is None and self.v_head_dim != 0)

    @property
    def is_gpt2(self) -> bool:
        """Whether Hugging Face's GPT2LMHeadModel holds this model (learned positions, full heads, no window or mod)."""
        return (
            not self.rope
            and not self.nope
            and self.n_kv_heads in (None, self.n_heads)
            and self.window is None
            and not self.score_mod
            and self.is_gpt2_block
        )

    @property
    def is_gpt2_block(self) -> bool:
        """GPT-2's block: pre-LayerNorm, a 4x GELU MLP with biases, heads of emb_dim // n_heads, no QK-norm."""
        return (
            (self.norm, self.norm_placement, self.mlp) == ("layernorm", "pre", "gelu")
            and self.hidden_dim in (None, 4 * self.emb_dim)
            and self.bias
            and self.head_dim in (None, self.emb_dim // self.n_heads)
            and not self.qk_norm
            and (self.emb_scale, self.attn_scale, self.final_softcap, self.num_experts) == (None, None, None, 0)
            and not self.sinks
            and not self.shapes_layers
            and self.kv_lora_rank is None
            and not (self.attn_output_gate or self.attn_head_gate)
            and self.attn_normalize == "softmax"
            and self.layer_types in (None, ("full",) * self.n_layers)
        )

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> GPTConfig:
        """One of the book's GPT-2 sizes (``gpt2-small`` ... ``gpt2-xl``) or a shape of today's decoders
        (``llama-3.2-1b``, ``qwen3-0.6b``, ...: ``PRESETS``), with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; known: {list(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)  # rope_scaling becomes a dict of its fields
        if self.layer_types is not None:
            values["layer_types"] = list(self.layer_types)
        values["dense_layers"] = list(self.dense_layers)
        values["index_shared"] = list(self.index_shared)
        return values  # full_layers and sliding_layers: a dict of their fields, or None

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GPTConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown GPTConfig fields {unknown}; known: {sorted(known)}")
        values = dict(values)
        for key in ("rope_scaling", "rope_local_scaling"):
            if isinstance(values.get(key), dict):
                values[key] = RopeScaling.from_dict(values[key])
        for key in ("full_layers", "sliding_layers"):
            if isinstance(values.get(key), dict):
                values[key] = LayerShape.from_dict(values[key])
        if isinstance(values.get("sparse_blocks"), dict):
            values["sparse_blocks"] = SparseBlocks(**values["sparse_blocks"])
        for key in ("layer_types", "dense_layers", "index_shared"):
            if isinstance(values.get(key), list):
                values[key] = tuple(values[key])
        v4 = values.get("deepseek_v4")
        if isinstance(v4, dict):  # saved in attnlab's own format (the zoo's compressed variant)
            scaling = v4.get("compress_scaling")
            scaling = RopeScaling.from_dict(scaling) if isinstance(scaling, dict) else scaling
            kinds, hashed = tuple(v4["layer_kinds"]), tuple(v4["hash_layers"])
            values["deepseek_v4"] = DeepseekV4Spec(
                **{**v4, "layer_kinds": kinds, "hash_layers": hashed, "compress_scaling": scaling}
            )
        return cls(**values)

    def with_(self, **changes: Any) -> GPTConfig:
        return replace(self, **changes)
