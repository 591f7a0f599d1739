"""Tour, part 3 (sections 3.5 to 3.6 and the KV cache): hide the future, many heads, generate token by token."""

from __future__ import annotations

import torch

from attnlab import book
from attnlab.book import golden
from attnlab.cache import EvictingCache, KVCache, PagedKVCache, QuantizedKVCache, SinkCache
from attnlab.explain.tour.core import Add, Checker, fmt
from attnlab.models.loaders import from_book_mha
from attnlab.nn.attention import Attention
from attnlab.observe import Recorder


def kv_cache_steps(attn: Attention, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Feed x (1, T, d) one token at a time through a KVCache; eager backend.

    Returns each step's new weight row (H, t) and the rows stacked into a
    (H, T, T) matrix, zero-padded on the right.
    """
    if attn.backend != "eager":
        raise ValueError(f"the step-through records weights, which only the eager backend forms; got {attn.backend!r}")
    t = x.shape[1]
    cache = KVCache(batch_size=1, num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim, max_len=t, dtype=x.dtype)
    rows, stacked = [], torch.zeros(attn.num_heads, t, t)
    with torch.no_grad():
        for i in range(t):
            with Recorder() as rec:
                attn(x[:, i : i + 1], cache=cache)
            row = rec.get("attn_weights")[0, :, 0, : i + 1]  # (H, i + 1): the filled slots of the cache
            rows.append(row)
            stacked[:, i, : i + 1] = row
    return rows, stacked


def cache_lab(attn: Attention, x: torch.Tensor) -> dict[str, object]:
    """The KV-cache lab on one sentence x (1, T, d), fed one token at a time through four caches.

    Returns the paged cache's stacked rows (H, T, T) and block table, the sink cache's last output and the
    same from plain attention over the tokens it kept, the int8 cache's largest key error and its bound,
    and H2O's kept grid (T steps x T positions: 1 kept, 0.5 let go, 0 not yet seen) with its last kept set.
    """
    t, h_kv, d = x.shape[1], attn.num_kv_heads, attn.head_dim
    shape = dict(batch_size=1, num_kv_heads=h_kv, head_dim=d, dtype=x.dtype)
    paged = PagedKVCache(**shape, num_blocks=-(-t // 2), max_len=t, block_size=2)  # type: ignore[arg-type]
    sink = SinkCache(**shape, sinks=1, recent=3)  # type: ignore[arg-type]
    quant = QuantizedKVCache(**shape, max_len=t + 1, bits=8, group_size=2, residual=2)  # type: ignore[arg-type]
    h2o = EvictingCache(**shape, budget=4, recent=2)  # type: ignore[arg-type]
    stacked, kept = torch.zeros(attn.num_heads, t, t), torch.zeros(t, t)
    keys = attn.split_qkv(x)[1]  # (1, Hkv, T, D): the exact keys
    with torch.no_grad():
        for i in range(t):
            token = x[:, i : i + 1]
            with Recorder() as rec:
                attn(token, cache=paged)
            weights = rec.get("attn_weights")[0, :, 0]  # (H, slots)
            stacked[:, i, : i + 1] = weights[:, : i + 1]
            sink_out = attn(token, cache=sink)
            attn(token, cache=quant)
            attn(token, cache=h2o)
            kept[i, : i + 1] = 0.5
            kept[i, h2o.positions[0]] = 1.0
        held = sorted(p for p in sink.held_positions().tolist() if p >= 0)  # slot order is not position order
        sink_plain = attn(x[:, held])[:, -1:]  # the kept tokens as if they were the whole sentence
        read = quant.update(torch.zeros_like(keys[:, :, :1]), torch.zeros_like(keys[:, :, :1]))[0]  # one more step
    error = (read[:, :, : t - 2] - keys[:, :, : t - 2]).abs().max()  # the quantized ones (the last 2 are exact)
    span = keys[:, :, : t - 2].amax() - keys[:, :, : t - 2].amin()
    return {
        "stacked": stacked,
        "blocks": paged.block_table[0].tolist(),
        "waste": paged.waste(),
        "sink_held": held,
        "sink_out": sink_out,
        "sink_plain": sink_plain,
        "int8_error": float(error),
        "int8_bound": float(span) / 255,  # a whole code's width over all keys: each group's own is narrower
        "kept": kept,
        "h2o_kept": h2o.positions[0].tolist(),
        "h2o_evicted": sorted(h2o.evicted[0]),
    }


def kv_step_lines(rows: list[torch.Tensor], template: str) -> list[str]:
    """One line per step of :func:`kv_cache_steps`: head 0's new row of weights, in the language's ``template``."""
    return [template.format(t=i + 1, row=", ".join(f"{v:.4f}" for v in row[0].tolist())) for i, row in enumerate(rows)]


def causal(add: Add, c: Checker) -> None:
    inputs = book.embedded_inputs()  # (6, 3)
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
        c.book("attn_weights", attn_weights, golden.CAUSAL_UNMASKED_WEIGHTS),
        c.book("masked_simple_norm", simple, golden.CAUSAL_WEIGHTS),
        c.holds("upper_zero", bool((simple[upper] == 0).all())),
        c.holds("rows_sum_1", torch.allclose(simple.sum(-1), torch.ones(6))),
        heat=simple,
    )
    masked_scores = attn_scores.masked_fill(upper, -torch.inf)
    masked = book.causal_weights_masked(attn_scores, keys.shape[-1])
    add(
        "causal_inf",
        "masked = attn_scores.masked_fill(mask.bool(), -torch.inf)\n"
        "attn_weights = torch.softmax(masked / keys.shape[-1]**0.5, dim=-1)",
        f"masked:\n{fmt(masked_scores)}\nattn_weights:\n{fmt(masked)}",
        c.book("masked", masked_scores, golden.CAUSAL_MASKED_SCORES),
        c.book("attn_weights", masked, golden.CAUSAL_WEIGHTS),
        c.holds("same_as_renormalized", torch.allclose(masked, simple, atol=1e-6)),
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
        c.holds("dropout_scale", bool((kept == 2).all())),
        c.holds("dropout_half", 0.25 < (example == 0).float().mean().item() < 0.75),
        c.holds("dropout_eval", bool((dropout.eval()(torch.ones(6, 6)) == 1).all())),
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
        c.book("context_vecs[0]", context_vecs[0], golden.CAUSAL_ATTENTION_OUTPUT),
        c.book("context_vecs[1]", context_vecs[1], golden.CAUSAL_ATTENTION_OUTPUT),
        c.holds("future_ignored", torch.equal(ca(changed)[:, :4], context_vecs[:, :4])),
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
        c.holds("shape", tuple(wrapped.shape) == (2, 6, 4), shape="(2, 6, 4)"),
        c.book("context_vecs[0]", wrapped[0], golden.MHA_WRAPPER_OUTPUT),
        heat=head_weights,
    )

    torch.manual_seed(123)
    mha = book.MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)
    with Recorder() as rec:
        out = mha(batch)
    full_weights = rec.get("attn_weights")[0]  # (heads, 6, 6) of the first sentence
    gpt2 = sum(p.numel() for p in book.MultiHeadAttention(768, 768, 1024, 0.0, 12).parameters())
    add(
        "mha",
        "torch.manual_seed(123)\nmha = MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)",
        f"{fmt(out)}\ncontext_vecs.shape: {out.shape}\n{c.say('gpt2_size')}: {gpt2:,}",
        c.holds("shape", tuple(out.shape) == (2, 6, 2), shape="(2, 6, 2)"),
        c.book("context_vecs[0]", out[0], golden.MHA_OUTPUT),
        c.holds("gpt2_params", gpt2 == golden.GPT2_MHA_PARAMETERS, f"{gpt2:,}"),
        heat=full_weights,
    )

    keys_prefix = mha.W_key(batch[:, :4])
    keys_full = mha.W_key(batch)
    add(
        "kv_cache",
        "keys_prefix = mha.W_key(batch[:, :4]); keys_full = mha.W_key(batch)",
        f"keys_full[0, :4] ==\n{fmt(keys_prefix[0])}",
        c.holds("keys_fixed", torch.equal(keys_prefix, keys_full[:, :4])),
    )

    attn = from_book_mha(mha.eval(), backend="eager")  # the same weights in attnlab.Attention, which takes a cache
    rows, stacked = kv_cache_steps(attn, batch[:1])
    lines = kv_step_lines(rows, c.words["kv_step"])
    add(
        "kv_steps",
        "cache = KVCache(batch_size=1, num_kv_heads=2, head_dim=1, max_len=6)\n"
        f"for t in range(6):\n    attn(x[:, t : t + 1], cache=cache)  # {c.say('cm_one_token')}",
        "\n".join(lines),
        c.holds("kv_rows", torch.allclose(stacked, full_weights, atol=1e-6)),
        heat=stacked,
    )

    lab = cache_lab(attn, batch[:1])
    add(
        "kv_lab",
        "PagedKVCache(..., block_size=2)  SinkCache(..., sinks=1, recent=3)\n"
        "QuantizedKVCache(..., bits=8, group_size=2, residual=2)  EvictingCache(..., budget=4, recent=2)",
        "\n".join(
            [
                c.say("lab_paged", blocks=lab["blocks"], waste=lab["waste"]),
                c.say("lab_sink", held=lab["sink_held"]),
                c.say("lab_int8", err=lab["int8_error"], bound=lab["int8_bound"]),
                c.say("lab_h2o", kept=lab["h2o_kept"], evicted=lab["h2o_evicted"]),
            ]
        ),
        c.holds("lab_paged", torch.allclose(lab["stacked"], full_weights, atol=1e-6)),  # type: ignore[arg-type]
        c.holds("lab_sink", torch.allclose(lab["sink_out"], lab["sink_plain"], atol=1e-6)),  # type: ignore[arg-type]
        c.holds("lab_int8", 0 < lab["int8_error"] <= lab["int8_bound"] / 2),  # type: ignore[operator]
        c.holds("lab_h2o", len(lab["h2o_kept"]) == 4),  # type: ignore[arg-type]
        heat=lab["kept"],
    )
    add("summary", "", "")
