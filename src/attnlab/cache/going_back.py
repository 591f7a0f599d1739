"""How a state of fixed size goes back to an earlier token (speculative decoding): the two ways of issue 57.

A recurrent state (``StateCache``) or a convolution's last inputs (``ConvolutionCache``) hold what the tokens read
left behind, not the tokens: after a pass of guesses, going back to the state after an earlier token needs that
state kept. :meth:`~_GoingBack.mark` says a pass whose last tokens may be refused starts here, and each way keeps a
copy of the state there; then:

- ``"each"`` (:class:`ToEach`): the layers of that pass hand the cache the state after each of its tokens (the
  recurrence's own states, ``each=True`` in ``attnlab.functional``; the convolution's inputs, whose slices they
  are), so :meth:`~ToEach.crop` goes back to any token since the mark, with nothing run again. The cost: the
  recurrent form for the pass, and T more states a layer while the pass is open (T tokens), let go at the crop.
  Without a mark nothing is kept: a plain decode pays nothing.
- ``"mark"`` (:class:`ToMark`): the mark alone; a refused guess sends the state back to it, and the decode loop
  runs again the tokens kept after it (``capabilities.marks``: it marks just before the last token it holds for
  certain, feeding the ones before on their own). The cost: one copy, and those tokens run twice.

``benchmarks/going_back.py`` measured both; docs/caches.md ("Going back") says which is the default and why.

Shapes: B = batch, T = tokens of the pass (of one write), K = kernel size.
"""

from __future__ import annotations

import torch

from attnlab.cache.base import Capabilities, LayerCache

WAYS = ("each", "mark")  # going_back=: the first is the default


def check_way(going_back: object) -> None:
    if not isinstance(going_back, str) or going_back not in WAYS:
        raise ValueError(
            f"going_back must be one of {list(WAYS)}: 'each' keeps the state after each token of a pass of "
            f"guesses, 'mark' the state at its start (kept tokens run again); got {going_back!r}"
        )


def check_spare(spare: object) -> int | None:
    if spare is not None and (isinstance(spare, bool) or not isinstance(spare, int) or not 0 <= spare <= 2**16):
        raise ValueError(
            f"spare must be None or an int in [0, 65536], the most tokens a pass goes back by; got {spare!r}"
        )
    return spare


class _GoingBack(LayerCache):
    """What both ways share: the length, and a copy of every buffer at the mark (not buffers: never saved)."""

    keeps_its_own = True  # whatever cache is named; it runs on past any length
    going_back: str
    _length: torch.Tensor
    _marked: list[torch.Tensor] | None = None  # allocated at the first mark
    _marked_length: int | None = None
    most_held_back = 0  # the most bytes held at once to go back (marked_nbytes' highest)

    def _kept(self) -> list[torch.Tensor]:
        """The tensors a mark copies (the length beside them)."""
        raise NotImplementedError

    @property
    def each(self) -> bool:
        """True while the state after each token is kept: the layer then writes with :meth:`ToEach.write_each`."""
        return False

    def each_tokens(self, tokens: int) -> int:
        """Of a write of ``tokens``, how many last ones' states are kept (none here)."""
        return 0

    def _refuse_write(self, *, each: bool) -> None:
        """A write of the states after each token while no pass is open, or of the last alone while one is."""
        if each and not self.each:
            raise ValueError(
                f"a {type(self).__name__} (going_back={self.going_back!r}) keeps the states after each token only "
                "while a pass is open (going_back='each', from mark() to crop()): write() the last one"
            )
        if not each and self.each:
            raise ValueError(
                f"a {type(self).__name__} has a pass open since its mark at {self._marked_length}: write_each() "
                "the state after each token (a layer asks cache.each), or crop() to close the pass first"
            )

    def mark(self) -> None:
        """Keep a copy of the state here (allocated at the first mark: one more state's bytes)."""
        if self._marked is None:
            self._marked = [t.clone() for t in self._kept()]
        else:
            for copy, now in zip(self._marked, self._kept(), strict=True):
                copy.copy_(now)
        self._marked_length = int(self._length)
        self.most_held_back = max(self.most_held_back, self.marked_nbytes())

    def _to_mark(self) -> None:
        for now, copy in zip(self._kept(), self._marked or [], strict=True):
            now.copy_(copy)
        assert self._marked_length is not None  # a mark was made: reach said so
        self._length.fill_(self._marked_length)

    def _refuse(self, n: int, since: str) -> ValueError:
        length = int(self._length)
        return ValueError(
            f"a {type(self).__name__} keeps no state before its latest {length - (self._marked_length or 0)} "
            f"tokens{since}: it cannot go back to {n}; mark() before a pass whose tokens may be refused"
        )

    def _check_n(self, n: int) -> int:
        length = int(self._length)
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= length:
            raise ValueError(f"crop(n) needs 0 <= n <= length ({length}), got {n!r}")
        return length

    def marked_nbytes(self) -> int:
        """Bytes held now to go back (the mark's copy; 0 before the first mark)."""
        return sum(t.numel() * t.element_size() for t in self._marked or [])

    # a call that fails halfway (``ModelCache.begin`` / ``abort``): the state as the call found it
    _before: list[torch.Tensor] | None = None  # copied at the call's first write (one copy, as the write is)
    _armed = False
    _writes_before = 0

    def begin(self) -> bool:
        """A model call starts: its first write copies the state it replaces, for :meth:`undo`."""
        self._armed, self._before = True, None
        return True

    def _keep_before(self) -> None:
        """A write, checked, is about to change the state."""
        if self._armed and self._before is None:
            self._before = [t.clone() for t in (*self._kept(), self._length)]
            self._writes_before = self._writes()

    def _writes(self) -> int:
        """Writes whose states a pass keeps (none here)."""
        return 0

    def _forget_writes(self, n: int) -> None:
        """Let go of the states kept by the writes after the first ``n`` (none here)."""

    def undo(self) -> None:
        if self._before is not None:  # it wrote in the call
            for now, then in zip((*self._kept(), self._length), self._before, strict=True):
                now.copy_(then)
            self._forget_writes(self._writes_before)
        self.commit()

    def commit(self) -> None:
        self._armed, self._before = False, None


class ToMark(_GoingBack):
    """Going back to the mark only; the tokens kept after it run again (the decode loop, told by ``marks``)."""

    capabilities = Capabilities(crop=True, marks=True)
    going_back = "mark"
    # a cache that goes back "each" by default gets its "mark" twin as (ToMark, that class): these come first
    each = _GoingBack.each
    each_tokens = _GoingBack.each_tokens
    mark = _GoingBack.mark
    marked_nbytes = _GoingBack.marked_nbytes

    def reach(self, n: int) -> int:
        """``n`` when it is every token read; else the mark, if ``n`` is at or after it (the tokens between run
        again); else refused."""
        length = self._check_n(n)
        if n == length:
            return n
        marked = self._marked_length
        if marked is None or not marked <= n:
            raise self._refuse(n, "" if marked is None else f" (its mark is at {marked})")
        return marked

    def crop(self, n: int) -> None:
        """Go back to ``reach(n)`` tokens: the state there, bitwise (its mark's copy)."""
        if self.reach(n) != int(self._length):
            self._to_mark()


class ToEach(_GoingBack):
    """Going back to any token since the mark (of a write's last ``spare``, when given): the state after each is
    kept, from the mark to the next crop."""

    capabilities = Capabilities(crop=True)
    going_back = "each"
    spare: int | None = None  # the most tokens a pass goes back by: of a write, the states after its last ones
    _open = False  # a mark was made and no crop since: the layers hand their states after each token
    _after: list[tuple[int, int, list[torch.Tensor]]]  # each write since the mark: its end, how many it kept, them

    def _at(self, states: list[torch.Tensor], t: int) -> list[torch.Tensor]:
        """What :meth:`_kept` held after the ``t``-th (1-based) of the tokens whose states are ``states``."""
        raise NotImplementedError

    @property
    def each(self) -> bool:
        return self._open

    def each_tokens(self, tokens: int) -> int:
        """Of a write of ``tokens``, how many last ones' states this cache keeps: 0 with no pass open; else every
        one, or the last ``spare`` (a prompt read in the pass runs its fast form up to them)."""
        if not self._open:
            return 0
        return tokens if self.spare is None else min(tokens, self.spare)

    def mark(self) -> None:
        """A pass of guesses starts here: keep a copy of the state, and the state after each token from now on."""
        self._open, self._after = True, []
        super().mark()

    def _writes(self) -> int:
        return len(self._after) if self._open else 0

    def _forget_writes(self, n: int) -> None:
        if self._open:
            del self._after[n:]  # the states kept after each token of the failed call's writes

    def _keep(self, tokens: int, states: list[torch.Tensor]) -> None:
        """Keep the states after a write's last ``each_tokens(tokens)`` tokens (the write has checked them)."""
        self._after.append((int(self._length), self.each_tokens(tokens), states))
        self.most_held_back = max(self.most_held_back, self.marked_nbytes())

    def reach(self, n: int) -> int:
        """``n`` itself: the mark, or a token of a write since it whose state was kept, or the last token read."""
        length = self._check_n(n)
        if n == length or (self._open and n == self._marked_length):
            return n
        name = type(self).__name__
        if not self._open:
            raise ValueError(
                f"a {name} has no pass open (mark() opens one, crop() closes it): it holds {length} tokens and "
                f"cannot go back to {n}; mark() before a pass whose tokens may be refused"
            )
        if not any(end - kept < n <= end for end, kept, _ in self._after):
            kept = ", ".join(f"{end - kept + 1}..{end}" for end, kept, _ in self._after if kept) or "none"
            raise ValueError(
                f"a {name} keeps the state at its mark ({self._marked_length}) and after tokens {kept} since: it "
                f"cannot go back to {n}"
                + ("" if self.spare is None else f" (a write keeps the states of its last spare={self.spare} tokens)")
            )
        return n

    def crop(self, n: int) -> None:
        """Go back to ``n`` tokens, the state after that token bitwise (kept when the pass ran); the pass is then
        closed: its states are let go, and a later write keeps none until the next mark."""
        if self.reach(n) != int(self._length) and n == self._marked_length:
            self._to_mark()
        elif n != int(self._length):
            end, kept, states = next(w for w in self._after if w[0] - w[1] < n <= w[0])
            for now, then in zip(self._kept(), self._at(states, n - (end - kept)), strict=True):
                now.copy_(then)
            self._length.fill_(n)
        self._open, self._after = False, []

    def marked_nbytes(self) -> int:
        """Bytes held now to go back: the mark's copy and, while a pass is open, the states after each token."""
        after = sum(t.numel() * t.element_size() for *_, states in self._after for t in states) if self._open else 0
        return super().marked_nbytes() + after
