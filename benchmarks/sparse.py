"""Issue 59, measured: what the sparse and compressed kinds read and keep a token, against dense attention, and
where their decode starts to pay on this CPU, in one run.

    .venv/bin/python benchmarks/sparse.py [--smoke] [--rounds 7] [--threads 2] [--json sparse.json]
    .venv/bin/python benchmarks/sparse.py --render sparse.json   # the docs/benchmarks.md section, from a run

Every model is a variant of the attention zoo (``attnlab.models.zoo``: its shapes, random weights): dense mha and
mla, and each sparse variant beside the dense one it is judged against (``SPARSE``).

- **Keys read and state bytes a token**, at each of ``LENGTHS`` tokens: a cache built for N tokens is filled with
  N - 1 (a prompt fed in chunks) and one token decoded under the meter (``attnlab.bench.sparse_meter``): the keys
  each layer read, from a gathering layer's own ``keys_read`` (its kernel's indices) or a dense layer's unmasked
  scores, and the bytes the cache's tensors hold. A model of one period of the variant's layers is measured (one
  layer for mha, mla and dsa, whose layers are all alike; compressed-sparse and heavily compressed for
  compressed), at the zoo's layer shapes; at ``LONGEST`` (32k) the decode models' caches, built for it, give the
  row once the decode is done. The zoo's four layers are the period repeated, so its figures a token are the
  measured ones times the repeats (the zoo records its four layers at 1024 tokens, measured:
  tests/test_sparse_bench.py holds the two together).
- **Decode speed** of each variant's zoo model, all its ``DECODE_LAYERS`` layers (``--layers 2``: the first two,
  one period of each, where a loaded machine would take too long over 32k tokens): one cache each, built for
  ``LONGEST``,
  filled up to each of ``DECODE_AT`` in turn; there ``STEPS`` tokens decoded and the cache cropped back, in
  interleaved rounds (each variant first in turn). A variant's time is the median a token, each sparse/dense
  ratio the median of the per-round ratios with their spread. Sparse *pays* from the shortest length at which it
  is faster than its dense variant there and at every longer length, each ratio past its spread
  (``_verdicts.judged``); a straight line through each variant's medians says where they would cross, said as
  an extrapolation.

``--smoke``: short lengths, two rounds; the run written to a temporary folder and read back (``make smoke``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from _runs import add_run_arguments, check_run, exit_with, finish, render_saved
from _sparse_models import CHUNK, build, fill, first_layers, one_period, period
from _sparse_table import render

SCHEMA = "attnlab.sparse/1"
DENSE = ("mha", "mla")
SPARSE = {  # each sparse variant and the dense variant its decode is judged against; a new kind joins by one line
    "dsa": "mla",  # the same latent attention, every key read
    "compressed": "mha",  # V4's layers against the chapter's
    "moba": "mha",  # the chapter's heads, each query reading its own block and the top blocks by mean key
    "nsa": "mha",  # compressed, selected and sliding branches, mixed by gates
}
LENGTHS = (16, 128, 1024, 8192)  # below DSA's top-k, the zoo's training sequence, 1k, 8k: caches of their own
LONGEST = 32768  # the decode caches' length; the last row of keys and bytes is theirs, filled to it
STEPS = 8  # tokens decoded a round
DECODE_AT = (1024, 4096, 8192, 16384)  # tokens held before each round's STEPS, and LONGEST - STEPS
DECODE_LAYERS = 4  # the decode models' layers: the zoo's (every variant's period divides it)
SMOKE_LENGTHS, SMOKE_LONGEST, SMOKE_STEPS = (16, 128), 200, 2
SMOKE_DECODE_AT = (64, SMOKE_LONGEST - SMOKE_STEPS)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def variants() -> list[str]:
    return [*DENSE, *SPARSE]


def read_row(name: str, model: Any, caches: Any, token: Any, tokens: int) -> dict[str, Any]:
    """Decode ``token`` under the meter (the cache, built for ``tokens``, then holds them all): the keys each
    layer read and the bytes the cache holds."""
    from attnlab.bench.sparse_meter import keys_read, state_bytes
    from attnlab.models.zoo import zoo_config

    read = keys_read(model, caches, token)
    return {
        "variant": name,
        "tokens": tokens,
        "layers_measured": model.config.n_layers,
        "zoo_layers": zoo_config(name).n_layers,
        "keys_by_layer": read,
        "state_bytes": state_bytes(caches),
    }


def measure_reads(name: str, tokens: int) -> dict[str, Any]:
    """One variant at ``tokens``, on one period of its layers: a cache built for them, N - 1 fed, one decoded."""
    import torch

    from attnlab.models.zoo import zoo_config

    model, twin = build(one_period(zoo_config(name)).with_(context_length=max(4096, tokens)))
    ids = torch.randint(0, 256, (1, tokens), generator=torch.Generator().manual_seed(tokens))
    caches = model.make_caches(batch_size=1, max_len=tokens)
    fill(twin, caches, ids[:, :-1])
    return read_row(name, model, caches, ids[:, -1:], tokens)


def measure_decode(
    decode_at: tuple[int, ...], longest: int, *, rounds: int, steps: int, layers: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every variant's model of its first ``layers`` layers, its cache (built for ``longest``) filled up to each length in
    turn and timed there, seconds a decoded token round by round; then filled to ``longest`` - 1 and one token
    decoded under the meter (the keys and bytes row at ``longest``)."""
    import time

    import torch

    from attnlab.bench.timing import timed_rounds
    from attnlab.models.zoo import zoo_config

    ids = torch.randint(0, 256, (1, longest), generator=torch.Generator().manual_seed(7))
    built = {}
    for name in variants():
        zoo = zoo_config(name)
        assert layers % period(zoo) == 0  # whole periods: a variant's layers in their proportions
        model, twin = build(first_layers(zoo, layers).with_(context_length=max(4096, longest)))
        built[name] = (model, twin, model.make_caches(batch_size=1, max_len=longest, spare=steps))
    held, out = 0, []
    for tokens in decode_at:
        began = time.perf_counter()
        for _, twin, caches in built.values():
            caches.crop(held)
            fill(twin, caches, ids[:, held:tokens])
        held = tokens
        say(f"filled to {tokens:,} in {time.perf_counter() - began:.0f} s")
        prepared = {}
        for name, (model, _, caches) in built.items():

            def decode(model: Any = model, caches: Any = caches) -> None:
                with torch.no_grad():
                    for i in range(steps):
                        model(ids[:, tokens + i : tokens + i + 1], caches=caches, last_only=True)

            def prepare(caches: Any = caches, decode: Any = decode) -> Any:
                caches.crop(tokens)  # untimed: every round decodes the same tokens after the same cache
                return decode

            prepared[name] = prepare
        times: dict[str, list[float]] = {name: [] for name in prepared}
        for took in timed_rounds(prepared, rounds, warmup=1):
            for name, seconds in took.items():
                times[name].append(seconds / steps)
        out.append({"tokens": tokens, "seconds_a_token": times})
    rows = []
    for name, (model, twin, caches) in built.items():
        caches.crop(held)
        fill(twin, caches, ids[:, held : longest - 1])
        rows.append(read_row(name, model, caches, ids[:, longest - 1 :], longest))
    return out, rows


def run(
    *, smoke: bool, rounds: int, threads: int, longest: int = LONGEST, layers: int = DECODE_LAYERS
) -> dict[str, Any]:
    import platform
    import time

    import torch

    from attnlab.models.zoo import DSA_TOPK, V4_TOPK, V4_WINDOW, zoo_config

    torch.set_num_threads(threads)
    began = time.perf_counter()
    lengths = SMOKE_LENGTHS if smoke else LENGTHS
    steps = SMOKE_STEPS if smoke else STEPS
    longest = SMOKE_LONGEST if smoke else longest
    decode_at = SMOKE_DECODE_AT if smoke else (*(n for n in DECODE_AT if n < longest - steps), longest - steps)
    v4 = zoo_config("compressed").deepseek_v4
    assert v4 is not None
    blocks = {name: zoo_config(name).sparse_blocks for name in ("moba", "nsa")}
    assert blocks["moba"] is not None and blocks["nsa"] is not None
    reads = [measure_reads(name, n) for n in lengths for name in variants()]
    say(f"keys and bytes up to {lengths[-1]:,} tokens in {time.perf_counter() - began:.0f} s")
    decode, last = measure_decode(decode_at, longest, rounds=rounds, steps=steps, layers=layers)
    return {
        "schema": SCHEMA,
        "command": " ".join(["benchmarks/sparse.py", *sys.argv[1:]]),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "threads": threads,
        "cpu": platform.processor() or platform.machine(),
        "smoke": smoke,
        "rounds": rounds,
        "steps": steps,
        "chunk": CHUNK,
        "decode_layers": layers,
        "sparse": dict(SPARSE),
        "shapes": {  # what selection is judged against in the docs: the zoo's own numbers
            "dsa_topk": DSA_TOPK,
            "window": V4_WINDOW,
            "v4_topk": V4_TOPK,
            "sparse_block": v4.sparse_block,
            "heavy_block": v4.heavy_block,
            "seq_len": 128,
            "heads": zoo_config("moba").n_heads,
            "moba_block": blocks["moba"].block,
            "moba_topk": blocks["moba"].top_k,
            "nsa_select_n": blocks["nsa"].select_n,
            "nsa_select_block": blocks["nsa"].select_block,
            "nsa_slide": blocks["nsa"].slide,
            "nsa_compress_block": blocks["nsa"].compress_block,
            "nsa_stride": blocks["nsa"].stride,
        },
        "reads": reads + last,
        "decode": decode,
        "seconds": time.perf_counter() - began,
    }


def problems(result: dict[str, Any]) -> list[str]:
    """A dense layer that did not read every token it holds, or a layer reading more keys than the tokens it holds
    (a key counted once a query: every kind but compressed, whose entries come on top of its window)."""
    out = []
    for row in result["reads"]:
        if row["variant"] in DENSE and any(k != row["tokens"] for k in row["keys_by_layer"]):
            out.append(f"{row['variant']} at {row['tokens']:,} tokens read {row['keys_by_layer']} keys, not every one")
        elif row["variant"] != "compressed" and any(k > row["tokens"] for k in row["keys_by_layer"]):
            out.append(f"{row['variant']} at {row['tokens']:,} tokens read {row['keys_by_layer']} keys, more than held")
    for at in result["decode"]:
        for name, seconds in at["seconds_a_token"].items():
            if not seconds or statistics.median(seconds) <= 0:
                out.append(f"{name} at {at['tokens']:,}: no decode timed")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="short lengths, 2 rounds, written to a temporary folder")
    add_run_arguments(parser, rounds=7)
    parser.add_argument("--longest", type=int, default=LONGEST, help=f"the longest context (default {LONGEST})")
    parser.add_argument("--layers", type=int, choices=(2, 4), default=DECODE_LAYERS, help="the decode models' layers")
    args = parser.parse_args()
    if args.render:
        render_saved(parser, args.render, SCHEMA, render)
        return 0
    check_run(parser, args)
    if not LENGTHS[-1] < args.longest <= 2**17:
        parser.error(f"--longest must be in ({LENGTHS[-1]}, {2**17}], got {args.longest}")
    rounds = 2 if args.smoke else args.rounds
    result = run(smoke=args.smoke, rounds=rounds, threads=args.threads, longest=args.longest, layers=args.layers)
    if not args.smoke:
        return finish(args.json, result, render, problems(result), "sparse")
    with tempfile.TemporaryDirectory() as folder:  # the run written and read back, as --render reads it
        path = Path(args.json or Path(folder) / "sparse.json")
        code = finish(str(path), result, render, problems(result), "sparse")
        if render(json.loads(path.read_text(encoding="utf-8"))) != render(result):
            print("sparse: the run read back renders otherwise", file=sys.stderr)
            return 1
    return code


if __name__ == "__main__":
    exit_with(main)
