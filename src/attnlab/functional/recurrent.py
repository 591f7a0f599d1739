"""Attention with a state of fixed size: linear attention and the gated delta rule, each in three forms.

Softmax attention keeps every key and value (the KV cache grows with the text). Linear attention
(Katharopoulos et al., 2020) drops the softmax for a positive feature map phi, so the sum over past keys
can be kept as one matrix per head, however long the text:

    S_t = S_{t-1} + phi(k_t) v_t^T          (Dk, Dv): the state
    z_t = z_{t-1} + phi(k_t)                (Dk,):    the normalizer
    o_t = S_t^T phi(q_t) / (z_t . phi(q_t))    (0 while z_t = 0: nothing written yet)

The gated delta rule (Gated DeltaNet, Yang et al., 2024; Qwen3-Next's linear layers) writes to the state
like a learner: it decays the state by a_t = exp(g_t), reads what the state already predicts for k_t, and
writes only a beta_t share of the error (the delta rule):

    S_t = a_t S_{t-1} + k_t (beta_t (v_t - a_t S_{t-1}^T k_t))^T
    o_t = S_t^T q_t                          (q and k unit length; q scaled by 1/sqrt(Dk))

Each comes in forms that give the same numbers:

- ``recurrent``: one token at a time, as the formulas read (the readable form, and the decode step);
- ``parallel`` (linear attention): all tokens at once, a causal (T, T) matrix of phi(q) . phi(k)
  (the "implicit attention weights" the recurrence equals: :func:`linear_attention_weights`);
- ``chunked``: chunks of C tokens in parallel inside, the state carried from chunk to chunk. For the delta
  rule each chunk solves one triangular system: unrolled inside a chunk from its start state S_0, the written
  errors U (C, Dv) satisfy (I + A) U = beta * V - (beta * exp(G)) * K S_0, with
  A_ij = beta_i exp(G_i - G_j) k_i . k_j for j < i and G the cumulative log decay inside the chunk; then
  o_i = exp(G_i) S_0^T q_i + sum_{j <= i} exp(G_i - G_j) (q_i . k_j) u_j and
  S_C = exp(G_C) S_0 + sum_j exp(G_C - G_j) k_j u_j^T.

Every function takes (B, H, T, D) tensors and an optional state, and returns the output and the state after
the last token, so a prompt can be read in one call and decoding continue one token at a time; with ``each=True``
(the recurrent form, which passes through them) the state after each token instead, stacked on dim 2: a cache
that must go back to any token of a short pass of guesses keeps them (``attnlab.cache.state``).

Shapes: B = batch, H = heads, T = tokens, Dk = key size, Dv = value size, C = chunk size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlab._checks import check_positive_int
from attnlab.functional.recurrent_checks import check_each, check_gates, check_qkv, check_state, stacked, state_shapes

Forms = ("recurrent", "parallel", "chunked")


def feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1: positive, so the normalizer z_t . phi(q_t) is 0 only where nothing has been written
    yet (left padding, whose phi(k) is zeroed; :func:`linear_attention` gives such a row 0)."""
    return F.elu(x) + 1


def _normalized(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den, and 0 on a row whose den is 0 (nothing written before it). The 0s are replaced by 1 before the
    division, not the quotient after it: a NaN row set to 0 afterwards still sends its zero gradient through
    d(num / den) = 1 / den = inf, and 0 * inf is NaN in every weight it reaches."""
    empty = den == 0
    return (num / den.masked_fill(empty, 1.0)).masked_fill(empty, 0.0)


# ---- linear attention ----


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    state: tuple[torch.Tensor, torch.Tensor] | None = None,
    form: str = "chunked",
    chunk_size: int = 64,
    each: bool = False,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Causal linear attention of phi(q), phi(k) (the caller applies :func:`feature_map`) over v.

    Args:
        q, k: (B, H, T, Dk), already positive (phi applied); v: (B, H, T, Dv).
        state: (S, z) after earlier tokens, (B, H, Dk, Dv) and (B, H, Dk); None starts from zero.
        form: "recurrent", "parallel" or "chunked" (the same numbers).
        each: return (S, z) after each token, (B, H, T, Dk, Dv) and (B, H, T, Dk) (the recurrent form only).
    Returns: the output (B, H, T, Dv) and the state (S, z) after the last token. A row whose normalizer is 0
        (nothing written yet, as under left padding) outputs 0, with gradient 0.
    """
    check_qkv("linear_attention", q, k, v)
    check_each("linear_attention", each, form)
    s_shape, z_shape = state_shapes(q, v)
    if state is None:
        state = (q.new_zeros(s_shape), q.new_zeros(z_shape))
    check_state("linear_attention", state[0], s_shape)
    check_state("linear_attention", state[1], z_shape)
    if form == "recurrent":
        return _linear_recurrent(q, k, v, state, each=each)
    if form == "parallel":
        return _linear_chunk(q, k, v, state)  # one chunk of every token
    if form == "chunked":
        check_positive_int("chunk_size", chunk_size, limit=2**16)
        outs = []
        for start in range(0, q.shape[2], chunk_size):
            part = slice(start, start + chunk_size)
            out, state = _linear_chunk(q[:, :, part], k[:, :, part], v[:, :, part], state)
            outs.append(out)
        return torch.cat(outs, dim=2) if outs else v.new_zeros(v.shape), state
    raise ValueError(f"form must be one of {list(Forms)}, got {form!r}")


def _linear_recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor], *, each: bool = False
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    s, z = state
    outs, states, norms = [], [], []
    for t in range(q.shape[2]):
        s = s + k[:, :, t, :, None] * v[:, :, t, None, :]  # (B, H, Dk, Dv): add phi(k_t) v_t^T
        z = z + k[:, :, t]  # (B, H, Dk)
        num = (q[:, :, t, :, None] * s).sum(dim=2)  # (B, H, Dv): S_t^T phi(q_t)
        den = (q[:, :, t] * z).sum(dim=-1, keepdim=True)  # (B, H, 1)
        outs.append(_normalized(num, den))
        states += [s] if each else []
        norms += [z] if each else []
    out = torch.stack(outs, dim=2) if outs else v.new_zeros(v.shape)  # (B, H, T, Dv)
    if each:  # (B, H, T, Dk, Dv) and (B, H, T, Dk): after each token
        return out, (stacked(states, s, q.shape[2]), stacked(norms, z, q.shape[2]))
    return out, (s, z)


def _linear_chunk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One chunk in parallel after the state of the tokens before it."""
    s, z = state
    t = q.shape[2]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    weights = (q @ k.transpose(-1, -2)).masked_fill(~causal, 0.0)  # (B, H, T, T): phi(q_i) . phi(k_j), j <= i
    num = weights @ v + q @ s  # (B, H, T, Dv): the chunk's own keys, then the state of those before
    den = weights.sum(dim=-1, keepdim=True) + (q @ z[..., None])  # (B, H, T, 1)
    s = s + k.transpose(-1, -2) @ v  # (B, H, Dk, Dv)
    z = z + k.sum(dim=2)  # (B, H, Dk)
    return _normalized(num, den), (s, z)


def linear_attention_weights(q: torch.Tensor, k: torch.Tensor, *, real: torch.Tensor | None = None) -> torch.Tensor:
    """The weights (B, H, T, T) that causal linear attention gives each earlier token: row i is
    phi(q_i) . phi(k_j) over its sum for j <= i, 0 after i. out = weights @ v, as the recurrence computes.
    ``real`` (B, T): False on left padding, whose rows are 0 (a padded token attends to nothing)."""
    if q.dim() != 4 or q.shape != k.shape:
        raise ValueError(
            f"q and k must be (batch, heads, tokens, dim) of one shape, got {tuple(q.shape)}, {tuple(k.shape)}"
        )
    t = q.shape[2]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-1, -2)).masked_fill(~causal, 0.0)  # (B, H, T, T)
    if real is not None:
        scores = scores.masked_fill(~real[:, None, :, None], 0.0)  # a padded row: nothing
    total = scores.sum(dim=-1, keepdim=True)
    return scores / total.masked_fill(total == 0, 1.0)


# ---- the gated delta rule ----


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    state: torch.Tensor | None = None,
    form: str = "chunked",
    chunk_size: int = 64,
    negative_eigenvalues: bool = False,
    each: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over q, k (unit length; q already scaled) and v.

    Args:
        q, k: (B, H, T, Dk); v: (B, H, T, Dv).
        g: (B, H, T) log decay, <= 0 (the state is multiplied by exp(g_t) before token t writes); -inf, a full
            reset, in the recurrent form only.
        beta: (B, H, T), the share of the error written, in [0, 1], or in [0, 2] with ``negative_eigenvalues``
            (OLMo-Hybrid: the state's transition I - beta k k^T may then flip a direction). Values outside either
            are refused.
        state: (B, H, Dk, Dv) after earlier tokens; None starts from zero.
        form: "recurrent" or "chunked" (the same numbers).
        each: return the state after each token, (B, H, T, Dk, Dv) (the recurrent form only).
    Returns: the output (B, H, T, Dv) and the state after the last token.
    """
    check_qkv("gated_delta_rule", q, k, v)
    check_each("gated_delta_rule", each, form)
    for label, t in (("g", g), ("beta", beta)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(q.shape[:3]):
            raise ValueError(
                f"gated_delta_rule: {label} must be (batch, heads, tokens) = {tuple(q.shape[:3])}, "
                f"got {tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}"
            )
    check_gates("gated_delta_rule", g, beta, chunked=form == "chunked", beta_max=2.0 if negative_eigenvalues else 1.0)
    s_shape, _ = state_shapes(q, v)
    state = q.new_zeros(s_shape) if state is None else state
    check_state("gated_delta_rule", state, s_shape)
    if form == "recurrent":
        return _delta_recurrent(q, k, v, g, beta, state, each=each)
    if form == "chunked":
        check_positive_int("chunk_size", chunk_size, limit=2**16)
        outs = []
        for start in range(0, q.shape[2], chunk_size):
            part = slice(start, start + chunk_size)
            out, state = _delta_chunk(
                q[:, :, part], k[:, :, part], v[:, :, part], g[:, :, part], beta[:, :, part], state
            )
            outs.append(out)
        return torch.cat(outs, dim=2) if outs else v.new_zeros(v.shape), state
    raise ValueError(f"form must be 'recurrent' or 'chunked' for the delta rule, got {form!r}")


def gated_delta_weights(
    q: torch.Tensor, k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *, negative_eigenvalues: bool = False
) -> torch.Tensor:
    """The implicit weights (B, H, T, T) of the gated delta rule from a zero state: its output is linear in the
    values, out = weights @ v, with weights = ((Q K^T) * Gamma) (I + A)^-1 diag(beta) (the chunked form's
    equations over one chunk of every token). Lower triangular; unlike softmax weights a row need not sum to 1,
    and an entry may be negative: a later write took back what an earlier one put under a similar key."""
    if q.dim() != 4 or q.shape != k.shape or g.shape != q.shape[:3] or beta.shape != q.shape[:3]:
        raise ValueError(
            f"q, k must be (batch, heads, tokens, dim) of one shape and g, beta (batch, heads, tokens); got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(g.shape)}, {tuple(beta.shape)}"
        )
    check_gates("gated_delta_weights", g, beta, chunked=True, beta_max=2.0 if negative_eigenvalues else 1.0)
    t = q.shape[2]
    lower = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    cum = g.cumsum(dim=-1)  # (B, H, T)
    gaps = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # (B, H, T, T)
    system = torch.eye(t, dtype=q.dtype, device=q.device) + (
        (k @ k.transpose(-1, -2)) * gaps * beta[..., :, None]
    ).tril(-1)
    writes = torch.linalg.solve_triangular(system, torch.diag_embed(beta), upper=False, unitriangular=True)
    return ((q @ k.transpose(-1, -2)) * gaps) @ writes  # (B, H, T, T)


def _delta_recurrent(
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
        s = s * g[:, :, t, None, None].exp()  # (B, H, Dk, Dv): decay
        predicted = (k[:, :, t, :, None] * s).sum(dim=2)  # (B, H, Dv): S^T k_t, what the state reads for k_t
        error = (v[:, :, t] - predicted) * beta[:, :, t, None]  # (B, H, Dv): the delta rule's write
        s = s + k[:, :, t, :, None] * error[:, :, None, :]  # (B, H, Dk, Dv)
        outs.append((q[:, :, t, :, None] * s).sum(dim=2))  # (B, H, Dv): S_t^T q_t
        states += [s] if each else []
    out = torch.stack(outs, dim=2) if outs else v.new_zeros(v.shape)  # (B, H, T, Dv)
    return out, stacked(states, s, q.shape[2]) if each else s  # (B, H, T, Dk, Dv) after each token, or the last


def _delta_chunk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, s: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk after the state s of the tokens before it (the module docstring's equations)."""
    c = q.shape[2]
    lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()  # j <= i
    cum = g.cumsum(dim=-1)  # (B, H, C): G_i, the log decay from the chunk's start through token i
    gaps = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # (B, H, C, C)
    strict = (k @ k.transpose(-1, -2)) * gaps * beta[..., :, None]  # (B, H, C, C): beta_i e^(G_i-G_j) k_i.k_j
    system = torch.eye(c, dtype=q.dtype, device=q.device) + strict.tril(-1)  # I + A, unit lower triangular
    rhs = beta[..., None] * v - (beta * cum.exp())[..., None] * (k @ s)  # (B, H, C, Dv)
    u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)  # (B, H, C, Dv): the writes
    out = cum.exp()[..., None] * (q @ s) + ((q @ k.transpose(-1, -2)) * gaps) @ u  # (B, H, C, Dv)
    last = cum[..., -1:]  # (B, H, 1): G_C
    s = last.exp()[..., None] * s + (k * (last - cum).exp()[..., None]).transpose(-1, -2) @ u  # (B, H, Dk, Dv)
    return out, s
