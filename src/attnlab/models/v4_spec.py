"""What a DeepSeek-V4 decoder adds to ``GPTConfig`` (its field ``deepseek_v4``): one frozen record, checked here.

- ``layer_kinds``: each layer "compressed_sparse" (blocks of ``sparse_block`` that overlap, the indexer's top
  ``index_topk`` entries), "heavily_compressed" (blocks of ``heavy_block``, every closed entry) or "sliding" (no
  entries, the main RoPE: the config's rope_base, unscaled); every layer reads the config's ``window`` of its own
  tokens, with a sink a head (``attnlab.nn.compressed``);
- ``q_lora_rank``, ``rope_dim`` (each head's trailing channels that turn), ``o_groups`` and ``o_lora_rank`` (the
  grouped output), the compressed layers' RoPE theta and its scaling (YaRN, cos and sin left unscaled);
- hyper-connections (``attnlab.models.hyper``): ``hc_mult`` streams, ``hc_sinkhorn_iters``, ``hc_eps``;
- the mixture (``attnlab.models.moe_v4``): its router's ``scoring``, ``hash_layers`` (routed by a fixed table of
  token ids, not by the scores), the SwiGLU's ``swiglu_limit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from attnlab._checks import check_positive_int
from attnlab.functional.rotary import RopeScaling

KINDS = ("compressed_sparse", "heavily_compressed", "sliding")
SCORINGS = ("sqrtsoftplus", "softmax", "sigmoid")


@dataclass(frozen=True, kw_only=True)
class DeepseekV4Spec:
    layer_kinds: tuple[Literal["compressed_sparse", "heavily_compressed", "sliding"], ...]
    sparse_block: int = 4
    heavy_block: int = 128
    index_topk: int = 512
    index_heads: int = 64
    index_head_dim: int = 128
    q_lora_rank: int = 1024
    rope_dim: int = 64
    o_groups: int = 8
    o_lora_rank: int = 1024
    compress_theta: float = 160000.0
    compress_scaling: RopeScaling | None = None
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    scoring: Literal["sqrtsoftplus", "softmax", "sigmoid"] = "sqrtsoftplus"
    hash_layers: tuple[int, ...] = ()
    swiglu_limit: float = 10.0

    def __post_init__(self) -> None:
        if not isinstance(self.layer_kinds, tuple) or any(k not in KINDS for k in self.layer_kinds):
            raise ValueError(f"layer_kinds must be a tuple of {list(KINDS)}, got {self.layer_kinds!r}")
        for name in ("sparse_block", "heavy_block", "index_topk", "index_heads", "index_head_dim", "q_lora_rank"):
            check_positive_int(name, getattr(self, name), limit=2**20)
        for name in ("rope_dim", "o_groups", "o_lora_rank", "hc_mult", "hc_sinkhorn_iters"):
            check_positive_int(name, getattr(self, name), limit=2**20)
        if self.scoring not in SCORINGS:
            raise ValueError(f"scoring must be one of {list(SCORINGS)}, got {self.scoring!r}")
        if self.compress_scaling is not None and self.compress_scaling.mscale != 1.0:
            raise ValueError(
                f"compress_scaling {self.compress_scaling!r} scales cos and sin; V4's compressed layers never do: "
                "set attention_factor=1.0"
            )
        layers = len(self.layer_kinds)
        if not isinstance(self.hash_layers, tuple) or any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers for i in self.hash_layers
        ):
            raise ValueError(f"hash_layers must be a tuple of layer indices below {layers}, got {self.hash_layers!r}")
        for name in ("hc_eps", "swiglu_limit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a number > 0, got {value!r}")

    def block(self, layer: int) -> int:
        """m, the tokens a layer pools into one entry (0: a sliding layer, none)."""
        kind = self.layer_kinds[layer]
        return {"compressed_sparse": self.sparse_block, "heavily_compressed": self.heavy_block}.get(kind, 0)
