"""Recurrent and convolution states whose rows come and go, kept at block ends for prefix reuse.

A paged model cache admits, runs and releases its sequences one by one (continuous batching), and a prefix cache
starts a new prompt where an earlier one's blocks end. The paged layers keep every key in blocks, so resuming at a
block's end needs nothing more: the window of a sliding layer is there too, its visibility masks the rest. A
recurrent layer (linear attention, Gated DeltaNet, KDA) and a convolution layer keep no key, only a state after
the last token: to resume at a block's end a prefix cache must have kept the state there. These caches do both:

- each row has its own state and length; a group of rows runs through a view (:meth:`rows`), a
  ``StateCache`` (``ConvolutionCache``) of their own whose writes go back into the rows;
- when a row's length reaches a block's end, the state there is kept (a copy per row, :attr:`ends`, counted
  in :meth:`kept_nbytes`); the prefix cache moves it to the block (:meth:`keep`) when its tree takes the
  block, and the block table frees it with the block (``BlockTable.freed``);
- :meth:`resume` starts a row from a block's kept state.

A state is kept only where a call ends (a layer hands its cache the state after its last token), so a prompt
run into a prefix cache with such layers runs in pieces ending at block ends (``PrefixCache.stops``).

A row's state before its first token is zeros, which is what the layers start from (the same numbers).

Shapes: B = rows, R = rows of a view, H = heads, Dk = key size, Dv = value size, C = channels, K = kernel size.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.cache.base import Capabilities
from attnlab.cache.blocks import BlockTable
from attnlab.cache.state import ConvolutionCache, StateCache


class RowStates:
    """What both row caches share: each row's length (the block table's), the states kept at block ends, and the
    views. Each writes through the model's one block table, as a paged layer does: the table takes a row's blocks
    (ids of token spans, whichever layer holds what for them) and moves its length once every layer wrote."""

    capabilities = Capabilities(rows=True, crop=True, marks=True)  # row by row, to a mark (ModelCache.crop_row)
    batch_size: int
    _length: torch.Tensor

    def _tensors(self) -> list[torch.Tensor]:
        """The state's tensors, each (B, ...): what a row is, and what is kept at a block's end."""
        raise NotImplementedError

    def _made(self, table: BlockTable, shape: dict[str, Any], *, keeps_ends: bool) -> None:
        if table.batch_size != self.batch_size:
            raise ValueError(f"the block table runs {table.batch_size} rows, this state {self.batch_size}")
        self.table, self.shape_args, self.keeps_ends = table, shape, keeps_ends
        table.layers += 1
        table.freed.append(self.blocks_freed)
        self.ends: list[dict[int, list[torch.Tensor]]] = [{} for _ in range(self.batch_size)]  # block j -> state
        self.blocks: dict[int, list[torch.Tensor]] = {}  # a block's id -> the state at its end (a tree's block)

    @property
    def length(self) -> int:
        """The longest row's tokens (0: every row fresh, and a layer starts from none)."""
        return max(self.table.length)

    def next_positions(self, t: int) -> torch.Tensor:
        """Each row's next ``t`` positions, (B, T)."""
        return self.table.next_positions(list(range(self.batch_size)), t).to(self._length.device)

    _overwritten: list[tuple[torch.Tensor, list[torch.Tensor]]] | None = None  # (rows, their tensors) this pass

    def begin(self) -> bool:
        """A pass starts: each write keeps the rows it overwrites, for :meth:`undo`."""
        self._overwritten = []
        return True

    def undo(self) -> None:
        """The rows as the call found them; what its writes kept at block ends past a row's length (the table's,
        already undone) goes, so the tree never takes it."""
        for index, before in reversed(self._overwritten or []):
            for now, then in zip(self._tensors(), before, strict=True):
                now.index_copy_(0, index, then)
        self._overwritten = None
        size = self.table.block_size
        self.ends = [
            {j: s for j, s in ends.items() if (j + 1) * size <= held}
            for ends, held in zip(self.ends, self.table.length, strict=True)
        ]

    def commit(self) -> None:
        self._overwritten = None

    def blocks_freed(self, block: int) -> None:
        """The block table let ``block`` go: what was kept at its end goes with it."""
        self.blocks.pop(block, None)

    def release(self, row: int) -> None:
        """Row ``row`` is done (the table releases its blocks): its state is zeros again, its block ends go."""
        for t in self._tensors():
            t[row].zero_()
        self.ends[row] = {}

    def resume(self, row: int, block: int) -> None:
        """Row ``row`` (released, then given its prefix's blocks) starts from the state kept at ``block``'s end."""
        for now, kept in zip(self._tensors(), self.blocks[block], strict=True):
            now[row].copy_(kept)

    def has(self, block: int) -> bool:
        """Whether the state at ``block``'s end is kept."""
        return block in self.blocks

    def keep(self, row: int, depth: int, block: int) -> None:
        """The tree holds row ``row``'s block ``depth`` as block ``block``: the state at its end goes with it, if
        this row's run ended a call there."""
        kept = self.ends[row].pop(depth, None)
        if kept is not None and block not in self.blocks:
            self.blocks[block] = kept

    _marked_rows: list[torch.Tensor] | None = None  # every row's state at the mark (speculative decoding)
    _marked_at: list[int] | None = None  # each row's length there

    def mark(self) -> None:
        """A pass of guesses starts: a copy of every row's state, and each row's length (the decode loop runs the
        tokens it holds for certain first, so a refused guess sends a row back by its guesses and one)."""
        self._marked_rows = [t.clone() for t in self._tensors()]
        self._marked_at = list(self.table.length)

    def reach_row(self, row: int, n: int) -> int:
        """How far row ``row`` can go back towards ``n`` tokens: ``n`` when it is every token read, else its mark
        (the tokens between run again); refused before the mark."""
        length = self.table.length[row]
        if n == length:
            return n
        at = None if self._marked_at is None else self._marked_at[row]
        if at is None or not at <= n <= length:
            raise ValueError(
                f"row {row} of this {type(self).__name__} holds {length} tokens and its mark is at {at}: it cannot go "
                f"back to {n}; mark() before a pass whose tokens may be refused"
            )
        return at

    def crop_row(self, row: int, to: int) -> None:
        """Row ``row`` goes back to ``to`` tokens (``reach_row``'s answer, before the table moves): its state at the
        mark, bitwise; what it kept at block ends past ``to`` (a refused guess's) goes."""
        if to != self.table.length[row]:
            assert self._marked_rows is not None  # reach_row said so
            for now, then in zip(self._tensors(), self._marked_rows, strict=True):
                now[row].copy_(then[row])
        self.ends[row] = {j: s for j, s in self.ends[row].items() if (j + 1) * self.table.block_size <= to}

    def kept_nbytes(self) -> int:
        """Bytes of states kept at block ends (the tree's and the running rows')."""
        states = [*self.blocks.values(), *(s for ends in self.ends for s in ends.values())]
        return sum(t.numel() * t.element_size() for state in states for t in state)

    def rows(self, rows: list[int]) -> Any:
        """Rows ``rows`` as a cache of their own over these states (a new prompt starts while others run)."""
        if not rows or len(set(rows)) != len(rows):
            raise ValueError(f"rows must name distinct sequences of this cache, got {rows!r}")
        for row in rows:
            self.table.check_row("row", row)
        return self._view(rows)

    def _view(self, rows: list[int]) -> Any:
        raise NotImplementedError

    def _wrote(self, rows: list[int], tensors: list[torch.Tensor], tokens: int) -> None:
        """``rows`` now hold ``tensors`` (R, ...), after ``tokens`` more tokens each: through the block table, and
        kept where a row reached a block's end."""
        plan = self.table.plan(tuple(rows), tokens)  # refused (nothing changed) if the rows cannot hold them
        index = plan.index.to(tensors[0].device)
        if self._overwritten is not None:  # a pass began: the rows as they were, for undo
            self._overwritten.append((index, [now.index_select(0, index) for now in self._tensors()]))
        for now, new in zip(self._tensors(), tensors, strict=True):
            now.index_copy_(0, index, new)
        size = self.table.block_size
        for n, row in enumerate(rows):
            end = self.table.length[row] + tokens
            if self.keeps_ends and end % size == 0:
                self.ends[row][end // size - 1] = [t[n].clone() for t in tensors]
        self.table.wrote(plan)


def _state_parts(cache: StateCache) -> list[torch.Tensor]:
    """A state cache's tensors that have a row each: the matrix, and the normalizer and convolution inputs it has."""
    return [cache.matrix] + [cache.normalizer] * cache.has_normalizer + [cache.conv] * cache.has_conv


def _positions(owner: RowStates, rows: list[int], t: int, device: torch.device) -> torch.Tensor:
    """The next ``t`` positions of each of ``rows``, (R, T)."""
    return owner.table.next_positions(rows, t).to(device)


class PagedStateCache(RowStates, StateCache):
    """A recurrent layer's state, (B, H, Dk, Dv) with its normalizer and convolution inputs, per row of a paged
    model cache; the state at a block's end kept for a prefix cache. Args as ``StateCache``, ``table``: the
    model's block table, ``keeps_ends``: keep the state at each block's end (a prefix cache)."""

    def __init__(self, *, table: BlockTable, keeps_ends: bool = False, **shape: Any) -> None:
        StateCache.__init__(self, **shape)
        self._made(table, shape, keeps_ends=keeps_ends)

    def _tensors(self) -> list[torch.Tensor]:
        return _state_parts(self)

    def _view(self, rows: list[int]) -> StateCache:
        return _StateView(self, rows)

    def write(self, state: Any, tokens: int, *, conv: torch.Tensor | None = None, **more: Any) -> None:
        """Every row at once, through a view of them all (checked whole before any row changes)."""
        self._view(list(range(self.batch_size))).write(state, tokens, conv=conv, **more)


class _StateView(StateCache):
    """Rows of a :class:`PagedStateCache` as a ``StateCache`` of their own: their states copied in, written back."""

    def __init__(self, owner: PagedStateCache, rows: list[int]) -> None:
        super().__init__(**{**owner.shape_args, "batch_size": len(rows), "device": owner.matrix.device})
        self.owner, self.picked = owner, rows
        index = torch.tensor(rows, device=owner.matrix.device)
        for mine, theirs in zip(_state_parts(self), owner._tensors(), strict=True):
            mine.copy_(theirs.index_select(0, index))
        self._length.fill_(max(owner.table.length[r] for r in rows))  # 0: every row fresh (the layer starts from none)

    def next_positions(self, t: int) -> torch.Tensor:
        return _positions(self.owner, self.picked, t, self.matrix.device)

    def write(self, state: Any, tokens: int, *, conv: torch.Tensor | None = None, **more: Any) -> None:
        super().write(state, tokens, conv=conv, **more)
        self.owner._wrote(self.picked, _state_parts(self), tokens)


class PagedConvolutionCache(RowStates, ConvolutionCache):
    """A convolution layer's last inputs, (B, C, K - 1), per row of a paged model cache; kept at block ends for a
    prefix cache. Args as ``ConvolutionCache``, ``table`` and ``keeps_ends`` as ``PagedStateCache``'s."""

    def __init__(self, *, table: BlockTable, keeps_ends: bool = False, **shape: Any) -> None:
        ConvolutionCache.__init__(self, **shape)
        self._made(table, shape, keeps_ends=keeps_ends)

    def _tensors(self) -> list[torch.Tensor]:
        return [self.conv]

    def _view(self, rows: list[int]) -> ConvolutionCache:
        return _ConvolutionView(self, rows)

    def write(self, conv: torch.Tensor, tokens: int, **more: Any) -> None:
        """Every row at once, through a view of them all (checked whole before any row changes)."""
        self._view(list(range(self.batch_size))).write(conv, tokens, **more)


class _ConvolutionView(ConvolutionCache):
    """Rows of a :class:`PagedConvolutionCache` as a ``ConvolutionCache`` of their own."""

    def __init__(self, owner: PagedConvolutionCache, rows: list[int]) -> None:
        super().__init__(**{**owner.shape_args, "batch_size": len(rows), "device": owner.conv.device})
        self.owner, self.picked = owner, rows
        self.conv.copy_(owner.conv.index_select(0, torch.tensor(rows, device=owner.conv.device)))
        self._length.fill_(max(owner.table.length[r] for r in rows))

    def next_positions(self, t: int) -> torch.Tensor:
        return _positions(self.owner, self.picked, t, self.conv.device)

    def write(self, conv: torch.Tensor, tokens: int, **more: Any) -> None:
        super().write(conv, tokens, **more)
        self.owner._wrote(self.picked, [self.conv], tokens)
