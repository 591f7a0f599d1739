"""Issue 54, item 2: left padding and rows that see nothing must not poison the gradients.

A left-padded row of linear attention has a normalizer of 0 (nothing written before it): its output was 0/0 set
to 0 afterwards, which is right forward, but the backward sent the zero gradient through 1 / 0, and 0 * inf made
every weight NaN after one optimiser step. So, for every variant the zoo trains, a left-padded batch must give
the gradients of its rows run alone, unpadded (the expected values come from those unpadded runs, which never
form an empty row), and a step must leave the weights finite; and each attention backend must give finite
gradients on a row that may attend to nothing, however it was emptied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import pytest
import torch
import torch.nn.functional as F

from attnlab.functional.attention import attention
from attnlab.functional.blocks import Running
from attnlab.functional.flash import Flash
from attnlab.functional.recurrent import feature_map, linear_attention
from attnlab.functional.visibility import Visibility
from attnlab.models import GPT
from attnlab.models.zoo import VARIANTS, zoo_config
from attnlab.nn.recurrent import GatedDeltaNet, LinearAttention

T, PAD = 10, 4  # the second row: PAD pad tokens, then T - PAD real ones


def summed_loss(model: GPT, idx: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token cross entropy summed over the real tokens (a real token predicting a real one): a sum, so the
    padded batch's loss is the sum of its rows' losses run alone."""
    logits = model(idx[:, :-1], attention_mask=None if mask is None else mask[:, :-1])  # (B, T-1, V)
    real = torch.ones_like(idx, dtype=torch.bool) if mask is None else mask.bool()
    counted = real[:, :-1] & real[:, 1:]  # (B, T-1)
    return F.cross_entropy(logits[counted], idx[:, 1:][counted], reduction="sum")


def gradients(model: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=False)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


# compressed: V4's layers pool a block's tokens into one entry and refuse a padded row by name (test_deepseek_v4_family)
@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "compressed"])
def test_a_left_padded_batch_trains_as_its_rows_alone(variant: str) -> None:
    torch.manual_seed(0)
    model = GPT(zoo_config(variant)).double()  # the zoo's own config: its layers, its backend ("auto")
    idx = torch.randint(1, 256, (2, T), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, :PAD] = 0
    idx[1, :PAD] = 0  # what a tokenizer pads with
    padded = gradients(model, summed_loss(model, idx, mask))
    alone = gradients(model, summed_loss(model, idx[:1]) + summed_loss(model, idx[1:, PAD:]))
    for name, grad in padded.items():
        assert torch.isfinite(grad).all(), f"{variant}: the gradient of {name} is not finite"
        torch.testing.assert_close(grad, alone[name], rtol=1e-9, atol=1e-11, msg=f"{variant}: {name}")
    assert padded.keys() == alone.keys()
    assert any(g.abs().max() > 0 for g in padded.values())  # the loss reached the weights at all
    model.zero_grad()
    summed_loss(model, idx, mask).backward()
    torch.optim.AdamW(model.parameters(), lr=1e-2).step()
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    assert not bad, f"{variant}: one optimiser step left {bad} non-finite"


def test_linear_attention_gives_an_empty_row_0_and_finite_gradients_in_every_form() -> None:
    """Keys zeroed on the first 3 tokens (left padding, as ``LinearAttention`` zeroes them): those rows read
    nothing, so 0; the gradient of a loss over the later rows equals the gradient with the padding cut off."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 9, 4, generator=g, dtype=torch.float64) for _ in range(3))
    upstream = torch.randn(2, 2, 9, 4, generator=g, dtype=torch.float64)
    for form in ("recurrent", "parallel", "chunked"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        keys = feature_map(leaves[1]).clone()
        keys[:, :, :3] = 0.0  # nothing written by the padding
        out, _ = linear_attention(feature_map(leaves[0]), keys, leaves[2], form=form, chunk_size=2)
        assert (out[:, :, :3] == 0).all(), form
        (out[:, :, 3:] * upstream[:, :, 3:]).sum().backward()
        cut = [t[:, :, 3:].clone().requires_grad_() for t in (q, k, v)]
        ref, _ = linear_attention(feature_map(cut[0]), feature_map(cut[1]), cut[2], form="recurrent")
        (ref * upstream[:, :, 3:]).sum().backward()
        for leaf, short in zip(leaves, cut, strict=True):
            assert leaf.grad is not None and short.grad is not None
            assert torch.isfinite(leaf.grad).all(), form
            assert (leaf.grad[:, :, :3] == 0).all(), form
            torch.testing.assert_close(leaf.grad[:, :, 3:], short.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("kind", "form"),
    [
        ("linear", "recurrent"),
        ("linear", "parallel"),
        ("linear", "chunked"),
        ("delta", "recurrent"),
        ("delta", "chunked"),
    ],
)
def test_each_recurrent_layer_form_trains_a_left_padded_row_as_the_row_alone(kind: str, form: str) -> None:
    """The layers themselves, in every form, chunks of 3 so the padding ends inside a chunk: the gradient of a loss
    over the real tokens is the unpadded row's, and every gradient is finite."""
    torch.manual_seed(5)
    layer_type = LinearAttention if kind == "linear" else GatedDeltaNet
    layer = layer_type(d_in=8, num_heads=2, form=form, chunk_size=3).double()
    x = torch.randn(1, 8, 8, dtype=torch.float64)
    upstream = torch.randn(1, 8 - PAD, 8, dtype=torch.float64)
    real = torch.ones(1, 1, 1, 8, dtype=torch.bool)
    real[..., :PAD] = False
    visibility = Visibility(q_pos=torch.arange(8), causal=True, mask=real)
    padded = gradients(layer, (layer(x, visibility=visibility)[:, PAD:] * upstream).sum())
    alone = gradients(layer, (layer(x[:, PAD:]) * upstream).sum())
    for name, grad in padded.items():
        assert torch.isfinite(grad).all(), f"{kind} {form}: {name}"
        torch.testing.assert_close(grad, alone[name], rtol=1e-10, atol=1e-12, msg=f"{kind} {form}: {name}")


def test_the_online_softmax_finishes_a_row_that_saw_nothing_with_finite_gradients() -> None:
    """Running.finish differentiated by autograd (flash and the ring wrap it in their own backward; a caller of
    blocks need not): a row with l = 0 gives out 0 and lse +inf, and gradient 0, not 0 * (1 / 0); the live rows
    get d out / d acc = 1 / l, d out / d l = -acc / l^2 and d lse / d l = 1 / l, d lse / d m = 1."""
    row_max = torch.tensor([[[0.5, float("-inf"), -1.0]]], dtype=torch.float64, requires_grad=True)  # (1, 1, 3)
    row_sum = torch.tensor([[[2.0, 0.0, 4.0]]], dtype=torch.float64, requires_grad=True)  # row 1 saw nothing
    acc = torch.tensor([[[[1.0, -2.0], [0.0, 0.0], [3.0, 1.0]]]], dtype=torch.float64, requires_grad=True)
    out, lse = Running(row_max=row_max * 1, row_sum=row_sum * 1, acc=acc * 1).finish()
    assert (out[0, 0, 1] == 0).all() and torch.isposinf(lse[0, 0, 1])
    (out.sum() + lse[:, :, [0, 2]].sum()).backward()
    assert row_max.grad is not None and row_sum.grad is not None and acc.grad is not None
    total, a = row_sum.detach(), acc.detach()
    torch.testing.assert_close(row_sum.grad[0, 0, [0, 2]], (-a.sum(-1) / total**2 + 1 / total)[0, 0, [0, 2]])
    torch.testing.assert_close(acc.grad[0, 0, [0, 2]], (1 / total[0, 0, [0, 2], None]).expand(2, 2))
    torch.testing.assert_close(row_max.grad, torch.tensor([[[1.0, 0.0, 1.0]]], dtype=torch.float64))
    assert row_sum.grad[0, 0, 1] == 0  # not 0 * (1 / 0)


B, H, TQ, D = 2, 2, 6, 4


def _emptied() -> dict[str, dict[str, Any]]:
    """Ways a row comes to see nothing: batch 0's query 2 by a bool or a float mask or a score_mod; with left
    padding and causality, batch 1's first 3 queries."""
    hidden = torch.ones(B, 1, TQ, TQ, dtype=torch.bool)
    hidden[0, :, 2] = False
    minus_inf = torch.zeros(B, 1, TQ, TQ, dtype=torch.float64)
    minus_inf[0, :, 2] = float("-inf")
    padding = torch.ones(B, 1, 1, TQ, dtype=torch.bool)
    padding[1, ..., :3] = False

    def drop_query_2(s: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> Any:
        return torch.where((b == 0) & (q == 2), float("-inf"), s)

    return {
        "bool mask": {"mask": hidden},
        "float mask": {"mask": minus_inf},
        "left padding": {"mask": padding, "is_causal": True},
        "score_mod": {"score_mod": drop_query_2},
    }


EMPTIED = _emptied()
DEAD = {
    "bool mask": [(0, 2)],
    "float mask": [(0, 2)],
    "left padding": [(1, 0), (1, 1), (1, 2)],
    "score_mod": [(0, 2)],
}
BACKENDS: dict[str, Callable[[], Any]] = {
    "eager": lambda: "eager",
    "sdpa": lambda: "sdpa",
    "flash": lambda: "flash",
    "flash tiles": lambda: Flash(block_q=2, block_k=2, fused=False),
    "flash fused tiles": lambda: Flash(block_q=2, block_k=2),
}


def _cases() -> list[Any]:
    cases = []
    for backend in BACKENDS:
        for how in EMPTIED:
            for sinks in (False, True):
                if backend == "sdpa" and (sinks or how == "score_mod"):
                    continue  # refused by name: sdpa has no lse for sinks, takes only a declared bias
                label = f"{backend}-{how}" + ("-sinks" if sinks else "")
                cases.append(pytest.param(backend, how, sinks, id=label))
    return cases


@pytest.mark.parametrize(("backend", "how", "sinks"), _cases())
def test_a_row_that_sees_nothing_has_finite_gradients_on_every_backend(backend: str, how: str, sinks: bool) -> None:
    """Its output is 0 and its gradients 0; every gradient finite; the live rows' gradients are eager's on the
    same call with the empty rows' upstream gradient zeroed (eager without sinks forms no empty-row division)."""
    g = torch.Generator().manual_seed(4)
    base = [torch.randn(B, H, TQ, D, generator=g, dtype=torch.float64) for _ in range(3)]
    upstream = torch.randn(B, H, TQ, D, generator=g, dtype=torch.float64)
    dead = DEAD[how]
    for b, i in dead:
        upstream[b, :, i] = 0.0

    def run(kernel: Any, with_sinks: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        leaves = [t.clone().requires_grad_() for t in base]
        sink = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True) if with_sinks else None
        out = attention(*leaves, backend=kernel, sinks=sink, **EMPTIED[how])
        assert isinstance(out, torch.Tensor)
        (out * upstream).sum().backward()
        grads = [leaf.grad for leaf in leaves] + ([sink.grad] if sink is not None else [])
        assert all(grad is not None for grad in grads)
        return out, [grad for grad in grads if grad is not None]

    out, grads = run(BACKENDS[backend](), sinks)
    for b, i in dead:
        assert (out[b, :, i] == 0).all()
        assert (grads[0][b, :, i] == 0).all()  # dq of the empty row
    for grad in grads:
        assert torch.isfinite(grad).all()
    if not sinks:
        _, expected = run("eager", False)
        for got, want in zip(grads, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_a_learned_float_mask_that_empties_a_row_gets_finite_gradients() -> None:
    """eager and sdpa differentiate a float mask: where it is -inf on a whole row, that row's gradient is 0, and
    the other rows' is softmax's, the same on both backends (and on the mask's finite entries)."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(B, H, TQ, D, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(B, 1, TQ, TQ, generator=g, dtype=torch.float64)
    bias[0, :, 2] = float("-inf")
    bias[1, :, :, 3] = float("-inf")  # a hidden key, not a hidden row

    def mask_grad(kernel: Literal["eager", "sdpa"]) -> torch.Tensor:
        leaf = bias.clone().requires_grad_()
        out = attention(q, k, v, mask=leaf, backend=kernel)
        assert isinstance(out, torch.Tensor)
        out.sum().backward()
        assert leaf.grad is not None
        return leaf.grad

    eager, sdpa = mask_grad("eager"), mask_grad("sdpa")
    for grad in (eager, sdpa):
        assert torch.isfinite(grad).all()
        assert (grad[0, :, 2] == 0).all()
    torch.testing.assert_close(sdpa, eager, rtol=0, atol=1e-12)
