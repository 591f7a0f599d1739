"""Issue 3's performance targets, as ratios measured in one run on one machine.

    .venv/bin/python benchmarks/module_vs_peers.py [--repeats 5] [--smoke]

1. attnlab.Attention (default backend) vs a plain module around SDPA and the
   book's MultiHeadAttention, all three with the book module's weights:
   batch 8, 1024 tokens, 768 dims, 12 heads, float32, causal; forward, and
   forward + backward. Each is first checked against the book module in
   float64 (outputs, and the input gradient of the same loss), then timed,
   the implementations interleaved round by round; medians, and the spread of
   the per-round ratios (over 25%: too noisy to trust).
2. The flash backend vs SDPA at 4096 tokens (batch 1, 12 heads, head_dim 64),
   the kernel alone (no projections), checked against each other first.
3. The flash backend's peak allocated bytes against sequence length.

``--smoke`` runs every step on tiny sizes (the test suite runs it).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence

import torch

from _timing import interleaved, report
from attnlab import attention
from attnlab.bench.impls import build, reference_weights
from attnlab.bench.memory import PeakMemory

IMPLS = {"plain SDPA module": "plain-sdpa", "attnlab.Attention": "attnlab-auto", "book MultiHeadAttention": "book-mha"}


def backward(module: torch.nn.Module, x: torch.Tensor) -> None:
    module(x).sum().backward()


def check(b: int, t: int, d: int, h: int) -> None:
    """Every module, in float64 with the book module's weights, against the book module: output and dL/dx."""
    ref = reference_weights(d, h, t).double()
    x = torch.randn(b, t, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    weight = torch.randn(b, t, d, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    want = ref(x)
    (want_grad,) = torch.autograd.grad((want * weight).sum(), x)
    for name, impl in IMPLS.items():
        got = build(impl, ref).double()(x)
        (got_grad,) = torch.autograd.grad((got * weight).sum(), x)
        err = max((got - want).abs().max().item(), (got_grad - want_grad).abs().max().item())
        assert err < 1e-8, f"{name} disagrees with the book module: {err:.1e}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat: that every step runs")
    args = parser.parse_args(argv)
    b, t, d, h = (1, 16, 32, 4) if args.smoke else (8, 1024, 768, 12)
    repeats = 1 if args.smoke else args.repeats
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    check(min(b, 2), min(t, 64), d, h)
    print("checked: every module equals the book's in float64, output and input gradient")

    ref = reference_weights(d, h, t)
    mods = {name: build(impl, ref) for name, impl in IMPLS.items()}  # one set of weights for all three
    x = torch.randn(b, t, d)
    xg = x.clone().requires_grad_()
    for mode in ("forward", "forward+backward"):
        if mode == "forward":
            with torch.no_grad():
                times = interleaved({name: functools.partial(m, x) for name, m in mods.items()}, repeats)
        else:
            times = interleaved({name: functools.partial(backward, m, xg) for name, m in mods.items()}, repeats)
        print(f"\n{mode}, B={b} T={t} d={d} H={h}, {repeats} interleaved rounds")
        report(times, "attnlab.Attention", width=26)

    seq = 128 if args.smoke else 4096
    q, k, v = (torch.randn(1, 12, seq, 64) for _ in range(3))
    with torch.no_grad():
        flash_out = attention(q, k, v, is_causal=True, backend="flash")
        assert torch.allclose(flash_out, attention(q, k, v, is_causal=True, backend="sdpa"), atol=1e-5)
        kernels = {
            "sdpa": lambda: attention(q, k, v, is_causal=True, backend="sdpa"),
            "flash": lambda: attention(q, k, v, is_causal=True, backend="flash"),
        }
        print(f"\nthe kernel alone, T={seq}, B=1, H=12, D=64 causal forward (checked equal first):")
        report(interleaved(kernels, repeats), "sdpa")

    print("\nflash peak allocated bytes (forward + backward, B=1, H=12, D=64):")
    for n in (64, 128) if args.smoke else (1024, 2048, 4096, 8192):
        q, k, v = (torch.randn(1, 12, n, 64, requires_grad=True) for _ in range(3))
        with PeakMemory() as mem:
            attention(q, k, v, is_causal=True, backend="flash").sum().backward()
        scores = 12 * n * n * 4
        print(f"  T={n:5d}: {mem.peak_bytes / 2**20:7.1f} MiB  (one float32 score matrix: {scores / 2**20:7.1f} MiB)")


if __name__ == "__main__":
    main()
