"""A transformers model's own rotary rotation, for a sink cache that moves its sinks (``attnlab.hf.cache("sink")``).

A sink cache keeps its first tokens for good and turns their keys on as the window slides, so that they sit just
before its oldest token (``attnlab.cache.sink``). The keys reach the cache already rotated by the model, so the
turn must be the model's own: :class:`ModelRotation` takes the model's rotary embedding (its cos and sin for any
positions) and its modeling module's ``apply_rotary_pos_emb`` (its convention: halves, pairs, a partial
rotation), and undoes the cos/sin scaling some RoPE variants fold in. A rotation that does not add up
(``rotate(rotate(x, a), b) == rotate(x, a + b)``), as with RoPE whose frequencies change with the length seen
(dynamic NTK, LongRoPE), is refused when the cache is made, with the reason.

Shapes: B = batch, H = heads, T = tokens, D = head_dim, R = rotated dimensions.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

from attnlab.hf.model_states import field

FIXED = ("default", "linear", "llama3", "yarn")  # frequencies fixed (YaRN's scaling of cos and sin is divided out)
MOVING = ("dynamic", "longrope")  # frequencies that move with the length seen


class ModelRotation:
    """``rotate(x, positions)``: keys x (B, H, T, D) turned on by ``positions`` (T,), the way ``model`` turns them.

    Raises:
        ValueError: a model with no single rotary embedding, no ``apply_rotary_pos_emb`` beside it, or RoPE whose
            frequencies move with the length (named).
    """

    def __init__(self, model: torch.nn.Module, config: Any) -> None:
        found = [m for _, m in model.named_modules() if type(m).__name__.endswith("RotaryEmbedding")]
        if len(found) != 1:
            raise ValueError(
                f"a sink cache turns its sinks by the model's rotary embedding, and this model has {len(found)} "
                "(a model without RoPE cannot move them; one with several is not read here): use attnlab's "
                "GPT.from_pretrained(path) with cache='sink', or another cache"
            )
        self.embedding = found[0]
        module = sys.modules[type(self.embedding).__module__]
        apply = getattr(module, "apply_rotary_pos_emb", None)
        if apply is None:
            raise ValueError(f"{module.__name__} has no apply_rotary_pos_emb to turn a sink cache's keys with")
        self.apply: Any = apply
        # apply_rotary_pos_emb(q, k, cos, sin) turns a pair; Gemma 4's apply_rotary_pos_emb(x, cos, sin) one tensor
        self._one = list(inspect.signature(apply).parameters)[1:2] == ["cos"]
        params = getattr(config, "rope_parameters", None) or {}
        if isinstance(params.get("full_attention"), dict):  # one set a layer type (Gemma 3): the full layers'
            params = params["full_attention"]
        kind = params.get("rope_type", "default")
        if kind not in FIXED:
            why = "whose frequencies change with the length seen" if kind in MOVING else "which is not read here"
            raise ValueError(
                f"this model's RoPE is {kind!r}, {why}, so a sink's key cannot be turned on by the model's "
                f"rotation: a sink cache takes RoPE of types {list(FIXED)}"
            )
        takes_type = "layer_type" in inspect.signature(self.embedding.forward).parameters
        self._type = ("full_attention",) if takes_type else ()
        probe = torch.randn(1, 1, 1, self._width(model, config))
        cos, _ = self._angles(probe, torch.zeros(1, dtype=torch.long))
        self.scaling = cos[..., :1]  # cos(0) = 1, times the scaling a RoPE variant folds into cos and sin
        twice = self.rotate(self.rotate(probe, torch.tensor([3])), torch.tensor([5]))
        if not torch.allclose(twice, self.rotate(probe, torch.tensor([8])), atol=1e-5):
            raise ValueError("this model's rotary rotations do not add up (3 then 5 is not 8): no sink cache for it")

    @staticmethod
    def _width(model: torch.nn.Module, config: Any) -> int:
        """The head size of the layers a sink cache holds, the full ones: a full layer's attention module's own
        (Gemma 4's ``global_head_dim``), else the config's head_dim (None where it is one per layer), else
        hidden_size / heads."""
        kinds = list(field(config, "layer_types") or [])
        full = {i for i, kind in enumerate(kinds) if kind == "full_attention"}
        for module in model.modules():
            index, size = getattr(module, "layer_idx", None), getattr(module, "head_dim", None)
            if isinstance(index, int) and isinstance(size, int) and (not full or index in full):
                return size
        head = field(config, "head_dim")
        return int(head) if isinstance(head, int) else int(config.hidden_size) // int(config.num_attention_heads)

    def _angles(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.embedding(x, positions.reshape(1, -1).to(x.device), *self._type)  # (1, T, R) each
        return cos, sin

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x (B, H, T, D) rotated on by ``positions`` (T,), or by one position for every token."""
        cos, sin = self._angles(x, positions)
        scale = self.scaling.to(cos)
        turned: torch.Tensor
        if self._one:
            turned = self.apply(x, cos / scale, sin / scale)  # its cos/sin (1, T, R) unsqueezed to (1, 1, T, R)
        else:
            turned, _ = self.apply(x, x, cos / scale, sin / scale)  # the same, for a pair
        return turned
