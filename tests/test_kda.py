"""Kimi Delta Attention (issue 56): the delta rule with a forget gate per channel (attnlab.functional.kda) and its
layer (attnlab.nn.kda); and Kimi Linear's other new part, latent attention without RoPE (attnlab.nn.latent).

The recurrent (readable) and chunked (fast) forms give the same numbers in float64, across calls that carry the
state; both equal transformers' own plain-PyTorch KDA functions on random inputs; with one decay a head it is the
gated delta rule; the per-channel decay does what it claims (a channel with no decay keeps what it was written,
the others forget). The layer's cached decode equals its uncached forward, its state is planned as a recurrent
layer's with the convolution's buffer, and bad input is refused by name.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.cache import ModelCache
from attnlab.cache.state import StateCache
from attnlab.functional.kda import kimi_delta_rule, kimi_delta_weights
from attnlab.functional.recurrent import gated_delta_rule
from attnlab.nn.kda import KimiDeltaAttention

B, H, T, DK, DV = 2, 3, 37, 8, 5  # T is not a multiple of the chunk: the last chunk is short


def inputs(seed: int = 0, t: int = T, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, ...]:
    """q, k (unit length, q scaled), v, a log decay per channel in [-1, 0] and beta in [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    q, k = (F.normalize(torch.randn(B, H, t, DK, generator=g, dtype=dtype), dim=-1) for _ in range(2))
    v = torch.randn(B, H, t, DV, generator=g, dtype=dtype)
    decay = -torch.rand(B, H, t, DK, generator=g, dtype=dtype)
    return q / math.sqrt(DK), k, v, decay, torch.rand(B, H, t, generator=g, dtype=dtype)


@pytest.mark.parametrize("chunk", [5, 64])  # 37 tokens: a short last chunk; one chunk of all
def test_the_chunked_form_equals_the_recurrence(chunk: int) -> None:
    args = inputs()
    slow, slow_state = kimi_delta_rule(*args, form="recurrent")
    fast, fast_state = kimi_delta_rule(*args, form="chunked", chunk_size=chunk)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-12)
    torch.testing.assert_close(fast_state, slow_state, rtol=0, atol=1e-12)
    torch.testing.assert_close(kimi_delta_weights(*args[:2], *args[3:]) @ args[2], slow, rtol=0, atol=1e-12)


@pytest.mark.parametrize("split", [1, 8, 20])
def test_a_state_carried_across_calls_equals_one_call(split: int) -> None:
    args = inputs(1)
    whole, end = kimi_delta_rule(*args, form="recurrent")
    first, state = kimi_delta_rule(*(a[:, :, :split] for a in args), form="chunked", chunk_size=8)
    rest, end_2 = kimi_delta_rule(*(a[:, :, split:] for a in args), state=state, form="chunked", chunk_size=16)
    torch.testing.assert_close(torch.cat([first, rest], 2), whole, rtol=0, atol=1e-12)
    torch.testing.assert_close(end_2, end, rtol=0, atol=1e-12)
    steps, state = [], None  # and one token a call, as decoding runs it
    for t in range(T):
        out, state = kimi_delta_rule(*(a[:, :, t : t + 1] for a in args), state=state, form="recurrent")
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 2), whole, rtol=0, atol=1e-12)


def test_one_decay_a_head_is_the_gated_delta_rule() -> None:
    """Every channel's g equal: the gated delta rule of attnlab.functional.recurrent, to the last digit."""
    q, k, v, decay, beta = inputs(2)
    scalar = decay[..., 0]  # (B, H, T)
    ours, state = kimi_delta_rule(q, k, v, scalar[..., None].expand_as(decay), beta)
    theirs, their_state = gated_delta_rule(q, k, v, scalar, beta, form="recurrent")
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    torch.testing.assert_close(state, their_state, rtol=0, atol=1e-12)
    moved, _ = kimi_delta_rule(q, k, v, decay, beta)  # the channels' own decays: not the same numbers
    assert float((moved - theirs).abs().max()) > 1e-2


def test_a_channel_without_decay_keeps_what_the_others_forget() -> None:
    """One token writes v along k = e_0 + e_1; then 30 tokens write nothing (beta 0) while channel 0 decays by
    exp(-1) a token and channel 1 not at all. A query along e_1 reads v back whole; along e_0 it reads v e^-30."""
    k = torch.zeros(1, 1, 31, 2, dtype=torch.float64)
    k[..., 0, :] = 1 / math.sqrt(2)
    v = torch.zeros(1, 1, 31, 1, dtype=torch.float64)
    v[..., 0, 0] = 3.0
    beta = torch.zeros(1, 1, 31, dtype=torch.float64)
    beta[..., 0] = 1.0
    decay = torch.zeros(1, 1, 31, 2, dtype=torch.float64)
    decay[..., 1:, 0] = -1.0
    _, state = kimi_delta_rule(k, k, v, decay, beta, chunk_size=8)
    kept, forgot = state[0, 0, 1, 0], state[0, 0, 0, 0]  # rows: the channels; 3 / sqrt(2) written in each
    torch.testing.assert_close(kept, torch.tensor(3 / math.sqrt(2), dtype=torch.float64))
    torch.testing.assert_close(forgot, kept * math.exp(-30))


@pytest.mark.slow  # imports transformers' KDA module
def test_both_forms_equal_transformers_kda_functions() -> None:
    """transformers' chunk_kimi_delta_attention and recurrent_kimi_delta_attention (its plain-PyTorch references,
    (B, T, H, D) and the l2norm and scale done inside) on the same random inputs, 80 tokens past its 64-token
    chunk, from a random state: within 1e-5 in float32."""
    from transformers.models.kimi_linear.modeling_kimi_linear import (
        chunk_kimi_delta_attention,
        recurrent_kimi_delta_attention,
    )

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, 80, H, DK, generator=g) for _ in range(3))
    decay = -torch.rand(B, 80, H, DK, generator=g) * 2
    beta = torch.rand(B, 80, H, generator=g)
    start = torch.randn(B, H, DK, DK, generator=g)
    theirs = chunk_kimi_delta_attention(
        q, k, v, decay, beta, initial_state=start, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    their_steps = recurrent_kimi_delta_attention(q, k, v, decay, beta, start, True, use_qk_l2norm_in_kernel=True)
    heads = lambda x: x.transpose(1, 2)  # (B, T, H, ...) -> (B, H, T, ...)
    unit = lambda x: x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)  # FLA's l2norm, as transformers has it
    ours_args = (heads(unit(q)) / math.sqrt(DK), heads(unit(k)), heads(v), heads(decay), heads(beta))
    for form, (out, state) in (("chunked", theirs), ("recurrent", their_steps)):
        ours, our_state = kimi_delta_rule(*ours_args, state=start, form=form)
        torch.testing.assert_close(heads(ours), out, rtol=0, atol=1e-5)
        torch.testing.assert_close(our_state, state, rtol=0, atol=1e-5)


def test_bad_gates_and_shapes_are_refused_by_name() -> None:
    q, k, v, decay, beta = inputs(4, t=5)
    with pytest.raises(ValueError, match=r"g must be \(batch, heads, tokens, Dk\): a log decay per channel"):
        kimi_delta_rule(q, k, v, decay[..., 0], beta)
    with pytest.raises(ValueError, match=r"beta must be \(batch, heads, tokens\)"):
        kimi_delta_rule(q, k, v, decay, beta[..., None])
    with pytest.raises(ValueError, match=r"g must be a log decay <= 0; got 0\.5 at \(batch, head, token, channel\)"):
        kimi_delta_rule(q, k, v, decay.index_fill(-1, torch.tensor([2]), 0.5), beta)
    with pytest.raises(ValueError, match=r"beta must be a share in \[0, 1\]"):
        kimi_delta_rule(q, k, v, decay, beta + 1.5)
    reset = decay.clone()
    reset[0, 0, 2, 1] = float("-inf")
    with pytest.raises(ValueError, match="pass form='recurrent'"):
        kimi_delta_rule(q, k, v, reset, beta)
    out, _ = kimi_delta_rule(q, k, v, reset, beta, form="recurrent")  # a full reset of one channel: exact there
    assert bool(out.isfinite().all())
    with pytest.raises(ValueError, match=r"form must be one of \['recurrent', 'chunked'\]"):
        kimi_delta_rule(q, k, v, decay, beta, form="parallel")


def kda_layer(seed: int = 0, **options: object) -> KimiDeltaAttention:
    """A KDA layer whose decays matter: A_log and dt_bias drawn so the channels decay from ~0.9 to ~0.2 a token."""
    torch.manual_seed(seed)
    layer = KimiDeltaAttention(d_in=16, num_heads=2, head_dim=4, chunk_size=4, **options).eval()  # type: ignore[arg-type]
    with torch.no_grad():
        layer.A_log.uniform_(-1.0, 0.5)
        layer.dt_bias.normal_(0.0, 1.0)
    return layer


def test_the_layer_decodes_as_it_reads_whole_and_plans_its_state() -> None:
    """Past a chunk (4 here) and one token a call through its StateCache (the state and the convolution's last
    inputs) equals the whole text at once; the plan gives it a recurrent state with the convolution's buffer."""
    layer = kda_layer()
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(1))
    state = layer.layer_state()
    assert (state.kind, state.kv_heads, state.head_dim, state.value_dim, state.conv) == ("recurrent", 2, 4, 4, (24, 3))
    with torch.no_grad():
        whole = layer(x)
        cache = ModelCache.build([state], rows=2, capacity=16)[0]
        assert isinstance(cache, StateCache)
        steps = [layer(x[:, :6], cache=cache)] + [layer(x[:, t : t + 1], cache=cache) for t in range(6, 11)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-5, rtol=1e-5)
    assert cache.nbytes() == 4 * 2 * (2 * 4 * 4 + 24 * 3)  # float32, batch 2: states and the convolution's inputs


@torch.no_grad()
def test_the_layers_gate_is_per_channel_and_its_parts_act() -> None:
    """g has a value per channel that differs inside a head; each part moves the output: the per-channel decay
    made one a head (its channels' mean), beta fixed at 1/2, the convolution taken out."""
    layer = kda_layer()
    x = torch.randn(1, 9, 16, generator=torch.Generator().manual_seed(2))
    g, beta = layer.gates(x)
    assert g.shape == (1, 2, 9, 4) and beta.shape == (1, 2, 9)
    assert float((g - g.mean(-1, keepdim=True)).abs().max()) > 1e-2  # channels of one head decay differently
    base = layer(x)
    flat = kda_layer()
    heads = flat.dt_bias.view(2, 4)  # (H, D): one bias a head, the same f_b rows for a head's channels
    heads.copy_(heads.mean(-1, keepdim=True))
    rows = flat.f_b_proj.weight.view(2, 4, 4)  # (H, D, D)
    rows.copy_(rows.mean(1, keepdim=True))
    g_flat, _ = flat.gates(x)
    torch.testing.assert_close(g_flat, g_flat[..., :1].expand_as(g_flat))
    assert float((flat(x) - base).abs().max()) > 1e-3
    fixed = kda_layer()
    fixed.b_proj.weight.zero_()
    assert float((fixed(x) - base).abs().max()) > 1e-3
    bare = kda_layer(conv_kernel=None)
    bare.load_state_dict({k: v for k, v in layer.state_dict().items() if k != "conv.weight"})
    assert float((bare(x) - base).abs().max()) > 1e-3


def test_the_layer_refuses_what_it_cannot_run() -> None:
    layer = kda_layer()
    with pytest.raises(ValueError, match=r"form must be one of \['recurrent', 'chunked'\] for KimiDeltaAttention"):
        KimiDeltaAttention(d_in=16, num_heads=2, form="parallel")
    with pytest.raises(ValueError, match=r"expected input \(batch, tokens, d_in=16\), got \(1, 3, 8\)"):
        layer(torch.zeros(1, 3, 8))
    without = ModelCache.build([kda_layer(conv_kernel=None).layer_state()], rows=1, capacity=4)[0]
    with torch.no_grad(), pytest.raises(ValueError, match=r"holds no convolution state; got \(1, 24, 3\)"):
        layer(torch.zeros(1, 1, 16), cache=without)


def test_the_kv_bytes_meter_counts_a_kda_layer_as_the_cache_holds_it() -> None:
    """A Kimi-like model (KDA, latent attention without RoPE, KDA): the meter's state for its KDA layers is the bytes
    their StateCaches hold (a (D, D) state a head and the convolution's last 3 inputs of q, k and v), the same
    after 1 token as after 10,000; its latent layer grows by its latent and RoPE key a token."""
    from attnlab.bench.kv_bytes import layer_kinds
    from attnlab.models import GPT, GPTConfig

    config = GPTConfig(
        vocab_size=64, emb_dim=32, n_heads=4, n_layers=3, drop_rate=0.0, norm="rmsnorm", mlp="swiglu", bias=False,
        layer_types=("kda", "full", "kda"), kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
        nope=True, delta_heads=2, delta_head_dim=8, conv_kernel=4,
    )  # fmt: skip
    kinds = {k.kind: k for k in layer_kinds(config, dtype="float32")}
    caches = GPT(config).make_caches(batch_size=1, max_len=8)
    held = [caches[i].nbytes() for i in (0, 2)]
    assert kinds["kda"].layers == 2 and held == [kinds["kda"].state_bytes] * 2 == [4 * (2 * 8 * 8 + 48 * 3)] * 2
    assert kinds["kda"].layer_bytes(1) == kinds["kda"].layer_bytes(10_000)
    assert kinds["latent"].layers == 1 and kinds["latent"].bytes_per_token == 4 * (16 + 8)


@torch.no_grad()
def test_latent_attention_without_rope_sees_no_positions_and_its_forms_agree() -> None:
    """Kimi Linear's MLA (LatentAttention(rope=False)): its qk_rope_head_dim dimensions are kept and turned by
    nothing, so the same tokens at other distances apart give the same output (with RoPE they do not), its cache
    plans no rotary, and decoding over its latent cache (the absorbed form) equals the expanded form without one."""
    from attnlab.nn.latent import LatentAttention

    sizes = dict(d_in=16, num_heads=2, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6)
    torch.manual_seed(0)
    plain = LatentAttention(**sizes, rope=False).eval()  # type: ignore[arg-type]
    turned = LatentAttention(**sizes).eval()  # type: ignore[arg-type]
    turned.load_state_dict(plain.state_dict(), strict=False)
    x, later = torch.randn(1, 7, 16), torch.tensor([0, 3, 9, 20, 41, 70, 100])  # farther apart than 0..6
    whole = plain(x)
    torch.testing.assert_close(plain(x, positions=later), whole)
    assert float((turned(x, positions=later) - turned(x)).abs().max()) > 1e-3
    assert plain.layer_state().rotary is None and turned.layer_state().rotary is not None
    cache = ModelCache.build([plain.layer_state()], rows=1, capacity=8)[0]
    steps = [plain(x[:, :4], cache=cache)] + [plain(x[:, t : t + 1], cache=cache) for t in range(4, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-5, rtol=1e-5)
    with pytest.raises(TypeError, match="rope must be a bool"):
        LatentAttention(**sizes, rope="no")  # type: ignore[arg-type]
