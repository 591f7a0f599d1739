"""``SharedIndexAttention``: GLM-5's "shared" indexer layers, whose queries read the keys an earlier layer's
lightning indexer chose.

GLM-5's ``indexer_types`` marks some layers "shared": such a layer has no indexer of its own (no weights) and
reuses the top-k of the layer before it, which a shared layer passes on unchanged, so it is the choice of the
nearest earlier layer with an indexer (its source, :func:`link_indexers`). Every latent layer's keys are the same
positions (one latent a token, slot for slot in the plain and the paged caches), so the source's
:class:`Selection` (``IndexedAttention.chosen``, kept by its last call) indexes this layer's keys as it indexed
its own. The layer then attends as ``IndexedAttention``'s fast form does (``gathered``): each query over its chosen
latents alone. Its state is a plain latent (``LatentAttention``'s: no indexer keys to keep).

Shapes: B = batch, T = tokens, K = keys chosen a query.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn

from attnlab.cache import Cache, LayerState
from attnlab.cache.indexed import index_width
from attnlab.functional.mods import MaskMod, ScoreMod
from attnlab.functional.selection import Selection, check_selectable
from attnlab.functional.visibility import Visibility
from attnlab.nn.attention import ForwardArgs, SharedKV
from attnlab.nn.indexed import IndexedAttention
from attnlab.nn.latent import LatentAttention


class SharedIndexAttention(IndexedAttention):
    """An indexed layer without an indexer (``IndexedAttention``'s arguments; its indexer's are dropped): its
    queries read the keys its source chose in the same call (:func:`link_indexers` names the source)."""

    def __init__(self, **indexed: object) -> None:
        super().__init__(**indexed)  # type: ignore[arg-type]  # IndexedAttention's keywords, checked there
        del self.indexer  # GLM-5's shared layer has none: nothing of it in the checkpoint
        self.source: tuple[IndexedAttention, ...] = ()  # a tuple: the source is not a submodule of this layer

    def layer_state(self) -> LayerState:
        """A plain latent a token: no indexer keys."""
        return LatentAttention.layer_state(self)

    def choice(self, batch: int, tokens: int) -> Selection:
        """The source's choice for this call's (B, T) queries: refused where no source ran this call's tokens."""
        if not self.source:
            raise ValueError(
                "a shared indexer layer reads an earlier layer's choice: link it to one (link_indexers, which a GPT "
                "runs on its layers); alone it has none"
            )
        chosen = self.source[0].chosen
        if chosen is None or tuple(chosen.indices.shape[:2]) != (batch, tokens):
            raise ValueError(
                f"a shared indexer layer reads its source layer's choice for the same {batch} x {tokens} queries: "
                "run the whole model (its source runs first in each call), not this layer alone"
            )
        return chosen

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cache: Cache | None = None,
        document_ids: torch.Tensor | None = None,
        mask_mod: MaskMod | None = None,
        score_mod: ScoreMod | None = None,
        visibility: Visibility | None = None,
        shared: dict[int | None, SharedKV] | None = None,
    ) -> torch.Tensor:
        """Each query over the keys its source chose (the fast form), after a latent cache's keys; refused
        before anything is written where there is no choice or the cache keeps indexer keys."""
        if shared is not None:
            raise ValueError("an indexed layer keeps its own latents; KV sharing (shared=) is for softmax layers")
        given = ForwardArgs(mask, positions, cache, document_ids, mask_mod, score_mod, visibility)
        visibility, positions = self._prepare(x, given)
        check_selectable(visibility)
        if cache is not None and index_width(cache) is not None:
            raise TypeError("a shared indexer layer keeps plain latents: build its cache from its layer_state()")
        selection = self.choice(x.shape[0], x.shape[1])
        q_latent = self.query_latent(x)
        q_nope, q_pe, latents = self.project(x, positions, q_latent=q_latent)
        vis = visibility
        if cache is not None:
            latents, _, key_pos = cache.update(latents, latents[..., : self.kv_lora_rank])
            vis = visibility.for_keys(key_pos)
        return self.gathered(q_nope, q_pe, latents, selection, vis)

    def extra_repr(self) -> str:
        return f"{LatentAttention.extra_repr(self)}, index_topk={self.index_topk}, shared indexer"


def link_indexers(layers: Sequence[nn.Module]) -> None:
    """Give each shared layer among ``layers`` (a model's attention modules, in order) its source: the nearest
    earlier layer with an indexer of its own. Refused where a shared layer has none before it."""
    source: IndexedAttention | None = None
    for n, layer in enumerate(layers):
        if isinstance(layer, SharedIndexAttention):
            if source is None:
                raise ValueError(f"layer {n} reads an earlier layer's indexer choice, and no layer before it has one")
            layer.source = (source,)
        elif isinstance(layer, IndexedAttention):
            source = layer
