"""Issue 35, part 4: the models that ship, measured: held-out loss (from each one's training log) and how much
greedy text repeats itself.

    .venv/bin/python benchmarks/shipped_models.py [--json shipped.json] [--tokens 200]
    .venv/bin/python benchmarks/shipped_models.py --render shipped.json   # the docs/heads.md section, from a run

For each shipped text model (``text``: bytes of Python's documentation; ``poems``: characters of Tang
poems), on the prompts the README and docs/heads.md give it, greedy decoding writes ``--tokens`` tokens (or as
many as the model's context holds after the prompt: 64 characters for the poems), and
the run records the share of the continuation's 8-grams (of tokens) that already occurred earlier in the
prompt and continuation: 0 for text that never repeats itself, near 1 for a loop ("the same as the same as").
The held-out loss is the last evaluation of the model's own training log (the poems held out are whole poems,
静夜思 among them). Each model's file size is recorded beside, and the total of every shipped model's
(the issue keeps them under 10 MB together). ``--smoke``: 20 tokens, one prompt each.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab.models import GPT, load_tokenizer
from attnlab.models.locate import SHIPPED, locate
from attnlab.models.train import read_log

PROMPTS = {  # the README's prompts for the text model; the poems' demo lines
    "text": ["The for statement", "The", "The cache lets go of what attention ignores."],
    "poems": ["床前明月光，", "春眠不觉晓，", "白日依山尽，"],
}
N = 8  # the n of the n-grams counted
LIMIT_MB = 10.0  # every shipped model together
REAL_WINDOWS = 500  # windows of held-out text measured as the reference


def repeated_share(ids: list[int], start: int, n: int = N) -> float:
    """The share of the n-grams that begin at or after ``start`` (the continuation) already seen earlier in ids."""
    seen: set[tuple[int, ...]] = set()
    repeated = total = 0
    for i in range(len(ids) - n + 1):
        gram = tuple(ids[i : i + n])
        if i >= start:
            total += 1
            repeated += gram in seen
        seen.add(gram)
    return repeated / total if total else 0.0


def longest_loop(ids: list[int], start: int, max_period: int = 64) -> tuple[int, int]:
    """(tokens, period) of the longest stretch of ids[start:] in which each token repeats the one ``period``
    before it, for a block said at least three times back to back (tokens >= 2 * period); (0, 0) if none.
    A run of one token counts too (period 1): 200 spaces are a loop."""
    best = (0, 0)
    for period in range(1, max_period + 1):
        run = 0
        for i in range(max(start, period), len(ids) + 1):
            if i < len(ids) and ids[i] == ids[i - period]:
                run += 1
                continue
            if run >= 2 * period and run > best[0]:
                best = (run, period)
            run = 0
    return best


def real_text(prompt_tokens: int, new_tokens: int, windows: int) -> dict[str, Any]:
    """The same measures on the text model's held-out documentation: ``windows`` windows (seeded) of
    prompt + new tokens, the first ``prompt_tokens`` read as the prompt."""
    from attnlab.models.tasks import TextTask, stdlib_text

    task = TextTask(stdlib_text(), seq_len=prompt_tokens + new_tokens - 1)
    rows = task.batch(windows, torch.Generator().manual_seed(0), split="eval")[0].tolist()  # (windows, length)
    shares = sorted(repeated_share(row, prompt_tokens) for row in rows)
    return {
        "windows": windows,
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "median_repeated_8grams": shares[len(shares) // 2],
        "longest_loop": max(longest_loop(row, prompt_tokens)[0] for row in rows),
    }


def measure(tokens: int, smoke: bool) -> dict[str, Any]:
    models = []
    for name, prompts in PROMPTS.items():
        where = locate(name)
        model, tokenizer, log = GPT.from_pretrained(name).eval(), load_tokenizer(where), read_log(where)
        runs = []
        for prompt in prompts[:1] if smoke else prompts:
            ids = tokenizer.encode(prompt)
            n = min(tokens, model.config.context_length - len(ids))  # the poems model's context is 64 characters
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), n)[0].tolist()
            loop, period = longest_loop(out, len(ids))
            runs.append(
                {
                    "prompt": prompt,
                    "new_tokens": n,
                    "text": tokenizer.decode(out[len(ids) :]),
                    "repeated_8grams": repeated_share(out, len(ids)),
                    "longest_loop": loop,
                    "loop_period": period,
                }
            )
        models.append(
            {
                "model": name,
                "held_out_loss": None if log is None or not log.eval_loss else log.eval_loss[-1],
                "steps": None if log is None or not log.step else log.step[-1],
                "bytes": sum(f.stat().st_size for f in where.iterdir() if f.is_file()),
                "runs": runs,
            }
        )
    shipped = sum(f.stat().st_size for name in SHIPPED for f in locate(name).iterdir() if f.is_file())
    real = real_text(len(PROMPTS["text"][0].encode("utf-8")), tokens, 20 if smoke else REAL_WINDOWS)
    return {
        "schema": "attnlab.shipped/1",
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "new_tokens": tokens,
        "models": models,
        "shipped_bytes": shipped,
        "real_text": real,
        "loop_tokens": real["longest_loop"] + 1,  # longer than any loop of the held-out documentation
    }


def render(result: dict[str, Any]) -> str:
    """The docs/heads.md section: every figure computed from the run's file (a run from before the loop
    measure has no loop column)."""
    loops = "real_text" in result
    lines = [
        f"`{result['command']}` ({result['date']}, torch {result['torch']}; greedy, up to {result['new_tokens']} new "
        "tokens a prompt, as many as the model's context holds):",
        "",
        "| model | held-out loss (its log) | steps | files | prompt | new tokens | 8-grams repeated | "
        + ("longest loop | " if loops else "")
        + "the continuation, first 40 characters |",
        "|---|---|---|---|---|---|---|" + ("---|" if loops else "") + "---|",
    ]
    for m in result["models"]:
        loss = "n/a" if m["held_out_loss"] is None else f"{m['held_out_loss']:.3f}"
        for r in m["runs"]:
            text = r["text"][:40].replace("\n", "⏎").replace("|", "\\|")
            loop = (
                ("none | " if not r["longest_loop"] else f"{r['longest_loop']} tokens (period {r['loop_period']}) | ")
                if loops
                else ""
            )
            lines.append(
                f"| {m['model']} | {loss} | {m['steps']} | {m['bytes'] / 1e6:.2f} MB | {r['prompt']} | {r['new_tokens']} | "
                f"{r['repeated_8grams']:.0%} | {loop}{text} |"
            )
    total = result["shipped_bytes"] / 1e6
    verdict = "under" if total < LIMIT_MB else "over"
    lines += ["", f"Every shipped model together: {total:.2f} MB, {verdict} the {LIMIT_MB:.0f} MB the issue allows."]
    if loops:
        real, limit = result["real_text"], result["loop_tokens"]
        looped = [f"{r['prompt']!r}" for m in result["models"] for r in m["runs"] if r["longest_loop"] >= limit]
        lines += [
            "",
            f"Real text, for comparison: {real['windows']} windows of the text model's held-out documentation, "
            f"{real['prompt_tokens']} bytes then {real['new_tokens']}, repeat a median "
            f"{real['median_repeated_8grams']:.0%} of their 8-grams, and their longest loop is {real['longest_loop']} "
            f"bytes (a heading's underline). A continuation loops here when its longest loop is longer than that, "
            f"{limit} tokens or more: " + (f"{len(looped)} did ({', '.join(looped)})." if looped else "none did."),
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--json", help="write the run here")
    parser.add_argument("--render", help="only print the section from a run's file")
    parser.add_argument("--smoke", action="store_true", help="20 tokens, one prompt a model")
    args = parser.parse_args(argv)
    if args.render:
        print(render(json.loads(Path(args.render).read_text(encoding="utf-8"))))
        return
    if args.tokens < 1:
        parser.error(f"--tokens must be >= 1, got {args.tokens}")
    result = measure(20 if args.smoke else args.tokens, args.smoke)
    if args.json:
        Path(args.json).write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(render(result))


if __name__ == "__main__":
    main()
