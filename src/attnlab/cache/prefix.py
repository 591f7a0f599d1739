"""Prefix sharing: a radix tree over token ids whose nodes are blocks of a paged cache (SGLang's RadixAttention).

A prompt that begins like an earlier one need not compute that beginning
again: the keys and values of a token depend only on the tokens up to it, so
the blocks an earlier prompt filled are the blocks this one would fill.
:class:`PrefixTree` is what a prefix cache (``attnlab.cache.PrefixCache``, a model cache of paged
layers, which share one block table) adds: a tree whose every edge is
one full block of token ids (``block_size`` of them) and whose every node
holds that block's id (the same in every layer's pool). A new prompt walks the tree as far as its tokens match, takes
those blocks into its block table (no copy: a block shared is a reference
more), and only its remaining tokens run through the model. Only full blocks
are shared, and a prompt always computes at least its last token (its logits
are the point), so nothing shared is ever written.

The tree holds a reference to each block it names, so a finished sequence's
prompt stays reusable; when the pool runs short, the least recently used
leaves that no running sequence holds are let go (:meth:`make_room`), until
every running sequence has room for all the tokens it will hold (``admit``
is told how many), so a cache kept across calls never fills up mid-run.

The blocks hold keys and values of one model's weights: :meth:`bind` records
which (the tensors of its state dict, by identity and version) and refuses a
tree filled by other weights, or by these before they changed.

Exact: a prompt gets the same keys and values, hence the same tokens, as
when it is computed whole (tested, token-identical, on every backend).
:attr:`hit_rate` is the share of prompt tokens that came from the tree.

The cache never sees token ids (``update`` takes keys and values), so the
sharing happens where the ids are: ``GPT.generate(..., cache="prefix")`` (a
tree for one call: rows of a batch share their common prefix) or a cache
``ModelCache.build(..., "prefix", ...)`` made (``GPT.make_caches(...,
cache="prefix")``, ``PrefixCache.for_model(model, ...)``) kept across calls and
given to ``generate`` and ``generate_many``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from attnlab.cache.paged import BlockTable


@dataclass
class _Node:
    block: int  # the block's id (-1 at the root)
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    parent: _Node | None = None
    key: tuple[int, ...] = ()
    used: int = 0  # when it was last matched or added (a counter): least recently used goes first


class PrefixTree:
    """A radix tree over token ids whose nodes are blocks of ``blocks``, the block table of a model's paged
    layers: what :class:`~attnlab.cache.model.PrefixCache` adds to a model cache (``ModelCache.build(...,
    "prefix", ...)`` makes one)."""

    def grow(self, blocks: BlockTable) -> None:
        """Start an empty tree over ``blocks``."""
        self.blocks = blocks
        self.batch, self.block_size = blocks.batch_size, blocks.block_size
        self.max_len = blocks.blocks_per_seq * self.block_size
        self.root = _Node(block=-1)
        self.clock = 0
        self.looked_up = 0  # prompt tokens asked for
        self.reused = 0  # of them, tokens taken from the tree
        self.planned = [0] * self.batch  # tokens each running sequence will hold at its end (0: not running)
        self.in_tree = [0] * self.batch  # full blocks of each running sequence the tree has
        self.weights: tuple[tuple[str, int, int, int], ...] | None = None  # what filled the tree (bind)

    @property
    def hit_rate(self) -> float:
        """The share of prompt tokens taken from the tree instead of computed (0 before any prompt)."""
        return self.reused / self.looked_up if self.looked_up else 0.0

    def check_fits(self, rows: int, tokens: int) -> None:
        """Refuse, before anything changes, ``rows`` sequences of ``tokens`` tokens that this cache cannot hold."""
        if rows > self.batch:
            raise ValueError(
                f"this prefix cache runs {self.batch} sequences at once, got {rows}; build it with "
                f"PrefixCache.for_model(model, batch_size={rows}, ...)"
            )
        if tokens > self.max_len:
            raise ValueError(
                f"a sequence of {tokens} tokens (prompt and new ones) is longer than this prefix cache's "
                f"max_len={self.max_len}; build it with max_len >= {tokens}"
            )
        need = rows * -(-tokens // self.block_size)
        if need > self.blocks.num_blocks:
            raise ValueError(
                f"{rows} sequences of {tokens} tokens need {need} blocks of {self.block_size} at once, more than this "
                f"prefix cache's num_blocks={self.blocks.num_blocks}; build it with num_blocks >= {need}"
            )

    def bind(self, model: Any) -> None:
        """Refuse ``model`` if the tree holds blocks that other weights filled (another model, or this one before
        its weights changed: trained, loaded); else record its weights as the tree's."""
        weights = _fingerprint(model)
        if self.cached_tokens() and self.weights != weights:
            raise ValueError(
                "this PrefixCache holds keys and values computed by other weights (another model, or this one "
                "before its weights changed): they would be reused as this model's; call clear() on it or build "
                "a new one with PrefixCache.for_model(model, ...)"
            )
        self.weights = weights

    def clear(self) -> None:
        """Forget every cached prefix (the tree's blocks go back to the pool); running sequences keep theirs."""
        for node in self._nodes():
            self.blocks.drop(node.block)
        self.root = _Node(block=-1)
        self.weights = None

    def admit(self, row: int, tokens: list[int], *, total: int | None = None) -> int:
        """Start sequence ``row`` on ``tokens``: take the blocks of its longest cached prefix (full blocks, not its
        last token), then make room for the ``total`` tokens it will hold (default: ``tokens``) beside what every
        other running sequence will; return how many tokens it already holds, from where the model must run."""
        self.release(row)
        node, matched = self.root, []
        for start in range(0, (len(tokens) - 1) // self.block_size * self.block_size, self.block_size):
            child = node.children.get(tuple(tokens[start : start + self.block_size]))
            if child is None:
                break
            node = child
            matched.append(node)
        while matched and not self.resumes_at(matched[-1].block):  # a layer kept no state there: start earlier
            matched.pop()
        self.clock += 1
        for held in matched:
            held.used = self.clock
        reused = len(matched) * self.block_size
        self.blocks.take(row, [n.block for n in matched], reused)
        self.looked_up += len(tokens)
        self.reused += reused
        self.planned[row] = len(tokens) if total is None else max(total, len(tokens))
        self.in_tree[row] = len(matched)
        self.make_room()
        return reused

    def resumes_at(self, block: int) -> bool:
        """Whether a prompt may start after ``block`` (a model cache with row states says where it kept them)."""
        return True

    def kept_at(self, row: int, depth: int, block: int) -> None:
        """Sequence ``row``'s block ``depth`` is the tree's ``block`` (a model cache with row states keeps theirs)."""

    def written(self, row: int, tokens: list[int]) -> None:
        """Sequence ``row`` holds ``tokens``: when that filled a block, put its full blocks in the tree."""
        if len(tokens) // self.block_size > self.in_tree[row]:
            self.remember(row, tokens)
            self.in_tree[row] = len(tokens) // self.block_size

    def remember(self, row: int, tokens: list[int]) -> None:
        """Put the full blocks of sequence ``row``, which holds ``tokens``, in the tree (a reference each)."""
        held = self.blocks.length[row]
        if held != len(tokens):
            raise ValueError(f"sequence {row} holds {held} tokens, not the {len(tokens)} given")
        node = self.root
        self.clock += 1
        for depth in range(len(tokens) // self.block_size):
            key = tuple(tokens[depth * self.block_size : (depth + 1) * self.block_size])
            child = node.children.get(key)
            if child is None:  # new to the tree: it keeps this sequence's block
                child = _Node(block=self.blocks.held[row][depth], parent=node, key=key)
                self.blocks.hold(child.block)
                node.children[key] = child
            child.used = self.clock
            self.kept_at(row, depth, child.block)
            node = child

    def release(self, row: int) -> None:
        """Sequence ``row`` is done: its blocks go back, except those the tree keeps."""
        self.blocks.release(row)
        self.planned[row] = 0

    def blocks_to_come(self) -> int:
        """Blocks the running sequences will still take from the pool to reach the tokens they were admitted for."""
        held = [len(h) for h in self.blocks.held]
        return sum(max(0, -(-plan // self.block_size) - n) for plan, n in zip(self.planned, held, strict=True))

    def make_room(self) -> None:
        """Let go of least recently used leaves that no sequence holds until every running sequence has room for
        the blocks it will still take (or none is left to let go: the pool then says it is full when written)."""
        need = self.blocks_to_come()  # letting go of a leaf no sequence holds leaves it as is
        while self.blocks.free_blocks() < need:
            leaves = [n for n in self._nodes() if not n.children and self.blocks.refcount[n.block] == 1]
            if not leaves:
                return
            oldest = min(leaves, key=lambda n: n.used)
            self.blocks.drop(oldest.block)
            assert oldest.parent is not None  # a leaf is never the root
            del oldest.parent.children[oldest.key]

    def cached_tokens(self) -> int:
        """Tokens the tree holds (full blocks)."""
        return sum(1 for _ in self._nodes()) * self.block_size

    def _nodes(self) -> list[_Node]:
        found, todo = [], list(self.root.children.values())
        while todo:
            node = todo.pop()
            found.append(node)
            todo.extend(node.children.values())
        return found


def _fingerprint(model: Any) -> tuple[tuple[str, int, int, int], ...]:
    """The tensors of ``model``'s state dict by name, identity, storage and version: any change of weights (an
    optimizer step, load_state_dict, another model) changes it; a forward pass does not."""
    state: dict[str, torch.Tensor] = model.state_dict(keep_vars=True)
    return tuple((name, id(t), t.data_ptr(), t._version) for name, t in state.items())
