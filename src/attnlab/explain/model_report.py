"""A whole model's attention: every head named, its training curves, and every layer on the probe and on a text."""

from __future__ import annotations

import torch

from attnlab.explain.checks import Check, holds
from attnlab.explain.heads import SCORES, HeadScores, describe_run, head_scores, probe
from attnlab.explain.model_view import (
    _check_characters,
    _latent,
    _state,
    _view,
    attention_view,
    characters_note,
    head_names,
    layer_kind,
    model_weights,
)
from attnlab.explain.render.curves import training_curves
from attnlab.explain.render.figure_output import page_figure
from attnlab.explain.render.heatmap import head_grid, heatmap
from attnlab.explain.render.html import Figure, Report, Section
from attnlab.explain.render.view import AttentionView
from attnlab.explain.render.view_data import MAX_VIEW_TOKENS
from attnlab.explain.report import MAX_TOKENS, _labels
from attnlab.explain.report_text import REPORT_TEXT
from attnlab.explain.selection import selecting_layers
from attnlab.explain.selection_report import selection_section
from attnlab.explain.sink_marks import sink_section
from attnlab.explain.tour import fmt
from attnlab.models.gpt import GPT
from attnlab.models.tokenizer import TextTokenizer
from attnlab.models.train import TrainLog

__all__ = ["attention_view", "model_report", "model_weights"]  # attention_view: users import it from here (README)


def _layer_sections(
    weights: torch.Tensor,
    labels: list[str],
    txt: dict[str, str],
    *,
    key: str,
    title: str,
    text: str,
    code: str,
    figures: bool,
    names: list[list[str]],
    model: GPT,
) -> list[Section]:
    """Each layer's heads on one run (weights (L, H, T, T)), named, kinded and checked by ``model``'s layers."""
    t = len(labels)
    upper = torch.ones(t, t, dtype=torch.bool).triu(1)
    sections = []
    windows = [block.att.window for block in model.blocks]
    types = [model.config.layer_type(i) for i in range(len(model.blocks))]
    states, latent = [_state(block) for block in model.blocks], _latent(model)
    for layer, w in enumerate(weights):  # w: (H, T, T)
        window, sinks = windows[layer], model.config.layer_shape(layer).sinks  # sinks by layer type (MiMo)
        source = model.config.kv_source(layer)
        kind = layer_kind(window, latent, txt, layer_type=types[layer], state=states[layer], source=source)
        kinds_differ = any(windows) or latent is not None or set(types) != {"full"} or model.config.kv_shared_layers > 0
        heading = f"{title.format(layer=layer)} · {kind}" if kinds_differ else title.format(layer=layer)
        drawn = []
        if figures:
            axes = (txt["keys"], txt["queries"])
            named = [f"{txt['head'].format(h=h)}: {n}" for h, n in enumerate(names[layer])] if names else None
            # the page's width: the report shows it at its own size
            fig = head_grid(
                w, labels, title=heading, axes=axes, head_title=txt["head"], head_titles=named, annotate=t <= 8
            )
            drawn = [page_figure(fig, heading)]
        checks = [] if types[layer] in ("delta", "kda", "conv") else [_rows_check(w, txt, sinks=sinks)]  # not a softmax
        checks.append(holds(txt["check_upper"], bool((w[:, upper] == 0).all())))
        if window is not None:
            checks.append(holds(txt["check_window"].format(window=window), int((w > 0).sum(-1).max()) <= window))
        about = text.format(heads=w.shape[0])  # Section's order: key, title, text, code, value, figures, checks
        sections.append(
            Section(f"{key}-{layer}", heading, about, code.format(layer=layer), fmt(w), drawn, checks, wide=True)
        )
    return sections


def _rows_check(w: torch.Tensor, txt: dict[str, str], *, sinks: bool) -> Check:
    """Rows of (H, T, T) weights sum to 1; with learned sinks (gpt-oss) to at most 1, the rest the sinks' share."""
    sums = w.sum(-1)  # (H, T)
    if not sinks:
        return holds(txt["check_rows"], torch.allclose(sums, torch.ones_like(sums), atol=1e-5))
    share = float(1 - sums.mean())
    return holds(txt["check_rows_sink"].format(share=share), bool((sums <= 1 + 1e-5).all()))


def _score_figure(grid: torch.Tensor, title: str, txt: dict[str, str], cells: list[list[str]] | None = None) -> Figure:
    """An (L, H) grid of scores on a fixed 0..1 colour scale, so colours compare across scores and models."""
    layers, heads = [str(i) for i in range(grid.shape[0])], [str(j) for j in range(grid.shape[1])]
    axes = (txt["heads_axis"], txt["layers_axis"])
    fig = heatmap(grid, layers, heads, title=title, axes=axes, annotate=True, cells=cells, limits=(0, 1))
    return page_figure(fig, title)


def _names_section(scores: HeadScores, txt: dict[str, str], *, figures: bool) -> Section:
    n_layers, n_heads = len(scores.induction), len(scores.induction[0])
    table = {s: torch.tensor(getattr(scores, s)) for s in SCORES}  # each (L, H)
    best = torch.stack(list(table.values())).amax(dim=0)  # (4, L, H) -> (L, H)
    name = lambda i, j: txt["name_" + (scores.label(i, j) or "none").replace("-", "_")]
    drawn = []
    if figures:
        cells = [[f"{name(i, j)}\n{float(best[i, j]):.2f}" for j in range(n_heads)] for i in range(n_layers)]
        drawn = [_score_figure(best, txt["names"], txt, cells)]
        drawn += [_score_figure(table[s], txt["score_" + s], txt) for s in SCORES]
    rows = [
        f"{txt['layers_axis']} {i} {txt['head'].format(h=j)}: {scores.label(i, j) or '-'}  "
        + "  ".join(f"{s} {table[s][i, j]:.2f}" for s in SCORES)
        for i in range(n_layers)
        for j in range(n_heads)
    ]
    return Section(
        key="heads",
        title=txt["names"],
        text=txt["names_text"].format(
            half=scores.half,
            first=scores.loss_first_half,
            second=scores.loss_second_half,
            icl=scores.in_context_learning,
        ),
        code="attnlab.explain.heads.head_scores(model)",
        value="\n".join(rows),
        figures=drawn,
    )


def _view_section(view: AttentionView, txt: dict[str, str]) -> Section:
    return Section(
        key="view",
        title=txt["view_title"],
        text=txt["view_text"],
        code="AttentionView(tokens=labels, weights=model.attention_weights(ids)[:, 0], names=...)",
        view=view.to_fragment(),
    )


def _training_section(log: TrainLog, txt: dict[str, str], lang: str, *, figures: bool) -> Section:
    title = txt["training"]
    text = txt["training_text"] + txt["sep"] + describe_run(log, txt)  # computed from this run's log, never typed
    every = max(1, len(log.eval_loss) // 10)
    return Section(
        key="training",
        title=title,
        text=text,
        code=f"attnlab train {log.task}" if log.task else "attnlab train TASK  # this log does not name its task",
        value="\n".join(
            f"step {s:>6}: eval loss {x:.3f}"
            for s, x in zip(log.eval_step[::every], log.eval_loss[::every], strict=True)
        ),
        figures=[page_figure(training_curves(log, lang=lang), title)] if figures else [],
    )


def model_report(
    model: GPT,
    tokenizer: TextTokenizer,
    text: str,
    *,
    name: str,
    lang: str = "en",
    log: TrainLog | None = None,
    figures: bool = True,
    cache: str | None = None,
    characters: bool = False,
    query: int = -1,
) -> Report:
    """Every head named (on the probe), the training curves if ``log``, then each layer on the probe and on ``text``.

    ``figures=False`` skips the heatmaps, curves and the interactive view (the terminal shows the numbers only,
    for at most MAX_TOKENS tokens). With figures, a text of up to MAX_VIEW_TOKENS tokens is shown in the view;
    a run (the probe, the text) past MAX_TOKENS gets no per-layer section (its grid would be unreadable).
    ``cache``: the view strikes out the keys that cache lets go in each layer. ``characters``: the text's
    tokens merged by character (:func:`by_character`) in the view and the grids. ``query``: the token whose
    choice a sparse model's section spells out (its selection beside the dense attention it replaced).
    """
    _check_characters(characters, cache)
    txt = REPORT_TEXT[lang]
    in_terminal = f"the model report in the terminal (with --html, up to {MAX_VIEW_TOKENS})"
    most, what = (MAX_VIEW_TOKENS, "the model report's view") if figures else (MAX_TOKENS, in_terminal)
    labels, weights = model_weights(model, tokenizer, text, most=most, what=what, characters=characters)
    note = characters_note(tokenizer, text, txt, characters=characters)
    scores = head_scores(model)
    sections = [_names_section(scores, txt, figures=figures)]
    sinks = [model.config.layer_shape(i).sinks for i in range(model.config.n_layers)]  # learned, by layer type
    sections.append(sink_section(weights, lang, sinks=sinks if any(sinks) else None, figures=figures))
    if selecting_layers(model):  # a sparse layer's choice beside the dense attention it replaced
        panel = figures and characters  # the view carries the panel, except by character (the choice is by token)
        sections.append(selection_section(model, tokenizer, text, lang=lang, query=query, figures=panel))
    if log is not None and log.eval_step:
        sections.append(_training_section(log, txt, lang, figures=figures))
    tokens = probe(model.config.vocab_size, half=scores.half, batch=1)  # the first sequence of the scores' probe
    probe_weights = model.attention_weights(tokens)[:, 0]  # (L, H, 2n, 2n)
    ids = [str(i) for i in tokens[0].tolist()]
    names = head_names(scores, txt)
    if figures:  # the terminal shows the numbers below; the view is for a browser
        view = _view(model, tokenizer, text, labels, weights, names, lang, cache, characters=characters)
        sections.append(_view_section(view, txt))
    c = model.config
    runs = {"probe": (probe_weights, ids, "ids = probe"), "layer": (weights, labels, "ids = tokenizer.encode(text)")}
    for key, (w, row_labels, ids_from) in runs.items():  # the probe, then the user's text
        if len(row_labels) > MAX_TOKENS:  # a grid of heads this long is unreadable; the view shows the text
            continue
        title, about = txt[f"{key}_title"], txt[f"{key}_text"]
        code = ids_from + "; model.attention_weights(ids)[{layer}]"
        sections += _layer_sections(
            w,
            row_labels,
            txt,
            key=key,
            title=title,
            text=about,
            code=code,
            figures=figures,
            names=names,
            model=model,
        )
    return Report(
        title=txt["model_title"].format(name=name, text=text),
        intro=txt["model_intro"].format(
            layers=c.n_layers, heads=c.n_heads, emb=c.emb_dim, tokens=len(tokenizer.encode(text))
        )
        + (f" {note}" if note else ""),
        lang=lang,
        sections=sections,
        labels=_labels(txt),
    )
