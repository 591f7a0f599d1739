"""Tour, part 4 ends: attention that keeps a state of fixed size instead of every key (linear attention, Gated
DeltaNet), each checked as ``after.py`` checks the softmax variants, and the zoo's shipped run (``attnlab zoo
--show``), every variant trained side by side.

Shapes: B = batch, H = heads, T = tokens, D = head size.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from attnlab.cache import ModelCache
from attnlab.explain.tour.core import Add, Checker, fmt
from attnlab.functional.recurrent import (
    feature_map,
    gated_delta_rule,
    gated_delta_weights,
    linear_attention,
    linear_attention_weights,
)
from attnlab.models.gpt import count_parameters
from attnlab.models.zoo import VARIANTS, zoo_config
from attnlab.nn.recurrent import GatedDeltaNet, LinearAttention
from attnlab.observe import Recorder

SHIPPED_ZOO = Path(__file__).resolve().parents[2] / "data" / "zoo" / "zoo.json"  # the run `attnlab zoo --show` prints


def _cache_bytes(cache: object) -> int:
    """What a cache module holds in its tensors (keys, values, latents, a state), its counters left out."""
    assert isinstance(cache, torch.nn.Module)
    return sum(b.numel() * b.element_size() for b in cache.buffers() if b.dim() > 1)


def _linear(add: Add, c: Checker, x: torch.Tensor) -> None:
    torch.manual_seed(123)
    linear = LinearAttention(d_in=3, num_heads=2, head_dim=2).double()
    queries, keys, values = (feature_map(t) if i < 2 else t for i, t in enumerate(linear.split_qkv(x.double())))
    outs = {
        form: linear_attention(queries, keys, values, form=form, chunk_size=4)
        for form in ("recurrent", "parallel", "chunked")
    }
    weights = linear_attention_weights(queries, keys)[0]  # (2, 6, 6)
    state, normalizer = outs["recurrent"][1]  # (1, 2, 2, 2), (1, 2, 2)
    with Recorder() as rec, torch.no_grad():
        out = linear(x.double())  # the module itself: its weights recorded, its output through out_proj
    by_hand = linear.merge_heads(outs["recurrent"][0])  # (1, 6, 3)
    longer = ModelCache.build([linear.layer_state()], rows=1, capacity=100_000)[0]
    add(
        "linear",
        "linear = LinearAttention(d_in=3, num_heads=2, head_dim=2)\n"
        "phi = lambda t: F.elu(t) + 1  # " + c.say("cm_phi") + "\n"
        "S = S + outer(phi(k_t), v_t); z = z + phi(k_t)\n"
        "out_t = S.T @ phi(q_t) / (z @ phi(q_t))",
        c.say("state_shape", s=tuple(state.shape), z=tuple(normalizer.shape), n=linear.state_values)
        + "\n"
        + fmt(weights[0].float()),
        c.holds(
            "linear_forms",
            all(torch.allclose(outs[f][0], outs["recurrent"][0], atol=1e-10) for f in ("parallel", "chunked"))
            and torch.allclose(out, by_hand, atol=1e-10),
        ),
        c.holds(
            "linear_weights",
            torch.allclose(weights @ values[0], outs["recurrent"][0][0], atol=1e-10)
            and torch.allclose(rec.get("attn_weights")[0], weights, atol=1e-10)
            and torch.allclose(weights.sum(-1), torch.ones(2, 6, dtype=torch.float64)),
        ),
        c.holds(
            "state_fixed",
            _cache_bytes(longer) == _cache_bytes(ModelCache.build([linear.layer_state()], rows=1, capacity=6)[0]),
        ),
        heat=weights.float(),
    )


def _delta(add: Add, c: Checker, x: torch.Tensor) -> None:
    key = torch.tensor([1.0, 0.0], dtype=torch.float64)  # one key, written twice, then read
    k = key.expand(1, 1, 2, 2)  # (B, H, T, D): the same unit key at both tokens
    v = torch.tensor([[[[1.0, 2.0], [5.0, -1.0]]]], dtype=torch.float64)  # (1, 1, 2, 2): two values for it
    no_decay, write_all = torch.zeros(1, 1, 2, dtype=torch.float64), torch.ones(1, 1, 2, dtype=torch.float64)
    _, delta_state = gated_delta_rule(k, k, v, no_decay, write_all, form="recurrent")  # (1, 1, 2, 2)
    _, (added, _) = linear_attention(k, k, v, form="recurrent")
    read_delta, read_added = key @ delta_state[0, 0], key @ added[0, 0]  # what the key reads back, (2,)
    torch.manual_seed(123)
    layer = GatedDeltaNet(d_in=3, num_heads=2, head_dim=2, chunk_size=4).double()
    with Recorder() as rec, torch.no_grad():
        chunked = layer(x.double())
    layer.form = "recurrent"
    with torch.no_grad():
        recurrent = layer(x.double())
    weights = rec.get("attn_weights")[0]  # (2, 6, 6): implicit, and some negative
    # a weight the delta rule makes negative where q . k is not: k0 = [1, 0], then k1 = [0.6, 0.8], read by q
    k2 = torch.tensor([[1.0, 0.0], [0.6, 0.8]], dtype=torch.float64)[None, None]  # (1, 1, 2, 2)
    q2 = torch.tensor([[1.0, 0.0], [0.28, 0.96]], dtype=torch.float64)[None, None]
    taken = gated_delta_weights(
        q2, k2, torch.zeros(1, 1, 2, dtype=torch.float64), torch.ones(1, 1, 2, dtype=torch.float64)
    )
    taken_back = 0.28 - 0.6 * (0.6 * 0.28 + 0.8 * 0.96)  # q.k0 - (k1.k0)(k1.q): v0 written, then partly replaced
    add(
        "deltanet",
        "S = exp(g_t) * S                          # " + c.say("cm_decay") + "\n"
        "S = S + beta_t * outer(k_t, v_t - S.T @ k_t)  # " + c.say("cm_delta") + "\n"
        "out_t = S.T @ q_t",
        c.say("delta_read", delta=read_delta.tolist(), linear=read_added.tolist())
        + "\n"
        + c.say("delta_taken", w=float(taken[0, 0, 1, 0]))
        + "\n"
        + fmt(weights[0].float()),
        c.holds("delta_replaces", torch.equal(read_delta, v[0, 0, 1]) and torch.equal(read_added, v[0, 0].sum(0))),
        c.holds("delta_forms", torch.allclose(chunked, recurrent, atol=1e-10)),
        c.holds(
            "delta_negative",
            bool((q2 @ k2.transpose(-1, -2) >= 0).all())
            and abs(float(taken[0, 0, 1, 0]) - taken_back) < 1e-12 < -taken_back,
        ),
        heat=weights.float(),
    )


HELD_AFTER = 1024 + 32  # the tokens the zoo's cache is measured after (bench.zoo_result's PROMPT + DECODE)


def _zoo(add: Add, c: Checker) -> None:
    run = json.loads(SHIPPED_ZOO.read_text(encoding="utf-8"))
    variants = {v["name"]: v for v in run["variants"]}
    lines = []
    for name, v in variants.items():
        losses = [curve["loss"][-1] for curve in v["curves"]]
        at_32k = v["cache_at"]["32768"] / 2**20  # MiB, batch 1, float32
        lines.append(f"{name:<13} {sum(losses) / len(losses):.3f}   {v['kv_bytes_per_token']:>5,}   {at_32k:>7.2f} MiB")

    def measured(name: str) -> float:
        """Bytes a token the run's caches held after HELD_AFTER tokens: less a length counter a layer (int64) and
        the recurrent layers' state, which does not grow."""
        v = variants[name]
        return (v["cache_bytes_held"] - 8 * len(v["layer_types"]) - v["state_bytes"]) / HELD_AFTER

    mla, hybrid = zoo_config("mla"), zoo_config("hybrid")
    rank, rope = mla.kv_lora_rank or 0, mla.qk_rope_head_dim
    mla_bytes = 4 * mla.n_layers * (rank + rope)  # float32: the latent and its RoPE key, every layer
    types = [hybrid.layer_type(i) for i in range(hybrid.n_layers)]
    kv = hybrid.emb_dim  # keys or values a token: every head's, n_heads x head_dim
    hybrid_bytes = 4 * types.count("full") * 2 * kv
    head_dim = hybrid.emb_dim // hybrid.n_heads
    state = 4 * types.count("delta") * hybrid.n_heads * head_dim * head_dim  # per head a (D, D) matrix
    runs = {tuple((cv["seed"], cv["steps"][-1]) for cv in v["curves"]) for v in variants.values()}  # seeds, steps
    budget = count_parameters(zoo_config("mha"))  # mha's parameters: every variant's, within 5%
    add(
        "zoo_run",
        "attnlab zoo --show          # " + c.say("cm_show") + '\nattnlab explain --model zoo:deltanet "..."',
        c.say(
            "zoo_header",
            steps=run["steps"],
            seeds=len(run["seeds"]),
            minutes=run["seconds"] / 60,
            threads=run["threads"],
        )
        + "\n"
        + c.say("zoo_columns")
        + "\n"
        + "\n".join(lines),
        c.holds("zoo_all", list(variants) == list(VARIANTS) and len(runs) == 1),
        c.holds(
            "zoo_mla",
            variants["mla"]["kv_bytes_per_token"] == mla_bytes == measured("mla"),
            layers=mla.n_layers,
            rank=rank,
            rope=rope,
            n=mla_bytes,
            tokens=f"{HELD_AFTER:,}",
        ),
        c.holds(
            "zoo_hybrid",
            variants["hybrid"]["kv_bytes_per_token"] == hybrid_bytes == measured("hybrid")
            and variants["hybrid"]["state_bytes"] == state,
            full=types.count("full"),
            kv=kv,
            n=hybrid_bytes,
            state=f"{state:,}",
        ),
        c.holds("zoo_budget", all(abs(v["parameters"] - budget) <= 0.05 * budget for v in variants.values())),
    )
