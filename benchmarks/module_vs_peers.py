"""Issue 3's performance targets, as ratios measured in one run on one machine.

    .venv/bin/python benchmarks/module_vs_peers.py [--repeats 5]

1. attnlab.Attention (default backend) vs a plain module around SDPA and the
   book's MultiHeadAttention: batch 8, 1024 tokens, 768 dims, 12 heads,
   float32, causal; forward, and forward + backward. Median wall time.
2. The flash backend vs SDPA at 4096 tokens (batch 1, 12 heads, head_dim 64).
3. The flash backend's peak allocated bytes against sequence length.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from attnlab import Attention, attention, book
from attnlab.bench.impls import PlainSDPA
from attnlab.bench.memory import PeakMemory


def median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")

    b, t, d, h = 8, 1024, 768, 12
    x = torch.randn(b, t, d)
    mods = {
        "plain SDPA module": PlainSDPA(d, h),
        "attnlab.Attention": Attention(d_in=d, num_heads=h),
        "book MultiHeadAttention": book.MultiHeadAttention(d, d, t, 0.0, h),
    }
    for mode in ("forward", "forward+backward"):
        res = {}
        for name, m in mods.items():
            if mode == "forward":
                with torch.no_grad():
                    res[name] = median_time(lambda: m(x), args.repeats)
            else:
                xg = x.clone().requires_grad_()
                res[name] = median_time(lambda: m(xg).sum().backward(), args.repeats)
        ours = res["attnlab.Attention"]
        print(f"\n{mode}, B={b} T={t} d={d} H={h}")
        for name, s in res.items():
            print(f"  {name:26s} {s * 1e3:8.1f} ms   attnlab / this = {ours / s:.2f}")

    q, k, v = (torch.randn(1, 12, 4096, 64) for _ in range(3))
    with torch.no_grad():
        sdpa = median_time(lambda: attention(q, k, v, is_causal=True, backend="sdpa"), args.repeats)
        flash = median_time(lambda: attention(q, k, v, is_causal=True, backend="flash"), args.repeats)
    print(
        f"\nT=4096, B=1, H=12, D=64 causal forward: sdpa {sdpa * 1e3:.1f} ms, flash {flash * 1e3:.1f} ms, "
        f"flash / sdpa = {flash / sdpa:.2f}"
    )

    print("\nflash peak allocated bytes (forward + backward, B=1, H=12, D=64):")
    for seq in (1024, 2048, 4096, 8192):
        q, k, v = (torch.randn(1, 12, seq, 64, requires_grad=True) for _ in range(3))
        with PeakMemory() as mem:
            attention(q, k, v, is_causal=True, backend="flash").sum().backward()
        scores = 12 * seq * seq * 4
        print(f"  T={seq:5d}: {mem.peak_bytes / 2**20:7.1f} MiB  (one float32 score matrix: {scores / 2**20:7.1f} MiB)")


if __name__ == "__main__":
    main()
