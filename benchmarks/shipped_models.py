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
from attnlab.models.checkpoints import SHIPPED, locate
from attnlab.models.train import read_log

PROMPTS = {  # the README's prompts for the text model; the poems' demo lines
    "text": ["The for statement", "The", "The cache lets go of what attention ignores."],
    "poems": ["床前明月光，", "春眠不觉晓，", "白日依山尽，"],
}
N = 8  # the n of the n-grams counted
LIMIT_MB = 10.0  # every shipped model together


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
            runs.append(
                {
                    "prompt": prompt,
                    "new_tokens": n,
                    "text": tokenizer.decode(out[len(ids) :]),
                    "repeated_8grams": repeated_share(out, len(ids)),
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
    return {
        "schema": "attnlab.shipped/1",
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "new_tokens": tokens,
        "models": models,
        "shipped_bytes": shipped,
    }


def render(result: dict[str, Any]) -> str:
    """The docs/heads.md section: every figure computed from the run's file."""
    lines = [
        f"`{result['command']}` ({result['date']}, torch {result['torch']}; greedy, up to {result['new_tokens']} new "
        "tokens a prompt, as many as the model's context holds):",
        "",
        "| model | held-out loss (its log) | steps | files | prompt | new tokens | 8-grams repeated | the continuation, "
        "first 40 characters |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in result["models"]:
        loss = "n/a" if m["held_out_loss"] is None else f"{m['held_out_loss']:.3f}"
        for r in m["runs"]:
            text = r["text"][:40].replace("\n", "⏎").replace("|", "\\|")
            lines.append(
                f"| {m['model']} | {loss} | {m['steps']} | {m['bytes'] / 1e6:.2f} MB | {r['prompt']} | {r['new_tokens']} | "
                f"{r['repeated_8grams']:.0%} | {text} |"
            )
    total = result["shipped_bytes"] / 1e6
    verdict = "under" if total < LIMIT_MB else "over"
    lines += ["", f"Every shipped model together: {total:.2f} MB, {verdict} the {LIMIT_MB:.0f} MB the issue allows."]
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
