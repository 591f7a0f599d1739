"""What ``attnlab.Attention`` checks of a call before anything is projected or written: who may attend (the
call's Visibility, :meth:`CallChecks.visibility_for`), what the backend and the cache can take, the positions and
the input. A model builds one Visibility a call and every layer of a kind shares it; each layer's module checks
it here before its cache is written, so a refused call leaves every cache as it was.

Shapes: B = batch, T = tokens, H = query heads, D = head_dim.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from attnlab.cache import Cache
from attnlab.functional.attention import check_mask
from attnlab.functional.mods import (
    MaskMod,
    ScoreMod,
    and_masks,
    check_document_ids,
    document,
    lookback,
    mod_name,
    sees_future,
)
from attnlab.functional.registry import KERNELS, Backend, resolve
from attnlab.functional.sdpa import check_sdpa
from attnlab.functional.visibility import Visibility
from attnlab.observe import is_recording

_CACHE_CLASSES: set[type] = set()  # classes that passed the Cache protocol check


class CallChecks(nn.Module):
    """The checks of one call of an attention module (``Attention`` and the modules built on it)."""

    d_in: int
    num_heads: int
    is_causal: bool
    window: int | None
    dropout: float
    backend: Backend
    sinks: nn.Parameter | None

    @property
    def dtype(self) -> torch.dtype:
        raise NotImplementedError  # the module's: its weights'

    def visibility_for(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        document_ids: torch.Tensor | None = None,
        mask_mod: MaskMod | None = None,
        score_mod: ScoreMod | None = None,
    ) -> Visibility:
        """Who may attend in a call on x (B, T, ..): this module's causal and window, and everything given.

        Without a cache: queries and keys at 0..T-1. With one: queries at ``cache.next_positions(T)`` and the
        keys bound later to what ``cache.update`` returns (``Visibility.for_keys``); a mask's columns are
        positions. Checked here, before anything is written.
        """
        b, t = x.shape[0], x.shape[1]
        causal, window = self.is_causal, self.window
        if mask_mod is not None and sees_future(mask_mod) and self.is_causal:
            if cache is not None:
                raise ValueError(
                    f"mask_mod {mod_name(mask_mod)} shows queries keys after them, which a causal model's cache "
                    "never holds when they ask (its keys arrive one call at a time): such a mod takes the causal "
                    "rule's place on a forward over the whole prompt without a cache; run that one without caches"
                )
            # it takes the causal rule's place; a sliding layer still reaches only `window` positions back
            causal, window = False, None
            mask_mod = mask_mod if self.window is None else and_masks(mask_mod, lookback(self.window))
        if document_ids is not None:
            if cache is not None:
                raise ValueError(
                    "document_ids pack documents for training or a prefill without a cache; pass one or the other"
                )
            check_document_ids(document_ids, b, t)
            packed = document(document_ids)
            mask_mod = packed if mask_mod is None else and_masks(packed, mask_mod)
        if mask is not None:
            keys = t if cache is None else self._keys_seen(cache.next_positions(t), mask)
            check_mask(mask, (b, self.num_heads, t, keys), x.device)
            mask = mask if mask.dtype == torch.bool else mask.to(x.dtype)
        restrictions: dict[str, Any] = dict(
            causal=causal,
            window=window,
            mask=mask,
            mask_mod=mask_mod,
            score_mod=score_mod,
            batch=b,
            heads=self.num_heads,
        )
        if cache is None:
            return Visibility.from_lengths(t, t, device=x.device, **restrictions)
        # queries at the cache's next positions; the keys are bound to the positions update() returns
        made = Visibility(q_pos=cache.next_positions(t), **restrictions)
        self.check_before_write(made)
        return made

    def check_before_write(self, visibility: Visibility) -> None:
        """What attention would refuse once the cache holds this call's keys, refused before it is written: the
        mods evaluated on every pair the call may ask (kept: once per Visibility, however many layers share it),
        and what the backend cannot take."""
        if visibility.k_pos is not None:
            raise ValueError(
                "this Visibility already has its key positions, and a cache returns them: build it with "
                "visibility_for(x, cache=cache)"
            )
        visibility.check_mods()
        if self.sinks is not None:  # as attention() resolves a call with learned sinks
            name, _ = resolve("flash" if self.backend == "auto" and not is_recording() else self.backend)
            if not KERNELS[name].has_lse:
                raise ValueError(
                    f"learned sinks are read off each row's log-sum-exp, which the {name} backend does not return: "
                    "use backend='flash' or 'eager' (or 'auto')"
                )
        else:
            name, _ = resolve(self.backend, vis=visibility)
        if name == "sdpa":
            check_sdpa(visibility)
        if name == "flex" and self.training and self.dropout > 0:
            raise ValueError("backend='flex' has no dropout (FlexAttention has none): call model.eval() or use 'flash'")
        if visibility.bias is not None and visibility.bias.requires_grad and not KERNELS[name].float_mask_grad:
            raise ValueError(
                f"the {name} backend treats float masks as constants; for a mask that needs gradients "
                "use backend='eager' or 'sdpa'"
            )

    @staticmethod
    def _keys_seen(query_pos: torch.Tensor, mask: object) -> int:
        """Cached + new tokens: the width a mask over positions must have.

        Compiled (no sync) or with no new token, the mask's own width is taken as given.
        """
        if torch.compiler.is_compiling() or query_pos.numel() == 0:
            return mask.shape[-1] if isinstance(mask, torch.Tensor) and mask.dim() else 1
        return int(query_pos.max()) + 1

    def _check_cache(self, cache: object) -> None:
        # a runtime Protocol check inspects the class each time (~40 us): a class that passed once is known
        if type(cache) not in _CACHE_CLASSES and not isinstance(cache, Cache):
            raise TypeError(
                f"cache must provide next_positions(t) and update(k, v) (attnlab.cache.Cache), "
                f"got {type(cache).__name__}; build one from layer_state() with attnlab.cache.ModelCache.build"
            )
        held = getattr(cache, "window", None)  # a cache that forgets keys older than its window
        if held is not None and (self.window is None or held < self.window):
            raise ValueError(
                f"this cache keeps only the last {held} positions, but Attention(window={self.window}) "
                "needs more; build the matching cache from layer_state() (attnlab.cache.ModelCache.build)"
            )
        _CACHE_CLASSES.add(type(cache))

    def _check_positions(self, positions: object, b: int, t: int) -> None:
        if not isinstance(positions, torch.Tensor):
            raise TypeError(f"positions must be an integer tensor (T,) or (B, T), got {type(positions).__name__}")
        if positions.dim() not in (1, 2) or positions.shape[-1] != t:
            raise ValueError(f"positions must be (T,) or (B, T) with T={t}, got shape {tuple(positions.shape)}")
        if positions.dim() == 2 and positions.shape[0] not in (1, b):
            raise ValueError(
                f"positions are for a batch of {positions.shape[0]} but the input has batch {b}; "
                f"give (T,) positions shared by all, or ({b}, {t})"
            )

    def _check_input(self, x: object) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor (batch, tokens, d_in), got {type(x).__name__}")
        if x.dim() != 3:
            hint = "; for one sequence use x.unsqueeze(0)" if x.dim() == 2 else ""
            raise ValueError(f"expected input (batch, tokens, d_in) with 3 dims, got shape {tuple(x.shape)}{hint}")
        if x.shape[-1] != self.d_in:
            raise ValueError(
                f"the last dimension of the input must be d_in={self.d_in}, got {x.shape[-1]} (shape {tuple(x.shape)})"
            )
        if x.dtype != self.dtype:
            raise TypeError(
                f"input dtype {x.dtype} differs from the module's {self.dtype}; "
                f"use x.to({self.dtype}) or module.to({x.dtype})"
            )
