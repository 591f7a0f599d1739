"""Issue 37, part 1: decoding beside the CPU engines people pick, CTranslate2 and llama.cpp, in one run.

    .venv/bin/python benchmarks/engines.py [--smoke] [--rounds 5] [--threads 2] [--json engines.json]
    .venv/bin/python benchmarks/engines.py --render engines.json   # the docs/benchmarks.md section, from a run

One seeded GPT-2 (gpt2-small's shape; ``--smoke``: 2 layers of 64) is written once as a Hugging Face folder, with
a byte-level BPE tokenizer made for it (the 256 bytes, then merges of byte pairs up to the vocabulary's size) so
that the converters accept it. CTranslate2's converter writes its float32 and int8 forms beside it; llama.cpp's
GGUF files are read from ``--gguf DIR`` (``convert_hf_to_gguf.py``, from llama-cpp-python's source tree, writes
them: the wheel does not ship it), and a row without them says so.

Rows: Hugging Face (float32, bfloat16), attnlab (float32 and bfloat16, each also with ``set_layout("auto")`` and
compiled, ``set_layout("auto")`` then ``generate(compile=True)``; int8, also compiled), CTranslate2 (float32, int8), llama.cpp (f32, f16, q8_0), and int8 at 8 and 32 prompts (attnlab's ``generate_many``, continuous batching
over paged blocks, and ``generate`` over the prompts as one static batch; CTranslate2's ``generate_batch``). Each row names the kernel its
weights ran through (attnlab: the layouts or int8 kernels it chose, counted over its weights). Each runs in its own process, so a crash or a missing package is a row and not the
end of the run, and each row's memory is its own. A round runs every row once, in an order rotated each round,
so a busy moment touches them all; a row's figure is the median over the rounds, with its spread
((max - min) / median), and a spread over ``NOISY`` is said.

In each process: load, warm up with one generation, then time ``PREFILL_RUNS`` one-token generations (the
prefill of the prompt) and one generation of ``new_tokens``; decode tokens/s = (new_tokens - 1) / (that time -
the prefill). Before any figure is kept, the tokens are checked: a float row must give Hugging Face float32's
greedy tokens exactly, and a quantized row reports the share of them it agrees with.

The floor: the bytes one decode step reads (``attnlab.bench.roofline.decode_bytes``: every weight once, at the
row's bytes a weight, and the keys and values so far) over the fastest rate this machine streamed a weight
matrix at, measured in the same run; the floor's time over a row's time a token says how near it runs (100%: at
the floor; past it, the row streams memory faster than torch's batch-1 product, and the floor is no bound for it).
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

from _engines_quality import quality_verdicts, text_perplexities
from _runs import add_run_arguments, check_run, exit_with, finish, render_saved
from _verdicts import judged

ROWS: list[tuple[str, str]] = [
    ("hf", "float32"),
    ("hf", "bfloat16"),
    ("attnlab", "float32"),
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
BATCHES = (8, 32)
BYTES_A_WEIGHT = {"float32": 4, "bfloat16": 2, "int8": 1, "f32": 4, "f16": 2, "q8_0": 34 / 32}  # q8_0: a scale a 32
QUANTIZED = {"int8", "q8_0"}
PREFILL_RUNS = 3
NOISY = 0.25  # a spread over this is said: too wide to trust a ratio
SCHEMA = "attnlab.engines/1"


# --- the model and its files ------------------------------------------------------------------------------------


def shape(smoke: bool) -> dict[str, int]:
    if smoke:
        return {"n_layers": 2, "emb_dim": 64, "n_heads": 2, "vocab_size": 512, "context_length": 256}
    return {"n_layers": 12, "emb_dim": 768, "n_heads": 12, "vocab_size": 50257, "context_length": 1024}


def gpt_config(smoke: bool) -> Any:
    """The benchmark's GPT-2 as attnlab's GPTConfig (GPT-2's layout: biases on q, k, v; no dropout)."""
    from attnlab.models import GPTConfig

    return GPTConfig.from_dict({**shape(smoke), "drop_rate": 0.0, "qkv_bias": True})


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A GPT-2 style byte-level BPE of exactly ``vocab_size`` tokens: the 256 bytes (as GPT-2 maps them to
    printable characters), then one merge of two byte characters a token, the last one <|endoftext|>."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]  # GPT-2's bytes_to_unicode
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    vocab = {chars[b]: b for b in range(256)}
    merges = []
    base = [chars[b] for b in range(256)]  # two byte characters: every merged token a distinct string
    for first in base:
        for second in base:
            if len(vocab) >= vocab_size - 1:
                break
            vocab[first + second] = len(vocab)
            merges.append(f"{first} {second}")
    vocab["<|endoftext|>"] = len(vocab)
    if len(vocab) != vocab_size:
        raise ValueError(f"made {len(vocab)} tokens for a vocabulary of {vocab_size}")
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    eos = "<|endoftext|>"
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024, "bos_token": eos, "eos_token": eos}
    config["unk_token"] = eos
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def write_model(folder: Path, smoke: bool) -> None:
    """The seeded GPT-2 as a Hugging Face folder (attnlab writes GPT-2's names and config), its tokenizer, and
    CTranslate2's two forms of it when ctranslate2 is installed."""
    import torch

    from attnlab.models import GPT

    torch.manual_seed(0)
    config = gpt_config(smoke)
    GPT(config).eval().save_pretrained(folder / "hf")
    described = json.loads((folder / "hf" / "config.json").read_text(encoding="utf-8"))
    described["n_ctx"] = described["n_positions"]  # GPT-2's own config.json has both; llama.cpp's converter reads n_ctx
    (folder / "hf" / "config.json").write_text(json.dumps(described, indent=2), encoding="utf-8")
    write_tokenizer(folder / "hf", config.vocab_size)
    try:
        from ctranslate2.converters import TransformersConverter
    except ImportError:
        return
    for quantization in ("float32", "int8"):
        TransformersConverter(str(folder / "hf")).convert(
            str(folder / f"ct2-{quantization}"), quantization=quantization
        )


# --- one row, in its own process --------------------------------------------------------------------------------


def run_row(spec: dict[str, Any]) -> dict[str, Any]:
    """Load one engine at one precision, warm it up, time the prefill and the decode; return its tokens."""
    engine, precision, folder = spec["engine"], spec["precision"], Path(spec["folder"])
    batch = batch_of(precision)
    prompts, new = [spec["prompt"], *spec["others"][: batch - 1]], spec["new_tokens"]
    generate, kernel = _generator(engine, precision, folder, spec)
    generate(prompts, new)  # warm-up
    prefill = []
    for _ in range(PREFILL_RUNS):
        start = time.perf_counter()
        generate(prompts, 1)
        prefill.append(time.perf_counter() - start)
    start = time.perf_counter()
    tokens = generate(prompts, new)[0]  # the first prompt's, checked against Hugging Face float32's
    total = time.perf_counter() - start
    first = statistics.median(prefill)
    speed = batch * (new - 1) / max(total - first, 1e-9)  # every prompt's new tokens after the first
    return {"tokens": tokens, "prefill_s": first, "decode_tokens_per_s": speed, "kernel": kernel}


def batch_of(precision: str) -> int:
    """The prompts a row decodes at once: "int8 batch 8" -> 8; 1 otherwise."""
    _, _, batch = precision.partition(" batch ")
    return int(batch) if batch else 1


def _counted(chosen: dict[str, str]) -> str:
    """{weight: kernel} as "onednn x49, rows x1", most used first."""
    from collections import Counter

    return ", ".join(f"{name} x{n}" for name, n in Counter(chosen.values()).most_common())


def _generator(engine: str, precision: str, folder: Path, spec: dict[str, Any]) -> tuple[Any, str]:
    """(generate(prompts, new) -> each prompt's new tokens, the kernel its weights run through). A batched row
    ("int8 batch 8") decodes its prompts together: attnlab by generate_many, CTranslate2 by generate_batch."""
    import torch

    torch.set_num_threads(spec["threads"])
    batch = batch_of(precision)
    precision = precision.split(" batch ")[0]
    if batch > 1 and engine not in ("attnlab", "ctranslate2"):
        raise ValueError(f"{engine} has no batched row here")
    if engine == "hf":
        from transformers import GPT2LMHeadModel

        hf = GPT2LMHeadModel.from_pretrained(folder / "hf", dtype=getattr(torch, precision)).eval()

        def run_hf(prompts: list[list[int]], new: int) -> list[list[int]]:
            (prompt,) = prompts
            with torch.no_grad():
                out = hf.generate(
                    torch.tensor([prompt]), max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
                )
            return [[int(t) for t in out[0, len(prompt) :]]]

        return run_hf, "torch matmul (Conv1D)"
    if engine == "attnlab":
        from attnlab.models import GPT

        base, _, variant = precision.partition(" ")
        model = GPT.from_pretrained(folder / "hf").eval()
        kernel = "rows (F.linear)"
        if base == "bfloat16":
            model = model.to(torch.bfloat16)
        elif base == "int8":
            # batched: the dynamic kernel's int8 x int8 products; compiled: the gemv loop, an op of the graph
            # (variant "static": generate over the prompts as one batch, instead of generate_many)
            pick = "dynamic" if batch > 1 else "gemv" if variant == "compiled" else "auto"
            kernel = _counted(model.quantize("int8", kernel=pick))
        if variant in ("layout-auto", "compiled") and base != "int8":
            kernel = _counted(model.set_layout("auto"))
        compiled = variant == "compiled"
        if compiled:
            kernel += ", torch.compile"

        def run_attnlab(prompts: list[list[int]], new: int) -> list[list[int]]:
            with torch.no_grad():
                if batch > 1 and variant == "static":  # one batch of equal prompts, the plain cache
                    out = model.generate(torch.tensor(prompts), new)
                    return [[int(t) for t in row[len(prompts[0]) :]] for row in out]
                if batch > 1:  # continuous batching: every prompt in one slot, over paged blocks
                    return model.generate_many(prompts, new, slots=batch)
                (prompt,) = prompts
                out = model.generate(torch.tensor([prompt]), new, compile=compiled)
            return [[int(t) for t in out[0, len(prompt) :]]]

        way = "generate" if variant == "static" else "generate_many"
        return run_attnlab, kernel + (f", {way} of {batch}" if batch > 1 else "")
    if engine == "ctranslate2":
        import ctranslate2

        where = folder / f"ct2-{precision}"
        if not where.is_dir():
            raise RuntimeError("ctranslate2 is not installed (pip install 'attnlab[engines]')")
        generator = ctranslate2.Generator(
            str(where), device="cpu", compute_type=precision, intra_threads=spec["threads"]
        )
        names = generator_vocabulary(folder)

        def run_ct2(prompts: list[list[int]], new: int) -> list[list[int]]:
            result = generator.generate_batch(
                [[names[t] for t in prompt] for prompt in prompts],
                max_length=new,
                min_length=new,
                sampling_topk=1,
                include_prompt_in_result=False,
            )
            return [list(one.sequences_ids[0]) for one in result]

        return run_ct2, f"ctranslate2 {precision}" + (f", generate_batch of {batch}" if batch > 1 else "")
    if engine == "llama.cpp":
        try:
            from llama_cpp import Llama
        except ImportError:
            raise RuntimeError("llama-cpp-python is not installed (pip install llama-cpp-python)") from None
        gguf = Path(spec["gguf"] or "") / f"model-{precision}.gguf"
        if not spec["gguf"] or not gguf.is_file():
            raise RuntimeError(f"no {gguf.name}: give --gguf DIR with it (convert_hf_to_gguf.py --outtype {precision})")
        llm = Llama(model_path=str(gguf), n_threads=spec["threads"], n_ctx=1024, verbose=False)

        def run_llama(prompts: list[list[int]], new: int) -> list[list[int]]:
            (prompt,) = prompts
            llm.reset()
            out: list[int] = []
            for token in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
                out.append(int(token))
                if len(out) == new:
                    break
            return [out]

        return run_llama, f"ggml {precision}"
    raise ValueError(f"unknown engine {engine!r}")


def generator_vocabulary(folder: Path) -> list[str]:
    """CTranslate2 takes tokens by name: id -> the tokenizer's string."""
    vocab = json.loads((folder / "hf" / "vocab.json").read_text(encoding="utf-8"))
    names = [""] * len(vocab)
    for name, i in vocab.items():
        names[i] = name
    return names


# --- the run ------------------------------------------------------------------------------------------------------


def floor_seconds(smoke: bool, precision: str, position: int) -> tuple[float, float]:
    """(seconds, GB/s): the bytes one decode step reads at ``precision`` over this machine's fastest streaming
    rate, measured now on a weight matrix of the model's width."""
    from attnlab.bench.roofline import decode_bytes, probe_rates

    config = gpt_config(smoke)
    step = decode_bytes(config, position, element=4)
    bytes_read = step.weights / 4 * BYTES_A_WEIGHT[precision.split()[0]] + step.kv
    rate = max(probe_rates(config.emb_dim, 4 * config.emb_dim).values())
    return bytes_read / (rate * 1e9), rate


ROW_SECONDS = 1800  # a row still running after this is stopped, and says so


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


def one_line(error: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:300]}"


def run(
    *, smoke: bool, rounds: int, threads: int, gguf: str | None, prompt_len: int, new_tokens: int
) -> dict[str, Any]:
    import torch

    started = time.perf_counter()
    vocab = shape(smoke)["vocab_size"]
    prompt = torch.randint(0, vocab - 1, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    others = torch.randint(0, vocab - 1, (max(BATCHES) - 1, prompt_len), generator=torch.Generator().manual_seed(1))
    results: dict[str, list[dict[str, Any]]] = {f"{e} {p}": [] for e, p in ROWS}
    with tempfile.TemporaryDirectory(prefix="attnlab-engines-") as tmp:
        folder = Path(tmp)
        write_model(folder, smoke)
        base = {"folder": tmp, "prompt": prompt, "others": others.tolist(), "new_tokens": new_tokens}
        base |= {"threads": threads, "gguf": gguf}
        order = list(ROWS)
        for r in range(rounds):
            for engine, precision in order[r % len(order) :] + order[: r % len(order)]:  # rotated each round
                name = f"{engine} {precision}"
                if results[name] and "error" in results[name][0]:
                    continue  # a row that failed once says so once
                results[name].append(attempt({**base, "engine": engine, "precision": precision}, r, rounds))
    reference = results["hf float32"][0].get("tokens") if results["hf float32"] else None
    rows = []
    for engine, precision in ROWS:
        row: dict[str, Any] = {"engine": engine, "precision": precision}
        runs, failed = good_rounds(results[f"{engine} {precision}"])
        if not runs:
            row["error"] = failed[0] if failed else "not run"
            rows.append(row)
            continue
        if failed:
            row["failed_rounds"] = failed
        rates = [x["decode_tokens_per_s"] for x in runs]
        median = statistics.median(rates)
        prefills = [x["prefill_s"] for x in runs]
        tokens = runs[0]["tokens"]
        agree = sum(a == b for a, b in zip(tokens, reference or [], strict=False)) / max(len(tokens), 1)
        floor, rate = floor_seconds(smoke, precision, prompt_len + new_tokens // 2)
        row |= {
            "kernel": runs[0].get("kernel", ""),
            "decode_tokens_per_s": median,
            "spread": (max(rates) - min(rates)) / median,
            "prefill_ms": 1000 * statistics.median(prefills),
            "prefill_spread": (max(prefills) - min(prefills)) / statistics.median(prefills),
            "batch": batch_of(precision),
            "agreement": agree,
            "tokens_identical": tokens == reference,
            "floor_fraction": floor * median / batch_of(precision),  # the floor's time a step over the row's
            "stream_gb_s": rate,
        }
        rows.append(row)
    hf = next((r for r in rows if r["engine"] == "hf" and r["precision"] == "float32" and "error" not in r), None)
    for row in rows:
        if hf and "error" not in row:
            row["vs_hf_float32"] = row["decode_tokens_per_s"] / hf["decode_tokens_per_s"]
    quality = text_perplexities(threads)
    return {
        "schema": SCHEMA,
        "seconds": round(time.perf_counter() - started),  # the whole run, its model written to its perplexities
        "quality": quality,
        "command": " ".join(["benchmarks/engines.py", *sys.argv[1:]]),
        "date": datetime.date.today().isoformat(),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": threads,
        "rounds": rounds,
        "model": shape(smoke),
        "prompt_tokens": prompt_len,
        "new_tokens": new_tokens,
        "rows": rows,
    }


def good_rounds(tried: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """(the rounds a row ran, the errors of those it failed): a row that crashed in a later round keeps the
    figures of its good ones, and the table says how many failed."""
    return [x for x in tried if "error" not in x], [x["error"] for x in tried if "error" in x]


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
    """The tables (one prompt; several at once) and the issue's targets, every cell and verdict from the result."""
    lines = [
        "| engine | precision | decode tok/s | spread | vs HF float32 | of the floor | prefill ms | tokens vs HF float32 "
        "| kernel |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    single = [r for r in result["rows"] if r.get("batch", batch_of(r["precision"])) == 1]
    batched = [r for r in result["rows"] if r not in single]
    for row in sorted(single, key=lambda r: -r.get("decode_tokens_per_s", 0)):
        ratio = "" if "error" in row else f"{row.get('vs_hf_float32', float('nan')):.2f}x"
        lines.append(_row_line(row, [row["engine"], row["precision"]], ratio))
    if batched:
        lines += [
            "",
            "| engine | precision | prompts | decode tok/s, all prompts | spread | of the floor | prefill ms, all "
            "prompts | first prompt's tokens vs HF float32 | kernel |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in sorted(batched, key=lambda r: (batch_of(r["precision"]), r["engine"])):
            lines.append(_row_line(row, [row["engine"], row["precision"], str(batch_of(row["precision"]))], None))
    model = result["model"]
    took = f", {result['seconds'] / 60:.0f} minutes in all" if "seconds" in result else ""  # runs since 2026-12-05
    lines.append(
        f"\n`{result['command']}` ({result['date']}, torch {result['torch']}, {result['threads']} threads, "
        f"{result['rounds']} interleaved rounds{took}): a seeded GPT-2 of {model['n_layers']} layers x {model['emb_dim']}, "
        f"{model['vocab_size']} tokens; a {result['prompt_tokens']}-token prompt, {result['new_tokens']} "
        "greedy tokens. Decode tok/s is the median over the rounds; the floor is one step's bytes at the fastest "
        "streaming rate measured in the run."
    )
    lines += ["", "The issue's targets, judged from this run (a ratio whose rows spread past 25% is no finding):"]
    lines += [f"- {line}" for line in verdicts(result)]
    return "\n".join(lines)


def _row_line(row: dict[str, Any], first: list[str], ratio: str | None) -> str:
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


def verdicts(result: dict[str, Any]) -> list[str]:
    """Each target of issue 37 that this run can judge, from its rows: the ratio, and met, not met, or not
    established (a row missing, or a spread over NOISY)."""
    rows = {f"{r['engine']} {r['precision']}": r for r in result["rows"] if "error" not in r}

    def best(*names: str, key: str = "decode_tokens_per_s", low: bool = False) -> str | None:
        found = [n for n in names if n in rows]
        pick = min if low else max
        return pick(found, key=lambda n: rows[n][key]) if found else None

    def judge(what: str, ours: str | None, theirs: str | None, target: float, *, prefill: bool = False) -> str:
        if ours is None or theirs is None:
            return f"{what}: not established (a row did not run)"
        spread = "prefill_spread" if prefill else "spread"
        a, b = rows[ours], rows[theirs]
        ratio = b["prefill_ms"] / a["prefill_ms"] if prefill else a["decode_tokens_per_s"] / b["decode_tokens_per_s"]
        if spread not in a or spread not in b:
            verdict = "not established (the run recorded no spread for it)"
        else:
            verdict = judged(ratio, target, max(a[spread], b[spread]))
            if (
                max(a[spread], b[spread]) <= NOISY and 0 < ratio < target and not prefill and "floor_fraction" in a
            ):  # how far: the target in floor terms
                needed = a["floor_fraction"] * target / ratio  # of the row's own floor (its own bytes a step)
                verdict += f"; it asks {ours} for {needed:.0%} of its floor, where it runs at {a['floor_fraction']:.0%}"
        return f"{what} ({ours} against {theirs}): {ratio:.2f}x, target {target:g}x: {verdict}"

    eager = best("attnlab float32", "attnlab float32 layout-auto")
    fp32 = ("attnlab float32", "attnlab float32 layout-auto", "attnlab float32 compiled")
    half = best("attnlab bfloat16", "attnlab bfloat16 layout-auto", "attnlab bfloat16 compiled")
    f32_peer = best("ctranslate2 float32", "llama.cpp f32")
    out = [
        judge("int8 decode", best("attnlab int8", "attnlab int8 compiled"), best("ctranslate2 int8"), 1.0),
        judge("bfloat16 decode against llama.cpp", half, best("llama.cpp f16"), 1.0),
        # like against like: the fastest bfloat16 row against the fastest float32 row, compiled or not
        judge("bfloat16 decode against float32", half, best(*fp32), 1.5),
        judge("float32 eager decode", eager, f32_peer, 1.0),
        judge("float32 compiled decode", best("attnlab float32 compiled"), f32_peer, 1.3),
    ]
    for size in BATCHES:
        ours, theirs = (
            (f"attnlab int8 batch {size}", f"attnlab int8 static batch {size}"),
            f"ctranslate2 int8 batch {size}",
        )
        out.append(judge(f"int8 at {size} prompts", best(*ours), best(theirs), 1.0))
    groups = {
        "float32": (
            ("attnlab float32", "attnlab float32 layout-auto", "attnlab float32 compiled"),
            ("hf float32", "ctranslate2 float32", "llama.cpp f32"),
        ),
        "16-bit": (
            ("attnlab bfloat16", "attnlab bfloat16 layout-auto", "attnlab bfloat16 compiled"),
            ("hf bfloat16", "llama.cpp f16"),
        ),
        "int8": (("attnlab int8", "attnlab int8 compiled"), ("ctranslate2 int8", "llama.cpp q8_0")),
    }
    for name, (ours_rows, peers) in groups.items():
        low = {"key": "prefill_ms", "low": True}
        out.append(judge(f"{name} prefill", best(*ours_rows, **low), best(*peers, **low), 1.0, prefill=True))  # type: ignore[arg-type]
    return out + quality_verdicts(result)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a 2-layer model, 1 round, 16 tokens: checks the run")
    add_run_arguments(parser, rounds=5)
    parser.add_argument("--gguf", metavar="DIR", help="llama.cpp's model-f32.gguf, model-f16.gguf, model-q8_0.gguf")
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
    rounds = 1 if args.smoke else args.rounds
    new = 16 if args.smoke else 64
    result = run(
        smoke=args.smoke,
        rounds=rounds,
        threads=args.threads,
        gguf=args.gguf,
        prompt_len=32 if args.smoke else 128,
        new_tokens=new,
    )
    return finish(args.json, result, render, check_quality(result), "tokens")


if __name__ == "__main__":
    exit_with(main)
