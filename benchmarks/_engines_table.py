"""benchmarks/engines.py's tables and verdicts, every cell from a saved run: one table of single-prompt rows, one
of batched rows (gpt2-small's shape), the run's note (machine, CPU, model), and the issues' targets judged."""

from __future__ import annotations

from typing import Any

from _engines_quality import quality_verdicts
from _engines_rows import batch_of
from _verdicts import judged

NOISY = 0.25  # a spread over this is said: too wide to trust a ratio
QUANTIZED = {"int8", "q8_0"}
BATCHES = (8, 32)


def check_quality(result: dict[str, Any]) -> list[str]:
    """What the tokens say is wrong: a float row whose greedy tokens are not Hugging Face float32's."""
    wrong = []
    for row in result["rows"]:
        base = row["precision"].split()[0]
        if "error" not in row and base not in QUANTIZED and base != "bfloat16":
            if not row["tokens_identical"]:
                wrong.append(f"{row['engine']} {row['precision']}: its greedy tokens differ from HF float32's")
    return wrong


def render(result: dict[str, Any]) -> str:
    """The tables (one prompt; several at once) and the issues' targets, every cell and verdict from the result."""
    lines = [
        "| engine | precision | decode tok/s | spread | vs HF float32 | of the floor | prefill ms | tokens vs HF float32 "
        "| kernel |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    single = [r for r in result["rows"] if r.get("batch", batch_of(r["precision"])) == 1]
    batched = [r for r in result["rows"] if r not in single]
    for row in sorted(single, key=lambda r: -r.get("decode_tokens_per_s", 0)):
        ratio = "" if "error" in row else f"{row.get('vs_hf_float32', float('nan')):.2f}x"
        lines.append(row_line(row, [row["engine"], row["precision"]], ratio))
    if batched:
        lines += [
            "",
            "| engine | precision | prompts | decode tok/s, all prompts | spread | of the floor | prefill ms, all "
            "prompts | first prompt's tokens vs HF float32 | kernel |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in sorted(batched, key=lambda r: (batch_of(r["precision"]), r["engine"])):
            lines.append(row_line(row, [row["engine"], row["precision"], str(batch_of(row["precision"]))], None))
    model = result["model"]
    took = f", {result['seconds'] / 60:.0f} minutes in all" if "seconds" in result else ""  # runs since 2026-12-05
    what = result.get("described") or (  # runs before --shape: gpt2-small's
        f"a seeded GPT-2 of {model['n_layers']} layers x {model['emb_dim']}, {model['vocab_size']} tokens"
    )
    cpu = f", {result['cpu']}" if result.get("cpu") else ""
    lines.append(
        f"\n`{result['command']}` ({result['date']}{cpu}, torch {result['torch']}, {result['threads']} threads, "
        f"{result['rounds']} interleaved rounds{took}): {what}; a {result['prompt_tokens']}-token prompt, "
        f"{result['new_tokens']} greedy tokens. Decode tok/s is the median over the rounds; {floor_note(result)}"
    )
    lines += ["", "The issues' targets, judged from this run (a ratio whose rows spread past 25% is no finding):"]
    lines += [f"- {line}" for line in verdicts(result)]
    return "\n".join(lines)


def floor_note(result: dict[str, Any]) -> str:
    """What the floor divides by: the rate measured once a round (runs since 2026-12-08), else once a run."""
    stream = result.get("stream")
    if not stream:
        return "the floor is one step's bytes at the fastest streaming rate measured in the run."
    wide = ", too wide to trust: no verdict against the floor" if stream["stream_spread"] > NOISY else ""
    rates = ", ".join(f"{rate:.1f}" for rate in stream["stream_rounds"])
    return (
        "the floor is one step's bytes at the fastest rate this machine streamed a weight matrix at, measured once "
        f"a round like a row ({rates} GB/s): their median, {stream['stream_gb_s']:.1f} GB/s, spread "
        f"{stream['stream_spread']:.0%}{wide}; a verdict against the floor takes the wider of the row's spread and "
        "the rate's."
    )


def row_line(row: dict[str, Any], first: list[str], ratio: str | None) -> str:
    """One table line: the ``first`` cells, then the rate, its spread, ``ratio`` (None: no such column), the
    floor, the prefill, the tokens and the kernel; a row that failed, its error."""
    cells = list(first)
    if "error" in row:
        cells += [row["error"]] + [""] * (6 if ratio is None else 7)
        return "| " + " | ".join(cells) + " |"
    wide = " (too wide to trust)" if row["spread"] > NOISY else ""
    cells += [f"{row['decode_tokens_per_s']:.1f}", f"{row['spread']:.0%}{wide}"]
    cells += [] if ratio is None else [ratio]
    same = "identical" if row["tokens_identical"] else f"{row['agreement']:.0%} agree"
    kernel = row.get("kernel") or "not recorded"
    if row.get("failed_rounds"):  # its figures are the other rounds'
        kernel += f"; {len(row['failed_rounds'])} round(s) failed: {row['failed_rounds'][0]}"
    cells += [f"{row['floor_fraction']:.0%}", f"{row['prefill_ms']:.1f}", same, kernel]
    return "| " + " | ".join(cells) + " |"


class _Judge:
    """The rows of one run by name, and a target's verdict between two of them."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.rows = {f"{r['engine']} {r['precision']}": r for r in result["rows"] if "error" not in r}

    def best(self, *names: str, key: str = "decode_tokens_per_s", low: bool = False) -> str | None:
        found = [n for n in names if n in self.rows]
        pick = min if low else max
        return pick(found, key=lambda n: self.rows[n][key]) if found else None

    def __call__(self, what: str, ours: str | None, theirs: str | None, target: float, *, prefill: bool = False) -> str:
        if ours not in self.rows or theirs not in self.rows:  # None: none of the rows asked for ran
            return f"{what}: not established (a row did not run)"
        assert ours is not None and theirs is not None
        spread = "prefill_spread" if prefill else "spread"
        a, b = self.rows[ours], self.rows[theirs]
        ratio = b["prefill_ms"] / a["prefill_ms"] if prefill else a["decode_tokens_per_s"] / b["decode_tokens_per_s"]
        if spread not in a or spread not in b:
            verdict = "not established (the run recorded no spread for it)"
        else:
            verdict = judged(ratio, target, max(a[spread], b[spread]))
            steady_floor = a.get("stream_spread", 0.0) <= NOISY  # a floor whose rate spread too wide says nothing
            if (
                max(a[spread], b[spread]) <= NOISY
                and 0 < ratio < target
                and not prefill
                and "floor_fraction" in a
                and steady_floor
            ):  # how far: the target in floor terms
                needed = a["floor_fraction"] * target / ratio  # of the row's own floor (its own bytes a step)
                verdict += f"; it asks {ours} for {needed:.0%} of its floor, where it runs at {a['floor_fraction']:.0%}"
        return f"{what} ({ours} against {theirs}): {ratio:.2f}x, target {target:g}x: {verdict}"

    def floor(self, name: str, target: float) -> str:
        """A row's fraction of its own floor against ``target``."""
        if name not in self.rows or "floor_fraction" not in self.rows[name]:
            return f"{name} at {target:.0%} of its floor: not established (the row did not run)"
        row = self.rows[name]
        if "stream_spread" in row and row["stream_spread"] > row["spread"]:  # the rate's, measured a round each
            verdict = judged(row["floor_fraction"], target, row["stream_spread"], whose="the floor's rate")
        else:
            verdict = judged(row["floor_fraction"], target, row["spread"], whose="the row")
        return f"{name} at {target:.0%} of its floor: {row['floor_fraction']:.0%}: {verdict}"


FP32 = ("attnlab float32", "attnlab float32 layout-auto", "attnlab float32 compiled")
HALF = ("attnlab bfloat16", "attnlab bfloat16 layout-auto", "attnlab bfloat16 compiled")
INT8 = ("attnlab int8", "attnlab int8 compiled")


def verdicts(result: dict[str, Any]) -> list[str]:
    """Each target this run can judge, from its rows: issue 37's (every shape; the batched ones on gpt2-small's),
    then issue 58's for the run's shape: the ratio, and met, not met, or not established (a row missing, or a
    spread over NOISY)."""
    judge = _Judge(result)
    best = judge.best
    eager = best("attnlab float32", "attnlab float32 layout-auto")
    half = best(*HALF)
    f32_peer = best("ctranslate2 float32", "llama.cpp f32")
    out = [
        judge("int8 decode", best(*INT8), best("ctranslate2 int8"), 1.0),
        judge("bfloat16 decode against llama.cpp", half, best("llama.cpp f16"), 1.0),
        # like against like: the fastest bfloat16 row against the fastest float32 row, compiled or not
        judge("bfloat16 decode against float32", half, best(*FP32), 1.5),
        judge("float32 eager decode", eager, f32_peer, 1.0),
        judge("float32 compiled decode", best("attnlab float32 compiled"), f32_peer, 1.3),
    ]
    if result.get("shape", "gpt2-small") == "gpt2-small":
        for size in BATCHES:
            ours = (f"attnlab int8 batch {size}", f"attnlab int8 static batch {size}")
            out.append(judge(f"int8 at {size} prompts", best(*ours), best(f"ctranslate2 int8 batch {size}"), 1.0))
    groups = {
        "float32": (FP32, ("hf float32", "ctranslate2 float32", "llama.cpp f32")),
        "16-bit": (HALF, ("hf bfloat16", "llama.cpp f16")),
        "int8": (INT8, ("ctranslate2 int8", "llama.cpp q8_0")),
    }
    for name, (ours_rows, peers) in groups.items():
        low = {"key": "prefill_ms", "low": True}
        out.append(judge(f"{name} prefill", best(*ours_rows, **low), best(*peers, **low), 1.0, prefill=True))  # type: ignore[arg-type]
    if "shape" in result:  # runs since issue 58
        out += issue_58(result, judge)
    return out + (quality_verdicts(result) if "quality" in result or "shape" not in result else [])


def issue_58(result: dict[str, Any], judge: _Judge) -> list[str]:
    """Issue 58's targets: on gpt2-small's shape the default float32 row (``from_pretrained`` + ``generate``)
    against its floor, CTranslate2 and Hugging Face; on the Qwen shapes, the default and the tuned rows against
    the peers at their precision and 1.5x Hugging Face's."""
    default = "attnlab float32"
    if result["shape"] == "gpt2-small":
        out = [
            judge.floor(default, 0.8),
            judge("default float32 against CTranslate2", default, "ctranslate2 float32", 0.95),
            judge("default float32 against Hugging Face", default, "hf float32", 1.0),
        ]
        single = [n for n in judge.rows if n.startswith("attnlab") and judge.rows[n].get("batch", 1) == 1]
        return out + [judge.floor(n, 0.8) for n in single if n != default]
    return [
        judge("default float32 against CTranslate2", default, "ctranslate2 float32", 1.0),
        judge("int8 against CTranslate2", judge.best(*INT8), "ctranslate2 int8", 1.0),
        judge("bfloat16 against llama.cpp", judge.best(*HALF), "llama.cpp f16", 1.0),
        judge("default float32 against Hugging Face", default, "hf float32", 1.5),
        judge("bfloat16 against Hugging Face", judge.best(*HALF), "hf bfloat16", 1.5),
    ]
