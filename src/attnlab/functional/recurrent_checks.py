"""The checks and shapes the recurrent forms share (``attnlab.functional.recurrent``, ``attnlab.functional.kda``):
q, k, v; a state's shape; ``each=`` with its form; the gates of the delta rules; the states after each token.

Shapes: B = batch, H = heads, T = tokens, Dk = key size, Dv = value size.
"""

from __future__ import annotations

import torch


def check_qkv(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for label, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}: {label} must be (batch, heads, tokens, dim), got {shape}")
    if q.shape != k.shape or v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"{name}: q and k must have one shape and v the same (batch, heads, tokens); got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )


def state_shapes(q: torch.Tensor, v: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    b, h, _, dk = q.shape
    return (b, h, dk, v.shape[-1]), (b, h, dk)


def check_state(name: str, state: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    if state is not None and tuple(state.shape) != shape:
        raise ValueError(f"{name}: the state must be {shape} (batch, heads, Dk[, Dv]), got {tuple(state.shape)}")


def check_each(name: str, each: bool, form: str) -> None:
    if each and form != "recurrent":
        raise ValueError(
            f"{name}: each=True returns the state after each token, which only the recurrent form passes through; "
            f"got form={form!r}: pass form='recurrent'"
        )


def stacked(states: list[torch.Tensor], start: torch.Tensor, t: int) -> torch.Tensor:
    """The states after each of ``t`` tokens (B, H, ...) stacked on dim 2: (B, H, T, ...); T = 0: empty."""
    return torch.stack(states, dim=2) if states else start.new_zeros(*start.shape[:2], 0, *start.shape[2:])


def check_gates(name: str, g: torch.Tensor, beta: torch.Tensor, *, chunked: bool, beta_max: float = 1.0) -> None:
    """Refuse what would give a wrong answer rather than NaN in, NaN out: g > 0 (a log decay is <= 0), beta outside
    [0, 1], and in the chunked forms a g of -inf (a full reset), which makes G_i - G_j = -inf + inf there; the
    recurrent form takes it exactly. NaN passes through to its own row's output, as in attention. Skipped while
    compiling (it is one host sync)."""
    if torch.compiler.is_compiling():
        return
    with torch.no_grad():
        bad_g = (g > 0) | torch.isneginf(g) if chunked else g > 0
        bad_beta = (beta < 0) | (beta > beta_max)
        if not bool(bad_g.any() | bad_beta.any()):
            return
        label, bad, values = ("g", bad_g, g) if bool(bad_g.any()) else ("beta", bad_beta, beta)
        where = tuple(int(i) for i in bad.nonzero()[0])
        value = float(values[where].detach())
    if label == "beta":
        rule = "beta must be a share in [0, 1], such as sigmoid(x)"
        if beta_max != 1:  # negative eigenvalues: twice the share
            rule = f"beta must be in [0, {beta_max:g}], such as {beta_max:g} * sigmoid(x)"
    elif value > 0:
        rule = "g must be a log decay <= 0"
    else:
        rule = (
            "g of -inf (a full reset) cannot go through the chunked form (exp(G_i - G_j) would be exp(-inf + inf)): "
            "pass form='recurrent', or a finite g such as -30, which already decays the state by 1e-13"
        )
    at = "(batch, head, token)" if len(where) == 3 else "(batch, head, token, channel)"  # a gate per channel: KDA's
    raise ValueError(f"{name}: {rule}; got {value:g} at {at} {where}")
