"""Issue 38, part 2: attnlab's caches inside transformers' ``generate``, judged on a trained model the way the
cache lab judges them on attnlab's own.

    .venv/bin/python benchmarks/hf_caches.py [--smoke] [--threads 1] [--json hf_caches.json]
    .venv/bin/python benchmarks/hf_caches.py --render hf_caches.json   # the docs/benchmarks.md section, from a run

The trained model is attnlab's shipped text model (4 layers, 128 wide, rotary positions, LayerNorm and a GELU
MLP), written as the transformers family with that block, GPT-NeoX (sequential residual, the whole head
rotated, the tanh GELU, zero qkv biases), and loaded with ``attn_implementation="attnlab"``. Before any figure
is kept, its logits on the held-out text must equal attnlab's model's within ``PARITY`` and its greedy tokens
without a cache must be attnlab's.

Each cache (``attnlab.hf.cache``: plain, int8, int4, sink, H2O and SnapKV at the cache lab's budgets) is measured as
``attnlab bench --caches`` measures attnlab's own (``attnlab.bench.caches``, its default sizes, on the same
prompts and held-out windows):

- **agreement**: greedy tokens from ``model.generate(prompts, cache=...)`` equal to recomputing's (no cache:
  ``use_cache=False``), position by position;
- **perplexity**: the held-out text fed one token at a time after a prefill through the cache, and its increase
  over recomputing's (one causal forward).

The sink cache keeps everything within these sizes, as in the cache lab; what it is for, going past the model's
context, is measured apart: the perplexity of a held-out window of twice the sink cache's window (the model's
context; ``--smoke``: 32) fed one token at a time through it, in transformers and on attnlab's model (no
recomputing reaches past the context).

Beside each row, the same cache class on attnlab's own copy of the model, in the same run: the two columns
measure one cache through two models' code. Where they part (other tokens, or perplexities apart by more than
``APART``) the run says so and exits 1: ``make smoke`` runs it, so a cache that stops evicting, or rounding, inside
transformers alone fails there.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import sys
import time
from pathlib import Path
from typing import Any

from _runs import exit_with, finish, render_saved

SCHEMA = "attnlab.hf_caches/1"
PARITY = 1e-4  # logits of the transformers copy against attnlab's model: the same arithmetic in another order
APART = 1e-4  # a cache's perplexity in transformers against attnlab's model's, relative: float rounding, no more
NAMES = ("plain", "int8", "int4", "sink", "h2o", "snapkv")


def neox_copy(model: Any) -> Any:
    """attnlab's text model (a rotary GPT with LayerNorm and a GELU MLP) as a transformers GPTNeoXForCausalLM."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    import attnlab.hf  # noqa: F401 - registers attn_implementation="attnlab"

    c = model.config
    d = c.emb_dim // c.n_heads
    config = GPTNeoXConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.emb_dim,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        intermediate_size=model.blocks[0].ff[0].out_features,
        hidden_act="gelu_pytorch_tanh",  # nn.GELU(approximate="tanh"), attnlab's
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_base, "partial_rotary_factor": 1.0},
        max_position_embeddings=c.context_length,
        layer_norm_eps=c.layer_norm_eps,
        use_parallel_residual=False,
        tie_word_embeddings=False,
        attention_bias=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    ours = model.state_dict()
    theirs = {
        "gpt_neox.embed_in.weight": ours["tok_emb.weight"],
        "gpt_neox.final_layer_norm.weight": ours["final_norm.weight"],
        "gpt_neox.final_layer_norm.bias": ours["final_norm.bias"],
        "lm_head.weight": ours["out_head.weight"],
    }
    for i in range(c.n_layers):
        a, b = f"trf_blocks.{i}.", f"gpt_neox.layers.{i}."
        q, k, v = ours[a + "att.qkv.weight"].view(3, c.n_heads, d, c.emb_dim)  # attnlab: all q heads, all k, all v
        theirs[b + "attention.query_key_value.weight"] = torch.stack([q, k, v], dim=1).reshape(-1, c.emb_dim)  # NeoX:
        # q, k, v of head 0, then of head 1 ... (3 * H * D, E)
        theirs[b + "attention.query_key_value.bias"] = torch.zeros(3 * c.n_heads * d)
        pairs = [
            ("input_layernorm", "norm1"),
            ("post_attention_layernorm", "norm2"),
            ("attention.dense", "att.out_proj"),
            ("mlp.dense_h_to_4h", "ff.0"),
            ("mlp.dense_4h_to_h", "ff.2"),
        ]
        for neox, ours_name in pairs:
            for part in ("weight", "bias"):
                theirs[f"{b}{neox}.{part}"] = ours[f"{a}{ours_name}.{part}"]
    copy = GPTNeoXForCausalLM(config).eval()
    missing, unexpected = copy.load_state_dict(theirs, strict=False)
    left = [m for m in missing if "rotary" not in m]
    if left or unexpected:
        raise RuntimeError(f"the GPT-NeoX copy misses {left} and has {unexpected} beyond it")
    copy.set_attn_implementation("attnlab")
    return copy


def hf_perplexity(hf: Any, cache: Any, text: Any, prompt: int) -> float:
    """exp(mean NLL) of text[:, prompt:] (B, N) through transformers with ``cache``: a prefill of ``prompt``
    tokens, then one token a step (what ``attnlab.bench.cache_metrics.perplexity`` does on attnlab's model)."""
    import torch

    from attnlab.bench.cache_metrics import _perplexity

    with torch.no_grad():
        logits = [hf(text[:, :prompt], cache=cache).logits[:, -1:]]
        for p in range(prompt, text.shape[1] - 1):
            logits.append(hf(text[:, p : p + 1], cache=cache).logits)
    return _perplexity(torch.cat(logits, dim=1), text[:, prompt:])


def run(*, smoke: bool, threads: int) -> dict[str, Any]:
    import torch

    import attnlab.hf
    from attnlab.bench.cache_metrics import _generate, perplexity, recomputed_perplexity
    from attnlab.bench.cache_table import DEFAULT_CACHES, QUICK_CACHES, load, variants
    from attnlab.cache import CACHES
    from attnlab.models.tasks import TextTask, stdlib_text

    torch.set_num_threads(threads)
    config = QUICK_CACHES if smoke else DEFAULT_CACHES
    model, prompts, held_out = load("text", config)
    hf = neox_copy(model)
    n, new = held_out.shape[1], config.new_tokens
    greedy = {"do_sample": False, "max_new_tokens": new, "min_new_tokens": new, "pad_token_id": 0}
    with torch.no_grad():
        gap = (hf(held_out).logits - model(held_out)).abs().max().item()
        reference = _generate(model, prompts, new, None)  # recomputing: the whole text again each step
        recomputed_hf = hf.generate(prompts, use_cache=False, **greedy)[:, prompts.shape[1] :]
    if gap > PARITY or not torch.equal(recomputed_hf, reference):
        raise RuntimeError(f"the transformers copy is not the model: logits {gap:.2e} apart, or other greedy tokens")
    recomputed = recomputed_perplexity(model, held_out, config.prompt_len)
    # past the window, where only a sink cache goes: twice the context (the smoke run, twice a window of 32)
    recent = 28 if smoke else model.config.context_length - 4  # 4 sinks, as StreamingLLM
    sink = functools.partial(CACHES["sink"], recent=recent)
    long_text = TextTask(stdlib_text(), seq_len=2 * (recent + 4)).batch(
        1, torch.Generator().manual_seed(1), split="eval"
    )[0]
    with torch.no_grad():
        past = {
            "tokens": int(long_text.shape[1]),
            "window": recent + 4,
            "transformers": hf_perplexity(
                hf, attnlab.hf.cache("sink", hf, recent=recent), long_text, config.prompt_len
            ),
            "attnlab": perplexity(model, sink, long_text, config.prompt_len),
        }
    rows = []
    for label, factory in variants(NAMES, config.prompt_len):
        name = label.split()[0]
        options = dict(factory.keywords) if hasattr(factory, "keywords") else {}
        start = time.perf_counter()
        with torch.no_grad():
            made = attnlab.hf.cache(name, hf, max_len=prompts.shape[1] + new, **options)
            tokens = hf.generate(prompts, cache=made, **greedy)[:, prompts.shape[1] :]
            through_hf = hf_perplexity(
                hf, attnlab.hf.cache(name, hf, max_len=n, **options), held_out, config.prompt_len
            )
            own_tokens = _generate(model, prompts, new, factory)
            own = perplexity(model, factory, held_out, config.prompt_len)
        rows.append(
            {
                "cache": label,
                "transformers": {"agreement": float((tokens == reference).float().mean()), "perplexity": through_hf},
                "attnlab": {"agreement": float((own_tokens == reference).float().mean()), "perplexity": own},
                "seconds": time.perf_counter() - start,
            }
        )
        print(f"{label}: done", file=sys.stderr, flush=True)
    return {
        "schema": SCHEMA,
        "command": " ".join(["benchmarks/hf_caches.py", *sys.argv[1:]]),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "threads": threads,
        "model": "text as GPT-NeoX",
        "logit_gap": gap,
        "prompts": int(prompts.shape[0]),
        "prompt_len": config.prompt_len,
        "new_tokens": new,
        "held_out": n - config.prompt_len,
        "held_out_rows": int(held_out.shape[0]),
        "recompute_perplexity": recomputed,
        "rows": rows,
        "past_context": past,
        "context_length": model.config.context_length,
    }


def render(result: dict[str, Any]) -> str:
    """The table, every cell from the result."""
    base = result["recompute_perplexity"]
    lines = [
        "| cache | agreement, in transformers | perplexity, in transformers | agreement, attnlab's model | perplexity, "
        "attnlab's model |",
        "|---|---|---|---|---|",
    ]
    window = result["past_context"]["window"]
    longest = result["prompt_len"] + max(result["new_tokens"], result["held_out"] // result["held_out_rows"])
    for row in result["rows"]:
        cells = []
        for side in ("transformers", "attnlab"):
            got = row[side]
            rise = got["perplexity"] / base - 1
            cells += [f"{got['agreement']:.1%}", f"{got['perplexity']:.4f} ({rise:+.2%})"]
        name = row["cache"]
        if name == "sink" and longest <= window:  # it drops nothing: the plain cache, by construction
            name += f" (its window of {window} holds every token of a row here, at most {longest}: the plain cache)"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append(
        f"\n`{result['command']}` ({result['date']}, torch {result['torch']}, {result['threads']} threads): "
        f"attnlab's text model as a transformers GPT-NeoX (logits within {result['logit_gap']:.1e} of attnlab's); "
        f"{result['prompts']} prompts of {result['prompt_len']} + {result['new_tokens']} greedy tokens against "
        f"recomputing's; perplexity over {result['held_out']} held-out tokens in {result['held_out_rows']} windows "
        f"after a prefill of {result['prompt_len']}, recomputing's {base:.4f}."
    )
    past = result["past_context"]
    lines.append(
        f"\nPast its window, where the sink cache drops tokens: a held-out window of {past['tokens']} tokens, "
        f"{past['tokens'] / past['window']:g}x the sink cache's window of "
        f"{past['window']} (4 sinks and the latest {past['window'] - 4}; the model's context is "
        f"{result['context_length']}), fed one token at a time, has perplexity {past['transformers']:.4f} in "
        f"transformers and {past['attnlab']:.4f} on attnlab's model."
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the cache lab's quick sizes: checks the run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as bench --caches)")
    parser.add_argument("--json", metavar="PATH", help="write the result here")
    parser.add_argument("--render", metavar="PATH", help="print the table of a saved result, no run")
    args = parser.parse_args()
    if args.render:
        render_saved(parser, args.render, SCHEMA, render)
        return 0
    if not 1 <= args.threads <= 256:
        parser.error(f"--threads must be in [1, 256], got {args.threads}")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        parser.error(f"cannot write --json {args.json!r}: its folder does not exist")
    result = run(smoke=args.smoke, threads=args.threads)
    return finish(args.json, result, render, parted(result), "apart")


def parted(result: dict[str, Any]) -> list[str]:
    """The rows where the cache in transformers measured otherwise than the same class on attnlab's model: other
    tokens, or a perplexity apart by more than ``APART`` (relative). One class, two models' code: they agree."""
    out = []
    past = result["past_context"]
    sink = {"agreement": 1.0, "perplexity": past["attnlab"]}
    for row in [
        *result["rows"],
        {
            "cache": "sink past the context",
            "transformers": {**sink, "perplexity": past["transformers"]},
            "attnlab": sink,
        },
    ]:
        hf, own = row["transformers"], row["attnlab"]
        off = hf["perplexity"] / own["perplexity"] - 1
        if hf["agreement"] != own["agreement"] or not abs(off) <= APART:  # NaN is apart too
            out.append(
                f"{row['cache']}: {hf['agreement']:.1%} agree and perplexity {hf['perplexity']:.6g} in transformers, "
                f"{own['agreement']:.1%} and {own['perplexity']:.6g} on attnlab's model"
            )
    return out


if __name__ == "__main__":
    exit_with(main)
