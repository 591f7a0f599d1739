"""Tour, part 4, today's ways to keep less: layers that share one layer's keys (Gemma 4's KV sharing), a delta
rule that forgets each key channel at its own rate (Kimi Delta Attention), and layers that do not attend at all
but mix each token with its last few (LFM's gated short convolution), each checked on the chapter's six tokens as
``after.py`` checks the softmax variants.

Shapes: B = batch, H = heads, T = tokens, D = head size, C = channels, K = kernel size.
"""

from __future__ import annotations

import torch

from attnlab.cache import ModelCache
from attnlab.cache.state import ConvolutionCache
from attnlab.explain.tour.after_state import _cache_bytes
from attnlab.explain.tour.core import Add, Checker, fmt
from attnlab.functional.convolution import short_convolution_reference
from attnlab.functional.kda import kimi_delta_rule
from attnlab.functional.recurrent import gated_delta_rule
from attnlab.nn.attention import Attention, SharedKV
from attnlab.nn.convolution import GatedShortConvolution
from attnlab.nn.kda import KimiDeltaAttention
from attnlab.observe import Recorder


def _kv_share(add: Add, c: Checker, x: torch.Tensor) -> None:
    torch.manual_seed(123)
    first = Attention(d_in=3, d_out=8, num_heads=4, num_kv_heads=2, backend="eager").double()
    later = Attention(d_in=3, d_out=8, num_heads=4, num_kv_heads=2, kv_source=0, backend="eager").double()
    x = x.double()
    shared: dict[int | None, SharedKV] = {}
    with torch.no_grad(), Recorder() as rec:
        first(x, shared=shared)
        out = later(x, shared=shared)
    weights = rec.get("attn_weights")[0]  # (4, 6, 6): the later layer's, the last recorded
    with torch.no_grad():  # by hand: the later layer's queries against the first layer's keys and values
        queries = later.split_qkv(x)[0]  # (1, 4, 6, 2)
        _, keys, values = first.split_qkv(x)  # (1, 2, 6, 2) each
        keys, values = keys.repeat_interleave(2, dim=1), values.repeat_interleave(2, dim=1)  # each for 2 heads
        t = x.shape[1]
        scores = (queries @ keys.transpose(-1, -2) / 2**0.5).masked_fill(
            torch.ones(t, t, dtype=torch.bool).triu(1), -torch.inf
        )
        by_hand = later.merge_heads(torch.softmax(scores, dim=-1) @ values)  # (1, 6, 3)
    cache = ModelCache.build([first.layer_state(), later.layer_state()], rows=1, capacity=6)
    alone = ModelCache.build([first.layer_state()], rows=1, capacity=6)
    rows = [a.qkv.weight.shape[0] for a in (first, later)]
    add(
        "kv_share",
        "first = Attention(d_in=3, d_out=8, num_heads=4, num_kv_heads=2)\n"
        "later = Attention(d_in=3, d_out=8, num_heads=4, num_kv_heads=2, kv_source=0)  # "
        + c.say("cm_share")
        + "\nshared = {}\nfirst(x, shared=shared); later(x, shared=shared)",
        c.say("share_rows", first=rows[0], later=rows[1], bytes=_cache_bytes(cache[0]), none=_cache_bytes(cache[1]))
        + "\n"
        + fmt(weights[0].float()),
        c.holds("share_by_hand", torch.allclose(out, by_hand, atol=1e-10)),
        c.holds(
            "share_cache",
            _cache_bytes(cache[1]) == 0 and sum(map(_cache_bytes, cache)) == sum(map(_cache_bytes, alone)) > 0,
        ),
        c.holds("share_rows_fewer", rows == [8 + 2 * 4, 8]),
        heat=weights.float(),
    )


def _short_conv(add: Add, c: Checker, x: torch.Tensor) -> None:
    torch.manual_seed(123)
    conv = GatedShortConvolution(d_in=3, kernel=3).double()
    x = x.double()
    with torch.no_grad(), Recorder() as rec:
        out = conv(x)
    weights = rec.get("attn_weights")[0, 0]  # (6, 6): the mean over the 3 channels
    with torch.no_grad():
        b_gate, c_gate, values = conv.gates(x, None)
        h = b_gate * values  # (1, 6, 3)
        taps = conv.conv.weight[:, 0]  # (3, 3)
        by_hand = torch.zeros_like(h)
        for t in range(6):  # y_t = C_t * sum_j w_j * h_{t - 2 + j}, the inputs before token 0 zeros
            for j in range(3):
                if t - 2 + j >= 0:
                    by_hand[:, t] += taps[:, j] * h[:, t - 2 + j]
        by_hand = conv.out_proj(c_gate * by_hand)
        reference, _ = short_convolution_reference(h, taps)
        cache = ModelCache.build([conv.layer_state()], rows=1, capacity=100_000)[0]
        steps = torch.cat([conv(x[:, i : i + 1], cache=cache) for i in range(6)], dim=1)
    assert isinstance(cache, ConvolutionCache)  # what a convolution layer's state is planned as
    held = cache.conv  # (1, 3, 2): its last inputs
    reach = torch.ones(6, 6, dtype=torch.bool).tril().triu(-2)
    add(
        "short_conv",
        "conv = GatedShortConvolution(d_in=3, kernel=3)\n"
        "B, C, x = in_proj(x).chunk(3)        # " + c.say("cm_gates") + "\n"
        "y_t = C_t * sum_j w_j * (B * x)_{t - 2 + j}\nout = out_proj(y)",
        c.say("conv_state", shape=tuple(held.shape), n=conv.state_values) + "\n" + fmt(weights.float()),
        c.holds(
            "conv_by_hand",
            torch.allclose(out, conv.out_proj(c_gate * reference), atol=1e-10)
            and torch.allclose(out, by_hand, atol=1e-10),
        ),
        c.holds("conv_reach", bool((weights[~reach] == 0).all()) and bool((weights[reach] != 0).all())),
        c.holds(
            "conv_state_held",
            torch.allclose(steps, out, atol=1e-10) and torch.allclose(held[0], h[0, -2:].T, atol=1e-12),
        ),
        heat=weights.float(),
    )


def _kda(add: Add, c: Checker, x: torch.Tensor) -> None:
    f64 = torch.float64
    key = torch.tensor([0.6, 0.8], dtype=f64)  # one key, written once with value [1, 2], then 5 tokens of nothing
    k = torch.zeros(1, 1, 6, 2, dtype=f64)
    k[0, 0, 0] = key
    v = torch.zeros(1, 1, 6, 2, dtype=f64)
    v[0, 0, 0] = torch.tensor([1.0, 2.0], dtype=f64)
    beta = torch.zeros(1, 1, 6, dtype=f64)
    beta[0, 0, 0] = 1.0
    g = torch.tensor([-1.0, 0.0], dtype=f64).expand(1, 1, 6, 2)  # channel 0 forgets e^-1 a token, channel 1 nothing
    _, state = kimi_delta_rule(k, k, v, g, beta, form="recurrent")  # (1, 1, 2, 2)
    fast, kept = state[0, 0, 0], state[0, 0, 1]  # what each key channel still holds of [1, 2]
    same = torch.full((1, 1, 6, 2), -0.3, dtype=f64)  # one decay for both channels: Gated DeltaNet's scalar gate
    unit = torch.nn.functional.normalize(
        torch.randn(1, 1, 6, 2, generator=torch.Generator().manual_seed(1), dtype=f64), dim=-1
    )
    per_channel, _ = kimi_delta_rule(unit, unit, unit, same, torch.full((1, 1, 6), 0.5, dtype=f64), form="recurrent")
    scalar, _ = gated_delta_rule(
        unit, unit, unit, same[..., 0], torch.full((1, 1, 6), 0.5, dtype=f64), form="recurrent"
    )
    torch.manual_seed(123)
    layer = KimiDeltaAttention(d_in=3, num_heads=1, head_dim=3, chunk_size=4, conv_kernel=None).double()
    with Recorder() as rec, torch.no_grad():
        chunked = layer(x.double())
    layer.form = "recurrent"
    with torch.no_grad():
        recurrent = layer(x.double())
    weights = rec.get("attn_weights")[0]  # (1, 6, 6): the implicit weights, some negative
    add(
        "kda",
        "S = diag(exp(g_t)) @ S                        # " + c.say("cm_channel_decay") + "\n"
        "S = S + beta_t * outer(k_t, v_t - S.T @ k_t)  # " + c.say("cm_delta") + "\n"
        "out_t = S.T @ q_t",
        c.say("kda_kept", fast=[round(float(t), 4) for t in fast], kept=[round(float(t), 4) for t in kept])
        + "\n"
        + fmt(weights[0].float()),
        c.holds(
            "kda_channels",
            torch.allclose(fast, 0.6 * torch.tensor([1.0, 2.0], dtype=f64) * torch.exp(torch.tensor(-5.0, dtype=f64)))
            and torch.allclose(kept, 0.8 * torch.tensor([1.0, 2.0], dtype=f64), atol=1e-12),
        ),
        c.holds("kda_scalar", torch.allclose(per_channel, scalar, atol=1e-12)),
        c.holds("kda_forms", torch.allclose(chunked, recurrent, atol=1e-10)),
        heat=weights.abs().float(),
    )
