"""Log-log plot of a bench run: time and peak memory against sequence length, with fitted exponents.

Drawn with matplotlib's object API: no pyplot, no backend chosen at import.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from attnlab.bench.results import BenchResult


def plot(result: BenchResult, path: str | Path) -> Path:
    """Two panels (median time, peak allocated bytes) per implementation, for the prefill mode."""
    mode = result.config["mode"]
    cases = [c for c in result.cases if c.ok and c.mode == mode]
    fig = Figure(figsize=(12, 4.8))
    ax_t, ax_m = fig.subplots(1, 2)
    for impl in dict.fromkeys(c.impl for c in cases):
        pts = sorted((c for c in cases if c.impl == impl), key=lambda c: c.seq)
        fit = result.fits.get(f"{impl} {mode}")
        te = fit.time_exponent if fit else None
        me = fit.memory_exponent if fit else None
        seqs = [c.seq for c in pts]
        ax_t.plot(seqs, [c.median_ms for c in pts], marker="o", label=f"{impl} (T^{te:.2f})" if te else impl)
        ax_m.plot(
            seqs,
            [(c.peak_allocated_bytes or 0) / 2**20 for c in pts],
            marker="o",
            label=f"{impl} (T^{me:.2f})" if me else impl,
        )
    for ax, ylabel in ((ax_t, "median time (ms)"), (ax_m, "peak allocated (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    cfg = result.config
    fig.suptitle(
        f"{mode}, batch {cfg['batch']}, d={cfg['d_model']}, {cfg['heads']} heads, {cfg['dtype']}, "
        f"{result.machine.threads} threads",
        fontsize=10,
    )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path
