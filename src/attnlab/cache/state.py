"""``StateCache``: what a recurrent layer (linear attention, the gated delta rule) keeps between calls.

A softmax layer's cache grows by a key and a value per token. A recurrent layer keeps one state of fixed size
whatever the length (``attnlab.functional.recurrent``): per head a (Dk, Dv) matrix, and for linear attention a
(Dk,) normalizer beside it; a layer with a short causal convolution before its recurrence (Qwen3.5's Gated
DeltaNet) also keeps the convolution's last K - 1 inputs per channel (``attnlab.functional.convolution``). This
cache holds those tensors and the number of tokens read into them, so the layer's positions and the model's
decode loop see the same ``next_positions`` as from any other cache.

Going back (speculative decoding, ``attnlab.cache.going_back``): ``going_back="each"`` (the default) keeps, from
a :meth:`~StateCache.mark` to the next crop, the state after each token of the pass, so :meth:`~StateCache.crop`
goes back to any of them, nothing run again; ``"mark"`` keeps the state at the mark alone, and the decode loop
runs the kept guesses again. A plain decode marks nothing and keeps nothing more.

Shapes: B = batch, H = heads, Dk = key size, Dv = value size, C = convolved channels, K = kernel size, T = the
tokens of one write.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from attnlab.cache.going_back import ToEach, ToMark, check_spare, check_way


class StateCache(ToEach):
    """The recurrent state of one layer: (B, H, Dk, Dv), with a normalizer (B, H, Dk) when ``normalizer`` and the
    convolution's inputs (B, C, K - 1) when ``conv`` is (C, K - 1). ``going_back``: "each" (the default) or
    "mark" (``attnlab.cache.going_back``); ``spare``: with "each", the most tokens a pass goes back by (the states
    after a write's last ``spare`` tokens are kept; None: after every token of the pass)."""

    ways: ClassVar[dict[str, type[StateCache]]]  # going_back -> the class that goes back so (set below)

    def __new__(cls, *args: Any, going_back: str | None = None, **kwargs: Any) -> StateCache:
        """The class of the way ``going_back`` names (None: ``cls``'s own), checked before anything is made: the
        way is declared by the class (``capabilities.marks``), which ``ModelCache`` reads."""
        if going_back is not None:
            check_way(going_back)
        made: StateCache = super().__new__(cls if going_back is None else cls.ways[going_back])
        return made

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
        going_back: str | None = None,
        spare: int | None = None,
    ) -> None:
        super().__init__(batch_size=batch_size, num_kv_heads=num_heads, head_dim=key_dim, dtype=dtype)
        self.spare = check_spare(spare)
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
        is written. While a pass is open (:attr:`each`) the layer writes with :meth:`write_each` instead."""
        self._refuse_write(each=False)
        self._write(state, tokens, conv=conv)

    def write_each(
        self,
        states: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        tokens: int,
        *,
        inputs: torch.Tensor | None = None,
    ) -> None:
        """Keep the states after the last M = ``each_tokens(tokens)`` of ``tokens`` more tokens, a pass being open
        (:attr:`each`): ``states`` (B, H, M, Dk, Dv), with the normalizer's (B, H, M, Dk) beside it (a tuple); and
        the convolution's K - 1 + T inputs (B, C, K - 1 + T), whose slice [t : t + K - 1] is its state after token
        t. The last of each is written."""
        self._refuse_write(each=True)
        matrices, norms = states if isinstance(states, tuple) else (states, None)
        last = self.each_tokens(tokens)
        want = (*self.matrix.shape[:2], last, *self.matrix.shape[2:])  # (B, H, M, Dk, Dv)
        if tuple(matrices.shape) != want or (norms is not None and tuple(norms.shape) != want[:4]):
            got = [tuple(t.shape) for t in (matrices, norms) if t is not None]
            raise ValueError(f"the states after the last {last} tokens must be {want} (and {want[:4]}), got {got}")
        held = (*self.conv.shape[:2], self.conv.shape[-1] + tokens) if self.has_conv else None  # (B, C, K - 1 + T)
        if (inputs is None) != (held is None) or (inputs is not None and tuple(inputs.shape) != held):
            given = None if inputs is None else tuple(inputs.shape)
            raise ValueError(f"the convolution's inputs of {tokens} tokens must be {held}, got {given}")
        final = matrices[:, :, -1] if norms is None else (matrices[:, :, -1], norms[:, :, -1])
        self._write(final, tokens, conv=None if inputs is None else inputs[:, :, tokens:])
        none = self.matrix.new_zeros(0)
        kept = none if inputs is None else _last_inputs(inputs, tokens, last)
        self._keep(tokens, [matrices, none if norms is None else norms, kept])

    def _at(self, states: list[torch.Tensor], t: int) -> list[torch.Tensor]:
        matrices, norms, inputs = states
        held = self.conv.shape[-1] if self.has_conv else 0  # K - 1
        return [
            matrices[:, :, t - 1],
            norms[:, :, t - 1] if self.has_normalizer else self.normalizer,
            inputs[:, :, t : t + held] if self.has_conv else self.conv,
        ]

    def _write(
        self, state: torch.Tensor | tuple[torch.Tensor, torch.Tensor], tokens: int, *, conv: torch.Tensor | None
    ) -> None:
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


class ConvolutionCache(ToEach):
    """What a layer of short convolutions alone keeps (LFM's "conv" layers): the convolution's last K - 1 inputs,
    (B, C, K - 1), and the tokens read, whatever the length. It goes back as a StateCache does (``going_back``)."""

    ways: ClassVar[dict[str, type[ConvolutionCache]]]  # going_back -> the class that goes back so (set below)

    def __new__(cls, *args: Any, going_back: str | None = None, **kwargs: Any) -> ConvolutionCache:
        """The class of the way ``going_back`` names (None: ``cls``'s own), as :meth:`StateCache.__new__`."""
        if going_back is not None:
            check_way(going_back)
        made: ConvolutionCache = super().__new__(cls if going_back is None else cls.ways[going_back])
        return made

    def __init__(
        self,
        *,
        batch_size: int,
        channels: int,
        kernel: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        going_back: str | None = None,
        spare: int | None = None,
    ) -> None:
        super().__init__(batch_size=batch_size, num_kv_heads=1, head_dim=channels, dtype=dtype)
        self.spare = check_spare(spare)
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
        """Keep the convolution's last inputs after ``tokens`` more tokens; checked before anything is written.
        While a pass is open (:attr:`each`) the layer writes with :meth:`write_each` instead."""
        self._refuse_write(each=False)
        self._write(conv, tokens)

    def write_each(self, inputs: torch.Tensor, tokens: int) -> None:
        """Keep the K - 1 + T inputs (B, C, K - 1 + T) of ``tokens`` more tokens, a pass being open: the state after
        token t is their slice [t : t + K - 1] (of the last ``each_tokens(tokens)``: those kept), the last written."""
        self._refuse_write(each=True)
        want = (*self.conv.shape[:2], self.conv.shape[2] + tokens)
        if tuple(inputs.shape) != want:
            raise ValueError(
                f"the inputs of {tokens} tokens must be (B, C, K - 1 + T) = {want}, got {tuple(inputs.shape)}"
            )
        self._write(inputs[:, :, tokens:], tokens)
        self._keep(tokens, [_last_inputs(inputs, tokens, self.each_tokens(tokens))])

    def _at(self, states: list[torch.Tensor], t: int) -> list[torch.Tensor]:
        return [states[0][:, :, t : t + self.conv.shape[-1]]]

    def _write(self, conv: torch.Tensor, tokens: int) -> None:
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


def _last_inputs(inputs: torch.Tensor, tokens: int, last: int) -> torch.Tensor:
    """The K - 1 + M inputs (B, C, K - 1 + M) that give the states after the last M of ``tokens``: copied out of
    the call's (B, C, K - 1 + T) where M < T, so a long prompt's are let go."""
    return inputs if last == tokens else inputs[:, :, tokens - last :].clone()


class _StateCacheToMark(ToMark, StateCache):
    """A StateCache that goes back to its mark alone (``going_back="mark"``)."""


class _ConvolutionCacheToMark(ToMark, ConvolutionCache):
    """A ConvolutionCache that goes back to its mark alone (``going_back="mark"``)."""


StateCache.ways = {"each": StateCache, "mark": _StateCacheToMark}
ConvolutionCache.ways = {"each": ConvolutionCache, "mark": _ConvolutionCacheToMark}
