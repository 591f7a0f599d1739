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

import torch

from attnlab import book
from attnlab.cache import ModelCache, SlidingWindowCache
from attnlab.explain.tour.after_shared import _kda, _kv_share, _short_conv
from attnlab.explain.tour.after_state import _cache_bytes, _delta, _linear, _zoo
from attnlab.explain.tour.core import Add, Checker, fmt
from attnlab.explain.tour.going_back import going_back
from attnlab.explain.tour.sink_step import attention_sink
from attnlab.nn.attention import Attention
from attnlab.nn.latent import LatentAttention
from attnlab.observe import Recorder


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


def what_came_after(add: Add, c: Checker) -> None:
    x = book.embedded_inputs()[None]  # (1, 6, 3): "Your journey starts with one step"
    add("after", "", "")
    _gqa(add, c, x)
    _mla(add, c, x)
    _sliding(add, c, x)
    attention_sink(add, c, x)  # why softmax needs somewhere to put its weight: the first token
    _sinks(add, c, x)
    _qk_norm(add, c, x)
    _gate(add, c, x)
    _linear(add, c, x)
    _delta(add, c, x)
    _kda(add, c, x)
    _kv_share(add, c, x)
    _short_conv(add, c, x)
    going_back(add, c, x)  # speculation: a ring and a recurrent state take back a refused guess
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
