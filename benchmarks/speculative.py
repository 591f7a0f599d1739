"""Issue 24, part 4: what speculative decoding buys, as ratios in one run, the tokens checked first.

    .venv/bin/python benchmarks/speculative.py [--new-tokens 128] [--lookup 4] [--rounds 5] [--only TEXT] [--smoke]

On the shipped text model (``--model text``), greedy, batch 1, four kinds of text:

- **repeats its context**: a listing given once and begun again, so the
  continuation copies it (what prompt lookup is for);
- **held-out documentation**: a window of it, continued freely; it repeats in
  part (the continuation reuses its words, and the model's own);
- **does not repeat**: 96 random bytes, continued freely: the model's text
  shares little with them or with itself, so lookup's guesses are mostly
  refused (the share kept is printed beside it), what lookup costs when it
  does not pay;
- **a model that copies**: the shipped induction model (``--model
  induction``, which has an induction head), given a block of distinct
  tokens and the block's first tokens again, as its task trains it;
- each decoded plainly and with ``lookup=k``. (A draft model needs a
  smaller model trained on the same bytes; none ships yet, so the draft path
  is tested for exactness, not timed here.)

Before timing, every run's tokens are compared with plain greedy decoding: a
difference is an error, not a row. Tokens/s is reported per case with its
ratio to plain decoding (median of per-round ratios, interleaved rounds).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence

import torch

from _timing import interleaved, report
from attnlab.models import GPT
from attnlab.models.generation import Lookup, Request, Stop, decode
from attnlab.models.locate import locate
from attnlab.models.tasks import TextTask, stdlib_text

LISTING = """for i in range(10):
    total = total + values[i] * weights[i]
print(total)
"""


def texts() -> dict[str, tuple[GPT, torch.Tensor]]:
    text = GPT.from_pretrained(locate("text")).eval()
    held_out = TextTask(stdlib_text(), seq_len=96).batch(1, torch.Generator().manual_seed(5), split="eval")[0]
    again = list(LISTING.encode()) * 2
    copier = GPT.from_pretrained(locate("induction")).eval()
    block = torch.randperm(copier.config.vocab_size, generator=torch.Generator().manual_seed(0))[:24]
    return {
        "repeats its context": (text, torch.tensor([again[: len(LISTING) + 12]])),
        "held-out documentation": (text, held_out[:, :96]),
        "does not repeat: random bytes": (
            text,
            torch.randint(0, 256, (1, 96), generator=torch.Generator().manual_seed(0)),
        ),
        "a model that copies, a block given again": (copier, torch.cat([block, block[:4]])[None]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--lookup", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="a few tokens, one round: that it runs")
    parser.add_argument(
        "--only", metavar="TEXT", help="run the kinds of text whose label contains TEXT (say 'does not repeat')"
    )
    args = parser.parse_args(argv)
    new, rounds = (8, 1) if args.smoke else (args.new_tokens, args.rounds)
    every = texts()
    chosen = {label: case for label, case in every.items() if args.only is None or args.only in label}
    if not chosen:
        parser.error(f"--only {args.only!r} is in no label; the texts are {list(every)}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, the shipped models, greedy, {new} tokens")
    asked = new
    for label, (model, prompt) in chosen.items():
        new = min(asked, model.config.context_length - prompt.shape[1] - args.lookup)  # what its context holds
        plain = model.generate(prompt, new)
        cache = model.make_caches(batch_size=1, max_len=prompt.shape[1] + new + args.lookup)
        request = Request(
            prompts=tuple(map(tuple, prompt.tolist())),
            stop=Stop(max_new_tokens=new),
            cache=cache,
            proposer=Lookup(k=args.lookup),
        )
        passes = decode(model, request)
        guessed = torch.cat([prompt, torch.tensor([[t for drawn in passes for _, t in drawn]])], dim=1)
        if not torch.equal(guessed, plain):
            raise SystemExit(f"{label}: lookup gave other tokens than plain greedy decoding")
        counts = passes.counts
        kept = counts.kept / max(counts.guessed, 1)
        print(
            f"{label}: {new} tokens in {counts.passes} passes with lookup={args.lookup} "
            f"({counts.kept} of {counts.guessed} guesses kept, {kept:.0%}); tokens identical to plain"
        )
        started = time.perf_counter()
        model.generate(prompt, new)
        reps = max(1, math.ceil(0.5 / (time.perf_counter() - started)))  # each timing at least half a second
        cases = {
            "plain": lambda: [model.generate(prompt, new) for _ in range(reps)],
            f"lookup={args.lookup}": lambda: [model.generate(prompt, new, lookup=args.lookup) for _ in range(reps)],
        }
        report(interleaved(cases, rounds), "plain")
        print(f"  (each timing: {reps} x {new} tokens; a ratio below 1x is faster than plain)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
