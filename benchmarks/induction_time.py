"""Issue 12: how long `attnlab train induction` takes to grow an induction head (score >= 0.7), over seeds.

    .venv/bin/python benchmarks/induction_time.py [--seeds 0 1 2] [--threads 2]

Each seed runs the real command in its own process, as a learner would. The
time to the head is measured from the command's start: the process's
start-up and the final save and table (wall time minus the loop's own time)
are counted in full, so the figure is an upper bound. A seed whose head never
reaches 0.7 within the run is reported as failed, never dropped.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from attnlab.explain.heads import first_step, seconds_to
from attnlab.models.train import read_log

ATTNLAB = Path(sys.executable).with_name("attnlab")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (OMP_NUM_THREADS); default 2")
    parser.add_argument("--smoke", action="store_true", help="one seed, a tiny model, 4 steps: that it runs")
    args = parser.parse_args(argv)
    extra = ["--steps", "4", "--eval-every", "2", "--layers", "1", "--emb-dim", "32", "--context", "32"]
    extra = extra if args.smoke else []
    if args.smoke:
        args.seeds = [0]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    times, failed = [], []
    print(f"attnlab train induction, {args.threads} threads; the first evaluation with an induction score >= 0.7")
    print(
        f"{'seed':>4} {'step':>6} {'loop s':>7} {'command s':>10} {'whole run s':>12} {'final ind':>10} {'final prev':>11}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            out = Path(tmp) / f"seed{seed}"
            began = time.perf_counter()
            subprocess.run(
                [str(ATTNLAB), "train", "induction", "--seed", str(seed), "--out", str(out), *extra],
                check=True,
                capture_output=True,
                env=env,
            )
            wall = time.perf_counter() - began
            log = read_log(out)
            assert log is not None
            step = first_step(log)
            last = log.extra["heads"][-1]
            final = max(last["induction"][-1]), max(last["previous_token"][0])
            if step is None:
                failed.append(seed)
                print(f"{seed:>4} {'never':>6} {'':>7} {'':>10} {wall:>12.1f} {final[0]:>10.2f} {final[1]:>11.2f}")
                continue
            to_head = (wall - log.seconds) + seconds_to(log, step)  # start-up and saving counted in full
            times.append(to_head)
            print(
                f"{seed:>4} {step:>6} {seconds_to(log, step):>7.1f} {to_head:>10.1f} {wall:>12.1f} "
                f"{final[0]:>10.2f} {final[1]:>11.2f}"
            )
    if times:
        print(
            f"median time from the command to an induction head: {statistics.median(times):.1f} s over {len(times)} seeds"
        )
    print(f"seeds that failed: {failed or 'none'}")


if __name__ == "__main__":
    main()
