"""The choice shown: the selection panel of the interactive view and the report's section (``explain.selection``
measures it), in English and Chinese.

Shapes: H = heads, T = queries, C = columns of a layer's dense axis.
"""

from __future__ import annotations

import torch

from attnlab.explain.render.html import Section
from attnlab.explain.render.selection_panel import panel_layer, selection_fragment
from attnlab.explain.selection import (
    SELECTION_TEXT,
    LayerChoice,
    check_sparse,
    layer_choices,
    layer_lines,
    query_lines,
)
from attnlab.models.gpt import GPT
from attnlab.models.tokenizer import TextTokenizer


def selection_panel(choices: list[LayerChoice], *, lang: str, query: int) -> str:
    """The panel's fragment for these layers' choices, ``query`` shown first (weights: the means over heads)."""
    t = choices[0].read.shape[0]
    if isinstance(query, bool) or not isinstance(query, int) or not -t <= query < t:
        raise ValueError(f"query must be a token index in [0, {t}) (or from the end, down to -{t}), got {query!r}")
    layers = [
        panel_layer(
            layer=c.layer,
            kind=c.kind,
            columns=c.columns,
            dense=c.dense.mean(0),  # (H, T, C) -> (T, C)
            used=c.sparse.mean(0),
            read=c.read,
            selected=c.selected,
            visible=c.visible(),
            kept=c.kept().mean(0),  # (H, T) -> (T,)
        )
        for c in choices
    ]
    return selection_fragment(layers, lang=lang, query=query % t)


def selection_view(model: GPT, ids: torch.Tensor, tokens: list[str], *, lang: str = "en", query: int = -1) -> str:
    """The panel of ``model`` on one sequence ``ids`` (1, T) labelled ``tokens``; a model without a sparse
    layer is refused by a ValueError that says so (no empty panel)."""
    return selection_panel(layer_choices(model, ids, tokens, lang=lang), lang=lang, query=query)


def selection_section(
    model: GPT, tokenizer: TextTokenizer, text: str, *, lang: str, query: int = -1, figures: bool = True
) -> Section:
    """The report's section on ``text``: each sparse layer's dense mass kept, then the chosen ``query``'s row in
    each (the keys it could see, the chosen marked, dense and used weights), and with ``figures`` the panel."""
    check_sparse(model, lang)
    txt = SELECTION_TEXT[lang]
    ids = tokenizer.encode(text)
    tokens = tokenizer.tokens(text)
    if len(tokens) != len(ids):  # a tokenizer whose labels do not match its ids: the ids
        tokens = [str(i) for i in ids]
    choices = layer_choices(model, torch.tensor([ids]), tokens, lang=lang)
    rows = layer_lines(choices, lang)
    for choice in choices:
        rows += query_lines(choice, query, lang)
    topk = sorted({str(getattr(model.blocks[c.layer].att, "index_topk", "")) for c in choices} - {""})
    return Section(
        key="selection",
        title=txt["title"],
        text=txt["text"].format(k="/".join(topk) or "k"),
        code="attnlab.explain.selection.layer_choices(model, ids, tokens)",
        value="\n".join(rows),
        view=selection_panel(choices, lang=lang, query=query) if figures else None,
    )
