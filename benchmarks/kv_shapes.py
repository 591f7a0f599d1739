"""Issue 56, measured: what the hybrid families attnlab reads keep while they read 32k and 128k tokens, on the
published shapes (``attnlab.models.families.shapes``), against a full-attention model of the same size.

    .venv/bin/python benchmarks/kv_shapes.py [--smoke] [--json kv_shapes.json]
    .venv/bin/python benchmarks/kv_shapes.py --render kv_shapes.json   # the docs/benchmarks.md section, from a run

Nothing is loaded or timed: every figure is counted from each checkpoint's config.json fields, read by the
family's own reader, with ``attnlab.bench.kv_bytes`` (``attnlab memory``'s meter), batch 1:

- each kind of layer's state: a full layer's keys and values in bfloat16 (its KV heads x (key + value size) x 2
  bytes a token, keys kept beside values where they are one projection, Gemma 4's K = V); a latent layer's latent
  and RoPE key (MLA, Kimi Linear); a sliding layer's window; a layer that reads an earlier layer's keys and
  values (KV sharing, Gemma 4) as 0 bytes, its keys counted in the layer it reads; a Gated DeltaNet or Kimi Delta
  Attention layer's state and its convolution's last inputs, kept in float32 whatever the weights' dtype (as
  ``attnlab.cache.StateCache`` keeps it), the same after one token as after a million; an LFM3 convolution
  layer's last K - 1 inputs of each channel (``ConvolutionCache``, in the weights' dtype), as fixed;
- against the same layers, every one a full softmax layer with the model's own full layers' KV heads and head
  size, or, where those are latent, every one a latent layer (``attnlab.bench.kv_bytes.every_layer_full``): what
  the design saves.

Before a run is written, each row's kinds must sum to its total and each hybrid must keep less than every layer
full; the script exits 1 where one does not. ``--smoke`` counts three shapes (Qwen3.5, OLMo-Hybrid, Gemma 4's
shared layers), writes the run to a temporary folder and reads it back (``make smoke``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from _runs import exit_with, finish, render_saved

SCHEMA = "attnlab.kv_shapes/1"
TOKENS = (32_768, 131_072)
DTYPE = "bfloat16"  # what these checkpoints are published in: the keys' and values' bytes
SHAPES = (  # attnlab's shape names; the hub folder each comes from is the table's (shapes.SOURCES)
    "qwen3.5-0.8b",
    "qwen3.5-4b",
    "qwen3.5-9b",
    "qwen3.5-27b",
    "olmo-hybrid-7b",
    "gemma-4-e2b",
    "gemma-4-e4b",
    "gemma-4-26b-a4b",
    "gemma-4-31b",
    "kimi-linear-48b-a3b",
    "mimo-v2-flash",
    "lfm3-1.7b",  # Lfm3Config's defaults, under the checkpoint name its docstring gives (the table's note)
)
DEFAULTS = {  # shapes whose fields are a config class's defaults, not a downloaded config.json
    "lfm3-1.7b": "transformers 5.24's Lfm3Config defaults, under the checkpoint name its docstring gives",
}
SMOKE = ("qwen3.5-0.8b", "olmo-hybrid-7b", "gemma-4-e2b")
RECURRENT = {  # a recurrent kind's name in a sentence
    "delta": "Gated DeltaNet",
    "kda": "Kimi Delta Attention",
    "linear": "linear attention",
    "conv": "convolution",
}


def measure(name: str) -> dict[str, Any]:
    """One shape's row: its layers by kind, and at each of ``TOKENS`` what each kind keeps, the total and what
    the same layers, every one full (or latent, where the model's full layers are), would keep."""
    from attnlab.bench.kv_bytes import every_layer_full, kv_report
    from attnlab.models.families.shapes import SOURCES, shape

    config = shape(name)
    report = kv_report(config, name=name, tokens=TOKENS, dtype=DTYPE)
    full = every_layer_full(config, dtype=DTYPE)
    kinds = [
        {
            "kind": k.kind,
            "window": k.window,
            "layers": k.layers,
            "bytes_per_token": k.bytes_per_token,
            "state_bytes": k.state_bytes,
        }
        for k in report.kinds
    ]
    at = []
    for point in report.at:
        by_kind = {label: count * point.layer_bytes[label] for label, count in _counts(report).items()}
        at.append(
            {
                "tokens": point.tokens,
                "past_context": point.past_context,
                "by_kind": by_kind,
                "total": point.total,
                "every_layer_full": full * point.tokens,
            }
        )
    return {
        "name": name,
        "repo": SOURCES[name],
        "family": config.family,
        "parameters": report.parameters,
        # Gemma 4's per-layer embeddings: one (vocabulary, layers x width) table, looked up, never multiplied
        "per_layer_table": config.vocab_size * config.n_layers * config.ple_dim,
        "n_layers": config.n_layers,
        "conv_kernel": config.conv_kernel,  # K: a convolution layer keeps its last K - 1 inputs
        "context_length": config.context_length,
        "baseline": "every layer latent" if config.kv_lora_rank is not None else "every layer full",
        "every_layer_full_per_token": full,
        "kinds": kinds,
        "at": at,
    }


def _counts(report: Any) -> dict[str, int]:
    """Layers of each kind, by the label ``CacheAt`` keys them with ("full", "sliding 1024", "delta", ...)."""
    return {k.kind if k.window is None else f"sliding {k.window}": k.layers for k in report.kinds}


def run(*, smoke: bool) -> dict[str, Any]:
    import torch

    names = SMOKE if smoke else SHAPES
    return {
        "schema": SCHEMA,
        "command": " ".join(["benchmarks/kv_shapes.py", *sys.argv[1:]]),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "dtype": DTYPE,
        "tokens": list(TOKENS),
        "rows": [measure(name) for name in names],
    }


def problems(result: dict[str, Any]) -> list[str]:
    """Rows whose kinds do not sum to their total, or that keep no less than every layer full."""
    out = []
    for row in result["rows"]:
        for at in row["at"]:
            if sum(at["by_kind"].values()) != at["total"]:
                out.append(
                    f"{row['name']} at {at['tokens']:,}: its kinds sum to {sum(at['by_kind'].values()):,} B, not {at['total']:,}"
                )
            if not at["total"] < at["every_layer_full"]:
                out.append(f"{row['name']} at {at['tokens']:,}: {at['total']:,} B, no less than {row['baseline']}")
    return out


def _label(kind: dict[str, Any]) -> str:
    return kind["kind"] if kind["window"] is None else f"sliding {kind['window']}"


def _layers(row: dict[str, Any]) -> str:
    """ "6 full, 18 delta": the layers by kind."""
    return ", ".join(
        f"{k['layers']} {k['kind']}" + (f" (window {k['window']:,})" if k["window"] else "") for k in row["kinds"]
    )


def _parameters(row: dict[str, Any]) -> str:
    """ "4.63B", or with per-layer embeddings "4.63B (2.28B without its per-layer table)"."""
    total = f"{row['parameters'] / 1e9:.2f}B"
    if not row["per_layer_table"]:
        return total
    return f"{total} ({(row['parameters'] - row['per_layer_table']) / 1e9:.2f}B without its per-layer table)"


def _others(row: dict[str, Any], at: dict[str, Any]) -> list[str]:
    """What each kind of layer that does not keep every token keeps, at ``at``'s tokens."""
    from attnlab.bench.kv_bytes import readable_bytes

    out = []
    for k in row["kinds"]:
        held = readable_bytes(at["by_kind"][_label(k)])
        if k["window"] is not None:
            out.append(
                f"{k['layers']} sliding layers keep their last {k['window']:,} tokens' keys and values, {held} in all "
                f"from {k['window']:,} tokens on"
            )
        elif k["kind"] == "shared":
            out.append(
                f"{k['layers']} shared layers keep 0 B of their own: each reads the keys and values of the last "
                "earlier layer of its type, counted there"
            )
        elif k["kind"] == "conv":
            taps = row["conv_kernel"] - 1
            out.append(
                f"{k['layers']} convolution layers keep their last {taps} inputs of each channel (a kernel of "
                f"{row['conv_kernel']}), a state of fixed size, {held} in all whatever the tokens"
            )
        elif k["state_bytes"]:
            out.append(
                f"{k['layers']} {RECURRENT.get(k['kind'], k['kind'])} layers keep a state of fixed size, {held} in "
                "all whatever the tokens"
            )
    return out


def _sentence(row: dict[str, Any]) -> str | None:
    """What the row says: the layers that keep every token, against the baseline, what the others keep, and the
    bound the saving climbs toward."""
    growing = [k for k in row["kinds"] if k["window"] is None and k["bytes_per_token"]]  # every token, kept
    per_token = sum(k["layers"] * k["bytes_per_token"] for k in growing)
    if not per_token:
        return None
    what = "latent and RoPE key" if {k["kind"] for k in growing} == {"latent"} else "keys and values"
    keeping = sum(k["layers"] for k in growing)
    last = row["at"][-1]
    return (
        f"- {row['repo']}: {keeping} of {row['n_layers']} layers keep every token's {what}, {per_token:,} B a token "
        f"against {row['every_layer_full_per_token']:,} B with {row['baseline']}; "
        + "; ".join(_others(row, last))
        + "; so the saving climbs toward "
        f"{row['every_layer_full_per_token'] / per_token:.2f}x as the tokens grow."
    )


def _defaults(result: dict[str, Any]) -> str:
    """ "; LiquidAI/LFM3-1.7B's: ..., not a downloaded config.json": each row whose fields are not a checkpoint's."""
    said = [f"{row['repo']}'s: {DEFAULTS[row['name']]}" for row in result["rows"] if row["name"] in DEFAULTS]
    return "".join(f"; {line}, not a downloaded config.json" for line in said)


def render(result: dict[str, Any]) -> str:
    """The table and what it says, every figure from the result."""
    from attnlab.bench.kv_bytes import readable_bytes

    lines = [
        "| model | layers | parameters | tokens | state, by kind of layer | total | every layer full | less |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        counts = {_label(k): k["layers"] for k in row["kinds"]}
        latent = " (every layer latent)" if row["baseline"] == "every layer latent" else ""
        for at in row["at"]:
            split = "; ".join(f"{counts[label]} {label}: {readable_bytes(b)}" for label, b in at["by_kind"].items())
            past = f" (past its {row['context_length']:,})" if at["past_context"] else ""
            lines.append(
                f"| {row['repo']} | {_layers(row)} | {_parameters(row)} | {at['tokens']:,}{past} | {split} | "
                f"{readable_bytes(at['total'])} | {readable_bytes(at['every_layer_full'])}{latent} | "
                f"{at['every_layer_full'] / at['total']:.2f}x |"
            )
    lines.append("")
    lines += [line for line in map(_sentence, result["rows"]) if line]
    lines.append(
        f"\n`{result['command']}` ({result['date']}, torch {result['torch']}): counted from each checkpoint's "
        f"config.json fields read by its family's reader (`attnlab.models.families.shapes`{_defaults(result)}), "
        f"batch 1; keys, values and latents in {result['dtype']}, a recurrent state in float32 as `StateCache` "
        f"keeps it, a convolution layer's last inputs in {result['dtype']}. \"Every layer "
        "full\": the same layers, each a full softmax layer with the model's own full layers' KV heads and head "
        "size (no window, no sharing); where the full layers are latent (MLA), each a latent layer of their shape. "
        "Nothing is loaded; the parameter count is the text model's, built on the meta device."
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="two shapes, the run written to a temporary folder")
    parser.add_argument("--json", metavar="PATH", help="write the result here")
    parser.add_argument("--render", metavar="PATH", help="print the table of a saved result, no run")
    args = parser.parse_args()
    if args.render:
        render_saved(parser, args.render, SCHEMA, render)
        return 0
    if args.json and not Path(args.json).resolve().parent.is_dir():
        parser.error(f"cannot write --json {args.json!r}: its folder does not exist")
    result = run(smoke=args.smoke)
    if not args.smoke:
        return finish(args.json, result, render, problems(result), "kv_shapes")
    with tempfile.TemporaryDirectory() as folder:  # the run written and read back, as --render reads it
        path = Path(args.json or Path(folder) / "kv_shapes.json")
        code = finish(str(path), result, render, problems(result), "kv_shapes")
        if render(json.loads(path.read_text(encoding="utf-8"))) != render(result):
            print("kv_shapes: the run read back renders otherwise", file=sys.stderr)
            return 1
    return code


if __name__ == "__main__":
    exit_with(main)
