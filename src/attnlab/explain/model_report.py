"""A whole model's attention: every head named, its training curves, and every layer on the probe and on a text."""

from __future__ import annotations

import torch

from attnlab.explain.checks import holds
from attnlab.explain.heads import SCORES, HeadScores, first_step, head_scores, probe
from attnlab.explain.render.curves import training_curves
from attnlab.explain.render.heatmap import head_grid, heatmap, png_bytes
from attnlab.explain.render.html import Figure, Report, Section
from attnlab.explain.report import MAX_TOKENS
from attnlab.explain.report_text import REPORT_TEXT
from attnlab.explain.tour import fmt
from attnlab.models.gpt import GPT
from attnlab.models.tokenizer import TextTokenizer
from attnlab.models.train import TrainLog


def model_weights(model: GPT, tokenizer: TextTokenizer, text: str) -> tuple[list[str], torch.Tensor]:
    """The text's tokens (as labels) and every layer's weights for it, (L, H, T, T)."""
    ids = tokenizer.encode(text)
    if not ids:
        raise ValueError(f"the text has no tokens: {text!r}")
    limit = min(MAX_TOKENS, model.config.context_length)  # more rows than this make an unreadable heatmap
    if len(ids) > limit:
        raise ValueError(f"the text has {len(ids)} tokens; the model report shows at most {limit}, shorten it")
    if max(ids) >= model.config.vocab_size:
        raise ValueError(
            f"the tokenizer gives id {max(ids)} but the model knows {model.config.vocab_size} tokens: "
            "pass the tokenizer the model was trained with (--tokenizer)"
        )
    labels = tokenizer.tokens(text)
    weights = model.attention_weights(torch.tensor([ids]))[:, 0]  # (L, H, T, T) of the one sequence
    return labels, weights


def _layer_sections(
    weights: torch.Tensor, labels: list[str], txt: dict[str, str], *, key: str, title: str, text: str, code: str
) -> list[Section]:
    t = len(labels)
    upper = torch.ones(t, t, dtype=torch.bool).triu(1)
    sections = []
    for layer, w in enumerate(weights):  # w: (H, T, T)
        heading = title.format(layer=layer)
        fig = head_grid(
            w, labels, title=heading, axes=(txt["keys"], txt["queries"]), head_title=txt["head"], annotate=t <= 8
        )
        sections.append(
            Section(
                key=f"{key}-{layer}",
                title=heading,
                text=text.format(heads=w.shape[0]),
                code=code.format(layer=layer),
                value=fmt(w),
                figures=[Figure(png=png_bytes(fig), alt=heading, caption=heading)],
                checks=[
                    holds(txt["check_rows"], torch.allclose(w.sum(-1), torch.ones(w.shape[:2]), atol=1e-5)),
                    holds(txt["check_upper"], bool((w[:, upper] == 0).all())),
                ],
            )
        )
    return sections


def _names_section(scores: HeadScores, txt: dict[str, str]) -> Section:
    layers = [str(i) for i in range(len(scores.induction))]
    heads = [str(j) for j in range(len(scores.induction[0]))]
    best = torch.tensor(
        [[max(getattr(scores, s)[i][j] for s in SCORES) for j in range(len(heads))] for i in range(len(layers))]
    )
    cells = [
        [
            f"{txt['name_' + (scores.label(i, j) or 'none').replace('-', '_')]}\n{float(best[i, j]):.2f}"
            for j in range(len(heads))
        ]
        for i in range(len(layers))
    ]
    axes = (txt["heads_axis"], txt["layers_axis"])
    figures = [
        Figure(
            png=png_bytes(heatmap(best, layers, heads, title=txt["names"], axes=axes, cells=cells, limits=(0, 1))),
            alt=txt["names"],
            caption=txt["names"],
        )
    ]
    for score in SCORES:
        title = txt["score_" + score]
        grid = torch.tensor(getattr(scores, score))  # (L, H)
        figures.append(
            Figure(
                png=png_bytes(heatmap(grid, layers, heads, title=title, axes=axes, annotate=True, limits=(0, 1))),
                alt=title,
                caption=title,
            )
        )
    rows = [
        f"{txt['layers_axis']} {i} {txt['head'].format(h=j)}: {scores.label(i, j) or '-'}  "
        + "  ".join(f"{s} {getattr(scores, s)[i][j]:.2f}" for s in SCORES)
        for i in range(len(layers))
        for j in range(len(heads))
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
        figures=figures,
        checks=[],
    )


def _training_section(log: TrainLog, txt: dict[str, str], lang: str) -> Section:
    title = txt["training"]
    formed = first_step(log)
    text = txt["training_text"]
    if formed is not None:
        text += " " + txt["formed"].format(step=formed)
    return Section(
        key="training",
        title=title,
        text=text,
        code="attnlab train induction",
        value=f"eval loss: {[round(x, 3) for x in log.eval_loss[:: max(1, len(log.eval_loss) // 10)]]}",
        figures=[Figure(png=png_bytes(training_curves(log, lang=lang)), alt=title, caption=title)],
        checks=[],
    )


def model_report(
    model: GPT,
    tokenizer: TextTokenizer,
    text: str,
    *,
    name: str,
    lang: str = "en",
    log: TrainLog | None = None,
) -> Report:
    """Every head named (on the probe), the training curves if ``log``, then each layer on the probe and on ``text``."""
    txt = REPORT_TEXT[lang]
    labels, weights = model_weights(model, tokenizer, text)
    scores = head_scores(model)
    sections = [_names_section(scores, txt)]
    if log is not None and log.eval_step:
        sections.append(_training_section(log, txt, lang))
    tokens = probe(model.config.vocab_size, half=scores.half, batch=1)  # the first sequence of the scores' probe
    probe_weights = model.attention_weights(tokens)[:, 0]  # (L, H, 2n, 2n)
    ids = [str(i) for i in tokens[0].tolist()]
    sections += _layer_sections(
        probe_weights,
        ids,
        txt,
        key="probe",
        title=txt["probe_layer"],
        text=txt["probe_text"],
        code="model.attention_weights(probe)[{layer}]",
    )
    sections += _layer_sections(
        weights,
        labels,
        txt,
        key="layer",
        title=txt["layer"],
        text=txt["layer_text"],
        code="model.attention_weights(ids)[{layer}]",
    )
    c = model.config
    return Report(
        title=txt["model_title"].format(name=name, text=text),
        intro=txt["model_intro"].format(layers=c.n_layers, heads=c.n_heads, emb=c.emb_dim, tokens=len(labels)),
        lang=lang,
        sections=sections,
        labels={"contents": txt["contents"], "numbers": txt["numbers"], "enlarge": txt["enlarge"]},
    )
