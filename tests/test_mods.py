"""Mask and score functions on every backend: against PyTorch's flex_attention and a float64 reference written here."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from attnlab import attention
from attnlab.cache import ModelCache
from attnlab.functional import Flash, Visibility, mods
from attnlab.functional.visibility import CLASSIFY_TILES, EMPTY, FULL, PARTIAL
from conftest import tiles

B, H, T, D = 2, 4, 40, 8
DOCS = torch.tensor([[0] * 10 + [1] * 18 + [2] * 12, [0] * 25 + [1] * 15])  # (B, T) packed documents
PREFIX = torch.tensor([6, 15])
LENGTHS = torch.tensor([40, 29])
TABLE = torch.linspace(-1, 1, H * 9, dtype=torch.float64).view(H, 9)  # relative_bias: distances -4..4


# The reference: each mod's definition written out here on explicit index grids, never through attnlab.
def allowed_ref(name: str) -> torch.Tensor:
    """(B, 1, T, T) bool."""
    b = torch.arange(B)[:, None, None, None]
    i = torch.arange(T)[None, None, :, None]
    j = torch.arange(T)[None, None, None, :]
    same_doc = torch.stack([DOCS[n][:, None] == DOCS[n][None, :] for n in range(B)])[:, None]  # (B, 1, T, T)
    prefix = PREFIX[b]
    return {
        "causal": i >= j,
        "window": (i >= j) & (i - j < 5),
        "prefix": (j < prefix) | (i >= j),
        "document": same_doc,
        "padding": j < LENGTHS[b],
        "doc_causal": same_doc & (i >= j),
        "prefix_or_window": (j < prefix) | ((i >= j) & (i - j < 5)),
        "none": torch.ones(1, 1, T, T, dtype=torch.bool),
    }[name].expand(B, 1, T, T)


def score_ref(name: str, s: torch.Tensor) -> torch.Tensor:
    """(B, H, T, T) scores after the mod."""
    h = torch.arange(H)[None, :, None, None]
    dist = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # (T, T): j - i
    slopes = torch.tensor([2 ** -(2 * k + 2) for k in range(H)], dtype=s.dtype)  # ALiBi, 4 heads: 2^(-8/4 * (k+1))
    if name == "alibi":
        return s + slopes[h] * dist
    if name == "softcap":
        return 3.0 * torch.tanh(s / 3.0)
    if name == "relative":
        return s + TABLE[h, dist.clamp(-4, 4) + 4]
    return s


def prefix_only(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    return kv_idx < PREFIX[b]  # a user's own mask_mod, combined below with a built-in


MASKS: dict[str, Callable[[], mods.MaskMod | None]] = {
    "causal": mods.causal,
    "window": lambda: mods.sliding_window(5),
    "prefix": lambda: mods.prefix_lm(PREFIX),
    "document": lambda: mods.document(DOCS),
    "padding": lambda: mods.padding(LENGTHS),
    "doc_causal": lambda: mods.and_masks(mods.causal(), mods.document(DOCS)),
    "prefix_or_window": lambda: mods.or_masks(prefix_only, mods.sliding_window(5)),
    "none": lambda: None,
}
SCORES: dict[str, Callable[[], mods.ScoreMod | None]] = {
    "none": lambda: None,
    "alibi": lambda: mods.alibi(H),
    "softcap": lambda: mods.softcap(3.0),
    "relative": lambda: mods.relative_bias(TABLE),
}
CASES = [(m, "none") for m in MASKS if m != "none"] + [
    ("none", "alibi"),
    ("none", "softcap"),
    ("causal", "relative"),
    ("doc_causal", "alibi"),
    ("window", "softcap"),
    ("prefix", "relative"),
]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: str, score: str) -> torch.Tensor:
    """softmax(score_mod(q k^T / sqrt(D)) masked) v in float64; a row that sees nothing gives 0."""
    s = score_ref(score, q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))  # (B, H, T, T)
    keep = allowed_ref(mask)
    weights = torch.softmax(s.masked_fill(~keep, -math.inf), dim=-1).nan_to_num(0.0)  # a dead row: NaN -> 0
    return weights @ v


def _inputs(dtype: torch.dtype = torch.float64, grad: bool = True) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, H, T, D, generator=g, dtype=dtype).requires_grad_(grad) for _ in range(3))


@pytest.fixture(scope="module")
def references() -> dict[tuple[str, str], tuple[torch.Tensor, tuple[torch.Tensor, ...]]]:
    """Each case's float64 reference output and gradients, computed once (the loops are slow)."""
    out = {}
    for mask, score in CASES:
        q, k, v = _inputs()
        ref = reference(q, k, v, mask, score)
        out[mask, score] = (ref.detach(), torch.autograd.grad((ref * ref).sum(), (q, k, v)))
    return out


# sdpa takes a score_mod only as an additive bias: softcap is refused there (test_a_bad_mod_gets_an_error_that_names_it)
BACKEND_CASES = [
    (m, s, b) for m, s in CASES for b in ("eager", "flash", "sdpa") if not (b == "sdpa" and s == "softcap")
]


@pytest.mark.parametrize(("mask", "score", "backend"), BACKEND_CASES)
def test_every_mod_equals_its_definition_forward_and_backward_in_float64(
    mask: str, score: str, backend: str, references: dict
) -> None:
    q, k, v = _inputs()
    out = attention(q, k, v, mask_mod=MASKS[mask](), score_mod=SCORES[score](), backend=tiles(backend, 16, 16))
    expected, grads = references[mask, score]
    torch.testing.assert_close(out, expected, atol=1e-10, rtol=0)
    got = torch.autograd.grad((out * out).sum(), (q, k, v))
    for name, g, e in zip("qkv", got, grads, strict=True):
        torch.testing.assert_close(g, e, atol=1e-10, rtol=0, msg=f"d{name}")


def _flex_uncompiled(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_mod: object, score_mod: object
) -> torch.Tensor:
    block_mask = create_block_mask(mask_mod, B, H, T, T, device="cpu") if mask_mod is not None else None
    with warnings.catch_warnings():  # the uncompiled path is the reference the issue names; its advice is moot
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile", category=UserWarning)
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)


@pytest.mark.parametrize(("mask", "score"), CASES)
def test_every_mod_moves_to_pytorchs_flex_attention_unchanged(mask: str, score: str) -> None:
    """The same functions handed to torch's flex_attention (uncompiled, CPU, float32) give what flash gives."""
    q, k, v = _inputs(torch.float32, grad=False)
    mask_mod, score_mod = MASKS[mask](), SCORES[score]()
    theirs = _flex_uncompiled(q, k, v, mask_mod, score_mod)
    ours = attention(q, k, v, mask_mod=mask_mod, score_mod=score_mod, backend=Flash(block_q=16, block_k=16))
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_the_flex_backend_hands_the_same_functions_to_flex_attention() -> None:
    """Our translation for flex (offsets, padding to its block, the bool mask and bias as mods, GQA), exactly:
    float64 runs flex_attention uncompiled. The compiled float32 path (seconds of compile on a cold cache) is
    checked against flash by benchmarks/mods_speed.py before it is timed."""
    q, k, v = _inputs(grad=False)
    mask_mod, score_mod = MASKS["doc_causal"](), SCORES["alibi"]()
    bias = torch.randn(1, H, T, T, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    keep = torch.rand(T, T, generator=torch.Generator().manual_seed(3)) > 0.2
    for kw in (
        {"mask_mod": mask_mod, "score_mod": score_mod},
        {"mask": bias, "is_causal": True},
        {"mask": keep, "window": 7},
    ):
        with torch.no_grad():
            flex = attention(q, k[:, :2], v[:, :2], backend="flex", **kw)  # 4 query heads on 2 kv heads
            eager = attention(q, k[:, :2], v[:, :2], backend="eager", **kw)
        torch.testing.assert_close(flex, eager, atol=1e-10, rtol=0)


def test_learnable_score_mods_train_through_flash_gradcheck() -> None:
    """Slopes read by a user's function and a relative-bias table: gradients through two flash calls, checked
    against finite differences."""
    q, k, v = (x.detach()[:1, :2, :8, :4].requires_grad_() for x in _inputs())
    table = torch.randn(2, 7, dtype=torch.float64, requires_grad=True)

    def both(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        slopes = lambda score, b, h, q_idx, kv_idx: score + s[h] * (kv_idx - q_idx)  # reads s, declares nothing
        first = attention(q, k, v, is_causal=True, score_mod=slopes, backend=Flash(block_q=4, block_k=4))
        return attention(first, k, v, score_mod=mods.relative_bias(t), backend=Flash(block_q=4, block_k=4))

    s = mods.alibi_slopes(2).requires_grad_()
    assert torch.autograd.gradcheck(both, (q, k, v, s, table))


def test_a_closure_that_captures_a_tensor_trains_it_too() -> None:
    """A user's own five-line score_mod: the tensor it closes over gets its gradient on flash as on eager."""
    q, k, v = _inputs()
    scale_per_head = torch.tensor([1.0, 0.5, 2.0, 1.5], dtype=torch.float64, requires_grad=True)

    def temperature(
        score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        return score * scale_per_head[h]

    grads = {}
    for backend in ("eager", "flash"):
        out = attention(q, k, v, is_causal=True, score_mod=temperature, backend=tiles(backend, 16, 16))
        grads[backend] = torch.autograd.grad(out.sum(), scale_per_head)[0]
    assert grads["eager"].abs().sum() > 0
    torch.testing.assert_close(grads["flash"], grads["eager"], atol=1e-10, rtol=0)


def test_alibi_slopes_are_the_papers() -> None:
    assert mods.alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]
    # 12 heads: the 8 of eight heads, then every other slope of sixteen heads: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    assert mods.alibi_slopes(12).tolist() == pytest.approx(
        [2.0**-k for k in range(1, 9)] + [2 ** -(k + 0.5) for k in range(4)]
    )


def test_tiles_a_mask_mod_hides_are_skipped_and_full_ones_are_not_masked() -> None:
    """4 documents of 32 tokens, causal, 16 x 16 tiles: per document 2 diagonal (partial) and 1 full tile below."""
    doc = torch.arange(4).repeat_interleave(32)[None]  # (1, 128)
    vis = Visibility.from_lengths(128, 128, mask_mod=mods.and_masks(mods.causal(), mods.document(doc)))
    kinds = vis.tile_kinds(16, 16)
    counts = {kind: sum(1 for k in kinds.values() if k == kind) for kind in (EMPTY, PARTIAL, FULL)}
    assert counts == {EMPTY: 64 - 4 * 3, PARTIAL: 4 * 2, FULL: 4 * 1}


def test_a_row_longer_than_one_classification_call_is_classified_whole() -> None:
    """4 documents of 80 tokens in 4 x 4 tiles: 80 key tiles a row, classified CLASSIFY_TILES at a time. Per
    document, 20 diagonal tiles are partial and the 20 * 19 / 2 below them full; the rest is empty."""
    assert 80 > CLASSIFY_TILES
    doc = torch.arange(4).repeat_interleave(80)[None]  # (1, 320)
    vis = Visibility.from_lengths(320, 320, mask_mod=mods.and_masks(mods.causal(), mods.document(doc)))
    kinds = vis.tile_kinds(4, 4)
    counts = {kind: sum(1 for k in kinds.values() if k == kind) for kind in (EMPTY, PARTIAL, FULL)}
    assert counts == {EMPTY: 80 * 80 - 4 * (20 + 190), PARTIAL: 4 * 20, FULL: 4 * 190}


def test_packed_documents_equal_each_document_alone() -> None:
    """Outputs and gradients of each packed document equal that document run alone (causal), on flash and eager."""
    sizes = [7, 20, 13]
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, H, sum(sizes), D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    doc = torch.repeat_interleave(torch.arange(3), torch.tensor(sizes))[None]
    for backend in ("flash", "eager"):
        packed = attention(
            q, k, v, mask_mod=mods.and_masks(mods.causal(), mods.document(doc)), backend=tiles(backend, 8, 8)
        )
        grads = torch.autograd.grad((packed**2).sum(), (q, k, v))
        start = 0
        for n in sizes:
            part = [x.detach()[:, :, start : start + n].requires_grad_() for x in (q, k, v)]
            alone = attention(*part, is_causal=True, backend="eager")
            torch.testing.assert_close(packed[:, :, start : start + n], alone, atol=1e-12, rtol=0)
            for got, want in zip(grads, torch.autograd.grad((alone**2).sum(), part), strict=True):
                torch.testing.assert_close(got[:, :, start : start + n], want, atol=1e-12, rtol=0)
            start += n


def test_positions_are_absolute_so_one_mod_serves_prefill_and_decoding() -> None:
    q, k, v = _inputs(grad=False)
    mod = mods.and_masks(mods.causal(), mods.document(DOCS))
    full = attention(q, k, v, mask_mod=mod, score_mod=mods.alibi(H), backend="eager")
    for backend in ("eager", "flash", "sdpa"):  # the last 3 queries alone, at their positions 37..39
        at_37 = Visibility.from_lengths(3, T, q_start=37, mask_mod=mod, score_mod=mods.alibi(H))
        tail = attention(q[:, :, -3:], k, v, visibility=at_37, backend=backend)
        torch.testing.assert_close(tail, full[:, :, -3:], atol=1e-12, rtol=0)
    # a chunk of keys at its offset: the queries 20..29 against keys 10..29 equal those rows where they see nothing older
    chunk = Visibility.from_lengths(10, 20, q_start=20, k_start=10, mask_mod=mods.sliding_window(5))
    part = attention(q[:, :, 20:30], k[:, :, 10:30], v[:, :, 10:30], visibility=chunk)
    torch.testing.assert_close(part, attention(q, k, v, window=5)[:, :, 20:30], atol=1e-12, rtol=0)


@pytest.mark.parametrize("backend", ["eager", "flash", "sdpa"])
def test_a_fully_masked_row_gives_zero_and_finite_gradients(backend: str) -> None:
    q, k, v = _inputs()
    hide_row_3 = lambda b, h, q_idx, kv_idx: q_idx != 3  # query 3 sees nothing
    out = attention(q, k, v, mask_mod=hide_row_3, score_mod=mods.alibi(H), backend=tiles(backend, 16, 16))
    assert out[:, :, 3].abs().max() == 0
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    assert grads[0][:, :, 3].abs().max() == 0


def _raises(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
    raise KeyError("doc 7")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"mask_mod": _raises}, ValueError, r"mask_mod _raises raised KeyError: 'doc 7'"),
        (
            {"mask_mod": lambda b, h, q, kv: (q >= kv).int()},
            TypeError,
            r"must return a bool tensor .*got dtype torch.int32",
        ),
        (
            {"mask_mod": lambda b, h, q, kv: torch.ones(3, dtype=torch.bool)},
            ValueError,
            r"returned shape \(3,\), which does not broadcast to \(batch, heads, Tq, Tk\) = \(2, 4, 40, 40\)",
        ),
        (
            {"score_mod": lambda s, b, h, q, kv: s.sum()},
            ValueError,
            r"score_mod <lambda> returned shape \(\) for scores of shape \(2, 4, 40, 40\)",
        ),
        (
            {"score_mod": lambda s, b, h, q, kv: s > 0},
            TypeError,
            r"score_mod <lambda> must return floating-point scores, got dtype torch.bool",
        ),
        ({"score_mod": "alibi"}, TypeError, r"score_mod must be a function \(see attnlab.functional.mods\), got str"),
        (
            {"score_mod": mods.softcap(3.0), "backend": "sdpa"},
            ValueError,
            r"score_mod softcap\(cap=3.0\) is not declared an additive bias, and sdpa can only add a bias .* "
            r"use backend='flash'",
        ),
        ({"backend": "flex"}, ValueError, r"flex_attention has no backward on CPU: run it under torch.no_grad\(\)"),
        ({"backend": "flex", "dropout_p": 0.1}, ValueError, r"backend='flex' has no dropout"),
    ],
)
def test_a_bad_mod_gets_an_error_that_names_it(kwargs: dict, error: type, message: str) -> None:
    q, k, v = _inputs(torch.float32)
    with pytest.raises(error, match=message):
        attention(q, k, v, **kwargs)


def test_built_in_mods_refuse_bad_arguments_by_name() -> None:
    with pytest.raises(ValueError, match=r"doc_ids must be a \(batch, seq\) integer tensor"):
        mods.document(torch.zeros(5))
    with pytest.raises(ValueError, match=r"cap must be a finite number > 0, got 0"):
        mods.softcap(0)
    with pytest.raises(ValueError, match=r"table must be \(num_heads, 2 \* max_distance \+ 1\)"):
        mods.relative_bias(torch.zeros(4, 8))
    with pytest.raises(ValueError, match=r"prefix_len must be an int >= 0"):
        mods.prefix_lm(-2)
    with pytest.raises(ValueError, match=r"and_masks needs at least one mask_mod"):
        mods.and_masks()


# ---- packed training: the module and the model ----


def _packed(sizes: list[int]) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))[None]  # (1, T)


@pytest.mark.parametrize("backend", ["flash", "sdpa"])
def test_attention_with_rope_on_packed_documents_equals_each_document_alone(backend: str) -> None:
    """No cross-document attention, and RoPE positions restart per document: outputs and gradients equal."""
    from attnlab import Attention

    torch.manual_seed(0)
    attn = Attention(d_in=16, num_heads=4, num_kv_heads=2, rope=True, backend=backend).double()
    sizes = [5, 11, 8]
    x = torch.randn(1, sum(sizes), 16, dtype=torch.float64, requires_grad=True)
    packed = attn(x, document_ids=_packed(sizes))
    grad = torch.autograd.grad((packed**2).sum(), x)[0]
    start = 0
    for n in sizes:
        part = x.detach()[:, start : start + n].requires_grad_()
        alone = attn(part)
        torch.testing.assert_close(packed[:, start : start + n], alone, atol=1e-12, rtol=0)
        torch.testing.assert_close(
            grad[:, start : start + n], torch.autograd.grad((alone**2).sum(), part)[0], atol=1e-12, rtol=0
        )
        start += n


def test_a_gpt_trains_on_packed_documents_exactly_as_on_each_alone() -> None:
    """Learned positions restart per document too: the logits and the loss's gradients of a packed batch equal the
    documents run one by one."""
    from attnlab.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, context_length=32, emb_dim=16, n_heads=2, n_layers=2, drop_rate=0.0)).double()
    sizes = [9, 4, 12]
    idx = torch.randint(0, 50, (1, sum(sizes)))
    logits = model(idx, document_ids=_packed(sizes))
    loss = torch.nn.functional.cross_entropy(logits[0], idx[0].roll(-1), reduction="sum")
    packed_grads = torch.autograd.grad(loss, list(model.parameters()))
    alone_loss, start = 0.0, 0
    for n in sizes:
        part = idx[:, start : start + n]
        alone = model(part)
        torch.testing.assert_close(logits[:, start : start + n], alone, atol=1e-10, rtol=0)
        alone_loss = alone_loss + torch.nn.functional.cross_entropy(
            alone[0], idx[0].roll(-1)[start : start + n], reduction="sum"
        )
        start += n
    for got, want in zip(packed_grads, torch.autograd.grad(alone_loss, list(model.parameters())), strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def test_document_ids_are_checked_by_name() -> None:
    from attnlab import Attention

    attn = Attention(d_in=8, num_heads=2)
    x = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match=r"document_ids must not decrease along a row"):
        attn(x, document_ids=torch.tensor([[0, 1, 0, 1]]))
    with pytest.raises(ValueError, match=r"document_ids must be \(batch, tokens\) = \(1, 4\), got shape \(4,\)"):
        attn(x, document_ids=torch.tensor([0, 0, 1, 1]))
    with pytest.raises(ValueError, match=r"pass one or the other"):
        attn(
            x,
            document_ids=torch.zeros(1, 4, dtype=torch.long),
            cache=ModelCache.build([attn.layer_state()], rows=1, capacity=8)[0],
        )
    assert mods.document_positions(torch.tensor([[0, 0, 1, 1, 1, 4]])).tolist() == [[0, 1, 0, 1, 2, 0]]


@pytest.mark.parametrize("backend", ["eager", "flash", "sdpa"])
def test_is_causal_and_window_mean_what_causal_and_sliding_window_mean(backend: str) -> None:
    """One mask language: the arguments keep their fast paths and equal the mods, alone and combined with them."""
    q, k, v = _inputs(grad=False)
    kw = {"backend": tiles(backend, 16, 16)}
    torch.testing.assert_close(
        attention(q, k, v, is_causal=True, **kw), attention(q, k, v, mask_mod=mods.causal(), **kw)
    )
    torch.testing.assert_close(
        attention(q, k, v, window=5, **kw), attention(q, k, v, mask_mod=mods.sliding_window(5), **kw)
    )
    torch.testing.assert_close(
        attention(q, k, v, is_causal=True, mask_mod=mods.document(DOCS), **kw),
        attention(q, k, v, mask_mod=mods.and_masks(mods.causal(), mods.document(DOCS)), **kw),
    )


# A user's score_mod reading a float64 table: on float32 scores its result is float64 (type promotion), and every
# backend casts it back to the scores' dtype, as the built-in mods do (a 1-element tensor promotes; a 0-dim one would not).
WIDE = torch.randn(12, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(5))  # (Tq, Tk)


def _wide(score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    return score * torch.tensor([1.5], dtype=torch.float64) + WIDE[q_idx, kv]


def _narrow(
    score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv: torch.Tensor
) -> torch.Tensor:
    return score * 1.5 + WIDE.float()[q_idx, kv]  # the same mod written in float32


def _wide_bias(
    score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv: torch.Tensor
) -> torch.Tensor:
    return score + WIDE[q_idx, kv]


def _narrow_bias(
    score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv: torch.Tensor
) -> torch.Tensor:
    return score + WIDE.float()[q_idx, kv]


for _fn in (_wide_bias, _narrow_bias):
    _fn.is_bias = True  # type: ignore[attr-defined]  # declared additive: sdpa takes only a bias


@pytest.mark.parametrize("backend", ["eager", "sdpa", "flash", "flex"])
def test_a_score_mod_returning_float64_on_float32_scores_is_cast_back_on_every_backend(backend: str) -> None:
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=g) for _ in range(3))
    wide, narrow, factor = (_wide_bias, _narrow_bias, 1.0) if backend == "sdpa" else (_wide, _narrow, 1.5)
    assert wide(torch.zeros(1, 1, 1, 1), *(torch.zeros(1, 1, 1, 1, dtype=torch.long),) * 4).dtype == torch.float64
    run = tiles(backend, 4, 4)
    with torch.no_grad():
        out = attention(q, k, v, score_mod=wide, is_causal=True, backend=run)
        # flex compiles once per mod (seconds): its float32 twin runs on eager, the readable path
        same = attention(q, k, v, score_mod=narrow, is_causal=True, backend="eager" if backend == "flex" else run)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, same, atol=1e-6, rtol=1e-5)
    q64, k64, v64 = q.double(), k.double(), v.double()  # the definition, written out here in float64
    s = (q64 @ k64.transpose(-2, -1) / math.sqrt(8)) * factor + WIDE
    ref = torch.softmax(s.masked_fill(torch.ones(12, 12, dtype=torch.bool).triu(1), -math.inf), dim=-1) @ v64
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)


def test_a_float64_table_in_a_score_mod_trains_through_flash_as_through_eager() -> None:
    """The cast is part of the graph: flash's backward replays the mod and the float64 table gets its gradient."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=g, requires_grad=True) for _ in range(3))
    table = WIDE.clone().requires_grad_()

    def mod(
        score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv: torch.Tensor
    ) -> torch.Tensor:
        return score + table[q_idx, kv]

    grads = []
    for backend in ("eager", Flash(block_q=4, block_k=4)):
        out = attention(q, k, v, score_mod=mod, is_causal=True, backend=backend)
        grads.append(torch.autograd.grad((out * out).sum(), (q, k, v, table)))
    assert grads[1][3].dtype == torch.float64 and bool(grads[1][3].abs().sum() > 0)
    for name, a, b in zip(("dq", "dk", "dv", "dtable"), *grads, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4, msg=name)
