"""A paged decode step's bookkeeping against the size of the pool (issue 32): it should not grow with it.

    .venv/bin/python benchmarks/paged_steps.py [--rounds 5] [--steps 256] [--smoke]

One ``BlockTable`` of 8 rows, as every paged layer of a model shares it, runs
``--steps`` decode steps (each row one token: plan the write, then commit
it) in pools of 64 blocks and of 65,536 (and in between); the time a step
takes is the figure, and its ratio to the smallest pool's; beside them, the
same steps with the old design's scan of every refcount (once a step: the old
code did it once a step of every layer). The old per-layer
bookkeeping scanned every block's refcount at each step of each layer, so it
grew with the pool; a queue of free ids and a plan that reads only the blocks
written keep it flat. Rounds are interleaved (``attnlab.bench.timing``), and a
ratio whose rounds spread by more than 25% is marked as not a finding.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from _timing import report
from attnlab.bench.timing import timed_rounds
from attnlab.cache import BlockTable

ROWS, BLOCK = 8, 16


def steps(blocks: int, n: int, *, scan: bool = False) -> Callable[[], Callable[[], None]]:
    """Makes (untimed: a table's size is paid once, when it is built) a call that runs ``n`` decode steps of
    every row in a fresh table of ``blocks`` blocks; ``scan``: each step also lists the free blocks by reading
    every refcount, as the old per-layer bookkeeping did (once per layer; here once), for comparison."""

    def prepare() -> Callable[[], None]:
        table = BlockTable(batch_size=ROWS, num_blocks=blocks, max_len=n + 1, block_size=BLOCK)
        table.layers = 1  # every layer writes through the same plan; its bookkeeping is done once
        rows = tuple(range(ROWS))

        def call() -> None:
            for _ in range(n):
                if scan:
                    [b for b, r in enumerate(table.refcount) if r == 0]  # the old plan's first line
                table.wrote(table.plan(rows, 1))

        return call

    return prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--smoke", action="store_true", help="a few steps, to check that the script runs")
    args = parser.parse_args()
    n = 8 if args.smoke else args.steps
    sizes = (64, 65_536) if args.smoke else (64, 1_024, 16_384, 65_536)
    pools = [max(p, ROWS * -(-(n + 1) // BLOCK)) for p in sizes]  # every row's blocks fit
    cases = {f"{p:,} blocks": steps(p, n) for p in pools}
    cases |= {f"{p:,} blocks, old scan": steps(p, n, scan=True) for p in (pools[0], pools[-1])}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for took in timed_rounds(cases, 1 if args.smoke else args.rounds, warmup=1):
        for name, seconds in took.items():
            times[name].append(seconds)
    print(
        f"{n} decode steps of {ROWS} rows, blocks of {BLOCK} tokens, the time of all {n}: one table, whatever the pool"
    )
    report(times, base=f"{pools[0]:,} blocks")


if __name__ == "__main__":
    main()
