"""The quality half of benchmarks/engines.py's int8 and bfloat16 targets: held-out perplexity of attnlab's shipped
text model at each precision the speed rows run, and their verdicts.

int8's perplexity depends on the kernel a weight runs through: "dynamic" quantizes the activations too, the
weight-only kernels ("gemv", "int8pack", "dequantize") do not. ``quantize("int8")`` picks a kernel per weight
shape by timing it, and picks otherwise for the text model's small weights than for gpt2-small's, so the
perplexity is measured through every kernel, and the int8 verdict judges the kernels the timed int8 rows ran.
"""

from __future__ import annotations

import re
from typing import Any

KERNEL = re.compile(r"([\w-]+) x\d+")  # each entry of a row's kernel column: "dynamic x37, gemv x12; a prompt's ..."


def text_perplexities(threads: int) -> dict[str, Any]:
    """Held-out perplexity of attnlab's shipped text model (trained here: a byte-level rotary GPT) in float32,
    bfloat16, and int8 through each int8 kernel (``int8_by_kernel``). The peers' converters cannot read it (see
    engines.py's docstring), so it is attnlab's alone."""
    import math

    import torch
    import torch.nn.functional as F

    from attnlab.linear.quantized import INT8_KERNELS
    from attnlab.models import GPT
    from attnlab.models.locate import locate
    from attnlab.models.tasks import TextTask, stdlib_text

    torch.set_num_threads(threads)
    text = TextTask(stdlib_text(), seq_len=256).batch(8, torch.Generator().manual_seed(0), split="eval")[0]
    out: dict[str, Any] = {"windows": int(text.shape[0]), "tokens": int(text.numel() - text.shape[0])}
    by_kernel: dict[str, float] = {}
    for precision in ("float32", "bfloat16", *INT8_KERNELS):
        model = GPT.from_pretrained(locate("text")).eval()
        if precision == "bfloat16":
            model = model.to(torch.bfloat16)
        elif precision in INT8_KERNELS:
            model.quantize("int8", kernel=precision)
        with torch.no_grad():
            logits = model(text)[:, :-1].double()  # (B, T - 1, V): position p predicts token p + 1
        nll = F.cross_entropy(logits.flatten(0, 1), text[:, 1:].flatten())
        if precision in INT8_KERNELS:
            by_kernel[precision] = math.exp(float(nll))
        else:
            out[precision] = math.exp(float(nll))
    out["int8_by_kernel"] = by_kernel
    return out


def timed_int8_kernels(result: dict[str, Any]) -> list[str]:
    """The int8 kernels attnlab's timed int8 rows ran, read off their kernel column ("dynamic x49, ...")."""
    found = set()
    for row in result["rows"]:
        if row["engine"] == "attnlab" and row["precision"].startswith("int8") and "error" not in row:
            found |= set(KERNEL.findall(row.get("kernel", "")))
    return sorted(found)


def quality_verdicts(result: dict[str, Any]) -> list[str]:
    """int8's perplexity (through the kernels the timed int8 rows ran) and bfloat16's, against float32's."""
    quality = result.get("quality")
    out = []
    for precision, most in (("int8", 0.01), ("bfloat16", 0.005)):
        what = f"{precision} perplexity within {most:.1%} of float32"
        if not quality:
            out.append(f"{what}: not established (this run measured no trained model)")
            continue
        where = f"the shipped text model, {quality['tokens']} held-out tokens"
        if precision == "bfloat16":
            rise = quality[precision] / quality["float32"] - 1
            out.append(
                f"{what} ({where}): {quality[precision]:.4f} against {quality['float32']:.4f}, {rise:+.3%}: "
                f"{'met' if rise <= most else 'not met'}"
            )
            continue
        timed = timed_int8_kernels(result)
        measured = quality.get("int8_by_kernel", {})
        missing = [k for k in timed if k not in measured]
        if not timed or missing:  # a run before int8_by_kernel: its one int8 figure is another kernel's
            other = f"through {quality['int8_kernel']}" if quality.get("int8_kernel") else "through no named kernel"
            out.append(
                f"{what}: not established for the kernels the timed int8 rows ran ({', '.join(timed) or 'none'}): "
                f"this run measured it {other} only ({where}: {quality['int8']:.4f} against "
                f"{quality['float32']:.4f}, {quality['int8'] / quality['float32'] - 1:+.3%})"
            )
            continue
        rises = {k: measured[k] / quality["float32"] - 1 for k in timed}
        each = ", ".join(f"{k} {measured[k]:.4f} ({rises[k]:+.3%})" for k in timed)
        met = max(rises.values()) <= most
        out.append(
            f"{what}, through the kernels the timed int8 rows ran ({where}): {each}, against "
            f"{quality['float32']:.4f}: {'met' if met else 'not met'}"
        )
    return out
