"""One answer to "who may attend": the Visibility, its readers, and the silent wrong results it ended.

Each of the four results the issue found silently wrong has a test here (or, for the ring, in test_ring.py) that
fails on the code before the Visibility and passes now.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from attnlab import Attention, attention
from attnlab.functional import EMPTY, FULL, PARTIAL, Visibility, mods
from attnlab.models import GPT, GPTConfig
from conftest import small, tiles

B, H, T, D = 2, 4, 24, 8


def _inputs(dtype: torch.dtype = torch.float64, t: int = T) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, H, t, D, generator=g, dtype=dtype) for _ in range(3))


# ---- 1. a score_mod's tensors train however the function reaches them ----

TEMPERATURE = torch.tensor([1.0, 0.5, 2.0, 1.5], dtype=torch.float64, requires_grad=True)  # module-level


def per_head_temperature(
    score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
) -> torch.Tensor:
    return score * TEMPERATURE[h]  # the README's first form: a global it does not declare


class _Holder:
    def __init__(self) -> None:
        self.t = TEMPERATURE

    def mod(
        self, score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> torch.Tensor:
        return score * self.t[h]


def _in_dict(
    table: dict, score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor
) -> torch.Tensor:
    return score * table["t"][h]


FORMS = {
    "global": lambda: per_head_temperature,
    "attribute": lambda: _Holder().mod,
    "dict via partial": lambda: functools.partial(_in_dict, {"t": TEMPERATURE}),
    "non-leaf (t * 1)": lambda: lambda s, b, h, q, k, t=TEMPERATURE * 1: s * t[h],
}


def _reference_grad() -> torch.Tensor:
    """d sum(out) / d temperature, written out here: softmax(s * t[h]) over the causal keys, summed."""
    q, k, v = _inputs()
    t = TEMPERATURE.detach().clone().requires_grad_()
    s = (q @ k.transpose(-2, -1)) / math.sqrt(D) * t[None, :, None, None]
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    (torch.softmax(s, dim=-1) @ v).sum().backward()
    assert t.grad is not None
    return t.grad


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("backend", ["eager", "flash", "auto"])
def test_a_score_mod_trains_the_tensors_it_reads_however_it_reaches_them(form: str, backend: str) -> None:
    q, k, v = _inputs()
    out = attention(q, k, v, is_causal=True, score_mod=FORMS[form](), backend=tiles(backend, 8, 8))
    got = torch.autograd.grad(out.sum(), TEMPERATURE, allow_unused=True)[0]
    assert got is not None, "the score_mod's tensor got no gradient"
    torch.testing.assert_close(got, _reference_grad(), atol=1e-10, rtol=0)


def test_sdpa_refuses_a_score_mod_it_cannot_add_instead_of_giving_it_zero_gradient() -> None:
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"score_mod per_head_temperature is not declared an additive bias.*"):
        attention(q, k, v, is_causal=True, score_mod=per_head_temperature, backend="sdpa")
    table = torch.randn(H, 9, dtype=torch.float64, requires_grad=True)  # a declared bias trains through sdpa
    grads = {
        b: torch.autograd.grad(attention(q, k, v, score_mod=mods.relative_bias(table), backend=b).sum(), table)[0]
        for b in ("eager", "sdpa")
    }
    assert grads["eager"].abs().sum() > 0
    torch.testing.assert_close(grads["sdpa"], grads["eager"], atol=1e-10, rtol=0)
    own = mods.bias(lambda b, h, q_idx, kv_idx: table[h, (kv_idx - q_idx).clamp(-4, 4) + 4])
    torch.testing.assert_close(
        attention(q, k, v, score_mod=own, backend="sdpa"), attention(q, k, v, score_mod=mods.relative_bias(table))
    )


def test_a_module_score_mod_on_a_model_is_in_its_parameters_and_its_checkpoint(tmp_path: object) -> None:
    model = GPT(
        GPTConfig(vocab_size=50, context_length=16, emb_dim=16, n_heads=2, n_layers=2, score_mod="learned-alibi")
    )
    names = [n for n, _ in model.named_parameters()]
    assert "score_mod.slopes" in names
    idx = torch.randint(0, 50, (1, 9))
    model(idx).sum().backward()
    assert model.score_mod is not None and model.score_mod.slopes.grad is not None
    assert model.score_mod.slopes.grad.abs().sum() > 0
    with torch.no_grad():
        model.score_mod.slopes.mul_(3.0)  # trained away from the paper's values: the file must keep them
    model.save_pretrained(tmp_path)  # type: ignore[arg-type]
    again = GPT.from_pretrained(tmp_path)  # type: ignore[arg-type]
    assert again.config.score_mod == "learned-alibi"
    torch.testing.assert_close(again.score_mod.slopes, model.score_mod.slopes)  # type: ignore[union-attr]
    torch.testing.assert_close(again(idx), model.eval()(idx))


def test_alibi_named_in_the_config_is_alibi_in_every_layer() -> None:
    torch.manual_seed(0)
    with_alibi = GPT(GPTConfig(vocab_size=50, context_length=16, emb_dim=16, n_heads=2, n_layers=2, score_mod="alibi"))
    plain = GPT(GPTConfig(vocab_size=50, context_length=16, emb_dim=16, n_heads=2, n_layers=2))
    plain.load_state_dict(with_alibi.state_dict())
    idx = torch.randint(0, 50, (1, 9))
    torch.testing.assert_close(with_alibi.eval()(idx), plain.eval()(idx, score_mod=mods.alibi(2)))
    assert not torch.allclose(with_alibi(idx), plain(idx))
    with pytest.raises(ValueError, match=r"score_mod must name a built-in, one of \['alibi', 'learned-alibi'"):
        GPTConfig(score_mod="t5")


# ---- 2. a score_mod that writes in place ----


def _doubled_in_place(
    s: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor
) -> torch.Tensor:
    return s.mul_(2)


def _doubled(s: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return s * 2


@pytest.mark.parametrize("backend", ["eager", "flash"])
def test_an_in_place_score_mod_gives_what_its_out_of_place_form_gives(backend: str) -> None:
    q, k, v = (x.requires_grad_() for x in _inputs())
    out = attention(q, k, v, is_causal=True, score_mod=_doubled_in_place, backend=tiles(backend, 8, 8))
    want = attention(q, k, v, is_causal=True, score_mod=_doubled, backend="eager")
    torch.testing.assert_close(out, want, atol=1e-12, rtol=0)
    for got, exp in zip(
        torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(want.sum(), (q, k, v)), strict=True
    ):
        torch.testing.assert_close(got, exp, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match=r"score_mod _doubled_in_place is not declared an additive bias"):
        attention(q, k, v, score_mod=_doubled_in_place, backend="sdpa")  # it used to ignore it (off by 0.47)


# ---- 3. a row whose every score a score_mod makes -inf ----


def _hide_query_3(s: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.where(q == 3, torch.full_like(s, -math.inf), s)


@pytest.mark.parametrize("backend", ["eager", "flash", "sdpa"])
def test_a_row_a_score_mod_makes_all_minus_inf_gives_zero_and_zero_gradients(backend: str) -> None:
    q, k, v = (x.requires_grad_() for x in _inputs())
    score_mod = (
        _hide_query_3 if backend != "sdpa" else mods.bias(lambda b, h, qi, ki: torch.where(qi == 3, -math.inf, 0.0))
    )
    out = attention(q, k, v, score_mod=score_mod, backend=tiles(backend, 8, 8))
    assert torch.isfinite(out).all() and out[:, :, 3].abs().max() == 0  # eager gave NaN
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    assert grads[0][:, :, 3].abs().max() == 0
    rest = attention(q, k, v, backend="eager")  # the other rows are untouched
    torch.testing.assert_close(out[:, :, 4:], rest[:, :, 4:], atol=1e-12, rtol=0)


def test_the_flex_backend_agrees_on_a_minus_inf_row() -> None:
    q, k, v = _inputs()
    with torch.no_grad():
        out = attention(q, k, v, score_mod=_hide_query_3, backend="flex")
    assert out[:, :, 3].abs().max() == 0
    torch.testing.assert_close(out, attention(q, k, v, score_mod=_hide_query_3, backend="eager"), atol=1e-10, rtol=0)


# ---- built once, read by every layer ----


class _Counting:
    """A mask_mod that counts its calls (causal and a 5-token lookback)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return q - k < 5


@pytest.mark.parametrize("backend", ["eager", "sdpa", "flash"])
def test_a_gpts_mask_mod_calls_do_not_grow_with_depth(backend: str) -> None:
    calls = {}
    for layers in (1, 4):
        torch.manual_seed(0)
        model = GPT(small(n_layers=layers, backend=backend)).eval()
        counter = _Counting()
        idx = torch.randint(0, 256, (2, 20))
        with torch.no_grad():
            model(idx, mask_mod=counter)
            caches = model.make_caches(batch_size=2, max_len=24)
            model(idx, caches=caches, mask_mod=counter)  # a prefill into the cache
            model(idx[:, :1], caches=caches, mask_mod=counter)  # one decode step
        calls[layers] = counter.calls
    assert calls[1] > 0
    assert calls[4] == calls[1], calls


def test_one_visibility_is_bound_once_per_key_positions() -> None:
    vis = Visibility(q_pos=torch.tensor([5]), causal=True, window=3)
    keys = torch.tensor([0, 1, 2, 3, 4, 5, -1, -1])
    bound = vis.for_keys(keys)
    assert vis.for_keys(keys.clone()) is bound  # the next layer's cache: equal positions, the same object
    assert vis.for_keys(torch.tensor([0, 1, 2, 3, 4, 5, 6, -1])) is not bound
    allowed, _ = bound.dense()
    assert allowed is not None and allowed[0, 0, 0].tolist() == [False, False, False, True, True, True, False, False]
    with pytest.raises(ValueError, match=r"already has its key positions"):
        bound.for_keys(keys)


def _brute_kinds(vis: Visibility, bq: int, bk: int) -> dict[tuple[int, int], int]:
    """Each tile's kind from the whole grid, computed here."""
    q, k = vis.q_pos[:, None], vis.k_pos[None, :]  # type: ignore[index]
    ok = (q >= 0) & (k >= 0)
    if vis.causal:
        ok &= k <= q
    if vis.window is not None:
        ok &= q - k < vis.window
    kinds = {}
    for bi in range(-(-vis.tq // bq)):
        for bj in range(-(-vis.tk // bk)):
            tile = ok[bi * bq : (bi + 1) * bq, bj * bk : (bj + 1) * bk]
            kinds[bi, bj] = FULL if bool(tile.all()) else EMPTY if not bool(tile.any()) else PARTIAL
    return kinds


@pytest.mark.parametrize("seed", range(6))
def test_tiles_classified_by_position_bounds_are_exact_for_increasing_positions(seed: int) -> None:
    """Increasing positions with empty slots (-1) at random: the bounds give the kind the whole grid gives."""
    g = torch.Generator().manual_seed(seed)
    tq, tk = int(torch.randint(5, 40, (), generator=g)), int(torch.randint(5, 60, (), generator=g))
    k_pos = torch.randint(0, 3, (tk,), generator=g).cumsum(0)
    k_pos[torch.rand(tk, generator=g) < 0.2] = -1  # empty slots anywhere
    q_pos = torch.arange(tq) + int(k_pos.max()) - tq + 3
    window = [None, 4, 9][seed % 3]
    vis = Visibility(q_pos=q_pos, k_pos=k_pos, causal=True, window=window)
    assert vis.tile_kinds(4, 8) == _brute_kinds(vis, 4, 8)
    ranged = Visibility.from_lengths(tq, tk, causal=True, window=window)  # arithmetic: the same answer
    assert ranged.tile_kinds(4, 8) == _brute_kinds(ranged, 4, 8)


@pytest.mark.parametrize("seed", range(8))
def test_whether_anything_is_hidden_read_off_the_extremes_is_what_the_grid_says(seed: int) -> None:
    """hides_nothing() reads the whole grid's kind off four extremes (a decode step asks it once); against every
    (query, key) pair, with one decoding query or several, a window or none, empty slots or none."""
    g = torch.Generator().manual_seed(seed)
    tk = int(torch.randint(1, 30, (), generator=g))
    k_pos = torch.randint(0, 3, (tk,), generator=g).cumsum(0)
    if seed % 2:
        k_pos[torch.rand(tk, generator=g) < 0.3] = -1  # empty slots: the extremes cannot say, the blocks do
    tq = 1 if seed < 4 else int(torch.randint(2, 6, (), generator=g))
    last = int(k_pos.max()) + int(torch.randint(-2, 3, (), generator=g))  # the last query: before, at or past
    q_pos = (torch.arange(tq) + last - tq + 1).clamp(min=0)
    for window in (None, 2, 40):
        vis = Visibility(q_pos=q_pos, k_pos=k_pos, causal=True, window=window)
        assert vis.hides_nothing() == all(kind == FULL for kind in _brute_kinds(vis, tq, tk).values())
        if not seed % 2:  # no empty slot: the extremes answer, and give the kind the blocks give
            assert vis._whole_kind() == vis._structure_kinds(tq, tk)[0][0] == _brute_kinds(vis, tq, tk)[0, 0]


def test_a_decode_step_asks_whether_anything_is_hidden_in_a_few_ops() -> None:
    """The effect: one decoding query over a cache's filled keys (positions from a tensor, so no arithmetic
    shortcut) is answered from the extremes in 3 aten ops and one read, where the blocks' bounds took 40."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            Count.ops += 1
            return func(*args, **(kwargs or {}))

    vis = Visibility(q_pos=torch.tensor([40]), k_pos=torch.arange(41), causal=True)
    with Count():
        assert vis.hides_nothing()
    assert Count.ops <= 5, Count.ops


@pytest.mark.parametrize("backend", ["eager", "sdpa", "flash", "flex"])
def test_every_backend_reads_a_cache_shaped_visibility_the_same(backend: str) -> None:
    """Keys in a ring buffer's order, with empty slots: equal to the same keys sorted and the holes dropped."""
    q, k, v = _inputs(t=10)
    order = torch.tensor([6, 7, 8, 9, -1, 2, 3, 4, 5, -1])  # positions held by slot
    vis = Visibility(q_pos=torch.tensor([8, 9]), k_pos=order, window=6)
    with torch.no_grad():
        got = attention(q[:, :, :2], k, v, visibility=vis, backend=tiles(backend, 2, 4))
        keep = order >= 0
        ref = attention(
            q[:, :, :2],
            k[:, :, keep][:, :, order[keep].argsort()],
            v[:, :, keep][:, :, order[keep].argsort()],
            visibility=Visibility(q_pos=torch.tensor([8, 9]), k_pos=order[keep].sort().values, window=6),
            backend="eager",
        )
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)


def test_the_module_takes_mods_and_they_mean_what_attention_means() -> None:
    torch.manual_seed(0)
    attn = Attention(d_in=16, num_heads=4, num_kv_heads=2).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    near = mods.sliding_window(3)
    got = attn(x, mask_mod=near, score_mod=mods.alibi(4))
    queries, keys, values = attn.split_qkv(x)
    want = attn.merge_heads(attention(queries, keys, values, is_causal=True, mask_mod=near, score_mod=mods.alibi(4)))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match=r"pass visibility= or mask, document_ids, mask_mod and score_mod, not both"):
        attn(x, mask_mod=near, visibility=Visibility.from_lengths(11, 11))


# ---- compiled flex, float32, lengths that are not a multiple of its 128 block ----


@pytest.mark.slow  # flex_attention compiled for real
def test_compiled_flex_in_float32_at_a_ragged_length_equals_eager() -> None:
    """The compiled kernel (float32 on CPU), 200 tokens of packed causal documents, one block mask per Visibility."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 200, 16, generator=g) for _ in range(3))
    doc = torch.repeat_interleave(torch.arange(3), torch.tensor([70, 90, 40]))[None]
    vis = Visibility.from_lengths(
        200, 200, causal=True, mask_mod=mods.document(doc), score_mod=mods.alibi(2), batch=1, heads=2
    )
    with torch.no_grad():
        got = attention(q, k, v, visibility=vis, backend="flex")
        again = attention(q * 0.5, k, v, visibility=vis, backend="flex")  # the kept block mask, reused
        want = attention(q, k, v, visibility=vis, backend="eager")
        want_again = attention(q * 0.5, k, v, visibility=vis, backend="eager")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(again, want_again, atol=1e-5, rtol=1e-5)
    assert "flex" in vis._kept  # built once, kept on the object


def test_a_ring_copy_follows_whatever_the_module_was_built_with() -> None:
    from attnlab.distributed import ContextParallelAttention

    torch.manual_seed(0)
    attn = Attention(
        d_in=16,
        num_heads=4,
        num_kv_heads=2,
        head_dim=6,
        qkv_bias=True,
        out_bias=False,
        dropout=0.1,
        is_causal=True,
        window=5,
        rope=True,
        rope_base=500.0,
        scale=0.3,
        backend="flash",
    )
    ring = ContextParallelAttention.from_attention(attn, layout="contiguous")
    assert ring.settings == {**attn.settings, "dropout": 0.0}  # the ring has no dropout: the one change
    assert ring.layout == "contiguous"
    for name, tensor in attn.state_dict().items():
        assert torch.equal(ring.state_dict()[name], tensor), name


def test_restrict_adds_to_a_visibility_what_the_sugar_would() -> None:
    q, k, v = _inputs()
    keep = torch.rand(T, T, generator=torch.Generator().manual_seed(5)) > 0.3
    base = Visibility.from_lengths(T, T, causal=True, mask_mod=mods.document(torch.tensor([[0] * 10 + [1] * 14] * B)))
    more = base.restrict(mask=keep, mask_mod=mods.sliding_window(6), score_mod=mods.alibi(H))
    want = attention(
        q,
        k,
        v,
        mask=keep,
        backend="eager",
        score_mod=mods.alibi(H),
        mask_mod=mods.and_masks(
            mods.causal(), mods.document(torch.tensor([[0] * 10 + [1] * 14] * B)), mods.sliding_window(6)
        ),
    )
    for backend in ("eager", "sdpa", "flash"):
        torch.testing.assert_close(attention(q, k, v, visibility=more, backend=backend), want, atol=1e-10, rtol=0)
    assert base.mask_mod is not None and base.score_mod is None  # the one it was built from is unchanged
