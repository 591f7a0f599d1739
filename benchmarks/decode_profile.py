"""Issue 20: what a gpt2-small decode step spends outside the matmuls, from a torch.profiler trace.

    .venv/bin/python benchmarks/decode_profile.py [--steps 20] [--rounds 3] [--threads 2] [--json out.json]
    .venv/bin/python benchmarks/decode_profile.py --preset qwen3-0.6b --dtype bfloat16   # issue 33: today's shapes

A GPT of gpt2-small's shape (or ``--preset``'s; random weights, float32 or ``--dtype``, batch 1) prefills a
128-token prompt into its KV caches, then decodes ``--steps`` tokens greedily
under ``torch.profiler``, ``--rounds`` times. Each op's *self* CPU time is
counted once: the matmuls (``mm``, ``addmm``, ``bmm``, ``baddbmm``) and SDPA's
attention kernel are the work any implementation does; the rest of the step's
wall time (timed without the profiler, whose own cost per op would inflate it)
is what attnlab adds around them: layer norms, GELU and residual adds, and the
shapes, masks, cache writes, checks and Python of attnlab's code. It prints the median step, its parts, and the ops that cost most
outside the kernels, as a markdown table for docs/benchmarks.md.

``--layout`` (issue 58) lays the weights out first, as ``GPT.set_layout`` does (``measured``: what ``generate``
does by default; ``ATTNLAB_CACHE`` says where the measurement is kept). A layout's products run compiled loops and
C++ the profiler does not see as matmuls, so the step is also split without it: every linear weight's product
on one token's row, in the layout it has, timed back to back (the weights' products alone), against the step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from _runs import exit_with
from attnlab.linear.products import LAYOUTS
from attnlab.models import GPT, GPTConfig
from attnlab.models.config import PRESETS

KERNELS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_dot_product_flash_attention_for_cpu"}


ATTENTION = "aten::_scaled_dot_product_flash_attention_for_cpu"
COMPILED = "## Call CompiledFxGraph"  # a layout's compiled loop (gemv): a product; prefetch.cpp's are unseen here


def one_round(model: GPT, prompt: torch.Tensor, steps: int) -> tuple[float, float, dict[str, float], float, float]:
    """(wall ms per step, without the profiler; kernel ms per step, every other op's self ms, and SDPA's kernel
    ms alone, with it; the weights' products alone, without it)."""

    def decode(profiled: bool) -> tuple[float, Any]:
        caches = model.make_caches(batch_size=1, max_len=prompt.shape[1] + steps + 1)
        with torch.no_grad():
            token = model(prompt, caches=caches, last_only=True)[:, -1].argmax(-1, keepdim=True)
            with profile(activities=[ProfilerActivity.CPU]) if profiled else contextlib.nullcontext() as prof:
                began = time.perf_counter()
                for _ in range(steps):
                    token = model(token, caches=caches, last_only=True)[:, -1].argmax(-1, keepdim=True)
                wall = (time.perf_counter() - began) / steps
        return wall * 1e3, prof

    wall, _ = decode(profiled=False)  # the profiler's own cost per op stays out of the wall time
    products = products_alone(model, steps)
    _, prof = decode(profiled=True)
    kernel, attention, other = 0.0, 0.0, defaultdict[str, float](float)
    for event in prof.key_averages():
        ms = event.self_cpu_time_total / 1e3 / steps
        if event.key in KERNELS or event.key.startswith(COMPILED):
            kernel += ms
            attention += ms if event.key == ATTENTION else 0.0
        else:
            other[event.key] += ms
    return wall, kernel, dict(other), attention, products


def products_alone(model: GPT, steps: int) -> float:
    """ms a step of every linear weight's product on one token's row (1, 1, in), in the layout it has, back to
    back: what the step's weights cost with nothing around them."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    dtype = next(model.parameters()).dtype
    rows = [torch.randn(1, 1, m.in_features, dtype=dtype) for m in linears]  # (1, 1, in) each
    with torch.no_grad():
        for m, x in zip(linears, rows, strict=True):
            m(x)  # a first call builds any compiled loop
        began = time.perf_counter()
        for _ in range(steps):
            for m, x in zip(linears, rows, strict=True):
                m(x)
    return (time.perf_counter() - began) / steps * 1e3


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--preset", choices=list(PRESETS), default="gpt2-small", help="the shape (default gpt2-small)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--smoke", action="store_true", help="a 1-layer model, 2 steps, 1 round: that it runs")
    parser.add_argument(
        "--layout",
        choices=["none", *LAYOUTS, "auto", "measured"],
        default="none",
        help="lay the weights out first, as GPT.set_layout (measured: what generate does by default)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = GPTConfig.preset(args.preset, drop_rate=0.0)
    if args.smoke:
        small = dict(n_layers=1, emb_dim=48, n_heads=4, vocab_size=256, n_kv_heads=None, head_dim=None, hidden_dim=None)
        config, args.steps, args.rounds = config.with_(**small), 2, 1
    model = GPT(config).eval().to(getattr(torch, args.dtype))
    chosen = {} if args.layout == "none" else model.set_layout(args.layout)
    counts = dict(sorted(Counter(chosen.values()).items()))  # weights a layout, by name
    prompt = torch.randint(0, config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1))
    rounds = [one_round(model, prompt, args.steps) for _ in range(args.rounds)]
    walls, kernels, alone = [r[0] for r in rounds], [r[1] for r in rounds], [r[4] for r in rounds]
    ours = [w - k for w, k in zip(walls, kernels, strict=True)]
    spread = (max(ours) - min(ours)) / statistics.median(ours)
    others: dict[str, list[float]] = defaultdict(list)
    for _, _, other, _, _ in rounds:
        for key, ms in other.items():
            others[key].append(ms)
    top = sorted(((statistics.median(v), k) for k, v in others.items()), reverse=True)[:8]
    print(
        f"torch {torch.__version__}, {args.threads} threads, {args.preset} shape, {args.dtype}, batch 1, prompt 128, "
        f"{args.steps} decode steps x {args.rounds} rounds (medians)"
        + (f", layout {args.layout}: " + ", ".join(f"{n} x{c}" for n, c in counts.items()) if counts else "")
    )
    print()
    print("| per decode step | ms |")
    print("|---|---|")
    print(f"| wall time | {statistics.median(walls):.1f} |")
    attention = [r[3] for r in rounds]
    print(f"| matmuls and SDPA's kernel (self time) | {statistics.median(kernels):.1f} |")
    print(f"| of which SDPA's kernel | {statistics.median(attention):.1f} |")
    flag = "" if spread <= 0.25 else f" (rounds spread {spread:.0%}: too noisy to trust)"
    print(f"| **everything else: attnlab's part** | **{statistics.median(ours):.1f}**{flag} |")
    rest = [w - a for w, a in zip(walls, alone, strict=True)]
    print(f"| the weights' products alone, in their layouts (timed apart) | {statistics.median(alone):.1f} |")
    middle = statistics.median(rest)  # at or below 0: the products alone took the step's time, no split to trust
    rest_spread = (max(rest) - min(rest)) / middle if middle > 0 else float("inf")
    rest_flag = "" if rest_spread <= 0.25 else f" (rounds spread {rest_spread:.0%}: too noisy to trust)"
    print(f"| the step less those products | {statistics.median(rest):.1f}{rest_flag} |")
    print()
    print("| op outside the kernels (self time) | ms per step |")
    print("|---|---|")
    for ms, key in top:
        print(f"| `{key}` | {ms:.2f} |")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "preset": args.preset,
                    "layout": args.layout,
                    "layouts": counts,
                    "products_alone_ms": alone,
                    "dtype": args.dtype,
                    "threads": args.threads,
                    "wall_ms": walls,
                    "kernel_ms": kernels,
                    "attention_ms": attention,
                    "ours_ms": ours,
                    "top": [[k, ms] for ms, k in top],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    exit_with(main)  # Ctrl-C: one line and 130; a closed pipe: quiet
