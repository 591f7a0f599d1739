"""The sink experiments' reports, in English or Chinese, and their plots: every figure and every verdict read
from the run's file (``StreamingResult``, ``BackcopyResult``), nothing typed in."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnlab.bench.sinks_result import BackcopyResult, MassiveResult, StreamingResult, VariantsResult, Verdict
from attnlab.bench.sinks_sigmoid import SigmoidResult
from attnlab.bench.sinks_text import CLAIMS, STATUS, WORDS


def _check_lang(lang: str) -> None:
    if lang not in WORDS:
        raise ValueError(f"lang must be one of {list(WORDS)}, got {lang!r}")


def _mean_spread(values: list[float]) -> str:
    """The mean ± half the spread (max - min); the mean alone for one value."""
    mean = statistics.fmean(values)
    return f"{mean:.3f}" if len(values) < 2 else f"{mean:.3f} ± {(max(values) - min(values)) / 2:.3f}"


def verdict_lines(verdicts: list[Verdict], lang: str) -> list[str]:
    """One sentence a claim: what the paper says, what was measured, and whether it held here."""
    _check_lang(lang)
    words = WORDS[lang]
    lines = []
    for v in verdicts:
        line = words["verdict"].format(
            claim=CLAIMS[v.claim][lang], mean=v.mean, spread=v.spread, n=len(v.gaps), status=STATUS[lang][v.status]
        )
        if v.size == v.size:  # not NaN
            line += words["size"].format(size=v.size)
        lines.append(f"- {line}")
    return lines


def partial_lines(result: BackcopyResult | VariantsResult | MassiveResult | SigmoidResult, lang: str) -> list[str]:
    """An interrupted run's line (the seeds it finished, the verdicts judged on them alone), else nothing."""
    return [WORDS[lang]["partial_seeds"].format(seeds=len(result.seeds)), ""] if result.interrupted else []


STREAMING_CLAIMS = ("window_fails", "sinks_recover", "dense_fails", "four_over_one")  # with every arm run


def streaming_report(result: StreamingResult, lang: str = "en") -> str:
    """The streaming run as Markdown: its setting, the table of perplexities, one verdict a claim."""
    _check_lang(lang)
    words = WORDS[lang]
    n = result.contexts * result.context
    verdicts = result.verdicts()
    lines = [
        f"### {words['streaming_title'].format(model=words['model_' + result.model])}",
        "",
        words["streaming_setup"].format(texts=result.texts, n=n, contexts=result.contexts, context=result.context),
        "",
        f"| {words['arm']} | {words['ppl']} |",
        "|---|---|",
        *[f"| {arm} | {_mean_spread(result.ppl[arm])} |" for arm in result.arms],
        "",
        words["first_token"].format(share=result.first_token, largest=result.largest_first, uniform=result.uniform),
        "",
        *([words["partial_arms"].format(arms=", ".join(result.arms)), ""] if result.interrupted else []),
        *verdict_lines(verdicts, lang),
    ]
    if result.interrupted:  # the claims whose arms the run did not reach
        judged = {v.claim for v in verdicts}
        lines += [f"- {words['missing'].format(claim=CLAIMS[c][lang])}" for c in STREAMING_CLAIMS if c not in judged]
    return "\n".join(lines) + "\n"


def backcopy_report(result: BackcopyResult, lang: str = "en") -> str:
    """The Bigram-Backcopy run as Markdown: its setting, each arm's measures at the last step, the verdicts."""
    _check_lang(lang)
    words = WORDS[lang]
    shown = ("loss", "sink", "sink_triggers", "value_ratio", "residual_ratio", "peak_ratio")
    s = result.settings
    lines = [
        f"### {words['backcopy_title']}",
        "",
        words["backcopy_setup"].format(
            layers=s["layers"],
            width=s["width"],
            length=s["length"],
            batch=s["batch"],
            steps=s["steps"],
            lr_adam=s["lr_adam"],
            lr_sgd=s["lr_sgd"],
            seeds=len(result.seeds),
        ),
        "",
        "| " + " | ".join([words["arm"], *(words[m] for m in shown)]) + " |",
        "|" + "---|" * (len(shown) + 1),
        *[
            "| " + " | ".join([arm.name, *(_mean_spread(result.final(arm.name, m)) for m in shown)]) + " |"
            for arm in result.arms
        ],
        "",
        *partial_lines(result, lang),
        *verdict_lines(result.verdicts(), lang),
    ]
    return "\n".join(lines) + "\n"


def variants_report(result: VariantsResult, lang: str = "en") -> str:
    """The variants run as Markdown: its setting, each variant's measures, the verdicts."""
    _check_lang(lang)
    words = WORDS[lang]
    s = result.settings
    shown = {"loss": "loss", "first_token": "largest_first", "learned_sink": "learned", "value_ratio": "value_min"}
    shown["peak_ratio"] = "peak_ratio"
    lines = [
        f"### {words['variants_title']}",
        "",
        words["variants_setup"].format(
            **{k: s[k] for k in ("layers", "heads", "width", "length", "batch", "steps", "lr")}, seeds=len(result.seeds)
        ),
        "",
        "| " + " | ".join([words["variant"], *(words[w] for w in shown.values())]) + " |",
        "|" + "---|" * (len(shown) + 1),
        *[
            "| " + " | ".join([name, *(_mean_spread(values[m]) for m in shown)]) + " |"
            for name, values in result.measures.items()
        ],
        "",
        *partial_lines(result, lang),
        *verdict_lines(result.verdicts(), lang),
    ]
    return "\n".join(lines) + "\n"


def massive_report(result: MassiveResult, lang: str = "en") -> str:
    """The massive-activation run as Markdown: its setting, the loss each way, where they were, the verdicts."""
    _check_lang(lang)
    words = WORDS[lang]
    s = result.settings
    names = words["ways"].format(top=s["top"]).split("|")
    lines = [
        f"### {words['massive_title']}",
        "",
        words["massive_setup"].format(
            **{k: s[k] for k in ("layers", "heads", "width", "steps", "top")}, seeds=len(result.seeds)
        ),
        "",
        f"| {words['way']} | {words['loss']} |",
        "|---|---|",
        *[
            f"| {name} | {_mean_spread(result.loss[way])} |"
            for name, way in zip(names, ("base", "mean", "zero", "control"), strict=True)
        ],
        "",
        *[
            words["found"].format(
                seed=seed,
                layer=f["layer"],
                channels=f["channels"],
                values=", ".join(f"{v:.2f}" for v in f["values"]),
                ratio=f["peak_ratio"],
                position=f["peak_position"],
            )
            for seed, f in zip(result.seeds, result.found, strict=True)
        ],
        "",
        *partial_lines(result, lang),
        *verdict_lines(result.verdicts(), lang),
    ]
    return "\n".join(lines) + "\n"


def sigmoid_report(result: SigmoidResult, lang: str = "en") -> str:
    """The sigmoid run as Markdown: its setting, each arm's measures, the verdicts."""
    _check_lang(lang)
    words = WORDS[lang]
    shown = {"loss": "loss", "first_token": "first_mean", "largest_first": "largest_first"}
    shown |= {"sink_rate": "sink_rate", "peak_ratio": "peak_ratio"}
    lines = [
        f"### {words['sigmoid_title']}",
        "",
        words["sigmoid_setup"].format(**result.settings, seeds=len(result.seeds), uniform=result.uniform),
        "",
        "| " + " | ".join([words["attention"], *(words[w] for w in shown.values())]) + " |",
        "|" + "---|" * (len(shown) + 1),
        *[
            "| " + " | ".join([arm, *(_mean_spread(values[m]) for m in shown)]) + " |"
            for arm, values in result.measures.items()
        ],
        "",
        *partial_lines(result, lang),
        *verdict_lines(result.verdicts(), lang),
    ]
    return "\n".join(lines) + "\n"


def streaming_plot(result: StreamingResult, path: str | Path) -> Path:
    """Each arm's mean NLL a byte, in bins, along the text: the first context's end marked."""
    from matplotlib.figure import Figure

    from attnlab.models.checkpoints import write_atomic

    fig = Figure(figsize=(9, 4.5))
    ax = fig.subplots()
    for arm in result.arms:
        xs = [result.bin * (i + 0.5) for i in range(len(result.curve[arm]))]
        ax.plot(xs, result.curve[arm], marker=".", label=arm)
    ax.axvline(result.context, color="grey", ls="--", lw=1)
    ax.set_xlabel("position")
    ax.set_ylabel(f"mean NLL a token (bins of {result.bin})")
    ax.set_title(f"{WORDS['en']['model_' + result.model]} past its {result.context}-token context")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    target = Path(path)
    write_atomic(target, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    return target


def backcopy_plot(result: BackcopyResult, path: str | Path) -> Path:
    """The sink, the value ratio and the residual ratio of each arm against steps (seed 0 thick, others thin)."""
    from matplotlib.figure import Figure

    from attnlab.models.checkpoints import write_atomic

    fig = Figure(figsize=(13, 4))
    panels = fig.subplots(1, 3)
    for ax, measure in zip(panels, ("sink", "value_ratio", "residual_ratio"), strict=True):
        for i, arm in enumerate(result.arms):
            for seed, values in enumerate(arm.measures[measure]):
                ax.plot(
                    arm.steps,
                    values,
                    color=f"C{i}",
                    lw=1.8 if seed == 0 else 0.6,
                    label=arm.name if seed == 0 else None,
                )
        ax.set_xlabel("step")
        ax.set_title(WORDS["en"][measure])
        ax.grid(True, alpha=0.3)
    panels[0].legend(fontsize=8)
    fig.tight_layout()
    target = Path(path)
    write_atomic(target, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    return target


REPORTS: dict[str, Callable[[Any, str], str]] = {  # experiment -> its report (``attnlab sinks``)
    "streaming": streaming_report,
    "backcopy": backcopy_report,
    "variants": variants_report,
    "massive": massive_report,
    "sigmoid": sigmoid_report,
}
