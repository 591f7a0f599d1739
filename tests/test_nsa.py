"""Native Sparse Attention (issue 59 item 1): compressed, selected and sliding branches mixed by gates.

The fast form (each group's query over its gathered blocks) equals the readable one (every key, all but the
chosen blocks hidden); with the gates fixed to one branch the layer is that branch alone: the sliding branch is
attnlab's windowed ``Attention`` with the same weights, the compressed branch a float64 loop written here from
the paper's description; keys read fall as select_n falls; greedy decoding through a cache equals the no-cache
forward; bad sizes are refused by name.
"""

from __future__ import annotations

import pytest
import torch

from attnlab import Attention
from attnlab.functional.nsa import nsa_select
from attnlab.models import GPT
from attnlab.models.zoo import zoo_config
from attnlab.nn.nsa import NSAAttention

E, H, HK, D, T = 32, 4, 2, 8, 45
SIZES = dict(compress_block=8, stride=4, select_block=8, slide=12, context_length=64)


def layer(select_n: int = 4, seed: int = 0) -> NSAAttention:
    torch.manual_seed(seed)
    made = NSAAttention(select_n=select_n, d_in=E, num_heads=H, num_kv_heads=HK, rope=True, **SIZES).double()
    with torch.no_grad():  # a compression and gates that are not their initial mean and one half
        made.compress_k.add_(torch.randn_like(made.compress_k) * 0.1)
        made.compress_k_pos.normal_(0, 0.3)
        made.compress_v_pos.normal_(0, 0.3)
        made.gate_proj.bias.normal_(0, 1)
    return made.eval()


def x_in(seed: int = 1) -> torch.Tensor:
    return torch.randn(2, T, E, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def only(made: NSAAttention, branch: int) -> NSAAttention:
    with torch.no_grad():
        made.gate_proj.weight.zero_()
        made.gate_proj.bias.copy_(torch.tensor([40.0 if c == branch else -40.0 for c in range(3)] * H))
    return made


@torch.no_grad()
def test_the_gathered_selection_gives_the_readable_forms_output() -> None:
    made, x = layer(), x_in()
    torch.testing.assert_close(made(x), made.readable(x), rtol=0, atol=1e-12)
    assert made.keys_read > 0


@torch.no_grad()
def test_the_sliding_branch_alone_is_attnlabs_windowed_attention() -> None:
    made, x = only(layer(), 2), x_in()
    window = Attention(d_in=E, num_heads=H, num_kv_heads=HK, rope=True, window=SIZES["slide"]).double().eval()
    q, hd = H * D, 3 * HK * D
    rows = [torch.arange(q)]
    for part in (q, q + hd):  # each head's sliding key rows, then its sliding value rows
        rows += [part + h * 3 * D + 2 * D + torch.arange(D) for h in range(HK)]
    window.qkv.weight.copy_(made.qkv.weight[torch.cat(rows)])
    window.out_proj.load_state_dict(made.out_proj.state_dict())
    torch.testing.assert_close(made(x), window(x), rtol=0, atol=1e-12)
    assert (made(x) - only(made, 1)(x)).abs().max() > 1e-3  # another branch alone is another output


@pytest.mark.slow  # a Python loop over every (row, head, query)
@torch.no_grad()
def test_the_compressed_branch_alone_is_a_loop_over_closed_blocks() -> None:
    made, x = only(layer(), 0), x_in()
    size, d = SIZES["compress_block"], SIZES["stride"]
    q, k, v = made.project(x, torch.arange(T))  # q (B, H, T, D); k, v (B, Hk, T, 3D)
    expected = torch.zeros(2, H, T, D, dtype=torch.float64)
    for b in range(2):
        for h in range(H):
            g = h // (H // HK)
            for t in range(T):
                starts = [s for s in range(0, T, d) if s + size - 1 <= t]  # the blocks closed at or before t
                if not starts:
                    continue  # nothing closed yet: the branch reads nothing
                ek = torch.stack([sum(made.compress_k[j] @ (k[b, g, s + j, :D] + made.compress_k_pos[j]) for j in range(size)) for s in starts])  # fmt: skip
                ev = torch.stack([sum(made.compress_v[j] @ (v[b, g, s + j, :D] + made.compress_v_pos[j]) for j in range(size)) for s in starts])  # fmt: skip
                weights = torch.softmax(ek @ q[b, h, t] / D**0.5, dim=0)
                expected[b, h, t] = weights @ ev
    torch.testing.assert_close(made(x), made.merge_heads(expected), rtol=0, atol=1e-10)


def test_selection_takes_the_first_and_local_blocks_and_the_best_scored_not_the_worst() -> None:
    weights = torch.zeros(1, 2, 1, 15, dtype=torch.float64)  # 15 entries of 8 every 4 over 64 keys; one query
    weights[0, :, 0, 5] = 1.0  # entry 5 covers positions 20..27: selection blocks 2 and 3
    q_pos = torch.tensor([[63]])  # block 7: its own, 6 and 0 are always read
    sizes = dict(kv_heads=1, compress_block=8, stride=4, select_block=8)
    best = nsa_select(weights, q_pos, 64, select_n=5, **sizes)
    worst = nsa_select(-weights, q_pos, 64, select_n=5, **sizes)
    assert set(best[0, 0, 0].tolist()) == {7, 6, 0, 2, 3}
    assert {2, 3}.isdisjoint(worst[0, 0, 0].tolist()) and {7, 6, 0} <= set(worst[0, 0, 0].tolist())
    same = dict(kv_heads=1, compress_block=8, stride=8, select_block=8)  # l = l' = d: p_slc is p_cmp (eq. 9)
    weights = torch.zeros(1, 2, 1, 8, dtype=torch.float64)
    weights[0, :, 0, 4] = 1.0
    assert set(nsa_select(weights, q_pos, 64, select_n=4, **same)[0, 0, 0].tolist()) == {7, 6, 0, 4}


def test_a_key_planted_far_back_is_selected_through_the_compressed_branch_and_missed_by_the_lowest() -> None:
    """One head; blocks of 8 compressed every 8 (mean-pooled, as a fresh layer does); a key planted in block 2 of
    64 that the last query matches: its entry draws the compressed weight, so its block is selected, and the
    selected branch reads its value. The lowest scores choose other blocks and miss it."""
    from attnlab.functional.nsa import compress, compressed_attention
    from attnlab.functional.sparse_blocks import gathered_attention

    g = torch.Generator().manual_seed(6)
    q, k = (torch.randn(1, 1, 64, D, generator=g, dtype=torch.float64) * 0.1 for _ in range(2))
    v = torch.zeros(1, 1, 64, D, dtype=torch.float64)
    needle = torch.zeros(D, dtype=torch.float64)
    needle[0] = 1.0
    k[0, 0, 19], v[0, 0, 19], q[0, 0, -1] = 64 * needle, needle, needle  # position 19: block 2 (16..23)
    pos = torch.arange(64)[None]
    mean = torch.eye(D, dtype=torch.float64).expand(8, D, D) / 8
    entries, ends = compress(k, pos, mean, torch.zeros(8, D, dtype=torch.float64), block=8, stride=8)
    _, weights = compressed_attention(q, entries, entries, ends, pos, D**-0.5)
    sizes = dict(kv_heads=1, compress_block=8, stride=8, select_block=8, select_n=4)
    for sign, finds in ((1, True), (-1, False)):
        chosen = nsa_select(sign * weights, pos, 64, **sizes)  # type: ignore[arg-type]
        out, _ = gathered_attention(q, k, v, chosen, pos, pos, block=8)
        assert (2 in chosen[0, 0, -1].tolist()) == finds
        assert (out[0, 0, -1, 0] > 0.99) == finds, float(out[0, 0, -1, 0])


@torch.no_grad()
def test_the_selected_branch_gathers_fewer_keys_as_select_n_falls_and_the_meter_says_what_every_branch_read() -> None:
    """The gather's own slots (recorded as "block_slots") fall with select_n. The layer's meter counts the keys a
    query's three branches drew on, once each: here checked against the keys given any weight by any head in the
    layer's map (entries spread over their blocks' keys, the chosen blocks, the window). The compression reads
    every closed block's keys again at each call, so that count stays where it is whatever select_n is."""
    from attnlab.observe import Recorder

    x = x_in(2)
    gathered, metered = [], []
    for n in (6, 5, 4, 3):
        made = layer(n)
        with Recorder(names=["block_slots", "attn_weights"]) as rec:
            made(x)
        gathered.append(int((rec.get("block_slots") >= 0).sum()))
        weights = rec.get("attn_weights")  # (B, H, T, T)
        assert int(made.keys_read) == int((weights > 0).any(dim=1).sum())
        metered.append(int(made.keys_read))
    assert gathered == sorted(gathered, reverse=True) and len(set(gathered)) == 4, gathered
    assert len(set(metered)) == 1 and metered[0] > sum(min(t + 1, SIZES["slide"]) for t in range(T)) * 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stride": 3}, "stride=3 must divide compress_block=8"),
        ({"select_block": 12, "stride": 8}, "stride=8 must divide select_block=12"),
        ({"compress_block": 16}, "compress_block=16 is longer than select_block=8"),
        ({"select_n": 9}, r"select_n=9 .* a context of 64 tokens holds 8 blocks"),
        ({"select_n": 2}, "select_n=2 .* at least 3"),
        ({"compress_block": 0}, "compress_block"),
        ({"slide": -1}, "window"),
    ],
)
def test_bad_sizes_are_refused_by_name(change: dict[str, int], message: str) -> None:
    sizes = {**SIZES, "select_n": 4, **change}
    with pytest.raises(ValueError, match=message):
        NSAAttention(d_in=E, num_heads=H, **sizes)  # type: ignore[arg-type]


@pytest.mark.slow  # two generations of 16 tokens and a no-cache loop
@torch.no_grad()
def test_greedy_through_a_cache_is_the_no_cache_forward() -> None:
    torch.manual_seed(0)
    model = GPT(zoo_config("nsa")).eval()
    prompt = torch.randint(1, 256, (1, 21), generator=torch.Generator().manual_seed(4))
    ids = prompt
    for _ in range(16):
        ids = torch.cat((ids, model(ids)[:, -1:].argmax(-1)), dim=1)
    assert torch.equal(model.generate(prompt, 16), ids)
    assert torch.equal(model.generate(prompt, 16, cache="paged"), ids)


@torch.no_grad()
def test_a_recorder_sees_the_gated_mixture_of_the_branches_weights() -> None:
    from attnlab.observe import Recorder

    made, x = layer(), x_in()
    with Recorder(names=["attn_weights"]) as rec:
        made(x)
    weights = rec.get("attn_weights")  # (B, H, T, S): the layer's last record
    assert weights.shape == (2, H, T, T) and (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, H, T, dtype=torch.float64))  # before a block closes too
    closed = SIZES["compress_block"] - 1  # the first query that reads a compressed entry, spread over its block
    assert (weights[:, :, closed, :closed] > 0).all()
    assert (weights.triu(1) == 0).all()  # nothing after the query
