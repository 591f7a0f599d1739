"""Every edge the independent test suite found (issue 9), each with the class it belongs to."""

from __future__ import annotations

import copy as copy_module

import pytest
import torch
import torch.nn as nn

from attnlab import Attention
from attnlab.cache import ModelCache
from attnlab.functional import attention, from_torch_mha_masks
from attnlab.models import GPT, from_hf_gpt2, from_hf_llama, from_torch_mha
from conftest import python_calls, small, tiles

BACKENDS = ["eager", "sdpa", "flash"]


def qkv(b: int = 2, h: int = 2, t: int = 6, d: int = 8, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(b, h, t, d, generator=g).to(dtype) for _ in range(3)]


# -- a failed call leaves the cache exactly as it was -------------------------------------------------------------
def _snapshot(cache: nn.Module) -> list[torch.Tensor]:
    return [t.clone() for t in cache.buffers()]


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (dict(mask=torch.ones(1, 1, 1, 9, dtype=torch.bool)), ValueError, r"does not broadcast"),
        (dict(mask=torch.ones(1, 1, 1, 5, dtype=torch.long)), TypeError, r"mask must be bool .* or floating point"),
        (dict(mask=torch.full((1, 1, 1, 5), float("nan"))), ValueError, r"must not hold NaN or \+inf"),
        (dict(positions=torch.arange(2)), ValueError, r"positions must be \(T,\) or \(B, T\) with T=1"),
        (dict(positions=torch.zeros(3, 1, dtype=torch.long)), ValueError, r"positions are for a batch of 3"),
        (dict(positions=torch.tensor([-1])), ValueError, r"positions must be >= 0"),
        (dict(x=torch.randn(1, 1, 16, dtype=torch.float64)), TypeError, r"input dtype torch.float64 differs"),
        (dict(x=torch.randn(2, 1, 16)), ValueError, r"built for batch_size=1, got keys for a batch of 2"),
        (dict(grad=True), ValueError, r"require grad, but a KV cache is for inference"),
    ],
)
def test_a_failed_cached_call_leaves_the_cache_untouched(
    window: int | None, call: dict[str, object], error: type[Exception], pattern: str
) -> None:
    torch.manual_seed(0)
    attn = Attention(d_in=16, num_heads=4, num_kv_heads=2, rope=True, window=window).eval()
    cache = ModelCache.build([attn.layer_state()], rows=1, capacity=8)[0]
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        attn(x[:, :4], cache=cache)
    before = _snapshot(cache)
    args = dict(call)
    new = args.pop("x", x[:, 4:5])
    with torch.set_grad_enabled(bool(args.pop("grad", False))), pytest.raises(error, match=pattern):
        attn(new, cache=cache, **args)
    after = _snapshot(cache)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    with torch.no_grad():  # the retry is right: the same as one pass over all five tokens
        retry = attn(x[:, 4:5], cache=cache)
    torch.testing.assert_close(retry, attn(x)[:, 4:5], atol=1e-5, rtol=1e-5)


def test_a_full_cache_refuses_before_writing() -> None:
    attn = Attention(d_in=16, num_heads=4).eval()
    cache = ModelCache.build([attn.layer_state()], rows=1, capacity=4)[0]
    with torch.no_grad():
        attn(torch.randn(1, 3, 16), cache=cache)
        before = _snapshot(cache)
        with pytest.raises(ValueError, match=r"the cache is full: it holds 3 of max_len=4 positions and cannot take 2"):
            attn(torch.randn(1, 2, 16), cache=cache)
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(cache), strict=True))


# -- masks of every rank SDPA accepts ------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_one_and_zero_dimensional_masks_broadcast_like_a_key_row(backend: str) -> None:
    """SDPA itself raises IndexError on a (Tk,) mask; attnlab reads it as the (1, Tk) row it broadcasts as."""
    q, k, v = qkv()
    keys = torch.tensor([True, True, False, True, False, True])
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keys[None, :])
    torch.testing.assert_close(attention(q, k, v, mask=keys, backend=backend), expected, atol=1e-5, rtol=1e-5)
    everything = torch.tensor(True)
    torch.testing.assert_close(
        attention(q, k, v, mask=everything, backend=backend),
        torch.nn.functional.scaled_dot_product_attention(q, k, v),
        atol=1e-5,
        rtol=1e-5,
    )
    bias = torch.linspace(-1, 1, 6)  # a float (Tk,) bias
    torch.testing.assert_close(
        attention(q, k, v, mask=bias, backend=backend),
        torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias[None, :]),
        atol=1e-5,
        rtol=1e-5,
    )


# -- float masks of another dtype: one rule, every backend ---------------------------------------------------------
@pytest.mark.parametrize(
    ("q_dtype", "mask_dtype", "hide"),
    [
        (torch.float32, torch.float64, torch.finfo(torch.float64).min),  # beyond float32: -inf once cast
        (torch.float16, torch.float32, -1e9),  # beyond float16: -inf once cast
        (torch.float32, torch.float32, torch.finfo(torch.float32).min),  # finite: every backend averages alike
    ],
)
def test_float_masks_of_another_dtype_agree_in_every_backend(
    q_dtype: torch.dtype, mask_dtype: torch.dtype, hide: float
) -> None:
    q, k, v = qkv(dtype=q_dtype)
    mask = torch.zeros(1, 1, 6, 6, dtype=mask_dtype)
    mask[..., 2, :] = hide  # row 2 may see nothing useful
    mask[..., 4, 1:] = hide  # row 4 may see key 0 only
    outs = {b: attention(q, k, v, mask=mask, backend=b).float() for b in BACKENDS}
    for b in ("sdpa", "flash"):
        torch.testing.assert_close(outs[b], outs["eager"], atol=2e-3, rtol=2e-3, msg=b)
    assert not any(o.isnan().any() for o in outs.values())
    if torch.tensor(hide, dtype=mask_dtype).to(q_dtype).isneginf():  # hidden after the cast: a dead row gives 0
        assert (outs["eager"][:, :, 2] == 0).all()
    torch.testing.assert_close(outs["eager"][:, :, 4], v[:, :, 0].float(), atol=2e-3, rtol=2e-3)


# -- non-finite inputs: the same in every backend, independent of tiles --------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("blocks", [(2, 2), (256, 256)])
def test_a_hidden_nan_never_reaches_a_visible_output(backend: str, blocks: tuple[int, int]) -> None:
    q, k, v = qkv(t=8)
    v[:, :, 5] = float("nan")  # key 5: hidden from queries 0..4 by the causal mask
    k[:, :, 6] = float("inf")
    out = attention(q, k, v, is_causal=True, backend=tiles(backend, blocks[0], blocks[1]))
    assert out[:, :, :5].isfinite().all()  # queries that cannot see 5 or 6 are untouched
    assert out[:, :, 5:].isnan().all()  # queries that see them are NaN, in every backend
    clean = attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], is_causal=True, backend="eager")
    torch.testing.assert_close(out[:, :, :5], clean, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nan_query_gives_a_nan_row_in_every_backend(backend: str) -> None:
    q, k, v = qkv()
    q[0, 1, 3, 0] = float("nan")
    out = attention(q, k, v, backend=backend)
    assert out[0, 1, 3].isnan().all()
    assert out.isnan().sum() == out.shape[-1]  # that row only


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cache_that_vouches_for_its_buffers_keeps_the_rule(backend: str) -> None:
    """A KV cache checks what it is written and vouches for its buffers, so attention does not sum them again;
    every NaN below sits where no query may see it, so the rule keeps every output finite (SDPA alone would
    spread it: a weight of 0 times NaN). A NaN put into an unfilled slot in place, after the cache vouched, moves
    the buffer's version and is seen; NaN tokens the cache was written, then cropped away, are never vouched for,
    nor are they in a deep copy of the cache, whatever its version counter comes to read."""
    torch.manual_seed(0)
    attn = Attention(d_in=8, num_heads=2, backend=backend).eval()
    x = torch.randn(1, 10, 8)
    want = attn(x).detach()  # (1, 10, 8): each query's output with nothing hidden in its way
    with torch.no_grad():
        cache = ModelCache.build([attn.layer_state()], rows=1, capacity=12)[0]
        attn(x[:, :3], cache=cache)
        cache.v_cache[:, :, -1] = float("nan")  # slot 11: unfilled, hidden from every query below
        steps = [attn(x[:, t : t + 1], cache=cache) for t in range(3, 10)]
        torch.testing.assert_close(torch.cat(steps, dim=1), want[:, 3:], atol=1e-5, rtol=1e-5)
        cache = ModelCache.build([attn.layer_state()], rows=1, capacity=12)[0]
        for t in range(3):  # one token a write, each vouched for: the buffers' version counters move to 3
            attn(x[:, t : t + 1], cache=cache)
        attn(torch.full((1, 7, 8), float("nan")), cache=cache)  # slots 3..9
        cache.crop(3)  # the NaN keys and values stay, hidden past the length
        copy = copy_module.deepcopy(cache)
        for held in (cache, copy):  # query t overwrites slot t and sees 0..t; slots past t keep their NaN
            for t in range(3, 9):
                torch.testing.assert_close(attn(x[:, t : t + 1], cache=held), want[:, t : t + 1], atol=1e-5, rtol=1e-5)


def test_a_decode_step_sums_its_query_not_the_whole_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The effect of vouching: in a decode step of a model with the plain cache no reduction reads a cache buffer
    (torch.profiler, input shapes recorded); with the vouch dropped after each write, each layer sums both."""
    from torch.profiler import ProfilerActivity, profile

    import attnlab.cache.kv as kv

    torch.manual_seed(0)
    model = GPT(small()).eval()
    idx = torch.randint(0, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(0))

    def cache_sums() -> int:
        caches = model.make_caches(batch_size=1, max_len=12)
        with torch.no_grad():
            model(idx, caches=caches)
            shape = list(caches[0].k_cache.shape)
            shape[2] = 7  # the keys attended over: the filled slots, the 6 held and the new one
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                model(idx[:, :1], caches=caches, last_only=True)
        return sum(1 for e in prof.events() if e.name == "aten::sum" and e.input_shapes and e.input_shapes[0] == shape)

    assert cache_sums() == 0
    monkeypatch.setattr(kv, "vouch", lambda t: None)  # the cache vouches for nothing
    assert cache_sums() == 2 * 2  # k and v, in each of the 2 layers


# -- sizes ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shapes", "pattern"),
    [
        (((1, 2, 4, 0), (1, 2, 4, 0)), r"q has head_dim = 0 \(shape \(1, 2, 4, 0\)\); attention needs at least 1"),
        (((1, 0, 4, 8), (1, 0, 4, 8)), r"q has heads = 0"),
        (((1, 2, 4, 8), (1, 0, 4, 8)), r"k has heads = 0"),
    ],
)
def test_zero_heads_or_head_dim_are_refused_by_name(shapes: tuple, pattern: str) -> None:
    q, kv = torch.randn(shapes[0]), torch.randn(shapes[1])
    with pytest.raises(ValueError, match=pattern):
        attention(q, kv, kv)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_keys_or_no_queries_give_zeros(backend: str) -> None:
    q, k, v = qkv()
    out = attention(q, k[:, :, :0], v[:, :, :0], backend=backend)
    assert out.shape == q.shape and (out == 0).all()
    assert attention(q[:, :, :0], k, v, backend=backend).shape == (2, 2, 0, 8)


# -- loaders -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "layer_idx"), [(dict(scale_attn_weights=False), 0), (dict(scale_attn_by_inverse_layer_idx=True), 3)]
)
def test_gpt2_scaling_flags_match_hugging_face(flags: dict[str, bool], layer_idx: int) -> None:
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    config = GPT2Config(n_embd=32, n_head=4, attn_pdrop=0.0, resid_pdrop=0.0, **flags)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = GPT2Attention(config, layer_idx=layer_idx).eval()
    ours = from_hf_gpt2(hf.state_dict(), num_heads=4, layer_idx=layer_idx, **flags).eval()
    x = torch.randn(2, 7, 32)
    causal = torch.zeros(1, 1, 7, 7).masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    with torch.no_grad():
        expected = hf(x, attention_mask=causal)[0]
        torch.testing.assert_close(ours(x), expected, atol=1e-5, rtol=1e-5)


def test_mis_shaped_projections_are_named_with_both_shapes() -> None:
    torch.manual_seed(0)
    sd = {"c_attn.weight": torch.randn(16, 48), "c_attn.bias": torch.randn(48)}
    sd |= {"c_proj.weight": torch.randn(16, 12), "c_proj.bias": torch.randn(16)}
    with pytest.raises(ValueError, match=r"c_proj.weight: expected \(16, 16\), found \(16, 12\)"):
        from_hf_gpt2(sd, num_heads=4)
    llama = {f"{n}_proj.weight": torch.randn(16, 16) for n in "qo"} | {
        f"{n}_proj.weight": torch.randn(8, 16) for n in "kv"
    }
    llama["o_proj.weight"] = torch.randn(16, 8)
    with pytest.raises(ValueError, match=r"o_proj.weight: expected \(16, 16\), found \(16, 8\)"):
        from_hf_llama(llama, num_heads=4, num_kv_heads=2)
    with pytest.raises(ValueError, match=r"the state dict lacks \['c_proj.weight'\]"):
        from_hf_gpt2({k: v for k, v in sd.items() if k != "c_proj.weight"}, num_heads=4)


def test_torch_mha_three_dimensional_mask_is_reshaped_per_head() -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    attn = from_torch_mha(mha)
    x = torch.randn(3, 5, 16)
    per_head = torch.rand(3 * 2, 5, 5) < 0.3  # True = masked out, a different mask per batch row and head
    per_head[..., 0] = False  # every query keeps key 0
    expected, _ = mha(x, x, x, attn_mask=per_head, need_weights=False)
    mask = from_torch_mha_masks(per_head, num_heads=2)
    assert mask is not None and mask.shape == (3, 2, 5, 5)
    torch.testing.assert_close(attn(x, mask=mask), expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"a 3-D attn_mask is \(batch \* num_heads, Tq, Tk\).*pass the module's"):
        from_torch_mha_masks(per_head)


# -- generate ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(small()).eval()


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        (dict(temperature=float("nan")), ValueError, r"temperature must be a finite number >= 0 .* got nan"),
        (dict(temperature=-0.5), ValueError, r"temperature must be a finite number >= 0 .* got -0.5"),
        (dict(temperature=float("inf")), ValueError, r"got inf"),
        (dict(temperature="hot"), TypeError, r"temperature must be a number >= 0 .* got 'hot'"),
        (dict(idx=torch.tensor([1, 2, 3])), ValueError, r"token ids must be \(batch, tokens\).*unsqueeze\(0\)"),
        (dict(idx=torch.zeros(1, 0, dtype=torch.long)), ValueError, r"the prompt is empty \(shape \(1, 0\)\)"),
        (dict(max_new_tokens=0), ValueError, r"max_new_tokens must be >= 1, got 0"),
    ],
)
def test_generate_refuses_by_name(model: GPT, kwargs: dict, error: type, pattern: str) -> None:
    args = {"idx": torch.tensor([[1, 2, 3]]), "max_new_tokens": 4, **kwargs}
    idx, n = args.pop("idx"), args.pop("max_new_tokens")
    with pytest.raises(error, match=pattern):
        model.generate(idx, n, **args)


def test_a_tiny_temperature_samples_the_greedy_token(model: GPT) -> None:
    idx = torch.tensor([[5, 6, 7, 8]])
    greedy = model.generate(idx, 6)
    cold = model.generate(idx, 6, temperature=1e-30, generator=torch.Generator().manual_seed(0))
    assert torch.equal(cold, greedy)  # no NaN from logits / 1e-30, and the limit of sampling is the argmax


def test_a_view_of_a_vouched_buffer_is_vouched_only_in_its_own_dtype() -> None:
    """A slice of a buffer vouched finite is finite; the same bits read as float16 are not: 0x7C007C00 is a finite
    float32 and two float16 infs. Such a view (which PyTorch 2.13 does not tie to its base; vouched() also checks
    the dtype, should one be) is summed again, and the NaN rule meets its infs."""
    from attnlab.functional.finite import clean, vouch, vouched

    buffer = torch.zeros(1, 1, 4, 2)
    buffer.view(torch.int32)[0, 0, 1, 0] = 0x7C007C00
    assert bool(torch.isfinite(buffer).all())
    vouch(buffer)
    assert vouched(buffer.narrow(2, 0, 3))  # a slice: finite with it
    halves = buffer.view(torch.float16)  # (1, 1, 4, 4)
    assert bool(torch.isinf(halves).any()) and not vouched(halves)
    q = torch.zeros(1, 1, 1, 4, dtype=torch.float16)
    *_, bad = clean(q, halves, torch.zeros_like(halves))
    assert bad is not None and bad.bad_kv[0, 0].tolist() == [False, True, False, False]
    buffer.add_(0)  # a write in place: the vouch is gone for the buffer and its slices
    assert not vouched(buffer) and not vouched(buffer.narrow(2, 0, 3))


def test_a_vouch_is_for_one_tensor_object_and_goes_with_it() -> None:
    """The registry holds tensors by identity: a clone, a deep copy and an unpickled copy (same numbers, other
    objects) are not vouched for; a tensor that dies takes its entry with it, so a new tensor that gets its id (as
    CPython reuses them) is not vouched for; vouching again after a write keeps one entry."""
    import copy
    import gc
    import pickle

    from attnlab.functional import finite

    before = len(finite._VOUCHED)
    buffer = torch.zeros(2, 3)
    finite.vouch(buffer)
    assert finite.vouched(buffer) and len(finite._VOUCHED) == before + 1
    for other in (buffer.clone(), copy.deepcopy(buffer), pickle.loads(pickle.dumps(buffer))):
        assert torch.equal(other, buffer) and not finite.vouched(other)
    buffer.add_(1)
    assert not finite.vouched(buffer)
    finite.vouch(buffer)  # again, after the write: the same entry, its version moved
    assert finite.vouched(buffer) and len(finite._VOUCHED) == before + 1
    key = id(buffer)
    del buffer
    gc.collect()
    assert key not in finite._VOUCHED and len(finite._VOUCHED) == before
    for _ in range(1000):  # a new tensor at a dead one's id: vouched for only if vouched itself
        fresh = torch.ones(2, 3)
        if id(fresh) == key:
            assert not finite.vouched(fresh)
            break
        del fresh


def test_asking_whether_a_buffer_is_vouched_for_costs_two_python_calls() -> None:
    """The effect of the registry's form: a decode step asks it four times a layer, and each question enters two
    Python functions (torch's WeakIdKeyDictionary made and compared a reference at each: five or more)."""
    from attnlab.functional.finite import vouch, vouched

    buffer = torch.zeros(1, 2, 8, 4)
    vouch(buffer)
    view = buffer.narrow(2, 0, 3)  # a cache's filled slots: found through its base
    assert vouched(buffer) and vouched(view)
    entered = python_calls(lambda: vouched(buffer) and vouched(view))  # the lambda's own call, then two each
    assert entered <= 5, entered
