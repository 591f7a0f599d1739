"""Training curves: the loss, and each head's scores against steps, so a phase change shows as a cliff and a rise.

Drawn with matplotlib's object API, as the heatmaps are (no pyplot, no global state).
"""

from __future__ import annotations

from matplotlib.figure import Figure

from attnlab.explain.render.fonts import fonts
from attnlab.explain.render.heatmap import safe_label
from attnlab.models.train import TrainLog

WORDS = {
    "en": {
        "loss": "loss",
        "train": "train (per step)",
        "eval": "held out",
        "step": "step",
        "score": "{score} score",
        "head": "layer {layer} head {head}",
        "title": "Training",
    },
    "zh": {
        "loss": "损失 (loss)",
        "train": "训练 (每步)",
        "eval": "留出数据",
        "step": "步数",
        "score": "{score} 分数",
        "head": "第 {layer} 层 头 {head}",
        "title": "训练过程",
    },
}


def training_curves(
    log: TrainLog, *, scores: tuple[str, ...] = ("induction", "previous_token"), lang: str = "en"
) -> Figure:
    """Loss against steps; then, if ``log`` has head scores (``explain.heads.watch``), one panel per score."""
    w = WORDS[lang]
    heads = log.extra.get("heads", [])
    panels = 1 + (len(scores) if heads else 0)
    with fonts():
        fig = Figure(figsize=(6.4, 2.6 * panels))
        axes = fig.subplots(panels, 1, squeeze=False, sharex=True)[:, 0]
        ax = axes[0]
        ax.plot(log.step, log.train_loss, color="#9ecae1", linewidth=0.8, label=safe_label(w["train"]))
        ax.plot(log.eval_step, log.eval_loss, color="#08519c", marker="o", markersize=2.5, label=safe_label(w["eval"]))
        ax.set_ylabel(safe_label(w["loss"]))
        ax.legend(fontsize=8)
        ax.set_title(safe_label(w["title"]), fontsize=10)
        steps = [row["step"] for row in heads]
        for ax, score in zip(axes[1:], scores, strict=False):  # no score panels without head scores
            table = [row[score] for row in heads]  # per evaluation: n_layers lists of n_heads
            for layer in range(len(table[0])):
                for head in range(len(table[0][layer])):
                    values = [t[layer][head] for t in table]
                    style = "-" if layer == len(table[0]) - 1 else "--"
                    ax.plot(
                        steps, values, style, linewidth=1.2, label=safe_label(w["head"].format(layer=layer, head=head))
                    )
            ax.set_ylim(0, 1.02)
            ax.set_ylabel(safe_label(w["score"].format(score=score.replace("_", "-"))))
            ax.legend(fontsize=6, ncol=2)
        axes[-1].set_xlabel(safe_label(w["step"]))
        fig.tight_layout()
    return fig
