"""A whole model's attention: every layer and head of a real checkpoint on one text, labelled by its tokens."""

from __future__ import annotations

import torch

from attnlab.explain.checks import holds
from attnlab.explain.render.heatmap import head_grid, png_bytes
from attnlab.explain.render.html import Figure, Report, Section
from attnlab.explain.report import MAX_TOKENS
from attnlab.explain.report_text import REPORT_TEXT
from attnlab.explain.tour import fmt
from attnlab.models.gpt import GPT
from attnlab.models.tokenizer import TextTokenizer


def model_weights(model: GPT, tokenizer: TextTokenizer, text: str) -> tuple[list[str], torch.Tensor]:
    """The text's tokens (as labels) and every layer's weights for it, (L, H, T, T)."""
    ids = tokenizer.encode(text)
    if not ids:
        raise ValueError(f"the text has no tokens: {text!r}")
    limit = min(MAX_TOKENS, model.config.context_length)  # more rows than this make an unreadable heatmap
    if len(ids) > limit:
        raise ValueError(f"the text has {len(ids)} tokens; the model report shows at most {limit}, shorten it")
    labels = tokenizer.tokens(text)
    weights = model.attention_weights(torch.tensor([ids]))[:, 0]  # (L, H, T, T) of the one sequence
    return labels, weights


def model_report(model: GPT, tokenizer: TextTokenizer, text: str, *, name: str, lang: str = "en") -> Report:
    """One section per layer: a grid of its heads, the weights, and the checks every causal layer passes."""
    txt = REPORT_TEXT[lang]
    labels, weights = model_weights(model, tokenizer, text)
    t = len(labels)
    upper = torch.ones(t, t, dtype=torch.bool).triu(1)
    sections = []
    for layer, w in enumerate(weights):  # w: (H, T, T)
        title = txt["layer"].format(layer=layer)
        fig = head_grid(
            w, labels, title=title, axes=(txt["keys"], txt["queries"]), head_title=txt["head"], annotate=t <= 8
        )
        sections.append(
            Section(
                key=f"layer-{layer}",
                title=title,
                text=txt["layer_text"].format(heads=w.shape[0]),
                code=f"model.attention_weights(ids)[{layer}]",
                value=fmt(w),
                figures=[Figure(png=png_bytes(fig), alt=title, caption=title)],
                checks=[
                    holds(txt["check_rows"], torch.allclose(w.sum(-1), torch.ones(w.shape[:2]), atol=1e-5)),
                    holds(txt["check_upper"], bool((w[:, upper] == 0).all())),
                ],
            )
        )
    c = model.config
    return Report(
        title=txt["model_title"].format(name=name, text=text),
        intro=txt["model_intro"].format(layers=c.n_layers, heads=c.n_heads, emb=c.emb_dim, tokens=t),
        lang=lang,
        sections=sections,
        labels={"contents": txt["contents"], "numbers": txt["numbers"], "enlarge": txt["enlarge"]},
    )
