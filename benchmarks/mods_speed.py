"""Issue 13: what mask functions cost, as ratios in one run (forward, float32, no gradient).

    .venv/bin/python benchmarks/mods_speed.py [--rounds 5] [--threads 2] [--no-flex]

1. Plain causal, B=1, T=4096, 12 heads of 64 (d=768): the flash backend against SDPA, by default (its full
   and diagonal blocks in PyTorch's fused CPU kernel, merged by their log-sum-exp) and with every tile
   walked in PyTorch (``Flash(fused=False)``, the readable path).
2. T=8192 holding 16 packed documents of 512 tokens, causal within each
   (``and_masks(causal(), document(ids))``), B=1, 12 heads of 64: flash with
   its tile skipping; flash with skipping turned off (every tile computed and
   masked); SDPA given the materialized boolean mask; the 16 documents run
   one by one (flash and SDPA, causal); and PyTorch's flex_attention compiled
   (the compile not timed): through attnlab's backend="flex" with the mask_mod
   (a Visibility, so a block mask, built per call), with one Visibility reused
   (its block mask built once, as the layers of a model share it), and called
   directly with a block mask built once.
Rounds interleave the implementations (rotating the order); each figure is
the median over rounds, and ratios are medians of per-round ratios, with
their spread (over 25%: too noisy to trust).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from _timing import interleaved, report
from _verdicts import judged
from attnlab import attention
from attnlab.bench.timing import ratios, spread
from attnlab.functional import PARTIAL, Flash, Visibility, mods
from attnlab.functional.flash_passes import DEFAULT_BLOCK, flash_forward

FLASH_TARGET = 1.1  # issue 24, part 5: flash at most this multiple of SDPA's time, causal, T = 4096


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-flex", action="store_true", help="leave out flex_attention (its compile takes a while)")
    parser.add_argument("--smoke", action="store_true", help="small sizes, one round, no flex: that every case runs")
    args = parser.parse_args(argv)
    long, t, docs = (256, 512, 4) if args.smoke else (4096, 8192, 16)
    if args.smoke:
        args.rounds, args.no_flex = 1, True
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, float32, forward, {args.rounds} interleaved rounds")
    g = torch.Generator().manual_seed(0)

    q, k, v = (torch.randn(1, 12, long, 64, generator=g) for _ in range(3))
    walked = Flash(fused=False)
    print(f"plain causal, T={long}, 12 heads x 64:")
    with torch.no_grad():
        times = interleaved(
            {
                "sdpa": lambda: attention(q, k, v, is_causal=True, backend="sdpa"),
                "flash": lambda: attention(q, k, v, is_causal=True, backend="flash"),
                "flash, tiles walked here": lambda: attention(q, k, v, is_causal=True, backend=walked),
            },
            args.rounds,
        )
        report(times, "sdpa")
    per_round = ratios(times, "flash", "sdpa")
    flash = statistics.median(per_round)
    verdict = judged(flash, FLASH_TARGET, spread(per_round), at_most=True, whose="the rounds")
    print(f"  target: flash at most {FLASH_TARGET}x sdpa: {flash:.2f}x, {verdict}")

    q, k, v = (torch.randn(1, 12, t, 64, generator=g) for _ in range(3))
    ids = torch.arange(docs).repeat_interleave(t // docs)[None]  # (1, T)
    packed = mods.and_masks(mods.causal(), mods.document(ids))
    vis = Visibility.from_lengths(t, t, mask_mod=packed, batch=1, heads=12)  # built once, as a model shares it
    precomputed = vis.dense()[0]  # the (T, T) boolean mask, built once: plain SDPA with nothing to evaluate
    every_tile = {tile: PARTIAL for tile in vis.tile_kinds(DEFAULT_BLOCK, DEFAULT_BLOCK)}  # nothing skipped
    n = t // docs
    scale = 1 / math.sqrt(64)

    def nothing_skipped() -> object:
        return flash_forward(
            q,
            k,
            v,
            vis,
            scale=scale,
            dropout_p=0.0,
            seed=0,
            block_q=DEFAULT_BLOCK,
            block_k=DEFAULT_BLOCK,
            kinds=every_tile,
        )

    cases = {
        "flash, tiles skipped": lambda: attention(q, k, v, mask_mod=packed, backend="flash"),
        "flash, nothing skipped": nothing_skipped,
        "flash, one Visibility reused": lambda: attention(q, k, v, visibility=vis, backend="flash"),
        "sdpa, materialized mask": lambda: attention(q, k, v, mask_mod=packed, backend="sdpa"),
        "sdpa, mask precomputed": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=precomputed),
        f"{docs} documents alone, flash": lambda: [
            attention(q[:, :, i : i + n], k[:, :, i : i + n], v[:, :, i : i + n], is_causal=True, backend="flash")
            for i in range(0, t, n)
        ],
        f"{docs} documents alone, sdpa": lambda: [
            attention(q[:, :, i : i + n], k[:, :, i : i + n], v[:, :, i : i + n], is_causal=True, backend="sdpa")
            for i in range(0, t, n)
        ],
    }
    if not args.no_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        compiled = torch.compile(flex_attention, dynamic=False)
        block_mask = create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (ids[b, qi] == ids[b, ki]), 1, 12, t, t, "cpu")
        cases["attnlab backend='flex'"] = lambda: attention(q, k, v, mask_mod=packed, backend="flex")
        cases["attnlab flex, one Visibility reused"] = lambda: attention(q, k, v, visibility=vis, backend="flex")
        cases["flex_attention, block mask reused"] = lambda: compiled(q, k, v, block_mask=block_mask)
    print(f"{docs} packed documents of {n}, causal in each, T={t}, 12 heads x 64:")
    with torch.no_grad():
        reference = as_tensor(cases["flash, tiles skipped"]())
        for name, case in cases.items():  # every contender computes the same thing, or it is not timed
            assert torch.allclose(as_tensor(case()), reference, atol=1e-4), f"{name} disagrees with flash"
        report(interleaved(cases, args.rounds), "flash, tiles skipped")


def as_tensor(got: object) -> torch.Tensor:
    """A case's output as one (B, H, T, D) tensor: flash_forward's (out, lse), or the documents one by one."""
    if isinstance(got, tuple):
        got = got[0]
    if isinstance(got, list):
        got = torch.cat(got, dim=2)
    assert isinstance(got, torch.Tensor)
    return got


if __name__ == "__main__":
    main()
