"""Tour, part 4: what came after the chapter. Each change to attention since GPT-2, on the chapter's sentence.

The chapter ends with multi-head attention and the KV cache. Every model since changed attention itself,
mostly to keep less, or to see further: GQA and MQA share keys and values, MLA caches one latent, sliding
windows keep the last tokens, learned sinks and an output gate let a head say nothing, QK-norm keeps the
scores in bounds, and linear attention and Gated DeltaNet replace the softmax with a state of fixed size.

Each step builds the variant with attnlab's own module on the chapter's six tokens (``book.embedded_inputs``,
3 dimensions each, seeded where the chapter seeds) and checks what the variant claims against a computation
written here in plain torch: the same weights by another route, the bytes its cache really holds, what it
keeps or gives up. The last step opens the zoo's shipped run (``attnlab zoo --show``), trained side by side.

Shapes: B = batch, H = heads, T = tokens, D = head size.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from attnlab import book
from attnlab.cache import ModelCache, SlidingWindowCache
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
from attnlab.nn.attention import Attention
from attnlab.nn.latent import LatentAttention
from attnlab.nn.recurrent import GatedDeltaNet, LinearAttention
from attnlab.observe import Recorder

SHIPPED_ZOO = Path(__file__).resolve().parents[2] / "data" / "zoo" / "zoo.json"  # the run `attnlab zoo --show` prints


def _weights(attn: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The module's output on x (1, T, 3) and the weights it formed, (H, T, T) of the one sentence."""
    with Recorder() as rec:
        out = attn(x)
    return out, rec.get("attn_weights")[0]


def _causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    """The chapter's recipe on (..., T, T) scores already scaled: -inf above the diagonal, softmax on each row."""
    t = scores.shape[-1]
    upper = torch.ones(t, t, dtype=torch.bool).triu(1)
    return torch.softmax(scores.masked_fill(upper, -torch.inf), dim=-1)


def _cache_bytes(cache: object) -> int:
    """What a cache module holds in its tensors (keys, values, latents, a state), its counters left out."""
    assert isinstance(cache, torch.nn.Module)
    return sum(b.numel() * b.element_size() for b in cache.buffers() if b.dim() > 1)


def what_came_after(add: Add, c: Checker) -> None:
    x = book.embedded_inputs()[None]  # (1, 6, 3): "Your journey starts with one step"
    add("after", "", "")
    _gqa(add, c, x)
    _mla(add, c, x)
    _sliding(add, c, x)
    _sinks(add, c, x)
    _qk_norm(add, c, x)
    _gate(add, c, x)
    _linear(add, c, x)
    _delta(add, c, x)
    _zoo(add, c)


def _gqa(add: Add, c: Checker, x: torch.Tensor) -> None:
    torch.manual_seed(123)
    gqa = Attention(d_in=3, d_out=8, num_heads=4, num_kv_heads=2, backend="eager")
    _, weights = _weights(gqa, x)
    queries, keys, _ = gqa.split_qkv(x)  # (1, 4, 6, 2), (1, 2, 6, 2), (1, 2, 6, 2)
    shared = keys.repeat_interleave(2, dim=1)  # (1, 4, 6, 2): heads 0, 1 read key head 0; heads 2, 3 key head 1
    by_hand = _causal_softmax(queries @ shared.transpose(-1, -2) / 2**0.5)[0]  # (4, 6, 6)
    mha = Attention(d_in=3, d_out=8, num_heads=4, backend="eager")
    held = {
        name: _cache_bytes(ModelCache.build([attn.layer_state()], rows=1, capacity=6)[0])
        for name, attn in (("mha", mha), ("gqa", gqa))
    }
    add(
        "gqa",
        "torch.manual_seed(123)\n"
        "gqa = Attention(d_in=3, d_out=8, num_heads=4, num_kv_heads=2)\n"
        "queries, keys, values = gqa.split_qkv(x)",
        f"queries.shape: {tuple(queries.shape)}\nkeys.shape:    {tuple(keys.shape)}\n"
        + c.say("cache_bytes", what="MHA", n=held["mha"])
        + "\n"
        + c.say("cache_bytes", what="GQA", n=held["gqa"])
        + "\n"
        + c.say("llama_gqa", mha=2 * 32 * 128, gqa=2 * 8 * 128),
        c.holds("gqa_by_hand", torch.allclose(weights, by_hand, atol=1e-6)),
        c.holds("gqa_half", held["gqa"] * 2 == held["mha"]),
        heat=weights,
    )


def _mla(add: Add, c: Checker, x: torch.Tensor) -> None:
    torch.manual_seed(123)
    mla = LatentAttention(
        d_in=3, num_heads=4, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2, backend="eager"
    )
    cache = ModelCache.build([mla.layer_state()], rows=1, capacity=6)[0]
    with torch.no_grad():
        expanded = mla(x)  # no cache: every head's keys and values rebuilt from the latents
        absorbed = torch.cat([mla(x[:, i : i + 1], cache=cache) for i in range(6)], dim=1)  # (1, 6, 3)
    per_token = _cache_bytes(cache) // 6 // 4  # float32 values the cache holds a token
    heads = 4 * (2 + 2 + 2)  # every head's key (2 + 2 RoPE) and value (2), as full attention would cache them
    deepseek = (512 + 64, 128 * (128 + 64 + 128))  # DeepSeek-V3's config: latent + RoPE key; 128 heads' k and v
    add(
        "mla",
        "mla = LatentAttention(d_in=3, num_heads=4, kv_lora_rank=4,\n"
        "                      qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2)\n"
        "cache = ModelCache.build([mla.layer_state()], rows=1, capacity=6)[0]  # " + c.say("cm_latent"),
        c.say("mla_values", latent=per_token, heads=heads)
        + "\n"
        + c.say("deepseek_values", latent=deepseek[0], heads=f"{deepseek[1]:,}", ratio=deepseek[1] / deepseek[0]),
        c.holds("mla_forms", torch.allclose(expanded, absorbed, atol=1e-5)),
        c.holds("mla_cache", per_token == 4 + 2, values=4 + 2),
    )


def _sliding(add: Add, c: Checker, x: torch.Tensor) -> None:
    torch.manual_seed(123)
    local = Attention(d_in=3, d_out=8, num_heads=4, window=3, backend="eager")
    out, weights = _weights(local, x)
    last_three = local(x[:, 3:])[:, -1]  # the last token, as if the sentence were only its last 3 tokens
    cache = ModelCache.build([local.layer_state()], rows=1, capacity=6)[0]
    with torch.no_grad():
        steps = torch.cat([local(x[:, i : i + 1], cache=cache) for i in range(6)], dim=1)  # (1, 6, 3)
    assert isinstance(cache, SlidingWindowCache)  # a windowed module's cache: a ring of `window` slots
    held = sorted(p for p in cache.positions().tolist() if p >= 0)
    add(
        "sliding",
        "local = Attention(d_in=3, d_out=8, num_heads=4, window=3)\n"
        "cache = ModelCache.build([local.layer_state()], rows=1, capacity=6)[0]  # " + c.say("cm_ring"),
        fmt(weights[0])
        + "\n"
        + c.say("ring_holds", held=held)
        # Gemma 3 27B: 62 layers, 5 local (window 1024) to 1 global; at 32k tokens
        + "\n"
        + c.say("gemma_local", share=(52 * 1024 + 10 * 32768) / (62 * 32768)),
        c.holds("window_rows", bool(((weights > 0).sum(-1) <= 3).all())),
        c.holds("window_last", torch.allclose(out[:, -1], last_three, atol=1e-6)),
        c.holds("window_cached", torch.allclose(steps, out, atol=1e-6) and held == [3, 4, 5]),
        heat=weights[0],  # one head: the band is the same in every head
    )


def _sinks(add: Add, c: Checker, x: torch.Tensor) -> None:
    torch.manual_seed(123)
    gpt_oss = Attention(d_in=3, d_out=8, num_heads=4, sinks=True, backend="eager")
    with torch.no_grad():
        gpt_oss.sinks.copy_(torch.tensor([0.0, 1.0, 2.0, -1.0]))  # type: ignore[union-attr]
    with Recorder() as rec:
        gpt_oss(x)
    share = rec.get("sink_weight")[0]  # (4, 6): what each row gave its sink
    weights = rec.get("attn_weights")[0]  # (4, 6, 6): what the softmax gave the keys, each row 1 - its share
    queries, keys, _ = gpt_oss.split_qkv(x)
    scores = (queries @ keys.transpose(-1, -2) / 2**0.5)[0]  # (4, 6, 6)
    upper = torch.ones(6, 6, dtype=torch.bool).triu(1)
    exp = scores.masked_fill(upper, -torch.inf).exp()  # (4, 6, 6)
    assert gpt_oss.sinks is not None
    sink = gpt_oss.sinks.detach().exp()[:, None]  # (4, 1): exp(sink logit) in every row's sum
    by_hand = exp / (exp.sum(-1) + sink)[..., None]
    add(
        "sinks",
        "gpt_oss = Attention(d_in=3, d_out=8, num_heads=4, sinks=True)\n"
        "gpt_oss.sinks  # " + c.say("cm_sinks") + "\n"
        "attn_weights.sum(-1) == 1 - sink_weight  # " + c.say("cm_sink_weight"),
        c.say("sink_share", shares=", ".join(f"{float(s):.4f}" for s in share[:, 0])) + "\n" + fmt(share),
        c.holds("sinks_by_hand", torch.allclose(weights, by_hand, atol=1e-6)),
        c.holds("sinks_less", bool(((share > 0) & (share < 1)).all())),
        heat=weights,
    )


def _qk_norm(add: Add, c: Checker, x: torch.Tensor) -> None:
    torch.manual_seed(123)
    normed = Attention(d_in=3, d_out=8, num_heads=4, qk_norm=True, backend="eager")
    torch.manual_seed(123)
    plain = Attention(d_in=3, d_out=8, num_heads=4, backend="eager")
    loud = x * 100  # inputs 100 times larger: the scores of plain attention grow 10,000 times
    peaks = {
        name: (float(_weights(attn, x)[1].amax(-1).mean()), float(_weights(attn, loud)[1].amax(-1).mean()))
        for name, attn in (("plain", plain), ("qk-norm", normed))
    }
    _, quiet_w = _weights(normed, x)
    _, loud_w = _weights(normed, loud)
    add(
        "qk_norm",
        "torch.manual_seed(123)\nnormed = Attention(d_in=3, d_out=8, num_heads=4, qk_norm=True)\n"
        "normed(x * 100)  # " + c.say("cm_loud"),
        "\n".join(c.say("peak", name=name, quiet=quiet, loud=loud) for name, (quiet, loud) in peaks.items()),
        c.holds("qk_norm_same", torch.allclose(quiet_w, loud_w, atol=1e-4)),
        c.holds("plain_peaks", peaks["plain"][1] > 0.95 > peaks["plain"][0]),
        heat=loud_w[0],  # head 0 with 100x inputs: as with the chapter's inputs
    )


def _gate(add: Add, c: Checker, x: torch.Tensor) -> None:
    torch.manual_seed(123)
    gated = Attention(d_in=3, d_out=8, num_heads=4, output_gate=True, backend="eager")
    queries, keys, values = gated.split_qkv(x)
    context = _causal_softmax(queries @ keys.transpose(-1, -2) / 2**0.5) @ values  # (1, 4, 6, 2)
    context = context.transpose(1, 2).reshape(1, 6, 8)  # (1, T, H * D)
    assert gated.gate is not None
    by_hand = gated.out_proj(torch.sigmoid(gated.gate(x)) * context)
    with torch.no_grad():
        out = gated(x)
        gated.gate.weight.fill_(-50.0)  # every gate shut: sigmoid(-50 * (x1 + x2 + x3)) is about 0
        shut = gated(x)
    add(
        "gate",
        "gated = Attention(d_in=3, d_out=8, num_heads=4, output_gate=True)\n"
        "out = out_proj(sigmoid(gate(x)) * context_vec)  # " + c.say("cm_gate"),
        c.say("gate_shut", bias=fmt(gated.out_proj.bias.detach()), out=fmt(shut[0, -1])),
        c.holds("gate_by_hand", torch.allclose(out, by_hand, atol=1e-6)),
        c.holds("gate_silent", torch.allclose(shut, gated.out_proj.bias.expand_as(shut), atol=1e-6)),
    )


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
