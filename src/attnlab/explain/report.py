"""Build the HTML reports: the chapter's tour, and any sentence explained.

Both observe the real implementations through the trace recorder (the
book's classes; attnlab.Attention on the eager backend) and never copy them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import regex
import torch

from attnlab import book
from attnlab._checks import check_dropout, check_heads, check_positive_int, check_seed
from attnlab.explain.checks import Check, holds
from attnlab.explain.glossary import HEADINGS, TERMS, first_uses, phrase_in, rows
from attnlab.explain.render.figure_output import page_figure
from attnlab.explain.render.heatmap import head_grid, heatmap
from attnlab.explain.render.html import Figure, Report, Section
from attnlab.explain.report_text import REPORT_TEXT
from attnlab.explain.sink_marks import sink_section
from attnlab.explain.tour import LANGS, build_tour, fmt, kv_cache_steps, kv_step_lines, text_for
from attnlab.nn.attention import Attention
from attnlab.observe import Recorder

MAX_TOKENS = 64  # a heatmap with more rows is unreadable: the HTML report stops here
MAX_TOKENS_TEXT = 2048  # without a report, the terminal summary goes further (weights are T x T per head)
# a word is a run of clusters that start with a word character (an accent, a skin tone or a joiner stays with
# what it marks); any other visible cluster (a punctuation mark, a flag, an emoji) is a token of its own
_TOKEN = regex.compile(r"(?:(?=\w)\X)+|(?!\s)\X")


def tokenize(sentence: str) -> list[str]:
    """Words and punctuation marks, in order: 'Hi, you!' -> ['Hi', ',', 'you', '!']."""
    return _TOKEN.findall(sentence)


def _check_lang(lang: str) -> dict[str, str]:
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {list(LANGS)}, got {lang!r}")
    return REPORT_TEXT[lang]


def _figure(
    matrix: torch.Tensor,
    labels: list[str],
    title: str,
    txt: dict[str, str],
    col_labels: list[str] | None = None,
    *,
    features: bool = False,
) -> Figure:
    """A heatmap in the report's language; ``features``: the columns are feature dimensions, not keys."""
    axes = (txt["features"], txt["tokens_axis"]) if features else (txt["keys"], txt["queries"])
    if matrix.dim() == 3:
        fig = head_grid(matrix, labels, title=title, col_labels=col_labels, axes=axes, head_title=txt["head"])
    else:
        fig = heatmap(matrix, labels, col_labels, title=title, axes=axes)
    return page_figure(fig, title)


def _labels(txt: dict[str, str]) -> dict[str, str]:
    return {"contents": txt["contents"], "numbers": txt["numbers"], "enlarge": txt["enlarge"]}


def _kv_section(
    attn: Attention,
    x: torch.Tensor,
    labels: list[str],
    full_weights: torch.Tensor,
    txt: dict[str, str],
    *,
    lang: str,
    draw: bool,
) -> Section:
    rows, stacked = kv_cache_steps(attn, x)
    lines = kv_step_lines(rows, text_for(lang).words["kv_step"])
    return Section(
        key="kv-cache",
        title=txt["kv"],
        text=txt["kv_text"],
        code="for token in x: attn(token, cache=cache)",
        value="\n".join(lines),
        figures=[_figure(stacked, labels, txt["kv"], txt)] if draw else [],
        checks=[holds(txt["check_kv"], torch.allclose(stacked, full_weights, atol=1e-5))],
    )


def tour_report(lang: str = "en") -> Report:
    """The guided tour of chapter 3 as an HTML report, with heatmaps and checks."""
    txt = _check_lang(lang)
    words = list(book.WORDS)
    sections = []
    steps = build_tour(lang)
    uses = first_uses(lang, [(step.key, step.text) for step in steps])  # each term linked where first written
    for step in steps:
        figures = []
        if step.heat is not None:
            features = step.heat_axes == "features"
            columns = [str(d) for d in range(step.heat.shape[-1])] if features else None
            figures.append(_figure(step.heat, words, step.title, txt, columns, features=features))
        sections.append(
            Section(
                key=step.key,
                title=step.title,
                text=step.text,
                code=step.code or None,
                value=step.value or None,
                figures=figures,
                checks=list(step.checks),
                links={str(phrase_in(t, lang, step.text)): f"term-{t.key}" for t in uses.get(step.key, [])},
            )
        )
    titles = {step.key: step.title for step in steps}
    sections.append(
        Section(
            key="glossary",
            title=txt["glossary_title"],
            text=txt["glossary_text"],
            table=(
                HEADINGS[lang],
                [(f"term-{t.key}", row) for t, row in zip(TERMS, rows(lang, steps=titles), strict=True)],
            ),
        )
    )
    return Report(
        title=txt["tour_title"],
        intro=txt["tour_intro"],
        lang=lang,
        sections=sections,
        labels=_labels(txt),
    )


def word_vector(word: str, *, seed: int, d_model: int) -> torch.Tensor:
    """A (d_model,) vector drawn from a generator seeded by the word itself and ``seed``.

    The same word gets the same vector in every sentence; different words
    ("The" and "the" included) get different ones. Untrained: it shows how
    attention computes, not what a model has learned.
    """
    digest = hashlib.sha256(f"{seed}\x00{word}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
    return torch.randn(d_model, generator=generator)


def explain_report(
    sentence: str,
    *,
    heads: int = 2,
    causal: bool = True,
    dropout: float = 0.0,
    seed: int = 123,
    d_model: int = 16,
    lang: str = "en",
    figures: bool = True,
) -> Report:
    """Any sentence through attnlab.Attention (eager), every step traced (and, with ``figures``, drawn)."""
    txt = _check_lang(lang)
    check_explain_args(sentence, heads=heads, dropout=dropout, seed=seed, d_model=d_model, figures=figures)
    with torch.random.fork_rng(devices=[]):  # the seed is this report's; the caller's generator is left as it was
        torch.manual_seed(seed)
        return _explain(
            tokenize(sentence),
            heads=heads,
            causal=causal,
            dropout=dropout,
            seed=seed,
            d_model=d_model,
            txt=txt,
            lang=lang,
            sentence=sentence,
            draw=figures,
        )


def check_explain_args(sentence: str, *, heads: int, dropout: float, seed: int, d_model: int, figures: bool) -> None:
    """Every argument of :func:`explain_report`, checked before any work (the CLI calls this first)."""
    tokens = tokenize(sentence)
    if not tokens:
        raise ValueError(f"the sentence has no words or punctuation to attend over: {sentence!r}")
    limit = MAX_TOKENS if figures else MAX_TOKENS_TEXT
    if len(tokens) > limit:
        where = "the HTML report's heatmaps show" if figures else "explain shows"
        raise ValueError(f"the sentence has {len(tokens)} tokens; {where} at most {limit}, shorten it")
    check_positive_int("d_model", d_model, limit=4096)
    check_heads(d_model, heads, names=("d_model", "heads"))
    check_dropout(dropout)
    check_seed(seed)


def _explain(
    tokens: list[str],
    *,
    heads: int,
    causal: bool,
    dropout: float,
    seed: int,
    d_model: int,
    txt: dict[str, str],
    lang: str,
    sentence: str,
    draw: bool,
) -> Report:
    attn = Attention(d_in=d_model, num_heads=heads, is_causal=causal, dropout=dropout, backend="eager")
    attn.train(dropout > 0)
    x = torch.stack([word_vector(t, seed=seed, d_model=d_model) for t in tokens])[None]  # (1, T, d_model)
    with torch.no_grad(), Recorder() as rec:
        out = attn(x)

    def figure(matrix: torch.Tensor, title: str, columns: list[str] | None = None, **kw: bool) -> list[Figure]:
        return [_figure(matrix, tokens, title, txt, columns, **kw)] if draw else []

    def step(key: str, code: str, value: str | None = None, *, drawn: torch.Tensor | None = None, **kw: Any) -> Section:
        """A section of the sentence: its title and text (unless given) the report's words of the same key."""
        kw.setdefault("text", txt[f"{key}_text"])
        kw.setdefault("figures", [] if drawn is None else figure(drawn, txt[key]))
        return Section(key=key, title=txt[key], code=code, value=value, **kw)

    get = lambda name: rec.get(name)[0]
    head_dim = d_model // heads
    scaled = txt["scaled_text"].format(sqrt=head_dim**0.5)
    sections = [
        step(
            "tokens",
            "x = torch.stack([word_vector(word, seed=seed, d_model=d_model) for word in tokens])",
            "\n".join(  # the token last: a wide (CJK) character can shift nothing after it, in any font
                f"{i:2d}  [" + ", ".join(f"{v:+.3f}" for v in x[0, i, :6].tolist()) + f", ...]  {tok!r}"
                for i, tok in enumerate(tokens)
            ),
        ),
        step("scores", "attn_scores = q @ k.transpose(-2, -1)", fmt(get("attn_scores")), drawn=get("attn_scores")),
        step("scaled", "attn_scores * head_dim**-0.5", fmt(get("scaled_scores")), text=scaled),
    ]
    if causal:
        sections.append(step("mask", "causal_mask(T, T)", drawn=torch.ones(len(tokens), len(tokens)).tril()))
        masked = get("masked_scores")
        sections.append(step("masked", "scaled.masked_fill(~allowed, -inf)", fmt(masked), drawn=masked))
    weights = get("attn_weights")
    upper = torch.ones(len(tokens), len(tokens), dtype=torch.bool).triu(1)
    checks: list[Check] = [holds(txt["check_rows"], torch.allclose(weights.sum(-1), torch.ones(weights.shape[:2])))]
    if causal:
        checks.append(holds(txt["check_upper"], bool((weights[:, upper] == 0).all())))
    sections.append(
        step("weights", "attn_weights = softmax(masked, dim=-1)", fmt(weights), drawn=weights, checks=checks)
    )
    code = "attnlab.explain.sinks.first_token_share(attn_weights)"  # each head's share on token 0, marked
    sections.append(sink_section(weights[None], lang, causal=causal, figures=draw, code=code))  # (1, H, T, T)
    if dropout > 0:
        dropped = get("dropped_weights")
        visible = weights > 0
        frac = ((dropped == 0) & visible).sum().item() / max(visible.sum().item(), 1)
        value = f"{fmt(dropped)}\n" + txt["zeroed"].format(frac=frac, p=dropout)
        text = txt["dropout_text"].format(p=dropout)
        sections.append(step("dropout", f"F.dropout(attn_weights, p={dropout})", value, drawn=dropped, text=text))
    context = get("context_vec")  # (H, T, D)
    concat = context.transpose(0, 1).reshape(len(tokens), -1)  # (T, H*D): the heads side by side
    columns = [f"h{h}.{d}" for h in range(heads) for d in range(head_dim)]
    code = "context_vec = attn_weights @ v; out = out_proj(concat(heads))"
    drawn = figure(concat, txt["context"], columns, features=True)  # its columns are features, not keys
    sections.append(step("context", code, f"{fmt(concat)}\nout = {fmt(out[0])}", figures=drawn))
    if causal:
        attn.eval()  # the step-through shows the weights without dropout
        with torch.no_grad(), Recorder() as rec_eval:
            attn(x)
        sections.append(_kv_section(attn, x, tokens, rec_eval.get("attn_weights")[0], txt, lang=lang, draw=draw))
    else:
        sections.append(Section(key="kv-cache", title=txt["kv"], text=txt["kv_noncausal"]))
    return Report(
        title=txt["explain_title"].format(sentence=sentence),
        intro=txt["explain_intro"].format(seed=seed, d_model=d_model, heads=heads, causal=causal, dropout=dropout),
        lang=lang,
        sections=sections,
        labels=_labels(txt),
    )
