"""What every layer's cache shares: the protocol Attention speaks, declared capabilities, one set of checks.

A cache declares what it can do in :class:`Capabilities` (a class attribute,
never discovered by looking for a method): whether it can be cropped back
(speculative decoding), whether its sequences come and go on their own
(paged blocks), whether generation may run past the model's context (a sink
cache with rotary positions), whether a prompt may start from blocks an
earlier one filled (a prefix cache), and whether it weighs the attention its keys
get (an evicting cache: Attention then calls :meth:`LayerCache.observe`).
``attnlab.cache.ModelCache`` combines its layers' capabilities once, when
generation is planned.

:meth:`LayerCache.check` is the one check of keys and values every cache
runs before it writes anything, in one wording.

Shapes: B = batch, Hkv = kv heads, D = head_dim, T = new tokens, S = slots returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

import torch
import torch.nn as nn

from attnlab._checks import check_positive_int

if TYPE_CHECKING:
    from attnlab.functional.sigmoid import Normalization
    from attnlab.functional.visibility import Visibility


@dataclass(frozen=True)
class Capabilities:
    """What a cache can do; a model's cache can do what every one of its layers can."""

    crop: bool = False  # go back to an earlier token (speculation refuses a cache that cannot): reach, crop
    rows: bool = False  # sequences admitted, run and released on their own (a paged pool)
    past_context: bool = False  # generation may go past context_length (with rotary positions)
    observes: bool = False  # weighs the attention its keys get (Attention calls observe after attending)
    shares_prefixes: bool = False  # a prompt may start from blocks an earlier one filled (admitted one a pass)
    marks: bool = False  # goes back only to a mark (a recurrent state): the loop marks where it may go back

    def __and__(self, other: Capabilities) -> Capabilities:
        return Capabilities(
            crop=self.crop and other.crop,
            rows=self.rows and other.rows,
            past_context=self.past_context and other.past_context,
            observes=self.observes or other.observes,  # not a capability to share: any layer that observes
            shares_prefixes=self.shares_prefixes and other.shares_prefixes,
            marks=self.marks or other.marks,  # not shared either: any layer that goes back only to a mark
        )


@runtime_checkable
class Cache(Protocol):
    """What ``attnlab.Attention`` asks of a layer's cache, and all it asks.

    ``next_positions(t)``: absolute positions (T,) of the next ``t`` tokens,
    or (B, T) for a cache whose sequences have lengths of their own.
    ``update(k, v)``: check k, v (B, Hkv, T, D) and raise before writing
    anything if they do not fit; then store them and return the keys and
    values to attend over, (B, Hkv, S, D), with each one's absolute position
    (S,) or (B, S), -1 for a slot that holds nothing.
    ``capabilities``: what else it can do; ``observe``: called after attending when it ``observes``.
    """

    @property
    def capabilities(self) -> Capabilities: ...

    def next_positions(self, t: int) -> torch.Tensor: ...

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def room(self) -> int | None: ...

    def observe(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        *,
        visibility: Visibility,
        scale: float | None,
        normalize: Normalization = "softmax",
    ) -> None: ...


class LayerCache(nn.Module):
    """The base of every layer's cache: its shape, checked once, and :meth:`check` for what it is given."""

    capabilities: ClassVar[Capabilities] = Capabilities()
    keeps_its_own: ClassVar[bool] = False  # a window's ring, a recurrent state: kept whatever cache is named
    # why it cannot go back to an earlier token, where it cannot (the refusal of speculative decoding names it)
    why_no_crop: ClassVar[str] = "speculative decoding needs a cache that can (the plain one)"

    def __init__(
        self, *, batch_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, value_dim: int | None = None
    ) -> None:
        super().__init__()
        value_dim = head_dim if value_dim is None else value_dim  # a value head's own size (MiMo-V2-Flash)
        for name, value in (
            ("batch_size", batch_size),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("value_dim", value_dim),
        ):
            check_positive_int(name, value, limit=2**20)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"cache dtype must be a floating-point torch.dtype, got {dtype!r}")
        self.batch_size, self.num_kv_heads, self.head_dim = batch_size, num_kv_heads, head_dim
        self.value_dim = value_dim

    def _held(self) -> torch.Tensor:
        """A tensor of what it holds, whose dtype and device the keys must have (it follows ``.to()``)."""
        return next(self.buffers())

    def check(self, k: torch.Tensor, v: torch.Tensor, *, batch: int | None = None) -> None:
        """Refuse keys/values (``batch`` rows, default every row) that do not fit this cache; writes nothing."""
        batch = self.batch_size if batch is None else batch
        held = self._held()
        for name, t, width, size in (
            ("keys", k, self.head_dim, "head_dim"),
            ("values", v, self.value_dim, "value_dim"),
        ):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name} must be a 4-D tensor (batch, kv_heads, T, head_dim), got {shape}")
            if t.shape[0] != batch:
                raise ValueError(
                    f"this cache was built for batch_size={batch}, got {name} for a batch of {t.shape[0]}; "
                    "a cache holds one batch: build a new cache for this batch"
                )
            if (t.shape[1], t.shape[3]) != (self.num_kv_heads, width):
                raise ValueError(
                    f"this cache holds num_kv_heads={self.num_kv_heads}, {size}={width}; got {name} with "
                    f"{t.shape[1]} heads of {size} {t.shape[3]}; build it from the layer's layer_state() (ModelCache.build)"
                )
            if t.dtype != held.dtype:
                raise TypeError(f"{name} are {t.dtype} but the cache holds {held.dtype}; build it with dtype={t.dtype}")
            if t.device != held.device:
                raise ValueError(
                    f"{name} are on {t.device} but the cache is on {held.device}; use cache.to({t.device})"
                )
            if torch.is_grad_enabled() and t.requires_grad:
                raise ValueError(
                    f"{name} require grad, but a KV cache is for inference: the next step would overwrite what "
                    "backward needs. Decode under torch.no_grad() (or torch.inference_mode()); train without a cache"
                )
        if k.shape[2] != v.shape[2]:
            raise ValueError(f"keys and values must hold the same number of tokens, got {k.shape[2]} and {v.shape[2]}")

    def room(self) -> int | None:
        """How many tokens the next call may bring (None: any number that fits)."""
        return None

    def begin(self) -> bool:
        """A pass starts (``ModelCache.begin``): keep what :meth:`undo` needs to come back here, cheaply (a length;
        what a write overwrites, as it overwrites it). False: this cache cannot come back (its writes reshape what
        it holds), and a model cache that a pass left halfway through it refuses to go on."""
        return False

    def undo(self) -> None:
        """A pass failed before every layer wrote: back to how :meth:`begin` found it, bitwise."""

    def commit(self) -> None:
        """The pass ended whole: what :meth:`begin` kept goes."""

    def touched(self) -> bool:
        """After a failed pass, for a cache that cannot undo: whether it wrote since :meth:`begin` (True unless it
        can tell)."""
        return True

    def mark(self) -> None:
        """A pass whose last tokens may be refused starts here (speculative decoding): a cache that goes back by
        returning to this point remembers it; one that crops to any token needs nothing."""

    def reach(self, n: int) -> int:
        """The most tokens, at most ``n``, this cache can go back to holding exactly (:meth:`crop`): ``n`` for a
        cache that crops to any token; a recurrent state's mark, whose accepted tokens then run again."""
        if not self.capabilities.crop:
            raise ValueError(f"a {type(self).__name__} cannot go back to {n} tokens: {self.why_no_crop}")
        return n

    def crop(self, n: int) -> None:
        raise ValueError(f"a {type(self).__name__} cannot be cropped back to {n} tokens: {self.why_no_crop}")

    def observe(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        *,
        visibility: Visibility,
        scale: float | None,
        normalize: Normalization = "softmax",
    ) -> None:
        """After attention; a cache whose capabilities say ``observes`` weighs its keys here."""
