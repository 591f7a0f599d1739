"""Each head's sink share, marked for a reader: the section ``attnlab explain`` (the sentence report and a model's
report) adds, in English and Chinese.

The measures are ``explain.sinks``' (defined once there): a head's **first-token share** is
``first_token_share`` of its weights on the text shown, and a head whose share is above
``THRESHOLDS["attnlab"]`` (the score ``explain`` names a head "first-token" at) is marked a **sink head**. For a
model with learned sinks (gpt-oss) the **learned sink's share** is ``learned_sink_share`` of what each row's
keys leave (1 minus the row's sum: the recorded ``sink_weight``), named apart: the sink is no token.

Shapes: L = layers, H = heads, T = tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlab.explain.render.html import Section
from attnlab.explain.report_text import REPORT_TEXT
from attnlab.explain.sinks.measures import THRESHOLDS, first_token_share, learned_sink_share

SINK_THRESHOLD = THRESHOLDS["attnlab"]  # applies to the first-token share (its .score)

SINK_TEXT = {
    "en": {
        "title": "Sink heads: each head's share on the first token",
        "text": "A head's first-token share is the mean over rows 1..T-1 of its weight on token 0 (row 0 can see "
        "only token 0); 1 means the head looks at nothing else. A head above {threshold:.2f} is marked a sink head "
        "(attnlab's threshold, where a head is named first-token). A head spread evenly over what it can see would "
        "give {even:.2f} on these {t} tokens.",
        "learned": " This model has learned sinks (gpt-oss): a logit that takes part of every row and is no token. "
        "The learned sink's share is named apart from the first-token share.",
        "row": "layer {layer} head {head}: first-token share {share:.2f}",
        "row_learned": "; learned sink's share {learned:.2f}",
        "mark": "  ← sink head",
        "none": "  (no learned sink in this layer)",
        "too_short": "A first-token share needs at least 2 tokens (row 0 sees only token 0): give a longer text.",
        "figure": "first-token share (marked: sink head)",
        "cell_mark": "sink",
    },
    "zh": {
        "title": "汇聚头 (sink head)：每个头落在首个 Token 上的份额",
        "text": "一个头的首个 Token 份额，是第 1..T-1 行在 Token 0 上权重的平均 (第 0 行只看得到 Token 0)；"
        "1 表示这个头别的什么都不看。份额高于 {threshold:.2f} 的头标为汇聚头 (attnlab 的阈值，也是把头命名为"
        "首个 Token 头的分数)。在这 {t} 个 Token 上，一个把注意力平均分给看得到的 Token 的头会给出 {even:.2f}。",
        "learned": " 这个模型有可学习的注意力汇聚点 (sink，gpt-oss)：它是一个 logit，从每一行拿走一部分，却不是任何 Token。"
        "可学习汇聚点的份额与首个 Token 份额分开列出。",
        "row": "第 {layer} 层 头 {head}：首个 Token 份额 {share:.2f}",
        "row_learned": "；可学习汇聚点份额 {learned:.2f}",
        "mark": "  ← 汇聚头",
        "none": "  (这一层没有可学习的汇聚点)",
        "too_short": "首个 Token 份额至少需要 2 个 Token (第 0 行只看得到 Token 0)：请给一段更长的文本。",
        "figure": "首个 Token 份额 (标出：汇聚头)",
        "cell_mark": "汇聚",
    },
}


def is_sink_head(share: float) -> bool:
    """A head whose first-token share is above the threshold, as ``sink_rate`` counts one (strictly above)."""
    return share > SINK_THRESHOLD.value


def cell_marks(share: float, learned: float | None, txt: dict[str, str]) -> list[str]:
    """A head's marks under its pattern in the view (``txt``: one language of VIEW_TEXT): its first-token share,
    "sink head" when it is one, and the learned sink's share where the model has learned sinks."""
    marks = [txt["first_token"].format(share=f"{share:.2f}")]
    if is_sink_head(share):
        marks.append(txt["sink_head"])
    if learned is not None:
        marks.append(txt["learned_share"].format(share=f"{learned:.2f}"))
    return marks


@dataclass(frozen=True)
class SinkMarks:
    """Per layer and head, the first-token share on one text and whether it marks a sink head; with learned sinks,
    each such layer's sink share (None for a layer without)."""

    first_token: list[list[float]]  # (L, H)
    learned: list[list[float] | None] | None  # per layer (H,) or None; None when the model has no learned sinks
    tokens: int  # T

    def is_sink(self, layer: int, head: int) -> bool:
        """Whether head ``head`` of layer ``layer`` is a sink head (:func:`is_sink_head`)."""
        return is_sink_head(self.first_token[layer][head])


def sink_marks(weights: torch.Tensor, *, sinks: list[bool] | None = None) -> SinkMarks:
    """The marks of weights (L, H, T, T), as shown (each row a distribution, or short of 1 by what a learned sink
    took); ``sinks``: per layer, whether it has learned sinks (None: no layer has)."""
    if not isinstance(weights, torch.Tensor) or weights.dim() != 4:
        got = tuple(weights.shape) if isinstance(weights, torch.Tensor) else type(weights).__name__
        raise ValueError(f"weights must be (layers, heads, T, T), got {got}")
    if sinks is not None and len(sinks) != weights.shape[0]:
        raise ValueError(f"sinks must give one flag per layer, {weights.shape[0]}, got {len(sinks)}")
    shares = first_token_share(weights)  # (L, H)
    learned = None
    if sinks is not None and any(sinks):
        left = (1 - weights.sum(dim=-1)).clamp(0, 1)  # (L, H, T): each row's share the sink took (its sink_weight)
        learned = [learned_sink_share(left[n]).tolist() if has else None for n, has in enumerate(sinks)]
    return SinkMarks(first_token=[[float(v) for v in row] for row in shares], learned=learned, tokens=weights.shape[-1])


def even_share(t: int, *, causal: bool = True) -> float:
    """The first-token share of a head spread evenly over what each row can see, on T = t tokens (the baseline
    the section quotes): the measure applied to that head."""
    even = torch.tril(torch.ones(t, t)) if causal else torch.ones(t, t)  # (T, T)
    return float(first_token_share(even / even.sum(dim=-1, keepdim=True)))


def sink_lines(marks: SinkMarks, lang: str) -> list[str]:
    """One line per head: its share, its learned sink's share where its layer has one, and the mark."""
    txt = SINK_TEXT[lang]
    lines = []
    for layer, row in enumerate(marks.first_token):
        for head, share in enumerate(row):
            line = txt["row"].format(layer=layer, head=head, share=share)
            if marks.learned is not None:
                got = marks.learned[layer]
                line += txt["none"] if got is None else txt["row_learned"].format(learned=got[head])
            lines.append(line + (txt["mark"] if marks.is_sink(layer, head) else ""))
    return lines


def sink_text(marks: SinkMarks, lang: str, *, causal: bool = True) -> str:
    """The section's prose: the measure, the threshold, the even head's share on this many tokens."""
    txt = SINK_TEXT[lang]
    text = txt["text"].format(
        threshold=SINK_THRESHOLD.value, even=even_share(marks.tokens, causal=causal), t=marks.tokens
    )
    return text + (txt["learned"] if marks.learned is not None else "")


def sink_section(
    weights: torch.Tensor,
    lang: str,
    *,
    sinks: list[bool] | None = None,
    causal: bool = True,
    figures: bool = False,
    code: str = "attnlab.explain.sinks.first_token_share(weights)",
) -> Section:
    """The report's section of weights (L, H, T, T): each head's share, marked; a text of one token gets the
    section with what it needs instead (no share can be read)."""
    txt = SINK_TEXT[lang]
    if weights.shape[-1] < 2:
        return Section(key="sinks", title=txt["title"], text=txt["too_short"])
    marks = sink_marks(weights, sinks=sinks)
    drawn = []
    if figures:  # matplotlib only where a figure is drawn (the view imports this module for is_sink_head)
        from attnlab.explain.render.figure_output import page_figure
        from attnlab.explain.render.heatmap import heatmap

        grid = torch.tensor(marks.first_token)  # (L, H)
        cells = [
            [f"{txt['cell_mark'] if marks.is_sink(i, j) else ''}\n{v:.2f}" for j, v in enumerate(row)]
            for i, row in enumerate(marks.first_token)
        ]
        layers, heads = [str(i) for i in range(grid.shape[0])], [str(j) for j in range(grid.shape[1])]
        axes = (REPORT_TEXT[lang]["heads_axis"], REPORT_TEXT[lang]["layers_axis"])
        fig = heatmap(grid, layers, heads, title=txt["figure"], axes=axes, annotate=True, cells=cells, limits=(0, 1))
        drawn = [page_figure(fig, txt["figure"])]
    return Section(
        key="sinks",
        title=txt["title"],
        text=sink_text(marks, lang, causal=causal),
        code=code,
        value="\n".join(sink_lines(marks, lang)),
        figures=drawn,
    )
