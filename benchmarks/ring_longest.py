"""Issue 14: the longest sequence that P ring ranks reach against one process, under the same memory cap per process.

    .venv/bin/python benchmarks/ring_longest.py [--memory-limit 128] [--nproc 2 4] [--heads 4] [--head-dim 64]

Each process caps its own data segment (RLIMIT_DATA: heap and private mappings,
where tensors live) at its size after a warm-up plus --memory-limit MiB, so a
length that does not fit fails for real, in an allocation (``attnlab.bench.ring``).
The baseline is one process running plain flash attention (attnlab's
O(T)-memory kernel) on the whole sequence; then the ring on 1 process and on
each --nproc. For each, the length doubles from 4096 while it fits, then is
bisected between the longest fit and the shortest failure to 1/16. Causal,
zigzag, float32, forward. The model of the memory, in units of one (H x D)
float32 row per token: one process holds q, k, v and the output (4 T); a ring
rank holds its shard's q, k, v and output plus two travelling K/V blocks, the
one in hand and the one arriving (8 T / P); so P ranks reach P / 2 times one
process, less what the constant (the flash tiles, the processes) takes.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from attnlab.bench.ring import Longest, RingRun, longest


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory-limit", type=int, default=128, help="MiB per process above its warm-up (128)")
    parser.add_argument("--nproc", type=int, nargs="+", default=[4], help="ring sizes to try (default 4)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--smoke", action="store_true", help="2 processes, a coarse search from 256 tokens")
    args = parser.parse_args(argv)
    search: dict[str, Any] = {"start": 256, "resolution": 0.5} if args.smoke else {}
    if args.smoke:
        args.nproc, args.heads, args.head_dim, args.memory_limit = [2], 1, 8, 4
    base = RingRun(heads=args.heads, head_dim=args.head_dim, memory_limit_mib=args.memory_limit, check_len=0)
    print(
        f"cap: each process's data segment at its warm-up size + {args.memory_limit} MiB; "
        f"causal, zigzag, {args.heads} heads x {args.head_dim}, float32, forward"
    )
    runs = [("one process, flash", 1, False), ("ring, 1 process", 1, True)]
    runs += [(f"ring, {p} processes", p, True) for p in args.nproc]
    found: list[tuple[str, Longest]] = []
    for name, nproc, ring in runs:

        def said(n: int, fitted: bool, seconds: float | None, name: str = name) -> None:
            print(
                f"  {name}: {n} tokens {'fits' if fitted else 'does not fit'}"
                + (f" ({seconds:.1f} s)" if seconds else ""),
                flush=True,
            )

        result = longest(RingRun(**{**base.__dict__, "ring": ring}), nproc, on_trial=said, **search)
        found.append((name, result))
    one = max(found[0][1].fits, 1)
    print(f"\n{'run':<22} {'longest that fits':>18} {'shortest that fails':>20} {'x one process':>14}")
    for name, result in found:
        print(f"{name:<22} {result.fits:>18} {result.fails or 0:>20} {result.fits / one:>14.2f}")


if __name__ == "__main__":
    main()
