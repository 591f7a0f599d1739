"""All backends agree with the eager (readable) path, outputs and gradients."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnlab.functional import Flash, attention, flash_attention, padding_mask
from attnlab.functional.blocks import Running, attend_block, merge
from conftest import tiles

FAST = ("sdpa", "flash", "flash-tiles")  # flash-tiles: every tile walked in PyTorch, no fused kernel


@st.composite
def problems(draw: st.DrawFn) -> dict:
    b = draw(st.integers(1, 2))
    h_kv = draw(st.integers(1, 3))
    groups = draw(st.sampled_from([1, 2, 4]))
    tk = draw(st.integers(1, 40))
    tq = draw(st.integers(1, tk + 3))  # fewer queries than keys (decoding), or a few more
    d = draw(st.sampled_from([4, 8, 16]))
    is_causal = draw(st.booleans())
    window = draw(st.one_of(st.none(), st.integers(1, 12)))
    mask_kind = draw(st.sampled_from(["none", "padding", "bool", "float"]))
    seed = draw(st.integers(0, 2**16))
    blocks = draw(st.sampled_from([(4, 8), (7, 5), (64, 64)]))
    return dict(
        b=b,
        h_kv=h_kv,
        groups=groups,
        tq=tq,
        tk=tk,
        d=d,
        is_causal=is_causal,
        window=window,
        mask_kind=mask_kind,
        seed=seed,
        blocks=blocks,
    )


def make(p: dict, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(p["seed"])
    h = p["h_kv"] * p["groups"]
    q = torch.randn(p["b"], h, p["tq"], p["d"], generator=g, dtype=dtype)
    k = torch.randn(p["b"], p["h_kv"], p["tk"], p["d"], generator=g, dtype=dtype)
    v = torch.randn(p["b"], p["h_kv"], p["tk"], p["d"], generator=g, dtype=dtype)
    return q, k, v


def make_mask(p: dict, dtype: torch.dtype) -> torch.Tensor | None:
    g = torch.Generator().manual_seed(p["seed"] + 1)
    shape = (p["b"], p["h_kv"] * p["groups"], p["tq"], p["tk"])
    if p["mask_kind"] == "padding":
        lengths = torch.randint(0, p["tk"] + 1, (p["b"],), generator=g)
        return padding_mask(lengths, p["tk"], left=True)
    if p["mask_kind"] == "bool":
        return torch.rand(shape[0], 1, shape[2], shape[3], generator=g) > 0.3
    if p["mask_kind"] == "float":
        bias = torch.randn(shape[2], shape[3], generator=g, dtype=dtype)
        return bias.masked_fill(torch.rand(shape[2], shape[3], generator=g) < 0.2, float("-inf"))
    return None


def run(
    p: dict, backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, ...]:
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = attention(
        q,
        k,
        v,
        mask=mask,
        is_causal=p["is_causal"],
        window=p["window"],
        backend=Flash(block_q=p["blocks"][0], block_k=p["blocks"][1], fused=False)
        if backend == "flash-tiles"
        else tiles(backend, *p["blocks"]),
    )
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
    return (out.detach(), *grads)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=problems())
def test_backends_agree_with_eager(p: dict, dtype: torch.dtype, tol: float) -> None:
    q, k, v = make(p, dtype)
    mask = make_mask(p, dtype)
    reference = run(p, "eager", q, k, v, mask)
    for t in reference:
        assert torch.isfinite(t).all()
    for backend in FAST:
        got = run(p, backend, q, k, v, mask)
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, reference, strict=False):
            torch.testing.assert_close(a, b, atol=tol, rtol=tol, msg=lambda m: f"{backend} {name}: {m}")


@pytest.mark.parametrize("backend", ["eager", "flash"])
@pytest.mark.parametrize("case", ["causal_gqa", "window_padding", "decode"])
def test_gradcheck_float64(backend: str, case: str) -> None:
    torch.manual_seed(0)
    if case == "causal_gqa":
        q, k, v = torch.randn(1, 4, 6, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
        kw: dict = dict(is_causal=True)
    elif case == "window_padding":
        q, k, v = torch.randn(2, 2, 7, 4), torch.randn(2, 2, 7, 4), torch.randn(2, 2, 7, 4)
        kw = dict(window=3, mask=padding_mask(torch.tensor([7, 4]), 7, left=True))
    else:
        q, k, v = torch.randn(1, 2, 2, 4), torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4)
        kw = dict(is_causal=True)
    inputs = tuple(t.double().requires_grad_() for t in (q, k, v))

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention(q, k, v, backend=tiles(backend, 3, 4), **kw)

    assert torch.autograd.gradcheck(f, inputs)


def test_eager_supports_double_backward() -> None:
    torch.manual_seed(0)
    inputs = tuple(torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradgradcheck(lambda q, k, v: attention(q, k, v, is_causal=True, backend="eager"), inputs)


def test_flash_returns_the_row_log_sum_exp() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 8)
    out, lse = flash_attention(q, k, v, is_causal=True, block_q=4, block_k=4)
    scores = (q @ k.transpose(-2, -1)) / 8**0.5
    scores = scores.masked_fill(torch.triu(torch.ones(9, 9, dtype=torch.bool), 1), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1))
    torch.testing.assert_close(out, attention(q, k, v, is_causal=True, backend="eager"))


def _readable_part(s: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One block attended the readable way: softmax over its scores, @ v, and the scores' log-sum-exp; a row
    that sees nothing gives 0 and lse +inf, the kernels' contract."""
    lse = s.logsumexp(dim=-1)
    out = torch.softmax(s, dim=-1).nan_to_num(0.0) @ v  # a row of -inf scores: NaN weights, 0 output
    return out, lse.masked_fill(torch.isneginf(lse), float("inf"))


def test_blocks_attended_or_merged_equal_one_softmax_over_all_their_scores() -> None:
    """The online softmax shared by flash and the ring: blocks folded in by their scores (attend_block) or as
    finished parts (merge), in any mix, equal one softmax over the concatenated scores. The first block hides
    every key (its lse is -inf against a state that has seen nothing), a middle one too, and query row 1 sees
    nothing at all: it stays 0 with lse +inf."""
    g = torch.Generator().manual_seed(3)
    s = 3 * torch.randn(2, 3, 5, 12, generator=g, dtype=torch.float64)  # (B, H, Tq, Tk)
    v = torch.randn(2, 3, 12, 4, generator=g, dtype=torch.float64)  # (B, H, Tk, Dv)
    cuts = [(0, 3), (3, 7), (7, 9), (9, 12)]
    for j0, j1 in (cuts[0], cuts[2]):
        s[..., j0:j1] = float("-inf")  # two blocks hide all their keys
    s[:, :, 1] = float("-inf")  # query row 1 sees no key
    want_out, want_lse = _readable_part(s, v)
    assert torch.isposinf(want_lse[:, :, 1]).all() and want_lse.isfinite().sum() == 2 * 3 * 4
    for how in ("merge", "attend", "mixed"):
        state = Running.start(2, 3, 5, 4, dtype=torch.float64, device=torch.device("cpu"))
        for n, (j0, j1) in enumerate(cuts):
            if how == "merge" or (how == "mixed" and n % 2):
                for r0, r1 in ((0, 2), (2, 5)):  # rows() are views: folding into them folds into the state
                    merge(state.rows(r0, r1), *_readable_part(s[:, :, r0:r1, j0:j1], v[:, :, j0:j1]))
            else:
                attend_block(state, s[..., j0:j1].clone(), v[:, :, j0:j1])
        out, lse = state.finish()
        torch.testing.assert_close(out, want_out, rtol=0, atol=1e-12, msg=how)
        torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-12, msg=how)


def _fused_calls(run: object) -> int:
    """How many times ``run()`` called PyTorch's fused CPU flash kernel, counted by the profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()  # type: ignore[operator]
    return sum(e.count for e in prof.key_averages() if e.key == "aten::_scaled_dot_product_flash_attention_for_cpu")


def test_flash_sends_full_and_causal_diagonal_blocks_to_the_fused_kernel() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 2500, 8, dtype=torch.float64) for _ in range(3))
    reference = attention(q, k, v, is_causal=True, backend="eager")
    calls = {}
    for fused in (True, False):
        got = {}
        calls[fused] = _fused_calls(
            lambda f=fused: got.setdefault("out", attention(q, k, v, is_causal=True, backend=Flash(fused=f)))
        )
        torch.testing.assert_close(got["out"], reference, atol=1e-12, rtol=1e-12)
    # 1024-query blocks: 3 diagonals, and the 2 later blocks' earlier keys in one call each
    assert calls == {True: 5, False: 0}
    # a window makes tiles the kernel cannot compute: they are walked here, the FULL ones still fused
    win = {}
    n = _fused_calls(lambda: win.setdefault("out", attention(q, k, v, window=300, backend="flash")))
    torch.testing.assert_close(win["out"], attention(q, k, v, window=300, backend="eager"), atol=1e-12, rtol=1e-12)
    assert n > 0
    # a score_mod changes scores inside a tile: nothing goes to the kernel
    bias = lambda s, b, h, i, j: s - 0.1 * (i - j)
    assert (
        _fused_calls(
            lambda: attention(
                q[:, :, :300], k[:, :, :300], v[:, :, :300], is_causal=True, score_mod=bias, backend="flash"
            )
        )
        == 0
    )


def test_fused_diagonal_needs_consecutive_positions_that_start_together() -> None:
    from attnlab.functional.visibility import Visibility

    zig = torch.tensor([0, 1, 2, 3, 12, 13, 14, 15])  # a zigzag shard: two runs of consecutive positions
    vis = Visibility(q_pos=zig, k_pos=zig, causal=True)
    assert vis.tile_is_aligned_causal(0, 4, 0, 4) and vis.tile_is_aligned_causal(4, 8, 4, 8)
    assert not vis.tile_is_aligned_causal(0, 8, 0, 8)  # the runs do not join
    assert not vis.tile_is_aligned_causal(4, 8, 0, 4)  # later queries over earlier keys: not a diagonal
    shifted = Visibility(q_pos=torch.arange(1, 5), k_pos=torch.arange(4), causal=True)
    assert not shifted.tile_is_aligned_causal(0, 4, 0, 4)  # each query also sees the next key: bottom-right
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 8, 4, dtype=torch.float64) for _ in range(3))
    for visibility in (vis, shifted):
        kk, vv = k[:, :, : visibility.tk], v[:, :, : visibility.tk]
        qq = q[:, :, : visibility.tq]
        want = attention(qq, kk, vv, visibility=visibility, backend="eager")
        got = attention(qq, kk, vv, visibility=visibility, backend=Flash(block_q=4, block_k=4))
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_half_precision_accumulates_in_float32() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))
    reference = attention(q, k, v, is_causal=True, backend="eager")
    for dtype in (torch.bfloat16, torch.float16):
        for backend in ("eager", "sdpa", "flash"):
            out = attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True, backend=backend)
            assert out.dtype == dtype
            torch.testing.assert_close(out.float(), reference, atol=2e-2, rtol=2e-2)


def test_flash_dropout_is_consistent_between_forward_and_backward() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 12, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(7)  # the same dropout masks in every evaluation gradcheck makes
        return attention(q, k, v, is_causal=True, dropout_p=0.3, backend=Flash(block_q=4, block_k=4))  # 3 x 3 tiles

    assert torch.autograd.gradcheck(f, (q, k, v))
    assert not torch.allclose(f(q, k, v), attention(q, k, v, is_causal=True, backend="flash"))


@pytest.mark.parametrize("backend", ["eager", "sdpa", "flash"])
def test_dropout_invariants(backend: str) -> None:
    """E[dropout(P) @ V] = P @ V; with V = identity the output is the dropped weights."""
    torch.manual_seed(0)
    t, p = 64, 0.25
    q, k = torch.randn(1, 8, t, 16), torch.randn(1, 8, t, 16)
    v = torch.eye(t).expand(1, 8, t, t).contiguous()
    weights = attention(q, k, v, backend="eager")  # no dropout: the weights themselves
    dropped = attention(q, k, v, dropout_p=p, backend=backend)
    zero = dropped == 0
    assert abs(zero.float().mean().item() - p) < 0.02
    torch.testing.assert_close(dropped[~zero], weights[~zero] / (1 - p), atol=1e-5, rtol=1e-4)
