"""What a model's KV cache weighs, from its config alone: per token, per layer, and at a number of tokens.

Each layer's cache stores one key and one value vector per KV head for every token it holds:

    bytes per token, one layer = 2 (k and v) x n_kv_heads x head_dim x bytes per element

A latent attention layer (DeepSeek's MLA) stores its latent and its RoPE key instead, once for every head:
(kv_lora_rank + qk_rope_head_dim) x bytes per element (``attnlab.cache.LatentCache``).

A DeepSeek-V4 compressed layer (``attnlab.cache.CompressedCache``) holds its window's tokens, one vector each (its
keys are its values), every closed block of m tokens as one entry (and, compressed-sparse, the indexer's entry
beside it), and the last 2m tokens' projections for the compressor: past the window it grows by an entry's bytes
every m tokens.

A full layer holds every token; a sliding layer holds at most its ``window`` (attnlab's ring buffer,
``attnlab.cache.SlidingWindowCache``), so past the window it stops growing. A recurrent layer (the zoo's
"linear" and "delta", ``attnlab.nn.recurrent``) holds a state of fixed size from the first token: per head a
head_dim x head_dim matrix, and for linear attention a head_dim normalizer beside it. A layer that reads an earlier
layer's keys (KV sharing, ``attnlab.cache.SharedCache``) keeps nothing: its keys are counted once, in that layer.
Each softmax layer is counted in its own type's shape (``GPTConfig.layer_shape``). Grouped-query heads are why
today's models are cheap here: Llama 3.2 1B keeps 8 KV heads of its 32 query heads.

>>> from attnlab.models import GPTConfig
>>> report = kv_report(GPTConfig.preset("llama-3.2-1b"), name="llama-3.2-1b", tokens=(1024,))
>>> report.per_token  # 16 layers x 2 x 8 KV heads x 64 dims x 2 bytes (bfloat16)
32768
>>> report.at[0].total == 1024 * 32768
True

The parameter count comes from the model itself, built on PyTorch's ``meta`` device: shapes, no memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from attnlab.models.config import GPTConfig
from attnlab.models.gpt import count_parameters

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def element_size(dtype: str) -> int:
    """Bytes of one element of ``dtype`` (a name in ``DTYPES``)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    return torch.empty((), dtype=DTYPES[dtype]).element_size()


@dataclass(frozen=True)
class LayerKind:
    """The layers of one kind ("full", "latent", "sliding" with its window, a recurrent "linear" or "delta", or
    "shared": reading another layer's keys) and what one of them stores per token, or, for a recurrent kind,
    whatever the tokens (``state_bytes``)."""

    kind: str
    window: int | None
    layers: int
    bytes_per_token: int  # one layer: 2 x n_kv_heads x head_dim x element size; 0 for a recurrent or shared one
    state_bytes: int = 0  # one recurrent layer's state, the same after one token as after a million
    block: int = 0  # a compressed layer's m: an entry (entry_bytes) every m tokens, its last 2m tokens' rows_bytes
    entry_bytes: int = 0
    rows_bytes: int = 0

    def held(self, tokens: int) -> int:
        """Tokens one layer of this kind holds after ``tokens`` tokens: all of them, or its window (a recurrent
        layer holds none: it has folded them into its state)."""
        if self.state_bytes:
            return 0
        if self.kind == "shared":  # it reads the keys another layer holds
            return 0
        return tokens if self.window is None else min(tokens, self.window)

    def layer_bytes(self, tokens: int) -> int:
        """One layer's bytes after ``tokens`` tokens."""
        entries = tokens // self.block * self.entry_bytes + (self.rows_bytes if tokens else 0) if self.block else 0
        return self.held(tokens) * self.bytes_per_token + (self.state_bytes if tokens else 0) + entries


@dataclass(frozen=True)
class CacheAt:
    """The whole cache (batch 1) after ``tokens`` tokens: per layer kind what one layer holds, and the total."""

    tokens: int
    held: dict[str, int]  # kind -> tokens one layer of it holds
    layer_bytes: dict[str, int]  # kind -> bytes one layer of it holds
    total: int
    past_context: bool  # tokens > the model's context_length: a cache that size is not one the model was built for


@dataclass(frozen=True)
class KVReport:
    name: str
    dtype: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    context_length: int
    parameters: int
    kinds: tuple[LayerKind, ...]
    at: tuple[CacheAt, ...]
    latent: int | None = None  # values a latent layer stores a token (kv_lora_rank + qk_rope_head_dim)
    # what the model's design saves against: every layer full (a hybrid), or the expanded heads a latent stands
    # for (MLA, as Hugging Face's cache holds them): its label and its bytes per token over every layer
    instead: tuple[str, int] | None = None

    @property
    def formula(self) -> str:
        """How one layer's bytes per token are counted, in this model's numbers."""
        size = element_size(self.dtype)
        if any(k.block for k in self.kinds):
            return f"{self.head_dim} x {size} a window token (its keys are its values), an entry every m tokens"
        if self.latent is not None:
            return f"{self.latent} latent and RoPE values x {size}"
        return f"2 x {self.n_kv_heads} x {self.head_dim} x {size}"

    @property
    def per_token(self) -> int:
        """Bytes one token adds to the whole cache while it is inside every window (the sum over layers)."""
        return sum(k.layers * k.bytes_per_token for k in self.kinds)

    @property
    def weight_bytes(self) -> int:
        """The parameters' bytes in this dtype."""
        return self.parameters * element_size(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "per_token": self.per_token, "weight_bytes": self.weight_bytes}


def layer_kinds(config: GPTConfig, *, dtype: str = "bfloat16") -> tuple[LayerKind, ...]:
    """The config's layers grouped by kind (full first, then each window, the shared layers, then the recurrent
    kinds), with each kind's bytes per token, or its state's bytes."""
    size = element_size(dtype)
    if config.deepseek_v4 is not None:
        return compressed_kinds(config, size)
    types = [config.layer_type(i) for i in range(config.n_layers)]
    softmax = [(i, config.layer_window(i)) for i, t in enumerate(types) if t in ("full", "sliding")]
    own = [(i, w) for i, w in softmax if config.kv_source(i) is None]
    shared = len(softmax) - len(own)  # KV sharing: they read an earlier layer's keys, counted with that layer
    groups: dict[tuple[str, int | None], list[int]] = {}  # (kind, window (None: full)) -> each layer's bytes
    for i, w in own:
        full = "latent" if config.kv_lora_rank is not None else "full"
        if config.index_topk is not None and i not in config.index_shared:  # DSA: the latent and the indexer's key
            full = "indexed"  # (GLM-5's shared layers read an earlier layer's choice and keep the latent alone)
        groups.setdefault((full if w is None else "sliding", w), []).append(softmax_bytes(config, i, size))
    kinds = []
    for kind, w in sorted(groups, key=lambda key: (-1 if key[1] is None else key[1], key[0])):
        each = groups[kind, w]
        assert len(set(each)) == 1, f"layers of one kind with different shapes: {each}"  # shapes are per type
        kinds.append(LayerKind(kind, window=w, layers=len(each), bytes_per_token=each[0]))
    for kind, rows in (("moba", 1), ("nsa", 3)):  # block-sparse (kind "blocks"): every token's keys and values,
        if kind in types:  # NSA's a row for each of its three branches (attnlab.nn.nsa)
            layer = types.index(kind)
            kinds.append(LayerKind(kind, None, types.count(kind), rows * softmax_bytes(config, layer, size)))
    if shared:
        kinds.append(LayerKind("shared", None, shared, 0))
    state = config.n_heads * config.d_head * config.d_head  # a (D, D) matrix per head
    wide = max(size, 4)  # a recurrent state is kept in float32 at least, whatever the weights' dtype (StateCache)
    if "linear" in types:  # and its (D,) normalizer
        extra = config.n_heads * config.d_head
        kinds.append(LayerKind("linear", None, types.count("linear"), 0, state_bytes=(state + extra) * wide))
    if "delta" in types:
        kinds.append(LayerKind("delta", None, types.count("delta"), 0, state_bytes=delta_state(config) * wide))
    if "conv" in types:  # LFM's convolution layers: their last K - 1 inputs per channel, in the weights' dtype
        held = config.emb_dim * ((config.conv_kernel or 1) - 1)
        kinds.append(LayerKind("conv", None, types.count("conv"), 0, state_bytes=held * size))
    if "kda" in types:  # Kimi Delta Attention: a (D, D) state a head, and its convolution's last inputs of q, k, v
        heads, d = config.delta_heads or config.n_heads, config.delta_head_dim or config.d_head
        kda = heads * d * d + 3 * heads * d * (config.conv_kernel - 1 if config.conv_kernel else 0)
        kinds.append(LayerKind("kda", None, types.count("kda"), 0, state_bytes=kda * wide))
    return tuple(kinds)


def compressed_kinds(config: GPTConfig, size: int) -> tuple[LayerKind, ...]:
    """DeepSeek-V4's layers by kind: the window's tokens (head_dim each), an entry (and the indexer's) every m
    tokens, the last 2m tokens' compressor rows (values and gates, 2x wide where blocks overlap)."""
    spec = config.deepseek_v4
    assert spec is not None and config.window is not None
    d = config.d_head
    sliding = spec.layer_kinds.count("sliding")  # a window alone, one vector a token
    kinds = [LayerKind("sliding", config.window, sliding, d * size)] if sliding else []
    for kind in ("compressed_sparse", "heavily_compressed"):
        layers = spec.layer_kinds.count(kind)
        if not layers:
            continue
        sparse = kind == "compressed_sparse"
        m, index = (spec.sparse_block, spec.index_head_dim) if sparse else (spec.heavy_block, 0)
        row = 2 * (2 * d + 2 * index) if sparse else 2 * d  # values and gates; overlapping: twice as wide
        entry, rows = (d + index) * size, 2 * m * row * size
        kinds.append(LayerKind(kind, config.window, layers, d * size, block=m, entry_bytes=entry, rows_bytes=rows))
    return tuple(kinds)


def softmax_bytes(config: GPTConfig, layer: int, size: int) -> int:
    """What one token adds to softmax layer ``layer``'s cache: its type's own key/value heads and head size
    (``GPTConfig.layer_shape``), keys and values; a latent layer's latent and RoPE key, once for every head."""
    if config.kv_lora_rank is not None:  # MLA, and DSA's indexer key beside each latent (cache/indexed.py)
        index = config.index_head_dim if config.index_topk is not None and layer not in config.index_shared else 0
        return (config.kv_lora_rank + config.qk_rope_head_dim + index) * size
    shape = config.layer_shape(layer)
    values = config.v_head_dim or shape.head_dim  # a value head's own size (MiMo-V2-Flash)
    return shape.n_kv_heads * (shape.head_dim + values) * size


def every_layer_full(config: GPTConfig, *, dtype: str = "bfloat16") -> int:
    """Bytes a token adds to a model of the same layers, every one a full softmax layer shaped as this model's
    full layers are (or, with none, as its first softmax layer): what a hybrid's design saves against."""
    size = element_size(dtype)
    softmax = [i for i in range(config.n_layers) if config.layer_type(i) in ("full", "sliding")]
    if not softmax:
        raise ValueError(
            f"{config.n_layers} layers of {sorted(set(config.layer_types or ()))}: no softmax layer to shape them on"
        )
    full = [i for i in softmax if config.layer_window(i) is None]
    return config.n_layers * softmax_bytes(config, (full or softmax)[0], size)


def delta_state(config: GPTConfig) -> int:
    """The numbers a Gated DeltaNet layer keeps, whatever the tokens: a (Dk, Dv) matrix per value head, and, with a
    short convolution (Qwen3.5), its last K - 1 inputs of each channel (q, k and v)."""
    heads, dk = config.delta_heads or config.n_heads, config.delta_head_dim or config.d_head
    value_heads, dv = config.delta_value_heads or heads, config.delta_value_dim or dk
    channels = 2 * heads * dk + value_heads * dv
    return value_heads * dk * dv + (channels * (config.conv_kernel - 1) if config.conv_kernel else 0)


def cache_at(kinds: tuple[LayerKind, ...], tokens: int, *, context_length: int) -> CacheAt:
    """The cache of these layers after ``tokens`` tokens (batch 1)."""
    held = {_label(k): k.held(tokens) for k in kinds}
    layer_bytes = {_label(k): k.layer_bytes(tokens) for k in kinds}
    total = sum(k.layers * k.layer_bytes(tokens) for k in kinds)
    return CacheAt(tokens, held, layer_bytes, total, tokens > context_length)


def _label(kind: LayerKind) -> str:
    return kind.kind if kind.window is None or kind.block else f"sliding {kind.window}"


def readable_bytes(n: float) -> str:
    """Bytes in binary units, three figures: 112 MiB, 3.50 GiB, 14.0 GiB."""
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    if unit == "B":
        return f"{int(n):,} B"
    return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def expanded_head_values(config: GPTConfig) -> int:
    """Values one token adds to one latent layer's cache when its heads are kept expanded (as Hugging Face's cache
    holds them): each head's key (its nope and RoPE parts) and its value."""
    return config.n_heads * (config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim)


def kv_report(config: GPTConfig, *, name: str, tokens: tuple[int, ...], dtype: str = "bfloat16") -> KVReport:
    """Bytes per token per layer kind, the whole cache at each of ``tokens``, and the parameter count."""
    kinds = layer_kinds(config, dtype=dtype)
    size = element_size(dtype)
    instead = None
    if config.kv_lora_rank is not None:
        heads = expanded_head_values(config)
        instead = ("the expanded heads, as Hugging Face caches them", config.n_layers * heads * size)
    elif len(kinds) > 1 and kinds[0].kind == "full":  # a hybrid: sliding or recurrent layers beside full ones
        instead = ("every layer full", every_layer_full(config, dtype=dtype))
    return KVReport(
        name=name,
        dtype=dtype,
        n_layers=config.n_layers,
        n_kv_heads=1 if config.deepseek_v4 is not None else config.n_kv_heads or config.n_heads,
        head_dim=config.d_head,
        context_length=config.context_length,
        parameters=count_parameters(config),
        kinds=kinds,
        latent=None if config.kv_lora_rank is None else config.kv_lora_rank + config.qk_rope_head_dim,
        instead=instead,
        at=tuple(cache_at(kinds, n, context_length=config.context_length) for n in tokens),
    )


def read_config(path: str | Path) -> GPTConfig:
    """The GPTConfig of a checkpoint folder from its config.json alone, no tensors read
    (``attnlab.models.checkpoints.read_config``: the route ``read_checkpoint`` takes)."""
    from attnlab.models.checkpoints import read_config as from_folder

    return from_folder(path)
