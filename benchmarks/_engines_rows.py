"""One row of benchmarks/engines.py, in its own process: load one engine at one precision, warm it up, time the
prefill and the decode, and return its tokens. A batched row ("int8 batch 8") decodes its prompts together."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PREFILL_RUNS = 3
Generate = Callable[[list[list[int]], int], list[list[int]]]  # (prompts, new) -> each prompt's new tokens
Said = Callable[[], str]  # the kernels the row's weights ran through, asked after the run


def run_row(spec: dict[str, Any]) -> dict[str, Any]:
    """Load one engine at one precision, warm it up, time the prefill and the decode; return its tokens."""
    engine, precision, folder = spec["engine"], spec["precision"], Path(spec["folder"])
    batch = batch_of(precision)
    prompts, new = [spec["prompt"], *spec["others"][: batch - 1]], spec["new_tokens"]
    generate, kernel = generator(engine, precision, folder, spec)  # kernel: said after the run (a default may choose)
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
    return {"tokens": tokens, "prefill_s": first, "decode_tokens_per_s": speed, "kernel": kernel()}


def batch_of(precision: str) -> int:
    """The prompts a row decodes at once: "int8 batch 8" -> 8; 1 otherwise."""
    _, _, batch = precision.partition(" batch ")
    return int(batch) if batch else 1


def counted(chosen: dict[str, str]) -> str:
    """{weight: kernel} as "onednn x49, rows x1", most used first."""
    from collections import Counter

    return ", ".join(f"{name} x{n}" for name, n in Counter(chosen.values()).most_common())


def refused(folder: Path, form: str) -> None:
    """Raise the converter's reason where it refused to write ``form`` (a ``<form>.error`` file beside it), or
    what to install where it could not run here (``<form>.missing``)."""
    reason, missing = folder / f"{form}.error", folder / f"{form}.missing"
    if missing.is_file():
        raise RuntimeError(missing.read_text(encoding="utf-8").strip())
    if reason.is_file():
        raise RuntimeError(f"the converter refused this model: {reason.read_text(encoding='utf-8').strip()}")


def generator(engine: str, precision: str, folder: Path, spec: dict[str, Any]) -> tuple[Generate, Said]:
    """(generate(prompts, new) -> each prompt's new tokens, what says the kernel its weights ran through)."""
    import torch

    torch.set_num_threads(spec["threads"])
    batch = batch_of(precision)
    precision = precision.split(" batch ")[0]
    if batch > 1 and engine not in ("attnlab", "ctranslate2"):
        raise ValueError(f"{engine} has no batched row here")
    if engine == "hf":
        return _hf(folder, precision)
    if engine == "attnlab":
        return _attnlab(folder, precision, batch)
    if engine == "ctranslate2":
        return _ct2(folder, precision, batch, spec["threads"])
    if engine == "llama.cpp":
        return _llama(folder, precision, spec["threads"])
    raise ValueError(f"unknown engine {engine!r}")


def _hf(folder: Path, precision: str) -> tuple[Generate, Said]:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder / "hf", dtype=getattr(torch, precision)).eval()
    layer = "Conv1D" if hf.config.model_type == "gpt2" else "nn.Linear"

    def run_hf(prompts: list[list[int]], new: int) -> list[list[int]]:
        (prompt,) = prompts
        with torch.no_grad():
            out = hf.generate(
                torch.tensor([prompt]), max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
            )
        return [[int(t) for t in out[0, len(prompt) :]]]

    return run_hf, lambda: f"torch matmul ({layer})"


def _attnlab(folder: Path, precision: str, batch: int) -> tuple[Generate, Said]:
    """ "float32": ``GPT.from_pretrained(dir).generate(...)`` and nothing else, as a user gets it (the weights
    laid out and compile chosen as this machine measured: attnlab.models.generation.tuned); "float32 rows": the
    default before that (``set_layout("rows")``, eager); the others with the tuning calls their names say."""
    import torch

    from attnlab.models import GPT

    base, _, variant = precision.partition(" ")
    model = GPT.from_pretrained(folder / "hf").eval()
    if base == "bfloat16":
        model = model.to(torch.bfloat16)
    elif base == "int8":
        # batched: the dynamic kernel's int8 x int8 products; compiled: the gemv loop, an op of the graph
        # (variant "static": generate over the prompts as one batch, instead of generate_many)
        model.quantize("int8", kernel="dynamic" if batch > 1 else "gemv" if variant == "compiled" else "auto")
    if variant in ("layout-auto", "compiled") and base != "int8":
        model.set_layout("auto")
    if variant == "rows":  # the default before issue 58: nn.Linear's own layout, eager
        model.set_layout("rows")
    compiled = variant == "compiled"
    chooses = variant == ""  # the plain row leaves compile to the default path; the others name it
    way = "generate" if variant == "static" else "generate_many"
    after = (", torch.compile" if compiled else "") + (f", {way} of {batch}" if batch > 1 else "")

    def run_attnlab(prompts: list[list[int]], new: int) -> list[list[int]]:
        with torch.no_grad():
            if batch > 1 and variant == "static":  # one batch of equal prompts, the plain cache
                out = model.generate(torch.tensor(prompts), new)
                return [[int(t) for t in row[len(prompts[0]) :]] for row in out]
            if batch > 1:  # continuous batching: every prompt in one slot, over paged blocks
                return model.generate_many(prompts, new, slots=batch)
            (prompt,) = prompts
            idx = torch.tensor([prompt])
            out = model.generate(idx, new) if chooses else model.generate(idx, new, compile=compiled)
        return [[int(t) for t in out[0, len(prompt) :]]]

    return run_attnlab, lambda: said_kernels(model) + after


def said_kernels(model: Any) -> str:
    """The kernels a model's linears ran through, counted ("dynamic x37, gemv x12"), and where a prompt's rows
    take another ("; a prompt's rows: dynamic x49")."""

    one = linear_kernels(model)
    prompts = {n: "dynamic" for n, m in model.named_modules() if getattr(m, "prompt", None) == "dynamic"}
    prompt = {n: prompts.get(n, k) for n, k in one.items()}
    return counted(one) + (f"; a prompt's rows: {counted(prompt)}" if prompt != one else "")


def linear_kernels(model: Any) -> dict[str, str]:
    """{linear: the kernel it runs through}, read off the model as it stands after the run: an int8 layer's
    kernel, a layout's ("onednn", "gemv", ...: attnlab.linear.layout's class names), a plain ``nn.Linear`` by how
    its weight is stored ("rows", "columns")."""
    import torch.nn as nn

    from attnlab.linear.quantized import Int8Linear

    found: dict[str, str] = {}
    for name, module in model.named_modules():
        if isinstance(module, Int8Linear):
            found[name] = module.kernel
        elif type(module) is nn.Linear:
            found[name] = "rows" if module.weight.is_contiguous() else "columns"
        elif isinstance(module, nn.Linear):  # OneDNNLinear -> "onednn"
            found[name] = type(module).__name__.removesuffix("Linear").lower()
    return found


def _ct2(folder: Path, precision: str, batch: int, threads: int) -> tuple[Generate, Said]:
    import ctranslate2

    refused(folder, f"ct2-{precision}")
    where = folder / f"ct2-{precision}"
    if not where.is_dir():
        raise RuntimeError("ctranslate2 is not installed (pip install 'attnlab[engines]')")
    engine = ctranslate2.Generator(str(where), device="cpu", compute_type=precision, intra_threads=threads)
    names = vocabulary(folder)

    def run_ct2(prompts: list[list[int]], new: int) -> list[list[int]]:
        result = engine.generate_batch(
            [[names[t] for t in prompt] for prompt in prompts],
            max_length=new,
            min_length=new,
            sampling_topk=1,
            include_prompt_in_result=False,
        )
        return [list(one.sequences_ids[0]) for one in result]

    return run_ct2, lambda: f"ctranslate2 {precision}" + (f", generate_batch of {batch}" if batch > 1 else "")


def _llama(folder: Path, precision: str, threads: int) -> tuple[Generate, Said]:
    try:
        from llama_cpp import Llama
    except ImportError:
        raise RuntimeError("llama-cpp-python is not installed (pip install 'attnlab[engines]')") from None
    refused(folder, f"gguf-{precision}")
    gguf = folder / f"gguf-{precision}.gguf"
    if not gguf.is_file():
        raise RuntimeError("no GGUF file: give --llama-cpp DIR (llama.cpp's source tree, with convert_hf_to_gguf.py)")
    llm = Llama(model_path=str(gguf), n_threads=threads, n_ctx=1024, verbose=False)

    def run_llama(prompts: list[list[int]], new: int) -> list[list[int]]:
        (prompt,) = prompts
        llm.reset()
        out: list[int] = []
        for token in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
            out.append(int(token))
            if len(out) == new:
                break
        return [out]

    return run_llama, lambda: f"ggml {precision}"


def vocabulary(folder: Path) -> list[str]:
    """CTranslate2 takes tokens by name: id -> the tokenizer's string."""
    vocab = json.loads((folder / "hf" / "vocab.json").read_text(encoding="utf-8"))
    names = [""] * len(vocab)
    for name, i in vocab.items():
        names[i] = name
    return names
