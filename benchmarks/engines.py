"""Issue 37, part 1, and issue 58, items 3-4: decoding beside the CPU engines people pick, CTranslate2 and
llama.cpp, in one run, on gpt2-small's shape or today's (``--shape``).

    .venv/bin/python benchmarks/engines.py [--shape gpt2-small|qwen3-0.6b|qwen3.5-0.8b] [--smoke] [--rounds 5]
        [--threads 2] [--llama-cpp DIR] [--rows "attnlab int8,ctranslate2 int8"] [--json engines.json]
    .venv/bin/python benchmarks/engines.py --render engines.json   # the docs/benchmarks.md section, from a run

The model (``_engines_shapes.py``: gpt2-small, Qwen3-0.6B's shape or Qwen3.5-0.8B's, random weights at the real
size; ``--smoke``: a tiny config of the same family) is written once as a Hugging Face folder with a byte-level
BPE tokenizer made for it, so that the converters accept it. CTranslate2's converter writes its float32 and int8
forms beside it; given ``--llama-cpp DIR`` (llama.cpp's source tree: llama-cpp-python's sdist has it as
``vendor/llama.cpp``; the wheel does not ship the converter), ``convert_hf_to_gguf.py`` writes the f32, f16 and
q8_0 GGUF files. Where a converter refuses the model, its rows say why.

Rows (``_engines_rows.py``): Hugging Face (float32, bfloat16), attnlab (float32 as a user gets it,
``GPT.from_pretrained(dir).generate(...)`` and nothing else; float32 and bfloat16 also with ``set_layout("auto")``
and compiled, ``set_layout("auto")`` then ``generate(compile=True)``; bfloat16 by ``.to(torch.bfloat16)``; int8,
also compiled), CTranslate2 (float32, int8), llama.cpp (f32, f16, q8_0), and on gpt2-small's shape int8 at 8 and 32
prompts (attnlab's ``generate_many``, continuous batching over paged blocks, and ``generate`` over the prompts as
one static batch; CTranslate2's ``generate_batch``). Each row names the kernels its weights ran through (attnlab:
read off the model after the run, counted over its weights). Each runs in its own process, so a crash or a
missing package is a row and not the end of the run, and each row's memory is its own. A round runs every row
once, in an order rotated each round, so a busy moment touches them all; a row's figure is the median over the
rounds, with its spread ((max - min) / median), and a spread over ``NOISY`` is said.

In each process: load, warm up with one generation, then time ``PREFILL_RUNS`` one-token generations (the
prefill of the prompt) and one generation of ``new_tokens``; decode tokens/s = (new_tokens - 1) / (that time -
the prefill). Before any figure is kept, the tokens are checked: a float row must give Hugging Face float32's
greedy tokens exactly, and a quantized row reports the share of them it agrees with.

The floor: the bytes one decode step reads (``attnlab.bench.roofline.decode_bytes``: every weight once, at the
row's bytes a weight, and the keys and values so far, a recurrent layer's state) over the fastest rate this
machine streams a weight matrix at, measured like a row: once a round, the median of the rounds (``_engines_floor``);
the floor's time over a row's time a token says how near it runs (100%: at the floor; past it, the row streams
memory faster than torch's batch-1 product), and the rate's spread is judged with the row's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from _engines_floor import floor_seconds, stream_rate, summarized_rates
from _engines_quality import text_perplexities
from _engines_rows import PREFILL_RUNS, batch_of, run_row
from _engines_shapes import BATCHED, SHAPES, described, hf_config, one_line, vocab_size, write_model
from _engines_table import BATCHES, NOISY, check_quality, render, verdicts
from _runs import add_run_arguments, check_run, cpu_name, exit_with, finish, render_saved

__all__ = ["NOISY", "PREFILL_RUNS", "batch_of", "check_quality", "render", "verdicts"]

ROWS: list[tuple[str, str]] = [
    ("hf", "float32"),
    ("hf", "bfloat16"),
    ("attnlab", "float32"),  # GPT.from_pretrained(dir).generate(...): as a user gets it
    ("attnlab", "float32 rows"),  # set_layout("rows"), eager: the default before issue 58, beside it in one run
    ("attnlab", "float32 layout-auto"),  # set_layout("auto"): each weight in the layout this machine streams fastest
    ("attnlab", "float32 compiled"),  # layout auto, then generate(compile=True): the decode step under torch.compile
    ("attnlab", "bfloat16"),
    ("attnlab", "bfloat16 layout-auto"),
    ("attnlab", "bfloat16 compiled"),
    ("attnlab", "int8"),  # quantize("int8"): each weight's kernel the fastest here for one row
    ("attnlab", "int8 compiled"),  # quantize(kernel="gemv"), then generate(compile=True)
    ("ctranslate2", "float32"),
    ("ctranslate2", "int8"),
    ("llama.cpp", "f32"),
    ("llama.cpp", "f16"),
    ("llama.cpp", "q8_0"),
    ("attnlab", "int8 batch 8"),  # generate_many: continuous batching over paged blocks, 8 prompts at once, on
    # quantize(kernel="dynamic"): its int8 x int8 products (an int8 weight-only loop reads the weight once a row)
    ("attnlab", "int8 batch 32"),
    ("attnlab", "int8 static batch 8"),  # generate with the prompts as one batch: static batching over the plain
    ("attnlab", "int8 static batch 32"),  # cache, rows run together, as generate_batch runs them
    ("ctranslate2", "int8 batch 8"),  # generate_batch, 8 prompts
    ("ctranslate2", "int8 batch 32"),
]
SCHEMA = "attnlab.engines/1"
ROW_SECONDS = 1800  # a row still running after this is stopped, and says so


def rows_of(shape: str) -> list[tuple[str, str]]:
    """The rows a shape runs: every one on gpt2-small's; one prompt at a time on the others."""
    return [r for r in ROWS if shape in BATCHED or batch_of(r[1]) == 1]


# --- one row, in its own process --------------------------------------------------------------------------------


def spawn(spec: dict[str, Any]) -> dict[str, Any]:
    """One row in a fresh process: its result, or {"error": why}: the exception the row raised ("ValueError:
    ..."), else how the process ended (a signal, an exit code, a timeout) with the last line it wrote."""
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--row", json.dumps(spec)], capture_output=True, text=True, timeout=ROW_SECONDS
        )
    except subprocess.TimeoutExpired:
        return {"error": f"TimeoutExpired: the row ran past {ROW_SECONDS} s"}
    said = [line for line in done.stdout.splitlines() if line.strip()]
    try:
        result = json.loads(said[-1]) if said else None
    except ValueError:
        result = None
    if isinstance(result, dict) and (done.returncode == 0 or "error" in result):
        return result
    how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
    lines = [line for line in done.stderr.splitlines() if line.strip()] or said
    return {"error": f"{how}: {lines[-1].strip()[:300]}" if lines else how}


def attempt(spec: dict[str, Any], r: int, rounds: int) -> dict[str, Any]:
    """One row's round, in its own process, said on stderr as it ends: "round 1/5: attnlab bfloat16", and for a
    row that failed, why ("...: failed: ValueError: ..."), so that a failure under load is never silent."""
    result = spawn(spec)
    failed = f": failed: {result['error']}" if "error" in result else ""
    print(f"round {r + 1}/{rounds}: {spec['engine']} {spec['precision']}{failed}", file=sys.stderr, flush=True)
    return result


# --- the run ------------------------------------------------------------------------------------------------------


def run(
    *,
    shape: str,
    smoke: bool,
    rounds: int,
    threads: int,
    llama_cpp: Path | None,
    prompt_len: int,
    new_tokens: int,
    only: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    import torch

    from attnlab.models.families import config_from_hf

    started = time.perf_counter()
    vocab = vocab_size(shape, smoke)
    prompt = torch.randint(0, vocab - 1, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    others = torch.randint(0, vocab - 1, (max(BATCHES) - 1, prompt_len), generator=torch.Generator().manual_seed(1))
    chosen = only or rows_of(shape)
    results: dict[str, list[dict[str, Any]]] = {f"{e} {p}": [] for e, p in chosen}
    rates: list[float] = []  # GB/s, a round each
    with tempfile.TemporaryDirectory(prefix="attnlab-engines-") as tmp:
        folder = Path(tmp)
        write_model(shape, smoke, folder, llama_cpp)
        raw = json.loads((folder / "hf" / "config.json").read_text(encoding="utf-8"))
        config = config_from_hf(raw, folder / "hf")  # attnlab's reading of it: the floor's bytes
        base = {"folder": tmp, "prompt": prompt, "others": others.tolist(), "new_tokens": new_tokens}
        base |= {"threads": threads}
        for r in range(rounds):
            for engine, precision in chosen[r % len(chosen) :] + chosen[: r % len(chosen)]:  # rotated each round
                name = f"{engine} {precision}"
                if results[name] and "error" in results[name][0]:
                    continue  # a row that failed once says so once
                results[name].append(attempt({**base, "engine": engine, "precision": precision}, r, rounds))
            rates.append(stream_rate(config, threads))  # the floor's rate, measured like a row: once a round
    reference = results["hf float32"][0].get("tokens") if results.get("hf float32") else None
    stream = summarized_rates(rates)
    at = (config, prompt_len + new_tokens // 2, stream)  # the floor's model, position and rate
    rows = [summarized(e, p, results[f"{e} {p}"], reference, at) for e, p in chosen]
    hf = next((r for r in rows if r["engine"] == "hf" and r["precision"] == "float32" and "error" not in r), None)
    for row in rows:
        if hf and "error" not in row:
            row["vs_hf_float32"] = row["decode_tokens_per_s"] / hf["decode_tokens_per_s"]
    out = {
        "schema": SCHEMA,
        "shape": shape,
        "described": described(shape, smoke),
        "command": " ".join(["benchmarks/engines.py", *sys.argv[1:]]),
        "date": datetime.date.today().isoformat(),
        "machine": platform.processor() or platform.machine(),
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "threads": threads,
        "rounds": rounds,
        "model": hf_config(shape, smoke),
        "prompt_tokens": prompt_len,
        "new_tokens": new_tokens,
        "rows": rows,
        "stream": stream,
    }
    if shape == "gpt2-small" and only is None:  # attnlab's int8 on a trained model: once, with the first shape
        out["quality"] = text_perplexities(threads)
    out["seconds"] = round(time.perf_counter() - started)  # the whole run, its model written to its perplexities
    return out


def summarized(
    engine: str, precision: str, tried: list[dict[str, Any]], reference: Any, at: tuple[Any, int, dict[str, Any]]
) -> dict[str, Any]:
    """One row of the result from its rounds: the median rate, its spread, the prefill, the tokens' agreement
    with Hugging Face float32's and the floor; a row that never ran, its first error."""
    row: dict[str, Any] = {"engine": engine, "precision": precision}
    runs, failed = good_rounds(tried)
    if not runs:
        row["error"] = failed[0] if failed else "not run"
        return row
    if failed:
        row["failed_rounds"] = failed
    rates = [x["decode_tokens_per_s"] for x in runs]
    median = statistics.median(rates)
    prefills = [x["prefill_s"] for x in runs]
    tokens = runs[0]["tokens"]
    agree = sum(a == b for a, b in zip(tokens, reference or [], strict=False)) / max(len(tokens), 1)
    config, position, stream = at
    floor = floor_seconds(config, precision, position, stream["stream_gb_s"])
    return row | {
        "kernel": runs[0].get("kernel", ""),
        "decode_tokens_per_s": median,
        "spread": (max(rates) - min(rates)) / median,
        "prefill_ms": 1000 * statistics.median(prefills),
        "prefill_spread": (max(prefills) - min(prefills)) / statistics.median(prefills),
        "batch": batch_of(precision),
        "agreement": agree,
        "tokens_identical": tokens == reference,
        "floor_fraction": floor * median / batch_of(precision),  # the floor's time a step over the row's
        "stream_gb_s": stream["stream_gb_s"],
        "stream_spread": stream["stream_spread"],  # the floor's own, judged with the row's
    }


def good_rounds(tried: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """(the rounds a row ran, the errors of those it failed): a row that crashed in a later round keeps the
    figures of its good ones, and the table says how many failed."""
    return [x for x in tried if "error" not in x], [x["error"] for x in tried if "error" in x]


def parse_rows(parser: argparse.ArgumentParser, given: str | None, shape: str) -> list[tuple[str, str]] | None:
    """``--rows "attnlab int8,ctranslate2 int8"``: those of the shape's rows, in its order; a name it lacks is
    refused in one line that lists them. hf float32 is always run: the others' tokens are checked against it."""
    if given is None:
        return None
    names = [n.strip() for n in given.split(",") if n.strip()]
    known = {f"{e} {p}": (e, p) for e, p in rows_of(shape)}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"--rows: no row {unknown or given!r} on --shape {shape}; the rows are: {', '.join(known)}")
    return [r for n, r in known.items() if n in {*names, "hf float32"}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=SHAPES, default="gpt2-small", help="the model's shape (default gpt2-small)")
    parser.add_argument("--smoke", action="store_true", help="a tiny model of the shape's family, 1 round, 16 tokens")
    add_run_arguments(parser, rounds=5)
    parser.add_argument("--llama-cpp", metavar="DIR", help="llama.cpp's source tree: its converter writes the GGUFs")
    parser.add_argument("--rows", metavar="NAMES", help='only these rows, comma-separated ("attnlab int8,...")')
    parser.add_argument("--row", help=argparse.SUPPRESS)  # one row, in this process (the run spawns it)
    args = parser.parse_args()
    if args.row:
        try:
            print(json.dumps(run_row(json.loads(args.row))))
        except Exception as error:  # the reason, as the run's output and its table say it; the traceback too
            traceback.print_exc()
            print(json.dumps({"error": one_line(error)}))
            return 1
        return 0
    if args.render:
        render_saved(parser, args.render, SCHEMA, render)
        return 0
    check_run(parser, args)
    llama_cpp = Path(args.llama_cpp) if args.llama_cpp else None
    if llama_cpp is not None and not (llama_cpp / "convert_hf_to_gguf.py").is_file():
        parser.error(f"--llama-cpp {args.llama_cpp!r} has no convert_hf_to_gguf.py: give llama.cpp's source tree")
    only = parse_rows(parser, args.rows, args.shape)
    result = run(
        shape=args.shape,
        smoke=args.smoke,
        rounds=1 if args.smoke else args.rounds,
        threads=args.threads,
        llama_cpp=llama_cpp,
        prompt_len=32 if args.smoke else 128,
        new_tokens=16 if args.smoke else 64,
        only=only,
    )
    return finish(args.json, result, render, check_quality(result), "tokens")


if __name__ == "__main__":
    exit_with(main)
