"""Kimi Delta Attention (KDA; Kimi Linear, Moonshot AI, 2025): the gated delta rule with a forget gate per channel.

The gated delta rule (``attnlab.functional.recurrent``) decays a head's whole state by one number a token,
exp(g_t). KDA gives every key channel, every row of the (Dk, Dv) state, its own decay: g_t is a vector of Dk log
decays and a_t = exp(g_t) scales row d of the state by a_t[d] (Kimi Linear, eq. 1; diag(a_t) below):

    S_t = diag(a_t) S_{t-1} + k_t (beta_t (v_t - (diag(a_t) S_{t-1})^T k_t))^T
    o_t = S_t^T q_t                          (q and k unit length; q scaled by 1/sqrt(Dk))

so a head can keep some features for thousands of tokens while it forgets others within a few. With the Dk decays
of a token equal it is the gated delta rule exactly (tested).

Two forms give the same numbers:

- ``recurrent``: one token at a time, as the formulas read (the readable form, and the decode step);
- ``chunked``: chunks of C tokens in parallel inside, the state carried from chunk to chunk. Unrolled inside a
  chunk from its start state S_0, with G_i (Dk,) the cumulative log decay from the chunk's start through token i
  and Gamma_ij = exp(G_i - G_j) (Dk,) for j <= i, the written errors U (C, Dv) solve one unit lower triangular
  system, as the scalar rule's do, only with the decays inside the dot products:

      (I + A) U = beta * V - beta * (K * exp(G)) S_0,    A_ij = beta_i sum_d k_i[d] k_j[d] Gamma_ij[d]  (j < i)
      o_i = (q_i * exp(G_i))^T S_0 + sum_{j <= i} (sum_d q_i[d] k_j[d] Gamma_ij[d]) u_j
      S_C = exp(G_C) * S_0 (row by row) + sum_j (k_j * Gamma_Cj) u_j^T

  Gamma is formed per pair and channel, (C, C, Dk), never as exp(G_i) * exp(-G_j): a decay of e^-50 over a chunk
  would overflow exp(-G_j).

Each function takes (B, H, T, D) tensors and an optional state and returns the output and the state after the last
token, so a prompt can be read in one call and decoding continue one token at a time; with ``each=True`` (the
recurrent form) the state after each token, stacked on dim 2, as ``attnlab.functional.recurrent``'s.

Shapes: B = batch, H = heads, T = tokens, Dk = key size, Dv = value size, C = chunk size.
"""

from __future__ import annotations

import torch

from attnlab._checks import check_positive_int
from attnlab.functional.recurrent_checks import check_each, check_gates, check_qkv, check_state, stacked, state_shapes

FORMS = ("recurrent", "chunked")


def _check_shapes(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: object, beta: object) -> None:
    check_qkv(name, q, k, v)
    for label, t, want in (("g", g, tuple(q.shape)), ("beta", beta, tuple(q.shape[:3]))):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != want:
            dims = "(batch, heads, tokens, Dk): a log decay per channel" if label == "g" else "(batch, heads, tokens)"
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}: {label} must be {dims} = {want}, got {got}")


def kimi_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    state: torch.Tensor | None = None,
    form: str = "chunked",
    chunk_size: int = 64,
    each: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The delta rule with a decay per channel over q, k (unit length; q already scaled) and v.

    Args:
        q, k: (B, H, T, Dk); v: (B, H, T, Dv).
        g: (B, H, T, Dk) log decays, <= 0: row d of the state is multiplied by exp(g[..., t, d]) before token t
            writes; -inf, a full reset, in the recurrent form only.
        beta: (B, H, T), the share of the error written, in [0, 1].
        state: (B, H, Dk, Dv) after earlier tokens; None starts from zero.
        form: "recurrent" or "chunked" (the same numbers).
        each: return the state after each token, (B, H, T, Dk, Dv) (the recurrent form only).
    Returns: the output (B, H, T, Dv) and the state after the last token.
    Raises:
        ValueError: a shape, a g > 0, a beta outside [0, 1] or a form not known, named.
    """
    _check_shapes("kimi_delta_rule", q, k, v, g, beta)
    if form not in FORMS:
        raise ValueError(f"form must be one of {list(FORMS)} for the Kimi delta rule, got {form!r}")
    check_each("kimi_delta_rule", each, form)
    check_gates("kimi_delta_rule", g, beta, chunked=form == "chunked")
    s_shape, _ = state_shapes(q, v)
    state = q.new_zeros(s_shape) if state is None else state
    check_state("kimi_delta_rule", state, s_shape)
    if form == "recurrent":
        return _kda_recurrent(q, k, v, g, beta, state, each=each)
    check_positive_int("chunk_size", chunk_size, limit=2**16)
    outs = []
    for start in range(0, q.shape[2], chunk_size):
        part = slice(start, start + chunk_size)
        out, state = _kda_chunk(q[:, :, part], k[:, :, part], v[:, :, part], g[:, :, part], beta[:, :, part], state)
        outs.append(out)
    return torch.cat(outs, dim=2) if outs else v.new_zeros(v.shape), state


def kimi_delta_weights(q: torch.Tensor, k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """The implicit weights (B, H, T, T) of the Kimi delta rule from a zero state: out = weights @ v, with
    weights = (sum_d Q K Gamma) (I + A)^-1 diag(beta), the chunked form's equations over one chunk of every token.
    Lower triangular; a row need not sum to 1 and an entry may be negative, as the gated delta rule's."""
    _check_shapes("kimi_delta_weights", q, k, k, g, beta)  # no values: k stands in for their (B, H, T)
    check_gates("kimi_delta_weights", g, beta, chunked=True)
    t = q.shape[2]
    gaps = _gaps(g.cumsum(dim=2))  # (B, H, T, T, Dk)
    strict = torch.einsum("bhid,bhjd,bhijd->bhij", k, k, gaps) * beta[..., :, None]  # (B, H, T, T)
    system = torch.eye(t, dtype=q.dtype, device=q.device) + strict.tril(-1)
    writes = torch.linalg.solve_triangular(system, torch.diag_embed(beta), upper=False, unitriangular=True)
    return torch.einsum("bhid,bhjd,bhijd->bhij", q, k, gaps) @ writes  # (B, H, T, T)


def _gaps(cum: torch.Tensor) -> torch.Tensor:
    """Gamma (B, H, C, C, Dk): exp(G_i - G_j) per channel for j <= i, 0 above the diagonal, from G (B, H, C, Dk)."""
    c = cum.shape[2]
    later = torch.ones(c, c, dtype=torch.bool, device=cum.device).triu(1)  # j > i: nothing flows back in time
    diff = cum[:, :, :, None, :] - cum[:, :, None, :, :]  # (B, H, C, C, Dk): G_i - G_j
    return diff.masked_fill(later[:, :, None], float("-inf")).exp()


def _kda_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    s: torch.Tensor,
    *,
    each: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    outs, states = [], []
    for t in range(q.shape[2]):
        s = s * g[:, :, t, :, None].exp()  # (B, H, Dk, Dv): row d decayed by its own exp(g_t[d])
        predicted = (k[:, :, t, :, None] * s).sum(dim=2)  # (B, H, Dv): what the decayed state reads for k_t
        error = (v[:, :, t] - predicted) * beta[:, :, t, None]  # (B, H, Dv): the delta rule's write
        s = s + k[:, :, t, :, None] * error[:, :, None, :]  # (B, H, Dk, Dv)
        outs.append((q[:, :, t, :, None] * s).sum(dim=2))  # (B, H, Dv): S_t^T q_t
        states += [s] if each else []
    out = torch.stack(outs, dim=2) if outs else v.new_zeros(v.shape)  # (B, H, T, Dv)
    return out, stacked(states, s, q.shape[2]) if each else s  # (B, H, T, Dk, Dv) after each token, or the last


def _kda_chunk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, s: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk after the state s of the tokens before it (the module docstring's equations)."""
    c = q.shape[2]
    cum = g.cumsum(dim=2)  # (B, H, C, Dk): G_i
    gaps = _gaps(cum)  # (B, H, C, C, Dk)
    strict = torch.einsum("bhid,bhjd,bhijd->bhij", k, k, gaps) * beta[..., :, None]  # (B, H, C, C)
    system = torch.eye(c, dtype=q.dtype, device=q.device) + strict.tril(-1)  # I + A, unit lower triangular
    rhs = beta[..., None] * (v - (k * cum.exp()) @ s)  # (B, H, C, Dv)
    u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)  # (B, H, C, Dv): the writes
    scores = torch.einsum("bhid,bhjd,bhijd->bhij", q, k, gaps)  # (B, H, C, C): sum_d q_i k_j Gamma_ij, j <= i
    out = (q * cum.exp()) @ s + scores @ u  # (B, H, C, Dv)
    last = cum[:, :, -1:]  # (B, H, 1, Dk): G_C
    s = last.transpose(-1, -2).exp() * s + (k * (last - cum).exp()).transpose(-1, -2) @ u  # (B, H, Dk, Dv)
    return out, s
