"""Which keys a sparse layer's queries chose, beside the dense attention they replaced (issue 59 item 6).

A DSA layer (``IndexedAttention``: DeepSeek-V3.2, GLM-5) reads each query's top ``index_topk`` keys; a V4
compressed-sparse layer (``CompressedAttention`` with an indexer) reads its window's tokens and its top entries
(pooled blocks). While a Recorder runs, each records its choice (``attnlab.nn.selection_record``): the columns it
read and the selection's own indices (the kernel's, not recomputed here), the dense weights each query would have
had over every key it may see, and, as always, the weights its attention actually used. :func:`layer_choices`
reads them back, per layer, on the layer's **dense axis**: its tokens, then (V4) its entries. A block-sparse
layer (MoBA; NSA's selected branch, which also reads every closed compressed entry and its window) chooses per
head or key group: its keys read are kept per head, and a key is marked read where any head read it.

The **dense mass kept** by a query's selection is the share of its dense weights that falls on the keys it read:

    kept(t) = sum over keys s read by t of  dense(t, s)  /  sum over every key s of  dense(t, s)

(a learned sink, which is no key, in neither sum). 1 when the selection reads every key the query may see (top-k
at least the keys); on a head spread evenly over t + 1 keys, k / (t + 1).

Shapes: H = heads, T = queries (tokens), C = columns of the dense axis (T tokens, then n entries).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from attnlab.models.gpt import GPT
from attnlab.nn.compressed import CompressedAttention
from attnlab.nn.indexed import IndexedAttention
from attnlab.nn.moba import MoBAAttention
from attnlab.nn.nsa import NSAAttention
from attnlab.nn.selection_record import spread
from attnlab.observe import Recorder

SELECTION_TEXT = {
    "en": {
        "title": "The choice: which keys each sparse query read",
        "text": "A sparse layer's query reads only the keys its indexer chose (DSA: the top {k} keys; DeepSeek-V4's "
        "compressed-sparse layers: its window's tokens and the top entries, each a pooled block; MoBA and NSA: "
        "the top blocks of keys, chosen per head or key group). Beside the "
        "weights it used, the dense attention it replaced: a softmax over every key it may see. The dense mass "
        "kept is the share of those dense weights on the keys it read: 1 when it read every key.",
        "none": "This model has no sparse layer: no layer chooses keys (DSA's index_topk, a DeepSeek-V4 "
        "compressed-sparse layer, MoBA or NSA), so every query reads every key it may see and there is no choice to show.",
        "layer": "layer {layer} ({kind}): the selection kept {mean:.3f} of the dense mass on average over {queries} "
        "queries (least {least:.3f}); {all} of them read every key they could see",
        "query": "query {query} {token!r} in layer {layer}: read {read} of {visible} keys; kept {kept:.3f} of the "
        "dense mass",
        "key": "  {mark} {label}: dense {dense:.3f}, used {sparse:.3f}",
        "chosen": "✓",
        "window": "w",
        "skipped": "·",
        "kind_dsa": "DSA, top {k}",
        "kind_csa": "compressed-sparse, top {k} entries of {m} tokens, window {w}",
        "entry": "entry {w}: {a}–{b}",
        "kind_moba": "MoBA, top {k} blocks of {m} a head",
        "kind_nsa": "NSA's selected branch, top {k} blocks of {m} a key group; it also reads {n} compressed "
        "entries of {c} tokens and a window of {w}",
    },
    "zh": {
        "title": "选择：稀疏注意力的每个查询读了哪些键",
        "text": "稀疏层的查询只读它的索引器选中的键 (DSA：得分最高的 {k} 个键；DeepSeek-V4 的压缩稀疏层：窗口内的 Token "
        "和得分最高的条目，每个条目是一块压缩后的 Token；MoBA 和 NSA：按头或键组选出的得分最高的键块)。与它实际用到的权重并列的，是它取代的稠密注意力：在它看得到的所有键"
        "上做 softmax。保留的稠密份额，是稠密权重落在它读到的键上的比例：读了全部的键时为 1。",
        "none": "这个模型没有稀疏层：没有哪一层挑选键 (DSA 的 index_topk、DeepSeek-V4 的压缩稀疏层、MoBA 或 NSA)，每个查询都读它看得到"
        "的全部键，没有可展示的选择。",
        "layer": "第 {layer} 层 ({kind})：在 {queries} 个查询上，选择平均保留了 {mean:.3f} 的稠密份额 (最少 {least:.3f})；"
        "其中 {all} 个查询读了它看得到的全部键",
        "query": "第 {layer} 层的查询 {query} {token!r}：读了 {visible} 个键中的 {read} 个；保留了 {kept:.3f} 的稠密份额",
        "key": "  {mark} {label}：稠密 {dense:.3f}，实际 {sparse:.3f}",
        "chosen": "✓",
        "window": "窗",
        "skipped": "·",
        "kind_dsa": "DSA，前 {k} 个键",
        "kind_csa": "压缩稀疏，{m} 个 Token 一个条目，前 {k} 个条目，窗口 {w}",
        "entry": "条目 {w}：{a}–{b}",
        "kind_moba": "MoBA，每个头取 {m} 个 Token 一块的前 {k} 块",
        "kind_nsa": "NSA 的选择分支，每个键组取 {m} 个 Token 一块的前 {k} 块；它还读 {n} 个 {c} 个 Token 的压缩条目和"
        "长 {w} 的窗口",
    },
}


@dataclass(frozen=True)
class LayerChoice:
    """One sparse layer's choice on one sequence, on its dense axis (its T tokens, then a V4 layer's n entries)."""

    layer: int
    kind: str  # how the view names it ("DSA, top 4")
    columns: list[str]  # C labels: the tokens, then the entries
    dense: torch.Tensor  # (H, T, C): the weights over every key each query may see, the selection taken away
    sparse: torch.Tensor  # (H, T, C): the weights the layer used, spread back (0 on every key not read)
    read: torch.Tensor  # (T, C) bool: the keys each query read (a V4 layer's window included)
    selected: torch.Tensor  # (T, C) bool: the selection's own choice (DSA: what was read; V4: the entries)
    head_read: torch.Tensor | None = None  # (H, T, C) bool: a block-sparse layer's keys read by each head

    def kept(self) -> torch.Tensor:
        """The dense mass kept (H, T): dense weight on the keys read over dense weight on every key."""
        total = self.dense.sum(-1)  # (H, T)
        on = (self.dense * (self.read if self.head_read is None else self.head_read)).sum(-1)  # (H, T)
        return torch.where(total > 0, on / total.clamp(min=torch.finfo(total.dtype).tiny), torch.ones_like(total))

    def visible(self) -> torch.Tensor:
        """(T, C) bool: the keys each query may see (a dense weight above 0, or read)."""
        return (self.dense > 0).any(0) | self.read


def selecting_layers(model: GPT) -> list[int]:
    """The layers of ``model`` that choose keys: DSA's indexed layers, V4's compressed-sparse ones, MoBA and NSA."""
    atts = [_att(model, i) for i in range(len(model.blocks))]
    return [
        i
        for i, att in enumerate(atts)
        if isinstance(att, IndexedAttention | MoBAAttention)
        or (isinstance(att, CompressedAttention) and att.indexer is not None)
    ]


def _att(model: GPT, layer: int) -> nn.Module:
    """A layer's attention module, whatever its kind."""
    att: nn.Module = model.blocks[layer].att
    return att


def check_sparse(model: GPT, lang: str = "en") -> list[int]:
    """The selecting layers, or a ValueError that says the model has none (before anything runs)."""
    if lang not in SELECTION_TEXT:
        raise ValueError(f"lang must be one of {sorted(SELECTION_TEXT)}, got {lang!r}")
    layers = selecting_layers(model)
    if not layers:
        raise ValueError(SELECTION_TEXT[lang]["none"])
    return layers


def _entries(att: CompressedAttention, n: int, txt: dict[str, str]) -> list[str]:
    """Entry w's label: the tokens its block pools (V4's compressed-sparse blocks overlap the block before)."""
    m = att.compress_block
    return [txt["entry"].format(w=w, a=max(0, (w - 1) * m), b=(w + 1) * m - 1) for w in range(n)]


def layer_choices(model: GPT, ids: torch.Tensor, tokens: list[str], *, lang: str = "en") -> list[LayerChoice]:
    """Every selecting layer's choice on one sequence ``ids`` (1, T), its tokens labelled ``tokens``.

    Raises:
        ValueError: the model has no selecting layer (said in ``lang``), or ``ids`` is not one row of T = len(tokens).
    """
    layers = check_sparse(model, lang)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape != (1, len(tokens)):
        got = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"ids must be one sequence (1, T) with T = {len(tokens)} token labels, got {got}")
    txt, t = SELECTION_TEXT[lang], len(tokens)
    names = ["attn_weights", "read_slots", "selected_keys", "dense_weights", "block_slots", "selected_blocks"]
    names += ["entry_ends"]
    modules = [f"trf_blocks.{i}.att" for i in layers]
    with torch.no_grad(), Recorder(names=names, modules=modules) as rec:
        model(ids)
    made = []
    for i, module in zip(layers, modules, strict=True):
        att = _att(model, i)
        if isinstance(att, MoBAAttention):
            made.append(_block_choice(i, att, rec, module, list(tokens), txt))
            continue
        dense = rec.get("dense_weights", module=module)[0].float()  # (H, T, C)
        c = dense.shape[-1]
        read_slots = rec.get("read_slots", module=module)  # (1, T, R)
        sparse = spread(rec.get("attn_weights", module=module).float(), read_slots, c)[0]  # (H, T, C)
        read = torch.zeros(t, c + 1, dtype=torch.bool).scatter_(
            1, torch.where(read_slots[0] >= 0, read_slots[0], c), True
        )
        chosen = rec.get("selected_keys", module=module)[0]  # (T, K): slots (DSA) or entries (V4)
        if isinstance(att, IndexedAttention):
            kind, offset, columns = txt["kind_dsa"].format(k=att.index_topk), 0, list(tokens)
        else:
            assert isinstance(att, CompressedAttention)  # selecting_layers gives these two kinds
            kind = txt["kind_csa"].format(k=att.index_topk, m=att.compress_block, w=att.window)
            offset, columns = t, [*tokens, *_entries(att, c - t, txt)]
        where = torch.where(chosen >= 0, chosen + offset, c)  # (T, K): -1 lands on the dropped column
        selected = torch.zeros(t, c + 1, dtype=torch.bool).scatter_(1, where, True)
        made.append(LayerChoice(i, kind, columns, dense, sparse, read[:, :c], selected[:, :c]))
    return made


def _block_choice(
    layer: int, att: MoBAAttention, rec: Recorder, module: str, tokens: list[str], txt: dict[str, str]
) -> LayerChoice:
    """A MoBA or NSA layer's choice: its R rows of choices (a head each, or a key group) spread to its heads."""
    dense = rec.get("dense_weights", module=module)[0].float()  # (H, T, S)
    h, t, c = dense.shape
    sparse = rec.get("attn_weights", module=module)[0].float()  # (H, T, S): the layer records them on its slots
    slots = rec.get("block_slots", module=module)[0]  # (R, T, M): the gather's own, -1 for none
    r = slots.shape[0]
    rows = torch.zeros(r, t, c + 1, dtype=torch.bool).scatter_(2, torch.where(slots >= 0, slots, c), True)
    head_read = rows[..., :c].repeat_interleave(h // r, dim=0)  # (R, T, C) -> (H, T, C)
    blocks = rec.get("selected_blocks", module=module)[0]  # (R, T, K): the kernel's block ids
    n = -(-c // att.block_size)
    marks = torch.zeros(r, t, n + 1, dtype=torch.bool).scatter_(2, torch.where(blocks >= 0, blocks, n), True)
    column = torch.arange(c)
    selected = marks[:, :, column // att.block_size].any(0) & (column <= torch.arange(t)[:, None])  # (T, C)
    if isinstance(att, NSAAttention):
        entries = int((rec.get("entry_ends", module=module) >= 0).sum())
        kind = txt["kind_nsa"].format(k=att.top_k, m=att.block_size, n=entries, c=att.compress_block, w=att.slide)
    else:
        kind = txt["kind_moba"].format(k=att.top_k, m=att.block_size)
    return LayerChoice(layer, kind, tokens, dense, sparse, head_read.any(0), selected, head_read)


@dataclass(frozen=True)
class KeptMass:
    """A layer's dense mass kept over one sequence's queries (and heads): what a dense head would have attended
    to, against what the selection kept."""

    layer: int
    kind: str
    mean: float  # over every query and head
    least: float
    queries: int  # T
    whole: int  # queries that read every key they could see (kept exactly 1)

    @classmethod
    def of(cls, choice: LayerChoice) -> KeptMass:
        kept = choice.kept()  # (H, T)
        read = choice.read if choice.head_read is None else choice.head_read.all(0)  # (T, C): by every head
        whole = int((read | ~choice.visible()).all(-1).sum())  # read every key it could see
        return cls(choice.layer, choice.kind, float(kept.mean()), float(kept.min()), kept.shape[1], whole)


def kept_mass(model: GPT, ids: torch.Tensor, *, lang: str = "en") -> list[KeptMass]:
    """Each selecting layer's dense mass kept on one sequence ``ids`` (1, T) (labels are not needed)."""
    t = ids.shape[-1] if isinstance(ids, torch.Tensor) else 0
    return [KeptMass.of(c) for c in layer_choices(model, ids, [str(i) for i in range(t)], lang=lang)]


def layer_lines(choices: list[LayerChoice], lang: str) -> list[str]:
    """One line per layer: the dense mass its selection kept, mean and least over queries (and heads)."""
    txt = SELECTION_TEXT[lang]
    rows = [KeptMass.of(choice) for choice in choices]
    return [
        txt["layer"].format(layer=r.layer, kind=r.kind, mean=r.mean, least=r.least, queries=r.queries, all=r.whole)
        for r in rows
    ]


def query_lines(choice: LayerChoice, query: int, lang: str) -> list[str]:
    """A query's row in one layer: what it read of what it could see, the mass kept (mean over heads), and each
    key it could see with its dense and used weights (means over heads), the chosen ones marked."""
    txt = SELECTION_TEXT[lang]
    t = choice.read.shape[0]
    if isinstance(query, bool) or not isinstance(query, int) or not -t <= query < t:
        raise ValueError(f"query must be a token index in [0, {t}) (or from the end, down to -{t}), got {query!r}")
    query %= t
    visible, read = choice.visible()[query], choice.read[query]
    kept = float(choice.kept()[:, query].mean())
    head = txt["query"].format(
        query=query,
        token=choice.columns[query],
        layer=choice.layer,
        read=int(read.sum()),
        visible=int(visible.sum()),
        kept=kept,
    )
    dense, sparse = choice.dense[:, query].mean(0), choice.sparse[:, query].mean(0)  # (C,) each, over heads
    lines = [head]
    for col in visible.nonzero()[:, 0].tolist():
        mark = txt["chosen"] if choice.selected[query, col] else txt["window"] if read[col] else txt["skipped"]
        lines.append(
            txt["key"].format(mark=mark, label=choice.columns[col], dense=float(dense[col]), sparse=float(sparse[col]))
        )
    return lines
