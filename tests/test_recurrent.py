"""Issue 36: attention with a state of fixed size (linear attention, the gated delta rule) and the output gate.

Every form gives the same numbers in float64 (recurrent == parallel == chunked, across calls that carry the
state), with gradients; the chunked delta rule equals an independent reference (transformers' plain-PyTorch
Qwen3-Next functions); a cached decode equals the uncached forward in a model of every kind of layer; and each
technique has a test of what it does: the delta rule overwrites what a key held (linear attention adds to it),
the decay forgets, the state does not grow, the output gate can close a head.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.cache.state import StateCache
from attnlab.functional.recurrent import (
    feature_map,
    gated_delta_rule,
    gated_delta_weights,
    linear_attention,
    linear_attention_weights,
)
from attnlab.models import GPT
from attnlab.models.config import GPTConfig
from attnlab.nn.attention import Attention
from attnlab.nn.recurrent import GatedDeltaNet, LinearAttention

B, H, T, DK, DV = 2, 3, 37, 8, 5  # T is not a multiple of the chunk: the last chunk is short


def inputs(seed: int = 0, t: int = T) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, t, DK, generator=g, dtype=torch.float64) for _ in range(2))
    return {
        "q": q,
        "k": k,
        "v": torch.randn(B, H, t, DV, generator=g, dtype=torch.float64),
        "g": -torch.rand(B, H, t, generator=g, dtype=torch.float64),  # log decay in [-1, 0]
        "beta": torch.rand(B, H, t, generator=g, dtype=torch.float64),
    }


def delta_args(x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    q = F.normalize(x["q"], dim=-1) / math.sqrt(DK)
    return q, F.normalize(x["k"], dim=-1), x["v"], x["g"], x["beta"]


def test_linear_attention_is_the_formula_in_every_form() -> None:
    """out_t = sum_{s<=t} phi(q_t).phi(k_s) v_s / sum_{s<=t} phi(q_t).phi(k_s), written out here token by token."""
    x = inputs()
    q, k, v = feature_map(x["q"]), feature_map(x["k"]), x["v"]
    expected = torch.empty_like(v)
    for t in range(T):
        w = (q[:, :, t : t + 1] * k[:, :, : t + 1]).sum(-1)  # (B, H, t + 1)
        expected[:, :, t] = (w[..., None] * v[:, :, : t + 1]).sum(2) / w.sum(-1, keepdim=True)
    for form in ("recurrent", "parallel", "chunked"):
        out, (s, z) = linear_attention(q, k, v, form=form, chunk_size=8)
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(s, k.transpose(-1, -2) @ v, rtol=0, atol=1e-12)  # sum of phi(k) v^T
        torch.testing.assert_close(z, k.sum(2), rtol=0, atol=1e-12)
    torch.testing.assert_close(linear_attention_weights(q, k) @ v, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("split", [1, 8, 20])
def test_every_form_continues_from_a_state_as_from_one_call(split: int) -> None:
    x = inputs(1)
    q, k, v = feature_map(x["q"]), feature_map(x["k"]), x["v"]
    whole, _ = linear_attention(q, k, v, form="recurrent")
    first, state = linear_attention(q[:, :, :split], k[:, :, :split], v[:, :, :split], form="chunked", chunk_size=8)
    rest, _ = linear_attention(q[:, :, split:], k[:, :, split:], v[:, :, split:], state=state, form="parallel")
    torch.testing.assert_close(torch.cat([first, rest], 2), whole, rtol=0, atol=1e-12)
    args = delta_args(x)
    whole, end = gated_delta_rule(*args, form="recurrent")
    head = [a[:, :, :split] for a in args]
    tail = [a[:, :, split:] for a in args]
    first, state_d = gated_delta_rule(*head, form="chunked", chunk_size=8)  # type: ignore[arg-type]
    rest, end_2 = gated_delta_rule(*tail, state=state_d, form="chunked", chunk_size=16)  # type: ignore[arg-type]
    torch.testing.assert_close(torch.cat([first, rest], 2), whole, rtol=0, atol=1e-12)
    torch.testing.assert_close(end_2, end, rtol=0, atol=1e-12)


def test_the_forms_have_the_same_gradients() -> None:
    x = inputs(2, t=19)
    upstream = torch.randn(B, H, 19, DV, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    grads = {}
    for form in ("recurrent", "parallel", "chunked"):
        leaves = [t.clone().requires_grad_() for t in (x["q"], x["k"], x["v"])]
        out, _ = linear_attention(feature_map(leaves[0]), feature_map(leaves[1]), leaves[2], form=form, chunk_size=4)
        out.backward(upstream)
        grads[("linear", form)] = [leaf.grad for leaf in leaves]
    for form in ("recurrent", "chunked"):
        leaves = [t.clone().requires_grad_() for t in (x["q"], x["k"], x["v"], x["g"], x["beta"])]
        q = F.normalize(leaves[0], dim=-1) / math.sqrt(DK)
        out, _ = gated_delta_rule(q, F.normalize(leaves[1], dim=-1), *leaves[2:], form=form, chunk_size=4)
        out.backward(upstream)
        grads[("delta", form)] = [leaf.grad for leaf in leaves]
    for kind, form in grads:
        for got, want in zip(grads[(kind, form)], grads[(kind, "recurrent")], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_the_chunked_forms_pass_gradcheck() -> None:
    x = inputs(4, t=6)
    small = [t[:1, :1].clone().requires_grad_() for t in (x["q"], x["k"], x["v"], x["g"], x["beta"])]

    def linear(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return linear_attention(feature_map(q), feature_map(k), v, form="chunked", chunk_size=4)[0]

    def delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        return gated_delta_rule(F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, g, beta, chunk_size=4)[0]

    assert torch.autograd.gradcheck(linear, tuple(small[:3]))
    assert torch.autograd.gradcheck(delta, tuple(small))


@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers' own deprecations, if any, on import
def test_the_delta_rule_equals_transformers_qwen3_next_reference() -> None:
    """An independent implementation: transformers' plain-PyTorch gated delta rule (Qwen3-Next), which L2-norms
    q and k and scales q itself, in float32 inside."""
    from transformers.models.qwen3_next import modeling_qwen3_next as ref

    x = inputs(5)
    ours, state = gated_delta_rule(*delta_args(x), form="chunked", chunk_size=16)
    t = [a.transpose(1, 2) for a in (x["q"], x["k"], x["v"], x["g"], x["beta"])]  # (B, T, H, ...)
    for theirs in (ref.torch_chunk_gated_delta_rule, ref.torch_recurrent_gated_delta_rule):
        out, end = theirs(*t, initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(out.transpose(1, 2).double(), ours, rtol=0, atol=1e-5)
        torch.testing.assert_close(end.double(), state, rtol=0, atol=1e-5)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers' own deprecations, if any, on import
@pytest.mark.parametrize("form", ["chunked", "recurrent"])
def test_gated_deltanet_is_qwen3_next_parts_fed_from_its_own_weights(form: str) -> None:
    """The layer against transformers' Qwen3-Next parts, fed from the layer's own projection weights: its gates
    written out here as Qwen3NextGatedDeltaNet computes them, the core by transformers' gated delta rule (which
    L2-norms q and k and scales q by 1/sqrt(Dk) itself), the output by Qwen3NextRMSNormGated, then out_proj.
    Qwen3-Next's short convolution is the one part this layer leaves out, so it is left out here too. The core is
    also read where it enters the norm: the norm would hide a query scaled wrongly (RMSNorm undoes any scale)."""
    from transformers.models.qwen3_next import modeling_qwen3_next as ref

    b, t, e, h, d = 2, 9, 16, 2, 8
    torch.manual_seed(0)
    layer = GatedDeltaNet(d_in=e, num_heads=h, head_dim=d, form=form, chunk_size=4).double()
    x = torch.randn(b, t, e, dtype=torch.float64)
    w_query, w_key, w_value = layer.qkv.weight.chunk(3)  # (H * D, E) each
    q, k, v = ((x @ w.T).view(b, t, h, d) for w in (w_query, w_key, w_value))  # (B, T, H, D), as Qwen3-Next
    g = -layer.A_log.exp() * F.softplus(x @ layer.a_proj.weight.T + layer.dt_bias)  # (B, T, H)
    beta = torch.sigmoid(x @ layer.b_proj.weight.T)  # (B, T, H)
    core, _ = ref.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, chunk_size=4, use_qk_l2norm_in_kernel=True)
    z = (x @ layer.z_proj.weight.T).view(b, t, h, d)  # (B, T, H, D)
    gated_norm = ref.Qwen3NextRMSNormGated(d, eps=1e-6).double()  # the layer's norm_eps
    expected = layer.out_proj(gated_norm(core.double(), z).reshape(b, t, h * d))  # (B, T, E)
    seen: list[torch.Tensor] = []
    hook = layer.norm.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.no_grad():
        out = layer(x)
    hook.remove()
    torch.testing.assert_close(seen[0], core.transpose(1, 2).double(), rtol=0, atol=1e-5)  # (B, H, T, D)
    torch.testing.assert_close(out, expected.detach(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("form", ["recurrent", "parallel", "chunked"])
def test_the_linear_attention_layer_is_the_formula_fed_from_its_own_weights(form: str) -> None:
    """The layer against Katharopoulos et al.'s formula written out here from its own weights, phi = elu + 1:
    out_t = sum_{s<=t} (phi(q_t) . phi(k_s)) v_s / sum_{s<=t} phi(q_t) . phi(k_s) per head, heads joined, out_proj."""
    b, t, e, h, d = 2, 7, 12, 3, 4
    torch.manual_seed(1)
    layer = LinearAttention(d_in=e, num_heads=h, form=form, chunk_size=3).double()
    x = torch.randn(b, t, e, dtype=torch.float64)
    w_query, w_key, w_value = layer.qkv.weight.chunk(3)  # (H * D, E) each
    q, k, v = ((x @ w.T).view(b, t, h, d) for w in (w_query, w_key, w_value))  # (B, T, H, D)
    q, k = F.elu(q) + 1, F.elu(k) + 1
    heads = torch.empty(b, t, h, d, dtype=torch.float64)
    for i in range(t):
        w = (q[:, i : i + 1] * k[:, : i + 1]).sum(-1)  # (B, i + 1, H): phi(q_i) . phi(k_s)
        heads[:, i] = (w[..., None] * v[:, : i + 1]).sum(1) / w.sum(1)[..., None]
    expected = heads.reshape(b, t, h * d) @ layer.out_proj.weight.T + layer.out_proj.bias  # (B, T, E)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected, rtol=0, atol=1e-12)


def test_the_delta_rule_overwrites_what_a_key_held_where_linear_attention_adds() -> None:
    """Write v1 then v2 under one key, beta = 1 and no decay: the delta rule reads back v2 (the error is written,
    so v1 is replaced), linear attention the mean of the two. Without the delta term it would read v1 + v2."""
    k = F.normalize(torch.randn(1, 1, 1, DK, dtype=torch.float64), dim=-1).expand(1, 1, 2, DK)
    v = torch.randn(1, 1, 2, DV, dtype=torch.float64)
    zeros, ones = torch.zeros(1, 1, 2, dtype=torch.float64), torch.ones(1, 1, 2, dtype=torch.float64)
    out, _ = gated_delta_rule(k, k, v, zeros, ones, form="chunked")
    torch.testing.assert_close(out[0, 0, 1], v[0, 0, 1], rtol=0, atol=1e-12)  # q = k reads the last write
    assert (out[0, 0, 1] - v[0, 0].sum(0)).abs().max() > 0.1
    lin, _ = linear_attention(k.exp(), k.exp(), v, form="chunked")  # equal keys: equal weights
    torch.testing.assert_close(lin[0, 0, 1], v[0, 0].mean(0), rtol=0, atol=1e-12)


def test_the_decay_forgets_at_its_rate() -> None:
    """One write, then tokens that write nothing (beta = 0) under log decay g: the read is exp(sum g) of it."""
    k = F.normalize(torch.randn(1, 1, 1, DK, dtype=torch.float64), dim=-1).expand(1, 1, 5, DK)
    v = torch.randn(1, 1, 5, DV, dtype=torch.float64)
    g = torch.full((1, 1, 5), -0.3, dtype=torch.float64)
    beta = torch.tensor([[[1.0, 0, 0, 0, 0]]], dtype=torch.float64)
    out, _ = gated_delta_rule(k, k, v, g, beta, form="chunked")
    torch.testing.assert_close(out[0, 0, 4], math.exp(-0.3 * 4) * v[0, 0, 0], rtol=0, atol=1e-12)


def zoo_model(layer_types: tuple[str, ...], **changes: object) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=50,
        context_length=64,
        emb_dim=32,
        n_heads=4,
        n_layers=len(layer_types),
        drop_rate=0.0,
        rope=True,
        layer_types=layer_types,  # type: ignore[arg-type]
        **changes,  # type: ignore[arg-type]
    )
    return GPT(config).double().eval()


@pytest.mark.parametrize(
    "layer_types", [("linear", "delta", "full"), ("delta", "delta"), ("linear", "linear")], ids=str
)
def test_a_cached_decode_equals_the_uncached_forward(layer_types: tuple[str, ...]) -> None:
    model = zoo_model(layer_types, attn_output_gate=True)
    idx = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = model(idx)
        caches = model.make_caches(batch_size=2, max_len=64)
        parts = [model(idx[:, :13], caches=caches)] + [model(idx[:, t : t + 1], caches=caches) for t in range(13, 20)]
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=0, atol=1e-12)
    kinds = [type(block.att) for block in model.blocks]
    assert kinds == [{"linear": LinearAttention, "delta": GatedDeltaNet, "full": Attention}[t] for t in layer_types]


def test_a_left_padded_row_reads_as_the_row_alone() -> None:
    model = zoo_model(("linear", "delta", "full"))
    idx = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, :4] = 0
    with torch.no_grad():
        padded, alone = model(idx, attention_mask=mask), model(idx[1:, 4:])
        assert torch.isfinite(padded).all()
        torch.testing.assert_close(padded[1, 4:], alone[0], rtol=0, atol=1e-12)
        out = model.generate(idx, 5, attention_mask=mask)
    torch.testing.assert_close(out[1:, 20:], model.generate(idx[1:, 4:], 5)[:, 16:])


def test_the_state_does_not_grow_where_a_kv_cache_does() -> None:
    """What a recurrent layer saves: its cache holds the same bytes after 60 tokens as after 1; a full layer's
    keys and values grow with every token."""
    model = zoo_model(("delta", "linear", "full"))
    with torch.no_grad():
        caches = model.make_caches(batch_size=1, max_len=64)
        model(torch.zeros(1, 1, dtype=torch.long), caches=caches)
        state = [layer.nbytes() for layer in caches if isinstance(layer, StateCache)]
        model(torch.zeros(1, 59, dtype=torch.long), caches=caches)
    assert [layer.nbytes() for layer in caches if isinstance(layer, StateCache)] == state
    d = 8  # head_dim: 4 heads of 8, float64; the delta state is 4 x 8 x 8 values, linear adds a normalizer
    assert state == [4 * d * d * 8, (4 * d * d + 4 * d) * 8]
    assert caches[2].length == 60  # the full layer holds 60 keys and values


def test_the_output_gate_can_close_a_head() -> None:
    """Gated attention: openings of 1/2 (gate weights 0) halve every head's context vector; openings of 0 (a
    large negative gate on positive inputs) leave only out_proj's bias. The ungated layer shares the weights."""
    torch.manual_seed(0)
    gated = Attention(d_in=16, num_heads=2, output_gate=True).double()
    plain = Attention(d_in=16, num_heads=2).double()
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if not k.startswith("gate.")})
    x = torch.rand(1, 5, 16, dtype=torch.float64) + 0.1  # positive, so -1e4 weights close every dimension
    assert gated.gate is not None
    with torch.no_grad():
        gated.gate.weight.zero_()
        bias = gated.out_proj.bias
        torch.testing.assert_close(gated(x) - bias, (plain(x) - bias) / 2, rtol=0, atol=1e-12)
        gated.gate.weight.fill_(-1e4)
        torch.testing.assert_close(gated(x), bias.expand(1, 5, 16), rtol=0, atol=1e-12)
        assert (plain(x) - bias).abs().max() > 0.01


def test_recurrent_layers_refuse_what_they_cannot_do() -> None:
    model = zoo_model(("linear", "delta"))
    idx = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="packed documents"):
        model(idx, document_ids=torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="no scores for a mask_mod"):
        model(idx, mask_mod=lambda b, h, q, k: q >= k)
    with pytest.raises(ValueError, match="this model has none"):
        model.make_caches(batch_size=1, max_len=8, cache="int8")
    with pytest.raises(TypeError, match="not keys and values"):
        StateCache(batch_size=1, num_heads=1, key_dim=2, value_dim=2).update(torch.zeros(1), torch.zeros(1))
    with pytest.raises(ValueError, match="form must be one of"):
        GatedDeltaNet(d_in=8, num_heads=2, form="parallel")


def test_the_implicit_weights_are_what_the_recurrence_computes() -> None:
    """Each recurrent layer is linear in its values: out = weights @ v, with the weights formed in closed form."""

    x = inputs(6)
    q, k, v, g, beta = delta_args(x)
    out, _ = gated_delta_rule(q, k, v, g, beta, form="recurrent")
    weights = gated_delta_weights(q, k, g, beta)
    torch.testing.assert_close(weights @ v, out, rtol=0, atol=1e-12)
    assert torch.equal(weights, weights.tril())  # causal
    model = zoo_model(("linear", "delta", "full"))
    idx = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        every = model.attention_weights(idx)  # (L, B, H, T, T)
    assert every.shape == (3, 1, 4, 12, 12)
    torch.testing.assert_close(every[0].sum(-1), torch.ones(1, 4, 12, dtype=torch.float64))  # linear: rows of 1
    assert not torch.allclose(every[1].sum(-1), torch.ones(1, 4, 12, dtype=torch.float64))  # delta: not a softmax


def test_bfloat16_and_int8_models_keep_their_state_in_float32() -> None:
    """In bfloat16 a normalizer summed token by token stops growing after a few hundred tokens; the state is kept
    in float32, so a cached decode of 400 tokens still reads what the chunked forward computes. int8 weights
    (GPT.quantize) run the same layers."""
    model = zoo_model(("linear", "delta", "full")).float()
    idx = torch.randint(0, 50, (1, 400), generator=torch.Generator().manual_seed(8))
    half = zoo_model(("linear", "delta", "full")).to(torch.bfloat16)
    with torch.no_grad():
        whole = half(idx)[0, -1].float()
        caches = half.make_caches(batch_size=1, max_len=400)
        assert all(c.matrix.dtype == torch.float32 for c in caches if isinstance(c, StateCache))
        for t in range(0, 400, 100):
            step = half(idx[:, t : t + 100], caches=caches)
        torch.testing.assert_close(step[0, -1].float(), whole, rtol=0, atol=0.1)
        model.quantize("int8", kernel="dequantize")  # the state is the point, not the kernel
        assert model.generate(idx[:, :8], 4).shape == (1, 12)


def test_a_padded_rows_implicit_weights_are_zero_not_nan() -> None:
    model = zoo_model(("linear", "delta"))
    idx = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(9))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    with torch.no_grad():
        weights = model.attention_weights(idx, attention_mask=mask)  # (L, B, H, T, T)
    assert torch.isfinite(weights).all()
    assert (weights[0, 1, :, :2] == 0).all()  # the padded rows attend to nothing
    torch.testing.assert_close(weights[0, 1, :, 2:].sum(-1), torch.ones(4, 4, dtype=torch.float64))


def test_generate_many_runs_a_recurrent_state_per_row() -> None:
    """Rows admitted and released on their own, each with its own state: what each prompt gets alone."""
    model = zoo_model(("delta", "full"))
    prompts = [[1, 2], [3], [4, 5, 6, 7]]
    alone = [model.generate(torch.tensor([p]), 3)[0, len(p) :].tolist() for p in prompts]
    assert model.generate_many(prompts, 3, slots=2, cache="paged") == alone


def test_a_decay_or_write_share_out_of_range_is_refused_by_name() -> None:
    """g = -inf gave NaN in the chunked form (G_i - G_j = -inf + inf): refused there, pointing at the recurrent form,
    which takes it exactly as a full reset. g > 0 and beta outside [0, 1] are refused in every form, naming the
    value and where it is, also when g is a leaf of training (the message is not turned into a warning). NaN stays
    in its own row, as in attention."""
    q, k, v, g, beta = delta_args(inputs(7, t=6))
    where = r" at \(batch, head, token\) \(1, 2, 3\)"
    slips = {
        ("g", 0.5, "recurrent"): r"g must be a log decay <= 0; got 0\.5" + where,
        ("g", float("-inf"), "chunked"): r"g of -inf \(a full reset\) cannot go through the chunked form.*"
        r"form='recurrent'.*-30.*; got -inf" + where,
        ("beta", 1.5, "recurrent"): r"beta must be a share in \[0, 1\], such as sigmoid\(x\); got 1\.5" + where,
        ("beta", -0.1, "chunked"): r"beta must be a share in \[0, 1\].*; got -0\.1" + where,
    }
    for (label, value, form), message in slips.items():
        bad = {"g": g.clone(), "beta": beta.clone()}
        bad[label][1, 2, 3] = value
        bad = {name: t.requires_grad_() for name, t in bad.items()}
        with pytest.raises(ValueError, match="gated_delta_rule: " + message):
            gated_delta_rule(q, k, v, bad["g"], bad["beta"], form=form)
        with pytest.raises(ValueError, match="gated_delta_weights: " + message):
            gated_delta_weights(q, k, bad["g"], bad["beta"])
    reset = g.clone()
    reset[:, :, 3] = float("-inf")
    exact, _ = gated_delta_rule(q, k, v, reset, beta, form="recurrent")
    reset[:, :, 3] = -30.0
    for form in ("recurrent", "chunked"):  # -30 decays by 1e-13: the same reset within float64's rounding
        near, _ = gated_delta_rule(q, k, v, reset, beta, form=form, chunk_size=4)
        torch.testing.assert_close(near, exact, rtol=0, atol=1e-12)
    nan = g.clone()
    nan[1, 2, 3] = float("nan")
    out, _ = gated_delta_rule(q, k, v, nan, beta, form="chunked", chunk_size=4)
    assert out[1, 2, 3:].isnan().all() and not out[0].isnan().any() and not out[1, :2].isnan().any()
    edges = (torch.full_like(g, -30.0), torch.ones_like(beta)), (torch.zeros_like(g), torch.ones_like(beta))
    for edge_g, edge_beta in edges:  # the bounds themselves are taken, and the forms agree there
        chunked, _ = gated_delta_rule(q, k, v, edge_g, edge_beta, form="chunked", chunk_size=4)
        recurrent, _ = gated_delta_rule(q, k, v, edge_g, edge_beta, form="recurrent")
        torch.testing.assert_close(chunked, recurrent, rtol=0, atol=1e-12)
