"""Build the HTML reports: the chapter's tour, and any sentence explained.

Both observe the real implementations through the trace recorder (the
book's classes; attnlab.Attention on the eager backend) and never copy them.
"""

from __future__ import annotations

import re

import torch
import torch.nn as nn

from attnlab import book
from attnlab._checks import check_dropout, check_heads, check_positive_int
from attnlab.cache import KVCache
from attnlab.explain.checks import Check, holds
from attnlab.explain.render.heatmap import head_grid, heatmap, png_bytes
from attnlab.explain.render.html import Figure, Report, Section
from attnlab.explain.report_text import REPORT_TEXT
from attnlab.explain.tour import build_tour
from attnlab.explain.tour_text import LANGS
from attnlab.nn.attention import Attention
from attnlab.nn.loaders import from_book
from attnlab.observe import Recorder

MAX_TOKENS = 64
_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def tokenize(sentence: str) -> list[str]:
    """Words and punctuation marks, in order: 'Hi, you!' -> ['Hi', ',', 'you', '!']."""
    return _TOKEN.findall(sentence)


def _check_lang(lang: str) -> dict[str, str]:
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {list(LANGS)}, got {lang!r}")
    return REPORT_TEXT[lang]


def _figure(matrix: torch.Tensor, labels: list[str], title: str, col_labels: list[str] | None = None) -> Figure:
    if matrix.dim() == 3:
        fig = head_grid(matrix, labels, title=title, col_labels=col_labels)
    else:
        fig = heatmap(matrix, labels, col_labels, title=title)
    return Figure(png=png_bytes(fig), alt=title, caption=title)


def kv_cache_steps(attn: Attention, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Feed x (1, T, d) one token at a time through a KVCache; eager backend.

    Returns each step's new weight row (H, t) and the rows stacked into a
    (H, T, T) matrix, zero-padded on the right.
    """
    if attn.backend != "eager":
        raise ValueError(f"the step-through records weights, which only the eager backend forms; got {attn.backend!r}")
    t = x.shape[1]
    cache = KVCache(batch_size=1, num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim, max_len=t, dtype=x.dtype)
    rows, stacked = [], torch.zeros(attn.num_heads, t, t)
    with torch.no_grad():
        for i in range(t):
            with Recorder() as rec:
                attn(x[:, i : i + 1], cache=cache)
            row = rec.get("attn_weights")[0, :, 0, : i + 1]  # (H, i + 1): the filled slots of the cache
            rows.append(row)
            stacked[:, i, : i + 1] = row
    return rows, stacked


def _kv_section(
    attn: Attention, x: torch.Tensor, labels: list[str], full_weights: torch.Tensor, txt: dict[str, str]
) -> Section:
    rows, stacked = kv_cache_steps(attn, x)
    lines = [
        txt["kv_step"].format(t=i + 1, n=i + 1, row="[" + ", ".join(f"{v:.4f}" for v in row[0].tolist()) + "]")
        for i, row in enumerate(rows)
    ]
    return Section(
        key="kv-cache",
        title=txt["kv"],
        text=txt["kv_text"],
        code="for token in x: attn(token, cache=cache)",
        value="\n".join(lines),
        figures=[_figure(stacked, labels, txt["kv"])],
        checks=[holds("stacked rows == full causal weights", torch.allclose(stacked, full_weights, atol=1e-5))],
    )


def tour_report(lang: str = "en") -> Report:
    """The guided tour of chapter 3 as an HTML report, with heatmaps and checks."""
    txt = _check_lang(lang)
    words = list(book.WORDS)
    sections = []
    for step in build_tour(lang):
        figures = [_figure(step.heat, words, step.title)] if step.heat is not None else []
        sections.append(
            Section(
                key=step.key,
                title=step.title,
                text=step.text,
                code=step.code,
                value=step.value,
                figures=figures,
                checks=list(step.checks),
            )
        )
    with torch.random.fork_rng(devices=[]):  # the book's seed, without touching the caller's generator
        torch.manual_seed(123)
        mha = book.MultiHeadAttention(3, 2, 6, 0.0, num_heads=2).eval()
    x = book.embedded_inputs()[None]  # (1, 6, 3)
    with Recorder() as rec, torch.no_grad():
        mha(x)
    sections.append(_kv_section(from_book(mha, backend="eager"), x, words, rec.get("attn_weights")[0], txt))
    return Report(
        title=txt["tour_title"],
        intro=txt["tour_intro"],
        lang=lang,
        sections=sections,
        labels={"contents": txt["contents"], "numbers": txt["numbers"]},
    )


def explain_report(
    sentence: str,
    *,
    heads: int = 2,
    causal: bool = True,
    dropout: float = 0.0,
    seed: int = 123,
    d_model: int = 16,
    lang: str = "en",
) -> Report:
    """Any sentence through attnlab.Attention (eager), every step traced and drawn."""
    txt = _check_lang(lang)
    tokens = tokenize(sentence)
    if not tokens:
        raise ValueError(f"the sentence has no words or punctuation to attend over: {sentence!r}")
    if len(tokens) > MAX_TOKENS:
        raise ValueError(f"the sentence has {len(tokens)} tokens; the report shows at most {MAX_TOKENS}, shorten it")
    check_positive_int("d_model", d_model, limit=4096)
    check_heads(d_model, heads, names=("d_model", "heads"))
    check_dropout(dropout)
    with torch.random.fork_rng(devices=[]):  # the seed is this report's; the caller's generator is left as it was
        torch.manual_seed(seed)
        return _explain(
            tokens,
            heads=heads,
            causal=causal,
            dropout=dropout,
            seed=seed,
            d_model=d_model,
            txt=txt,
            lang=lang,
            sentence=sentence,
        )


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
) -> Report:
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(tokens))}
    embedding = nn.Embedding(len(vocab), d_model)
    attn = Attention(d_in=d_model, num_heads=heads, is_causal=causal, dropout=dropout, backend="eager")
    attn.train(dropout > 0)
    ids = torch.tensor([[vocab[t] for t in tokens]])
    with torch.no_grad(), Recorder() as rec:
        x = embedding(ids)  # (1, T, d_model)
        out = attn(x)
    get = lambda name: rec.get(name)[0]
    head_dim = d_model // heads
    sections = [
        Section(
            key="tokens",
            title=txt["tokens"],
            text=txt["tokens_text"],
            code="x = embedding(ids)",
            value="\n".join(
                f"{i:2d} {tok!r:>14}  [" + ", ".join(f"{v:+.3f}" for v in x[0, i, :6].tolist()) + ", ...]"
                for i, tok in enumerate(tokens)
            ),
        ),
        Section(
            key="scores",
            title=txt["scores"],
            text=txt["scores_text"],
            code="attn_scores = q @ k.transpose(-2, -1)",
            value=str(get("attn_scores")),
            figures=[_figure(get("attn_scores"), tokens, txt["scores"])],
        ),
        Section(
            key="scaled",
            title=txt["scaled"],
            text=txt["scaled_text"].format(sqrt=head_dim**0.5),
            code="attn_scores * head_dim**-0.5",
            value=str(get("scaled_scores")),
        ),
    ]
    if causal:
        mask = torch.ones(len(tokens), len(tokens)).tril()
        sections.append(
            Section(
                key="mask",
                title=txt["mask"],
                text=txt["mask_text"],
                code="causal_mask(T, T)",
                figures=[_figure(mask, tokens, txt["mask"])],
            )
        )
        sections.append(
            Section(
                key="masked",
                title=txt["masked"],
                text=txt["masked_text"],
                code="scaled.masked_fill(~allowed, -inf)",
                value=str(get("masked_scores")),
                figures=[_figure(get("masked_scores"), tokens, txt["masked"])],
            )
        )
    weights = get("attn_weights")
    upper = torch.ones(len(tokens), len(tokens), dtype=torch.bool).triu(1)
    checks: list[Check] = [holds("rows sum to 1", torch.allclose(weights.sum(-1), torch.ones(weights.shape[:2])))]
    if causal:
        checks.append(holds("upper triangle is exactly 0", bool((weights[:, upper] == 0).all())))
    sections.append(
        Section(
            key="weights",
            title=txt["weights"],
            text=txt["weights_text"],
            code="attn_weights = softmax(masked, dim=-1)",
            value=str(weights),
            figures=[_figure(weights, tokens, txt["weights"])],
            checks=checks,
        )
    )
    if dropout > 0:
        dropped = get("dropped_weights")
        visible = weights > 0
        frac = ((dropped == 0) & visible).sum().item() / max(visible.sum().item(), 1)
        sections.append(
            Section(
                key="dropout",
                title=txt["dropout"],
                text=txt["dropout_text"].format(p=dropout),
                code=f"F.dropout(attn_weights, p={dropout})",
                value=f"{dropped}\nzeroed: {frac:.2f} of the visible weights (p = {dropout})",
                figures=[_figure(dropped, tokens, txt["dropout"])],
            )
        )
    context = get("context_vec")  # (H, T, D)
    concat = context.transpose(0, 1).reshape(len(tokens), -1)  # (T, H*D): the heads side by side
    columns = [f"h{h}.{d}" for h in range(heads) for d in range(head_dim)]
    sections.append(
        Section(
            key="context",
            title=txt["context"],
            text=txt["context_text"],
            code="context_vec = attn_weights @ v; out = out_proj(concat(heads))",
            value=f"{concat}\nout = {out[0]}",
            figures=[_figure(concat, tokens, txt["context"], columns)],
        )
    )
    if causal:
        attn.eval()  # the step-through shows the weights without dropout
        with torch.no_grad(), Recorder() as rec_eval:
            attn(x)
        sections.append(_kv_section(attn, x, tokens, rec_eval.get("attn_weights")[0], txt))
    else:
        sections.append(Section(key="kv-cache", title=txt["kv"], text=txt["kv_noncausal"]))
    return Report(
        title=txt["explain_title"].format(sentence=sentence),
        intro=txt["explain_intro"].format(seed=seed, d_model=d_model, heads=heads, causal=causal, dropout=dropout),
        lang=lang,
        sections=sections,
        labels={"contents": txt["contents"], "numbers": txt["numbers"]},
    )
