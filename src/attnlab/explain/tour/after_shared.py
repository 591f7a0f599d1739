"""Tour, part 4, two of today's ways to keep less: layers that share one layer's keys (Gemma 4's KV sharing), and
layers that do not attend at all but mix each token with its last few (LFM's gated short convolution), each
checked on the chapter's six tokens as ``after.py`` checks the softmax variants.

Shapes: B = batch, H = heads, T = tokens, D = head size, C = channels, K = kernel size.
"""

from __future__ import annotations

import torch

from attnlab.cache import ModelCache
from attnlab.cache.state import ConvolutionCache
from attnlab.explain.tour.after_state import _cache_bytes
from attnlab.explain.tour.core import Add, Checker, fmt
from attnlab.functional.convolution import short_convolution_reference
from attnlab.nn.attention import Attention, SharedKV
from attnlab.nn.convolution import GatedShortConvolution
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
