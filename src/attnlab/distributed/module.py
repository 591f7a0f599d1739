"""``ContextParallelAttention``: ``attnlab.Attention`` on a sequence sharded over a process group.

The module is the same (its weights, RoPE, GQA, window); only the attention
step becomes ``ring_attention``, and RoPE rotates each token by its global
position, so a model built from it computes what one process computes on the
whole sequence. Its input is this rank's shard, (B, T / P, d_in), in the
group's layout (``shard_sequence``). A subclass rather than a flag on every
call: the floors keep ``nn`` below ``distributed``.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.distributed.collectives import LAYOUTS, Layout, _world, every_rank, gather_sequence, sequence_positions
from attnlab.distributed.ring import ring_attention
from attnlab.functional.mods import (
    and_masks,
    check_document_ids,
    document,
    document_positions,
    mod_name,
    sees_future,
)
from attnlab.functional.visibility import Visibility
from attnlab.nn.attention import Attention, ForwardArgs


class ContextParallelAttention(Attention):
    """``Attention(**kwargs)`` whose sequence is split over ``group`` (default: the whole world).

    ``seq_len``: the real global length, when the shards were padded to a multiple of the chunks.
    Called on this rank's shard x (B, T / P, d_in), it returns (B, T / P, d_out), with RoPE at the shard's
    global positions. ``document_ids``: this rank's shard (B, T / P) of the packed documents' ids
    (``shard_sequence(ids, 1)``): no token sees another document, and RoPE restarts at each document, as in
    ``Attention``. ``mask_mod`` / ``score_mod`` see global positions, as in ``ring_attention``. No mask,
    cache or visibility: the ring builds its own per block.
    """

    def __init__(
        self, *, group: Any = None, layout: Layout = "zigzag", seq_len: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if self.dropout > 0:
            raise ValueError(
                f"ring attention has no dropout on the weights; build it with dropout=0.0, got {self.dropout}"
            )
        self.group, self.layout, self.seq_len = group, layout, seq_len

    @classmethod
    def from_attention(cls, module: Attention, **options: Any) -> ContextParallelAttention:
        """The same weights and settings as ``module`` (whatever it was built with), attending over the ring.

        The ring has no dropout on the weights, so the copy has none (``dropout=0.0``), as it never had.
        """
        if not isinstance(module, Attention):
            raise ValueError(
                f"ContextParallelAttention copies an attnlab.Attention; {type(module).__name__} (a recurrent layer) "
                "carries a state along the sequence, not keys for a ring: run it in one process"
            )
        if not module.settings:  # LatentAttention builds no fused projection for the ring to copy
            raise ValueError(
                f"ContextParallelAttention copies an attnlab.Attention; {type(module).__name__} (latent attention) "
                "does not run on the ring yet: run it in one process"
            )
        made = cls(**{**module.settings, "dropout": 0.0, **options})
        made.load_state_dict(module.state_dict())
        return made.to(next(module.parameters()).dtype)

    def _prepare(self, x: torch.Tensor, given: ForwardArgs) -> tuple[Visibility, torch.Tensor]:
        """Checked on every rank (a collective where ranks could disagree): this shard's queries at their global
        positions with the call's restrictions, and the RoPE positions (global, or each document's from 0)."""
        if self.sinks is not None:  # the ring merges blocks by lse, but does not count a sink in it
            raise ValueError(
                "ContextParallelAttention does not take learned sinks (gpt-oss) yet: its ring would drop them "
                "silently; run the layer in one process"
            )
        if self.normalize != "softmax":  # the ring merges softmax blocks by lse; sigmoid rows have none
            raise ValueError(
                "ContextParallelAttention runs softmax attention only: run sigmoid attention in one process"
            )
        if given.mask is not None or given.cache is not None or given.visibility is not None:
            raise ValueError(
                "ContextParallelAttention takes no mask, cache or visibility (the ring builds its own per block): "
                "hide other documents "
                "with document_ids, or call ring_attention(..., mask_mod=) for any other mask"
            )
        if given.mask_mod is not None and sees_future(given.mask_mod) and self.is_causal:
            raise ValueError(
                f"mask_mod {mod_name(given.mask_mod)} shows queries keys after them, but the ring keeps this layer's "
                "causal rule in every block and a mask_mod only restricts it (the two are ANDed): the mod cannot "
                "widen it. Run the layer in one process (Attention(...)(x, mask_mod=...) on a forward without a "
                "cache, where it takes the causal rule's place), or pass a mod that only restricts"
            )
        self._check_input(x)
        rank, size = _world(self.group)
        b, t, _ = x.shape
        document_ids, positions, mask_mod = given.document_ids, given.positions, given.mask_mod
        given_ids = every_rank(document_ids is not None, self.group, x.device)  # all agree, or all raise
        if any(given_ids) and not all(given_ids):
            raise ValueError(
                "document_ids must be given on every rank or on none; ranks "
                f"{[r for r, g in enumerate(given_ids) if not g]} gave None and ranks "
                f"{[r for r, g in enumerate(given_ids) if g]} did not"
            )
        local = sequence_positions(t * size, rank, size, self.layout, x.device)  # (T / P,) global
        if document_ids is not None:
            fits = isinstance(document_ids, torch.Tensor) and tuple(document_ids.shape) == (b, t)
            wrong = [
                r for r, ok in enumerate(every_rank(fits, self.group, x.device)) if not ok
            ]  # all raise, none waits
            if wrong:
                got = tuple(document_ids.shape) if isinstance(document_ids, torch.Tensor) else document_ids
                raise ValueError(
                    f"document_ids must be each rank's shard, shape (batch, local tokens) = {(b, t)} here; "
                    f"ranks {wrong} gave another (this rank: {got!r:.60})"
                )
            whole = gather_sequence(document_ids, 1, length=t * size, group=self.group, layout=self.layout)
            check_document_ids(whole[:, : self.seq_len or t * size], b, self.seq_len or t * size)  # not the padding
            packed = document(whole)  # (B, T) ids, read at global positions
            mask_mod = packed if mask_mod is None else and_masks(packed, mask_mod)
            if positions is None:
                positions = document_positions(whole)[:, local]  # (B, T / P): each document starts at 0
        if positions is None:
            positions = local
        else:
            self._check_positions(positions, b, t)
        visibility = Visibility(  # what attend() reads of it: the mods; the ring binds its own per block
            q_pos=local,
            causal=self.is_causal,
            window=self.window,
            mask_mod=mask_mod,
            score_mod=given.score_mod,
            batch=b,
            heads=self.num_heads,
        )
        return visibility, positions

    def attend(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        *,
        visibility: Visibility,
        gate: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Ring attention and out_proj on this rank's projected, rotated q (B, H, T / P, D), k, v (B, Hkv, T / P, D);
        ``gate``: the output gate's openings for this rank's own tokens, as in one process."""
        context_vec = ring_attention(  # (B, H, T / P, D): who may attend is worked out per block on the ring
            queries,
            keys,
            values,
            mask_mod=visibility.mask_mod,
            score_mod=visibility.score_mod,
            group=self.group,
            is_causal=self.is_causal,
            window=self.window,
            scale=self.scale,
            layout=self.layout,
            seq_len=self.seq_len,
        )
        return self.merge_heads(context_vec, gate=gate)
