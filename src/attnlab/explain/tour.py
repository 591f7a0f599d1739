"""The guided tour of chapter 3: each step's code, tensor and check against the book.

:func:`build_tour` recomputes the chapter in order and returns the steps; it
prints nothing (the CLI renders them). A step's checks compare its tensor with
the number the book prints (``attnlab.book.golden``) or, where the notes print
none, with an invariant the chapter states (rows sum to 1, the future is
hidden, two methods agree).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from attnlab import book
from attnlab.book import golden
from attnlab.explain.checks import Check, holds
from attnlab.explain.tour_text import LANGS, TEXTS
from attnlab.observe import Recorder


@dataclass(frozen=True)
class TourStep:
    key: str
    title: str
    text: str
    code: str
    value: str
    checks: tuple[Check, ...] = field(default_factory=tuple)
    heat: torch.Tensor | None = None  # a (T, T) or (heads, T, T) matrix for the report's heatmap

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def _book_tensor(expected: object) -> torch.Tensor:
    """The book's numbers as float64; ``None`` stands for a printed ``-inf``."""

    def conv(x: object) -> object:
        if isinstance(x, (list, tuple)):
            return [conv(v) for v in x]
        return float("-inf") if x is None else x

    return torch.tensor(conv(expected), dtype=torch.float64)


def matches_book(label: str, actual: torch.Tensor | float, expected: object) -> Check:
    """Compare with a printed value at the printed precision (4 decimals)."""
    actual_t = torch.as_tensor(actual, dtype=torch.float64).detach()
    expected_t = _book_tensor(expected)
    if actual_t.shape != expected_t.shape:
        return Check(label, False, f"shape {tuple(actual_t.shape)} != book {tuple(expected_t.shape)}")
    finite = torch.isfinite(expected_t)
    if not torch.equal(actual_t[~finite], expected_t[~finite]):
        return Check(label, False, "-inf entries differ from the book")
    err = (actual_t[finite] - expected_t[finite]).abs().max().item() if finite.any() else 0.0
    return Check(label, err <= golden.ATOL, f"max |diff| vs book = {err:.2e}")


def fmt(t: torch.Tensor) -> str:
    """Print as the book does: torch's own repr at 4 decimals, without grad noise."""
    return str(t.detach())


Add = Callable[..., None]  # add(key, code, value, *checks, heat=None)


def build_tour(lang: str = "en") -> list[TourStep]:
    """Recompute chapter 3 step by step. Seeds are set where the book sets them."""
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {list(LANGS)}, got {lang!r}")
    text = TEXTS[lang]
    steps: list[TourStep] = []

    def add(key: str, code: str, value: str, *checks: Check, heat: torch.Tensor | None = None) -> None:
        title, body = text[key]
        steps.append(TourStep(key, title, body, code, value, tuple(checks), heat))

    # The book seeds torch's global generator; fork_rng gives that state back afterwards, so
    # building the tour leaves the caller's random numbers as they were.
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        _simplified(add)
        _trainable(add)
        _causal_and_multihead(add)
    return steps


def _simplified(add: Add) -> None:
    inputs = book.embedded_inputs()
    words = ", ".join(book.WORDS)
    add("inputs", "inputs = torch.tensor([[0.43, 0.15, 0.89], ...])", f"{words}\n{fmt(inputs)}")

    dot = torch.dot(inputs[0], inputs[1])
    add("dot", "torch.dot(inputs[0], inputs[1])", fmt(dot), matches_book("x(1) . x(2)", dot, golden.DOT_X1_X2))

    attn_scores_2 = book.attn_scores_for_query(inputs, 1)
    add(
        "scores_2",
        "for i, x_i in enumerate(inputs): attn_scores_2[i] = torch.dot(x_i, query)",
        fmt(attn_scores_2),
        matches_book("attn_scores_2", attn_scores_2, golden.ATTN_SCORES_2),
        holds("max at x(2) itself", attn_scores_2.argmax().item() == 1),
    )

    tmp = book.sum_normalize(attn_scores_2)
    add(
        "sum_norm",
        "attn_weights_2_tmp = attn_scores_2 / attn_scores_2.sum()",
        f"Attention weights: {fmt(tmp)}\nSum: {fmt(tmp.sum())}",
        matches_book("attn_weights_2_tmp", tmp, golden.ATTN_WEIGHTS_2_SUM_NORMALIZED),
        matches_book("sum", tmp.sum(), golden.ATTN_WEIGHTS_2_SUM_NORMALIZED_SUM),
    )

    attn_weights_2 = torch.softmax(attn_scores_2, dim=0)
    add(
        "softmax",
        "attn_weights_2 = torch.softmax(attn_scores_2, dim=0)",
        f"Attention weights: {fmt(attn_weights_2)}\nSum: {fmt(attn_weights_2.sum())}",
        matches_book("attn_weights_2", attn_weights_2, golden.ATTN_WEIGHTS_2_SOFTMAX),
        matches_book("sum", attn_weights_2.sum(), golden.ATTN_WEIGHTS_2_SOFTMAX_SUM),
    )

    naive = book.softmax_naive(attn_scores_2)
    add(
        "softmax_naive",
        "torch.exp(x) / torch.exp(x).sum(dim=0)",
        f"Attention weights: {fmt(naive)}\nSum: {fmt(naive.sum())}",
        matches_book("softmax_naive", naive, golden.ATTN_WEIGHTS_2_SOFTMAX),
    )

    big = attn_scores_2 * 1000
    naive_big, stable_big = book.softmax_naive(big), book.softmax_stable(big)
    add(
        "softmax_overflow",
        "softmax_naive(attn_scores_2 * 1000)  vs  softmax_stable(attn_scores_2 * 1000)",
        f"naive:  {fmt(naive_big)}\nstable: {fmt(stable_big)}",
        holds("naive overflows to NaN", bool(torch.isnan(naive_big).any())),
        holds(
            "stable stays finite and sums to 1",
            bool(torch.isfinite(stable_big).all()) and abs(stable_big.sum().item() - 1) < 1e-6,
        ),
    )

    context_vec_2 = book.context_vector_loop(inputs, attn_weights_2)
    add(
        "context_2",
        "for i, x_i in enumerate(inputs): context_vec_2 += attn_weights_2[i] * x_i",
        fmt(context_vec_2),
        matches_book("context_vec_2", context_vec_2, golden.CONTEXT_VEC_2),
    )

    scores_loop = book.attn_scores_loop(inputs)
    add(
        "scores_loop",
        "for i, x_i in ...: for j, x_j in ...: attn_scores[i, j] = torch.dot(x_i, x_j)",
        fmt(scores_loop),
        matches_book("attn_scores (loop)", scores_loop, golden.ATTN_SCORES),
    )

    attn_scores, attn_weights, all_context_vecs = book.all_context_vectors(inputs)
    add(
        "scores_all",
        "attn_scores = inputs @ inputs.T",
        fmt(attn_scores),
        matches_book("attn_scores", attn_scores, golden.ATTN_SCORES),
        heat=attn_scores,
    )
    add(
        "weights_all",
        "attn_weights = torch.softmax(attn_scores, dim=-1)",
        fmt(attn_weights),
        matches_book("attn_weights", attn_weights, golden.ATTN_WEIGHTS),
        holds("rows sum to 1", torch.allclose(attn_weights.sum(-1), torch.ones(6))),
        heat=attn_weights,
    )
    add(
        "context_all",
        "all_context_vecs = attn_weights @ inputs",
        fmt(all_context_vecs),
        matches_book("all_context_vecs", all_context_vecs, golden.ALL_CONTEXT_VECS),
        holds("row 2 == z(2) from the loop", torch.allclose(all_context_vecs[1], context_vec_2)),
    )


def _trainable(add: Add) -> None:
    inputs = book.embedded_inputs()
    w = book.trainable_walkthrough(inputs, d_out=2, seed=123)
    add(
        "weights_init",
        "torch.manual_seed(123)\nW_query = torch.nn.Parameter(torch.rand(d_in, d_out))  # then W_key, W_value",
        f"W_query={fmt(w.W_query)}\nW_key={fmt(w.W_key)}\nW_value={fmt(w.W_value)}",
        matches_book("W_query", w.W_query, golden.W_QUERY),
        matches_book("W_key", w.W_key, golden.W_KEY),
        matches_book("W_value", w.W_value, golden.W_VALUE),
    )
    add(
        "qkv_2",
        "query_2 = x_2 @ W_query; key_2 = x_2 @ W_key; value_2 = x_2 @ W_value",
        f"query_2={fmt(w.query_2)}\nkey_2={fmt(w.key_2)}\nvalue_2={fmt(w.value_2)}",
        matches_book("query_2", w.query_2, golden.QUERY_2),
        matches_book("key_2", w.key_2, golden.KEY_2),
        matches_book("value_2", w.value_2, golden.VALUE_2),
    )
    add(
        "keys_values",
        "keys = inputs @ W_key; values = inputs @ W_value",
        f"keys.shape={w.keys.shape}, values.shape={w.values.shape}",
        holds("keys.shape == (6, 2)", tuple(w.keys.shape) == golden.KEYS_SHAPE),
        holds("values.shape == (6, 2)", tuple(w.values.shape) == golden.VALUES_SHAPE),
    )
    add(
        "score_22",
        "attn_score_22 = query_2.dot(key_2)",
        fmt(w.attn_score_22),
        matches_book("attn_score_22", w.attn_score_22, golden.ATTN_SCORE_22),
    )
    add(
        "scores_2_trainable",
        "attn_scores_2 = query_2 @ keys.T",
        fmt(w.attn_scores_2),
        matches_book("attn_scores_2", w.attn_scores_2, golden.ATTN_SCORES_2_TRAINABLE),
    )
    add(
        "weights_2_scaled",
        "attn_weights_2 = torch.softmax(attn_scores_2 / d_k**0.5, dim=-1)",
        fmt(w.attn_weights_2),
        matches_book("attn_weights_2", w.attn_weights_2, golden.ATTN_WEIGHTS_2_SCALED),
    )
    add(
        "context_2_trainable",
        "context_vec_2 = attn_weights_2 @ values",
        fmt(w.context_vec_2),
        matches_book("context_vec_2", w.context_vec_2, golden.CONTEXT_VECTOR_2),
    )

    torch.manual_seed(123)
    sa_v1 = book.SelfAttentionV1(3, 2)
    out_v1 = sa_v1(inputs)
    add(
        "sa_v1",
        "torch.manual_seed(123)\nsa_v1 = SelfAttentionV1(d_in=3, d_out=2)\nsa_v1(inputs)",
        fmt(out_v1),
        matches_book("sa_v1(inputs)", out_v1, golden.SA_V1_OUTPUT),
        matches_book("row 2 == z(2)", out_v1[1], golden.CONTEXT_VECTOR_2),
    )

    torch.manual_seed(789)
    sa_v2 = book.SelfAttentionV2(3, 2)
    out_v2 = sa_v2(inputs)
    book.transfer_v2_to_v1(sa_v2, sa_v1)
    add(
        "sa_v2",
        "torch.manual_seed(789)\nsa_v2 = SelfAttentionV2(d_in=3, d_out=2)\nsa_v2(inputs)",
        fmt(out_v2),
        matches_book("sa_v2(inputs)", out_v2, golden.SA_V2_OUTPUT),
        holds("V1 with V2's transposed weights gives V2's output", torch.allclose(sa_v1(inputs), out_v2, atol=1e-6)),
    )


def _causal_and_multihead(add: Add) -> None:
    inputs = book.embedded_inputs()
    torch.manual_seed(789)  # the book reuses sa_v2 from seed 789 for section 3.5
    sa_v2 = book.SelfAttentionV2(3, 2)
    queries, keys = sa_v2.W_query(inputs), sa_v2.W_key(inputs)
    attn_scores = queries @ keys.T
    attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
    simple = book.causal_weights_renormalized(attn_weights)
    upper = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    add(
        "causal_simple",
        "attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)\n"
        "masked_simple = attn_weights * torch.tril(torch.ones(6, 6))\n"
        "masked_simple_norm = masked_simple / masked_simple.sum(dim=-1, keepdim=True)",
        f"attn_weights:\n{fmt(attn_weights)}\nmasked_simple_norm:\n{fmt(simple)}",
        matches_book("attn_weights", attn_weights, golden.CAUSAL_UNMASKED_WEIGHTS),
        matches_book("masked_simple_norm", simple, golden.CAUSAL_WEIGHTS),
        holds("upper triangle is exactly 0", bool((simple[upper] == 0).all())),
        holds("rows sum to 1", torch.allclose(simple.sum(-1), torch.ones(6))),
        heat=simple,
    )
    masked_scores = attn_scores.masked_fill(upper, -torch.inf)
    masked = book.causal_weights_masked(attn_scores, keys.shape[-1])
    add(
        "causal_inf",
        "masked = attn_scores.masked_fill(mask.bool(), -torch.inf)\n"
        "attn_weights = torch.softmax(masked / keys.shape[-1]**0.5, dim=-1)",
        f"masked:\n{fmt(masked_scores)}\nattn_weights:\n{fmt(masked)}",
        matches_book("masked", masked_scores, golden.CAUSAL_MASKED_SCORES),
        matches_book("attn_weights", masked, golden.CAUSAL_WEIGHTS),
        holds("same weights as the renormalized method", torch.allclose(masked, simple, atol=1e-6)),
        heat=masked,
    )

    torch.manual_seed(123)
    dropout = torch.nn.Dropout(0.5)
    example = dropout(torch.ones(6, 6))
    kept = example[example != 0]
    add(
        "dropout",
        "torch.manual_seed(123)\ndropout = torch.nn.Dropout(0.5)\ndropout(torch.ones(6, 6))",
        fmt(example),
        holds("survivors scaled by 1/(1-p) = 2", bool((kept == 2).all())),
        holds("about half dropped", 0.25 < (example == 0).float().mean().item() < 0.75),
        holds("identity in eval()", bool((dropout.eval()(torch.ones(6, 6)) == 1).all())),
        heat=example,
    )

    batch = book.batched_inputs()  # (2, 6, 3)
    torch.manual_seed(123)
    ca = book.CausalAttention(3, 2, batch.shape[1], 0.0)
    with Recorder() as rec:
        context_vecs = ca(batch)
    changed = batch.clone()
    changed[:, 4:] += 1.0  # edit the future of position 3
    add(
        "causal_class",
        "torch.manual_seed(123)\nca = CausalAttention(d_in=3, d_out=2, context_length=6, dropout=0.0)\n"
        "context_vecs = ca(batch)",
        f"{fmt(context_vecs)}\ncontext_vecs.shape: {context_vecs.shape}",
        matches_book("context_vecs[0]", context_vecs[0], golden.CAUSAL_ATTENTION_OUTPUT),
        matches_book("context_vecs[1]", context_vecs[1], golden.CAUSAL_ATTENTION_OUTPUT),
        holds("positions 0..3 ignore changes at 4..5", torch.equal(ca(changed)[:, :4], context_vecs[:, :4])),
        heat=rec.get("attn_weights")[0],
    )

    torch.manual_seed(123)
    mha_wrapper = book.MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)
    with Recorder() as rec:
        wrapped = mha_wrapper(batch)
    head_weights = torch.stack([s.tensor[0] for s in rec.steps if s.name == "attn_weights"])  # (heads, 6, 6)
    add(
        "mha_wrapper",
        "torch.manual_seed(123)\nmha = MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)",
        f"{fmt(wrapped)}\ncontext_vecs.shape: {wrapped.shape}",
        holds("shape (2, 6, 4)", tuple(wrapped.shape) == (2, 6, 4)),
        matches_book("context_vecs[0]", wrapped[0], golden.MHA_WRAPPER_OUTPUT),
        heat=head_weights,
    )

    torch.manual_seed(123)
    mha = book.MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)
    with Recorder() as rec:
        out = mha(batch)
    gpt2 = sum(p.numel() for p in book.MultiHeadAttention(768, 768, 1024, 0.0, 12).parameters())
    add(
        "mha",
        "torch.manual_seed(123)\nmha = MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)",
        f"{fmt(out)}\ncontext_vecs.shape: {out.shape}\nGPT-2 size parameters: {gpt2:,}",
        holds("shape (2, 6, 2)", tuple(out.shape) == (2, 6, 2)),
        matches_book("context_vecs[0]", out[0], golden.MHA_OUTPUT),
        holds("GPT-2 size: 2,360,064 parameters", gpt2 == golden.GPT2_MHA_PARAMETERS, f"got {gpt2:,}"),
        heat=rec.get("attn_weights")[0],
    )

    keys_prefix = mha.W_key(batch[:, :4])
    keys_full = mha.W_key(batch)
    add(
        "kv_cache",
        "keys_prefix = mha.W_key(batch[:, :4]); keys_full = mha.W_key(batch)",
        f"keys_full[0, :4] ==\n{fmt(keys_prefix[0])}",
        holds("keys of tokens 0..3 do not change when tokens 4, 5 arrive", torch.equal(keys_prefix, keys_full[:, :4])),
    )


def mismatches(steps: Sequence[TourStep]) -> list[tuple[str, Check]]:
    return [(s.key, c) for s in steps for c in s.checks if not c.ok]
