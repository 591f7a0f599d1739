"""``StateCache``: what a recurrent layer (linear attention, the gated delta rule) keeps between calls.

A softmax layer's cache grows by a key and a value per token. A recurrent layer keeps one state of fixed size
whatever the length (``attnlab.functional.recurrent``): per head a (Dk, Dv) matrix, and for linear attention a
(Dk,) normalizer beside it; a layer with a short causal convolution before its recurrence (Qwen3.5's Gated
DeltaNet) also keeps the convolution's last K - 1 inputs per channel (``attnlab.functional.convolution``). This
cache holds those tensors and the number of tokens read into them, so the layer's positions and the model's
decode loop see the same ``next_positions`` as from any other cache.

Going back (speculative decoding): the state after each token is not kept, so :meth:`StateCache.mark` keeps a
copy of the state at the start of a pass of guesses, and a refused guess sends the state back to that mark
(:meth:`reach` answers the mark; :meth:`crop` restores it bitwise). The decode loop then runs the guesses the model
kept again in its next pass, beside its new ones: a pass whose guesses are all kept goes back nowhere. The mark
costs one copy of the state, whatever the length. ``ConvolutionCache`` goes back the same way.

Shapes: B = batch, H = heads, Dk = key size, Dv = value size, C = convolved channels, K = kernel size.
"""

from __future__ import annotations

import torch

from attnlab.cache.base import Capabilities, LayerCache


class _Marks(LayerCache):
    """Going back to a mark: a copy of every buffer and the length at the start of a pass of guesses."""

    capabilities = Capabilities(crop=True, marks=True)
    keeps_its_own = True  # whatever cache is named; it runs on past any length
    _length: torch.Tensor
    _marked: list[torch.Tensor] | None = None  # the copy, made at the first mark (not buffers: never saved)
    _marked_length: int | None = None

    def _kept(self) -> list[torch.Tensor]:
        """The tensors a mark copies (the length beside them)."""
        raise NotImplementedError

    def mark(self) -> None:
        """Keep a copy of the state here (allocated at the first mark: one more state's bytes)."""
        marked = self._marked
        if marked is None:
            self._marked = [t.clone() for t in self._kept()]
            self._marked_length = int(self._length)
            return
        for copy, now in zip(marked, self._kept(), strict=True):
            copy.copy_(now)
        self._marked_length = int(self._length)

    def reach(self, n: int) -> int:
        """``n`` when it is every token read; else the mark, if ``n`` is at or after it (the tokens between run
        again); else refused."""
        length = int(self._length)
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= length:
            raise ValueError(f"crop(n) needs 0 <= n <= length ({length}), got {n!r}")
        if n == length:
            return n
        marked = self._marked_length
        if marked is None or not marked <= n:
            raise ValueError(
                f"a {type(self).__name__} keeps no state before its latest {length - (marked or 0)} tokens"
                + ("" if marked is None else f" (its mark is at {marked})")
                + f": it cannot go back to {n}; mark() before a pass whose tokens may be refused"
            )
        return marked

    def crop(self, n: int) -> None:
        """Go back to ``reach(n)`` tokens: the state there, bitwise (its mark's copy)."""
        to = self.reach(n)
        if to == int(self._length):
            return
        for now, copy in zip(self._kept(), self._marked or [], strict=True):
            now.copy_(copy)
        self._length.fill_(to)

    def marked_nbytes(self) -> int:
        """Bytes the mark's copy holds (0 before the first mark): what going back costs."""
        return sum(t.numel() * t.element_size() for t in self._marked or [])

    _before: list[torch.Tensor] | None = None  # the state when a pass began, copied at its first write
    _armed: bool = False

    def begin(self) -> bool:
        """A pass starts: the first write copies the state it replaces, for :meth:`undo` (one copy of the state a
        call, as a write is)."""
        self._armed, self._before = True, None
        return True

    def _keep_before(self) -> None:
        """Called by a write before it changes anything."""
        if self._armed and self._before is None:
            self._before = [t.clone() for t in (*self._kept(), self._length)]

    def undo(self) -> None:
        if self._before is not None:  # it wrote in the pass
            for now, then in zip((*self._kept(), self._length), self._before, strict=True):
                now.copy_(then)
        self.commit()

    def commit(self) -> None:
        self._armed, self._before = False, None


class StateCache(_Marks):
    """The recurrent state of one layer: (B, H, Dk, Dv), with a normalizer (B, H, Dk) when ``normalizer`` and the
    convolution's inputs (B, C, K - 1) when ``conv`` is (C, K - 1)."""

    def __init__(
        self,
        *,
        batch_size: int,
        num_heads: int,
        key_dim: int,
        value_dim: int,
        normalizer: bool = False,
        conv: tuple[int, int] | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(batch_size=batch_size, num_kv_heads=num_heads, head_dim=key_dim, dtype=dtype)
        self.value_dim = value_dim
        shape = (batch_size, num_heads, key_dim, value_dim)
        self.register_buffer("matrix", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer(
            "normalizer",
            torch.zeros(shape[:3] if normalizer else (0,), dtype=dtype, device=device),
            persistent=False,
        )
        conv_shape = (batch_size, *conv) if conv is not None else (0,)
        self.register_buffer("conv", torch.zeros(conv_shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("_length", torch.zeros((), dtype=torch.long, device=device), persistent=False)
        self.matrix: torch.Tensor
        self.normalizer: torch.Tensor
        self.conv: torch.Tensor
        self._length: torch.Tensor
        self.has_normalizer, self.has_conv = normalizer, conv is not None

    @property
    def length(self) -> int:
        """Tokens read into the state."""
        return int(self._length)

    def _kept(self) -> list[torch.Tensor]:
        return [self.matrix, self.normalizer, self.conv]

    def next_positions(self, t: int) -> torch.Tensor:
        return self._length + torch.arange(t, device=self.matrix.device)

    def state(self) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None:
        """What the layer continues from: None before any token; the matrix (and normalizer) after."""
        if self.length == 0:
            return None
        return (self.matrix, self.normalizer) if self.has_normalizer else self.matrix

    def conv_state(self) -> torch.Tensor | None:
        """The convolution's last inputs to continue from: None before any token (zeros, as a padded convolution
        has them)."""
        return self.conv if self.length and self.has_conv else None

    def write(
        self, state: torch.Tensor | tuple[torch.Tensor, torch.Tensor], tokens: int, *, conv: torch.Tensor | None = None
    ) -> None:
        """Keep the state (and the convolution's inputs) after ``tokens`` more tokens; checked whole before anything
        is written."""
        matrix, normalizer = state if isinstance(state, tuple) else (state, None)
        if (conv is None) == self.has_conv or (conv is not None and tuple(conv.shape) != tuple(self.conv.shape)):
            raise ValueError(
                f"this state cache holds {'a ' + str(tuple(self.conv.shape)) if self.has_conv else 'no'} convolution "
                f"state; got {None if conv is None else tuple(conv.shape)}: build it from the layer's layer_state()"
            )
        if tuple(matrix.shape) != tuple(self.matrix.shape) or (normalizer is None) == self.has_normalizer:
            raise ValueError(
                f"this state cache holds a {tuple(self.matrix.shape)} state"
                + (f" and a {tuple(self.normalizer.shape)} normalizer" if self.has_normalizer else "")
                + f"; got {tuple(matrix.shape)}"
                + ("" if normalizer is None else f" and {tuple(normalizer.shape)}")
                + ": build it from the layer's layer_state() (ModelCache.build)"
            )
        if torch.is_grad_enabled() and matrix.requires_grad:
            raise ValueError(
                "the state requires grad, but a cache is for inference: decode under torch.no_grad() (or "
                "torch.inference_mode()); train without a cache"
            )
        self._keep_before()
        self.matrix.copy_(matrix)
        if normalizer is not None:
            self.normalizer.copy_(normalizer)
        if conv is not None:
            self.conv.copy_(conv)
        self._length += tokens

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise TypeError(
            "a StateCache keeps a recurrent layer's state, not keys and values: give it to a LinearAttention or "
            "GatedDeltaNet layer (a softmax Attention needs a KV cache)"
        )

    def nbytes(self) -> int:
        """Bytes held: the same after 10 tokens as after 100,000."""
        return sum(t.numel() * t.element_size() for t in (self.matrix, self.normalizer, self.conv))


class ConvolutionCache(_Marks):
    """What a layer of short convolutions alone keeps (LFM's "conv" layers): the convolution's last K - 1 inputs,
    (B, C, K - 1), and the tokens read, whatever the length. It goes back to a mark, as a StateCache does."""

    def __init__(
        self,
        *,
        batch_size: int,
        channels: int,
        kernel: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(batch_size=batch_size, num_kv_heads=1, head_dim=channels, dtype=dtype)
        shape = (batch_size, channels, kernel - 1)
        self.register_buffer("conv", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("_length", torch.zeros((), dtype=torch.long, device=device), persistent=False)
        self.conv: torch.Tensor
        self._length: torch.Tensor

    @property
    def length(self) -> int:
        """Tokens read."""
        return int(self._length)

    def _kept(self) -> list[torch.Tensor]:
        return [self.conv]

    def next_positions(self, t: int) -> torch.Tensor:
        return self._length + torch.arange(t, device=self.conv.device)

    def conv_state(self) -> torch.Tensor | None:
        """The last inputs to continue from: None before any token (zeros, as a padded convolution has them)."""
        return self.conv if self.length else None

    def write(self, conv: torch.Tensor, tokens: int) -> None:
        """Keep the convolution's last inputs after ``tokens`` more tokens; checked before anything is written."""
        if tuple(conv.shape) != tuple(self.conv.shape):
            raise ValueError(
                f"this convolution cache holds {tuple(self.conv.shape)} inputs, got {tuple(conv.shape)}: build it "
                "from the layer's layer_state() (ModelCache.build)"
            )
        if torch.is_grad_enabled() and conv.requires_grad:
            raise ValueError(
                "the convolution's inputs require grad: decode under torch.no_grad(); train without a cache"
            )
        self._keep_before()
        self.conv.copy_(conv)
        self._length += tokens

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise TypeError(
            "a ConvolutionCache keeps a convolution layer's last inputs, not keys and values: give it to a "
            "GatedShortConvolution layer (a softmax Attention needs a KV cache)"
        )

    def nbytes(self) -> int:
        """Bytes held: the same after 10 tokens as after 100,000."""
        return self.conv.numel() * self.conv.element_size()
