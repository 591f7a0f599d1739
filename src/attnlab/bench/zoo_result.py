"""What ``attnlab zoo`` saves and reads back: the run's file (:class:`ZooResult`, its variants and their curves),
and the table, the findings and the plot drawn from it alone (``attnlab.bench.zoo`` makes the run)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attnlab.bench.kv_bytes import readable_bytes

SCHEMA = "attnlab.zoo/1"
SHIPPED_RUN = Path(__file__).resolve().parents[1] / "data" / "zoo" / "zoo.json"  # `attnlab zoo --show`; its plot beside
TOKENS = (1024, 32768, 131072)
PROMPT = 1024  # the long context decode is measured at
DECODE = 32  # tokens decoded after it
READ = f"keys read a token at {PROMPT}"  # the table's heading: every layer's keys, one token decoded after PROMPT


@dataclass
class Curve:
    """One variant, one seed: the held-out loss at each evaluation."""

    seed: int
    steps: list[int]
    loss: list[float]
    seconds: float
    stopped: str = ""  # why it stopped before the last step ("" when it ran them all)


@dataclass
class VariantResult:
    name: str
    what: str
    what_zh: str
    models: str
    parameters: int
    hidden_dim: int
    layer_types: list[str]
    kv_bytes_per_token: int  # float32, every layer; 0 for a model of recurrent layers only
    state_bytes: int  # the recurrent layers' state, float32, whatever the tokens
    cache_at: dict[str, int]  # tokens -> bytes of the whole cache, batch 1, float32
    curves: list[Curve]
    decode_tokens_per_s: float = 0.0
    decode_spread: float = 0.0  # (max - min) / median over the timed rounds
    cache_bytes_held: int = 0  # what the model's cache objects hold after PROMPT + DECODE tokens, measured
    heads: dict[str, float] = field(default_factory=dict)
    # measured after a PROMPT-token prompt (attnlab.bench.sparse_meter); empty / 0 in a run made before they were
    keys_read_by_layer: list[int] = field(default_factory=list)  # keys each layer read decoding one token
    state_bytes_per_token: float = 0.0  # the cache's tensors' bytes over the PROMPT + 1 tokens it holds

    @property
    def keys_read_per_token(self) -> int:
        """Keys one decoded token read after PROMPT tokens, every layer's summed."""
        return sum(self.keys_read_by_layer)

    @property
    def final_losses(self) -> list[float]:
        return [c.loss[-1] for c in self.curves if c.loss]

    @property
    def loss(self) -> float:
        """The mean final held-out loss over the seeds."""
        return statistics.fmean(self.final_losses) if self.final_losses else math.nan

    @property
    def spread(self) -> float:
        """max - min of the final held-out loss over the seeds (0 with one seed)."""
        losses = self.final_losses
        return max(losses) - min(losses) if len(losses) > 1 else 0.0

    def against(self, base: VariantResult) -> list[float]:
        """Its final held-out loss minus ``base``'s, seed by seed: each seed trains both on the same batches and
        evaluates both on the same held-out batches, so the pair differs only by the variant. A seed where either
        stopped early (out of time, interrupted) is left out: the two did not see the same tokens."""
        theirs = {c.seed: c.loss[-1] for c in base.curves if c.loss and not c.stopped}
        return [c.loss[-1] - theirs[c.seed] for c in self.curves if c.loss and not c.stopped and c.seed in theirs]


@dataclass
class ZooResult:
    schema: str
    command: str
    date: str
    torch: str
    threads: int
    minutes: float
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    seeds: list[int]
    seconds: float
    variants: list[VariantResult]
    interrupted: bool = False  # Ctrl-C: the variants trained so far, saved

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ZooResult:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a zoo run: schema {data.get('schema')!r}, expected {SCHEMA!r}")
        variants = [VariantResult(**{**v, "curves": [Curve(**c) for c in v["curves"]]}) for v in data["variants"]]
        return cls(**{**data, "variants": variants})

    @classmethod
    def read(cls, path: str | Path) -> ZooResult:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def write(self, path: str | Path) -> Path:
        from attnlab.models.checkpoints import write_atomic

        target = Path(path)
        text = json.dumps(self.to_dict(), ensure_ascii=False, indent=1) + "\n"
        write_atomic(target, lambda tmp: tmp.write_text(text, encoding="utf-8"))
        return target

    def base(self) -> VariantResult | None:
        """The chapter's mha, which every other variant is set against (None if the run left it out)."""
        return next((v for v in self.variants if v.name == "mha"), None)


def verdict(gaps: list[float]) -> tuple[float, float, bool]:
    """(mean, spread, finding) of paired differences: a finding when the mean is larger than the spread
    (max - min) over the seeds, which needs two seeds or more and puts every seed's difference on one side."""
    mean = statistics.fmean(gaps) if gaps else math.nan
    spread = max(gaps) - min(gaps) if len(gaps) > 1 else math.nan
    return mean, spread, len(gaps) > 1 and abs(mean) > spread


def _head(heads: dict[str, float], key: str, fmt: str) -> str:
    """A head score, or "" for a variant whose heads were not measured (a gathering layer's weights are no map)."""
    return format(heads[key], fmt) if key in heads else ""


def rows(result: ZooResult) -> list[dict[str, str]]:
    """The table, one row a variant, every cell from the run's file."""
    base = result.base()
    metered = any(v.keys_read_by_layer for v in result.variants)
    table = []
    for v in result.variants:
        spread = f" ± {v.spread / 2:.3f}" if len(v.final_losses) > 1 else ""
        against = ""
        if base is not None and v is not base:
            mean, gap_spread, finding = verdict(v.against(base))
            gap = "" if math.isnan(gap_spread) else f" ± {gap_spread / 2:.3f}"
            against = f"{mean:+.3f}{gap}" + (" *" if finding else "")
        table.append(
            {
                "variant": v.name,
                "held-out loss": f"{v.loss:.3f}{spread}",
                "against mha": against,
                "parameters": f"{v.parameters:,}",
                "KV bytes a token": f"{v.kv_bytes_per_token:,}"
                + (f" + state {readable_bytes(v.state_bytes)}" if v.state_bytes else ""),
                "cache at 32k": readable_bytes(v.cache_at[str(TOKENS[1])]),
                "cache at 128k": readable_bytes(v.cache_at[str(TOKENS[2])]),
                f"decode tok/s at {PROMPT}": f"{v.decode_tokens_per_s:.0f} ({v.decode_spread:.0%})",
                "cache held (measured)": readable_bytes(v.cache_bytes_held),
                "prev-token": _head(v.heads, "previous_token", ".2f"),
                "induction": _head(v.heads, "induction", ".2f"),
                "in-context gain": _head(v.heads, "in_context_gain", "+.2f"),
                "sink": f"{v.heads['sink']:.2f}" if "sink" in v.heads else "",
            }
        )
        if metered:  # a run made before the meters has no such columns
            table[-1] |= {
                READ: f"{v.keys_read_per_token:,}" if v.keys_read_by_layer else "",
                "state bytes a token (measured)": f"{v.state_bytes_per_token:,.0f}" if v.state_bytes_per_token else "",
            }
    return table


def markdown(result: ZooResult) -> str:
    """The table as Markdown, with the run's settings and its noise rule beneath; all from the file."""
    table = rows(result)
    head = list(table[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row[h] for h in head) + " |" for row in table]
    rule = (
        f"Held-out loss: the mean over {len(result.seeds)} seeds ± half its spread. Against mha: the difference "
        "taken seed by seed (a seed trains and evaluates every variant on the same batches), its mean ± half "
        "its spread; * marks a finding, a mean larger than the spread, every seed on one side. Decode: the median "
        f"of 3 timed rounds of {DECODE} tokens after a {PROMPT}-token prompt, (its spread)."
        if len(result.seeds) > 1
        else "One seed: no spread was measured, so no difference in loss is called a finding. Decode: the median "
        f"of the timed rounds of {DECODE} tokens after a {PROMPT}-token prompt, (its spread)."
    )
    lines += [
        "",
        f"`{result.command}` ({result.date}, torch {result.torch}, {result.threads} threads): {result.steps} steps of "
        f"{result.batch_size} x {result.seq_len} bytes, lr {result.lr:g}, seeds {result.seeds}; "
        f"{result.seconds / 60:.1f} minutes of a {result.minutes:g}-minute budget. {rule}",
    ]
    stopped = [f"{v.name} (seed {c.seed}: {c.stopped})" for v in result.variants for c in v.curves if c.stopped]
    if stopped:
        lines.append("Stopped early: " + "; ".join(stopped) + ".")
    return "\n".join(lines)


def findings(result: ZooResult) -> list[str]:
    """A sentence a variant about its held-out loss against mha, from the file: the paired difference, its
    spread, and whether it is a finding (:func:`verdict`)."""
    base = result.base()
    if base is None or len(result.seeds) < 2:
        return []
    said = []
    for v in result.variants:
        if v is base:
            continue
        mean, spread, finding = verdict(v.against(base))
        side = "lower" if mean < 0 else "higher"
        said.append(
            f"{v.name}: {mean:+.3f} against mha ({side}; spread {spread:.3f} over {len(result.seeds)} seeds: "
            f"{'a finding' if finding else 'within the noise'})"
        )
    return said


def plot(result: ZooResult, path: str | Path) -> Path:
    """The held-out loss curves of every variant (seed 0 solid, others thin) beside the cache at 32k tokens."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5))
    curves, caches = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    colors = [f"C{i % 10}" for i in range(len(result.variants))]
    for v, color in zip(result.variants, colors, strict=True):
        for c in v.curves:
            curves.plot(
                c.steps, c.loss, color=color, lw=1.8 if c.seed == 0 else 0.7, label=v.name if c.seed == 0 else None
            )
    curves.set_xlabel("step")
    curves.set_ylabel("held-out loss (nats a byte)")
    curves.set_title(f"{len(result.variants)} kinds of attention, the same text, parameters and steps")
    curves.grid(True, alpha=0.3)
    curves.legend(fontsize=7, ncol=2)
    names = [v.name for v in result.variants]
    sizes = [v.cache_at[str(TOKENS[1])] / 2**20 for v in result.variants]
    caches.barh(names, sizes, color=colors)
    caches.set_xscale("log")
    caches.invert_yaxis()
    caches.set_xlabel(f"cache at {TOKENS[1]:,} tokens, float32 (MiB, log)")
    caches.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    target = Path(path)
    from attnlab.models.checkpoints import write_atomic

    write_atomic(target, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    return target
