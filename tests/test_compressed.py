"""DeepSeek-V4's compressed layers (attnlab.nn.compressed): the readable and fast forms agree, an entry is invisible
before its block closes, the fast form gathers only what it reads (a meter from its own indices), the compressor
against a float64 reference written here from the paper's formula, and the layer against transformers' own."""

from __future__ import annotations

import pytest
import torch

from attnlab.functional.compression import compress, compress_readable
from attnlab.nn.compressed import CompressedAttention

PEER_SEED = 2  # transformers' layer's weights: a seed whose indexer choices have a margin (see margin)
SIZES = dict(d_model=32, num_heads=4, head_dim=16, rope_dim=8, q_lora_rank=12, window=5, o_groups=2, o_lora_rank=6)


def layer(index_topk: int | None, block: int = 4, seed: int = 0) -> CompressedAttention:
    torch.manual_seed(seed)
    made = CompressedAttention(**SIZES, compress_block=block, index_topk=index_topk, index_heads=2, index_head_dim=8)
    for p in made.parameters():
        torch.nn.init.normal_(p, std=0.3)  # random gates, biases and sinks: every part acts
    return made


def inputs(t: int = 23, seed: int = 1) -> torch.Tensor:
    return torch.randn(2, t, 32, generator=torch.Generator().manual_seed(seed))


def margin(attn: CompressedAttention, x: torch.Tensor) -> float:
    """The least gap, over queries with more closed entries than k, between the k-th and the next score: top-k
    on random weights can tie (every indexer head's ReLU at 0) and flip under any change of summation order, so
    a test that compares two runs' choices asserts this is clear of rounding."""
    assert attn.index_topk is not None
    t, k, m = x.shape[1], attn.index_topk, attn.compress_block
    positions = torch.arange(t)
    with torch.no_grad():
        _, _, q_latent, rows = attn._project(x, positions)
        _, index = attn._entries(rows, 0, readable=True)
        assert index is not None
        scores = attn.scores(x, q_latent, index, positions)
    gaps = [
        float(s[k - 1] - s[k])
        for p in range(t)
        if (p + 1) // m > k
        for s in scores[:, p, : (p + 1) // m].sort(dim=-1, descending=True).values
    ]
    return min(gaps)


@pytest.mark.parametrize("overlap", [True, False])
def test_the_compressor_fast_form_equals_a_float64_reference_of_the_formula(overlap: bool) -> None:
    """entry_w = sum_j softmax_j(z_j + bias_j) c_j per channel, over block w's second series and (overlap) block
    w-1's first series; block 0 pools its own alone. Written here channel by channel in float64."""
    g = torch.Generator().manual_seed(2)
    m, d, n = 4, 3, 5
    c = 2 * d if overlap else d
    kv, gate, bias = (
        torch.randn(1, n * m + 2, c, generator=g),
        torch.randn(1, n * m + 2, c, generator=g),
        torch.randn(m, c, generator=g),
    )
    got = compress(kv, gate, bias, block=m, overlap=overlap)
    assert torch.allclose(got, compress_readable(kv, gate, bias, block=m, overlap=overlap), atol=1e-6)
    assert got.shape == (1, n, d)  # the open block's 2 tokens make no entry
    for w in range(n):
        for ch in range(d):
            slots = [(w * m + j, j, ch + c - d) for j in range(m)]  # (token, place, channel): its own block's
            if overlap and w > 0:
                slots += [((w - 1) * m + j, j, ch) for j in range(m)]  # the block before's first series
            logits = torch.tensor(
                [float(gate[0, tok, k]) + float(bias[j, k]) for tok, j, k in slots], dtype=torch.float64
            )
            values = torch.tensor([float(kv[0, tok, k]) for tok, _, k in slots], dtype=torch.float64)
            want = float((torch.softmax(logits, 0) * values).sum())
            assert abs(float(got[0, w, ch]) - want) < 1e-5, (w, ch)


@pytest.mark.parametrize("index_topk", [2, None])
def test_readable_and_fast_forms_agree_whole_and_through_a_cache(index_topk: int | None) -> None:
    """Both kinds: the readable form (every key, a mask) equals the gathered one, whole; and a prefill, decode
    steps and a chunk through the layer's cache equal the whole sequence (blocks close inside chunks and steps)."""
    from attnlab.cache import ModelCache

    attn, x = layer(index_topk, seed=2), inputs()
    if index_topk is not None:
        assert margin(attn, x) > 1e-4  # this seed's choices are clear of rounding
    with torch.no_grad():
        whole = attn.readable(x)
        assert torch.allclose(attn(x), whole, atol=1e-5)
        cache = ModelCache.build([attn.layer_state()], rows=2, capacity=32)[0]
        parts = [attn(x[:, :7], cache=cache)] + [attn(x[:, i : i + 1], cache=cache) for i in range(7, 13)]
        parts.append(attn(x[:, 13:], cache=cache))
    assert torch.allclose(torch.cat(parts, dim=1), whole, atol=1e-5)


@pytest.mark.parametrize("index_topk", [2, None])
@pytest.mark.parametrize("form", ["readable", "fast"])
def test_an_entry_is_invisible_before_its_block_closes(index_topk: int | None, form: str) -> None:
    """A query's output does not change when the tokens after it change, though they share its open block: what
    an open block holds never reaches an entry a query reads. Seen red with closing_positions at a block's first
    token (an open block's entry visible) and with the compressor pooling past the query."""
    attn, x = layer(index_topk, block=4), inputs()
    run = attn.readable if form == "readable" else attn
    y = x.clone()
    t = 13  # position 13: block 3 (12..15) is open, its entry closes at 15
    y[:, t + 1 :] = torch.randn(2, x.shape[1] - t - 1, 32, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        before, after = run(x), run(y)
    assert torch.allclose(before[:, : t + 1], after[:, : t + 1], atol=1e-6)
    assert not torch.allclose(before[:, t + 1 :], after[:, t + 1 :], atol=1e-3)  # the change is seen after


def test_the_closed_entries_change_the_output() -> None:
    """Effect: change what the compressor pools and the output moves, from the first block's close on (the
    entries are normed, so the change is a direction, not a scale)."""
    attn, x = layer(None, block=4), inputs()
    with torch.no_grad():
        with_entries = attn(x)
        attn.compressor.kv_proj.weight.add_(torch.randn_like(attn.compressor.kv_proj.weight))
        moved = attn(x)
    assert not torch.allclose(with_entries[:, 3:], moved[:, 3:], atol=1e-3)  # from the first closed block on
    assert torch.allclose(with_entries[:, :3], moved[:, :3])  # before it, no entry: nothing moves


def test_the_keys_read_meter_counts_the_gathered_entries_and_falls_with_top_k() -> None:
    """From the gather's own indices: query t of a compressed-sparse layer reads min(k, closed(t)) entries, with
    closed(t) = (t + 1) // m; a heavily compressed one reads every closed entry; and the window's tokens,
    min(t + 1, W). The counts here are arithmetic on positions, not the layer's."""
    x, t, m, w = inputs(), 23, 4, 5
    closed = [(p + 1) // m for p in range(t)]
    reads = {}
    for k in (4, 2, 1):
        attn = layer(k)
        with torch.no_grad():
            attn(x)
        assert int(attn.keys_read) == 2 * sum(min(k, c) for c in closed)
        assert int(attn.window_read) == 2 * sum(min(p + 1, w) for p in range(t))
        reads[k] = int(attn.keys_read)
    assert reads[4] > reads[2] > reads[1]
    heavy = layer(None)
    with torch.no_grad():
        heavy(x)
    assert int(heavy.keys_read) == 2 * sum(closed)


def test_bad_sizes_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="compress_block must be an int in"):
        CompressedAttention(**SIZES, compress_block=1, index_topk=None)
    with pytest.raises(ValueError, match="o_groups=3 splits the heads"):
        CompressedAttention(**{**SIZES, "o_groups": 3}, compress_block=4, index_topk=None)
    with pytest.raises(ValueError, match="index_head_dim=4 turns its last rope_dim=8"):
        CompressedAttention(**SIZES, compress_block=4, index_topk=2, index_heads=1, index_head_dim=4)


@pytest.mark.slow
@pytest.mark.parametrize("layer_type", ["compressed_sparse_attention", "heavily_compressed_attention"])
def test_the_layer_equals_transformers_deepseek_v4_attention(layer_type: str) -> None:
    """transformers 5.24's DeepseekV4Attention on a random small config (blocks of 4 and 8 that close and stay
    open, top-2 of up to 5 entries, a window of 5, sinks), its weights loaded under their own names: within 1e-5.
    The indexer's top-k on random weights can tie: the test asserts this seed's margin at the k-th score."""
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Attention, DeepseekV4RotaryEmbedding

    rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}
    config = DeepseekV4Config(
        vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, head_dim=16, q_lora_rank=12,
        layer_types=[layer_type], compress_rates=rates, sliding_window=5, o_groups=2, o_lora_rank=6,
        index_n_heads=2, index_head_dim=8, index_topk=2, partial_rotary_factor=0.5, n_routed_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, hc_mult=2,
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(PEER_SEED)
    theirs = DeepseekV4Attention(config, 0)
    for p in theirs.parameters():
        torch.nn.init.normal_(p, std=0.3)
    sparse = layer_type == "compressed_sparse_attention"
    ours = CompressedAttention(
        **SIZES, compress_block=rates[layer_type], index_topk=2 if sparse else None, index_heads=2, index_head_dim=8,
        rope_theta=config.compress_rope_theta,
    )  # fmt: skip
    renamed = {"compressor.indexer.scorer.": "indexer.", "compressor.indexer.q_b_proj": "indexer.q_b_proj"}
    state = {}
    for key, value in theirs.state_dict().items():
        for old, new in renamed.items():
            key = key.replace(old, new)
        state[key.replace("compressor.indexer.", "indexer.compressor.")] = value
    ours.load_state_dict(state)  # strict: every weight has its place
    t = 23
    x = torch.randn(1, t, 32, generator=torch.Generator().manual_seed(1))
    if sparse:
        assert margin(ours, x) > 1e-4  # this seed's choices are clear of rounding
    positions = torch.arange(t)[None]
    rotary = DeepseekV4RotaryEmbedding(config)
    angles = {kind: rotary(x, positions, layer_type=kind) for kind in ("main", "compress")}
    i = torch.arange(t)
    window = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < 5)
    mask = torch.zeros(1, 1, t, t).masked_fill(~window, float("-inf"))
    with torch.no_grad():
        want = theirs(x, angles, positions, mask, None)[0]
        assert torch.allclose(ours.readable(x), want, atol=1e-5)
        assert torch.allclose(ours(x), want, atol=1e-5)
