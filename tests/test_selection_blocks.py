"""See the choice of MoBA and NSA (issue 59 item 6): the blocks each head (MoBA) or key group (NSA) read.

The recorded choice is the layer's own (``moba_select`` and ``nsa_select`` called here on the layer's own
projections); the keys recorded read are the gather's, and equal the chosen blocks' keys up to each query, written
by hand; the dense mass kept is 1 where the blocks chosen cover the past, and on a planted construction (a block
whose mean key scores low hiding the one key the dense head wants) it is the share written here by hand; the report
names the zoo's moba and nsa layers; ``zoo_kept_mass`` compares the zoo's sparse variants on one text.
"""

from __future__ import annotations

import math

import pytest
import torch

import test_nsa as nsa
from attnlab import Recorder
from attnlab.explain.model_report import model_report
from attnlab.explain.selection import layer_choices
from attnlab.explain.selection_zoo import zoo_kept_mass
from attnlab.functional.nsa import compress, compressed_attention, nsa_select
from attnlab.functional.sparse_blocks import moba_select
from attnlab.functional.visibility import Visibility
from attnlab.models import GPT
from attnlab.models.tokenizer import ByteTokenizer
from attnlab.models.zoo import zoo_config
from attnlab.nn.moba import MoBAAttention

SHORT = "sparse attention reads"  # 22 bytes: within every zoo variant's top-k
LONG = "a sparse query reads a chosen few keys; a dense head would have read them all, near and far. " * 2  # 188


def chosen_keys(blocks: torch.Tensor, block: int, slots: int) -> torch.Tensor:
    """(B, R, T, S) bool by hand: the keys of each (row, query)'s chosen blocks, none after the query."""
    b, r, t, _ = blocks.shape
    out = torch.zeros(b, r, t, slots, dtype=torch.bool)
    for i, j, q, n in (blocks >= 0).nonzero().tolist():
        k = int(blocks[i, j, q, n])
        for s in range(k * block, min((k + 1) * block, q + 1)):
            out[i, j, q, s] = True
    return out


def read_of(slots: torch.Tensor, columns: int) -> torch.Tensor:
    """Recorded "block_slots" (B, R, T, M) as (B, R, T, columns) bool."""
    marks = torch.zeros(*slots.shape[:3], columns + 1, dtype=torch.bool)
    return marks.scatter_(3, torch.where(slots >= 0, slots, columns), True)[..., :columns]


@torch.no_grad()
def test_a_moba_layers_record_is_its_own_choice_and_the_keys_it_gathered() -> None:
    torch.manual_seed(0)
    m = MoBAAttention(block_size=8, top_k=3, d_in=32, num_heads=4, num_kv_heads=2, context_length=64).double()
    x = torch.randn(2, 45, 32, dtype=torch.float64)
    with Recorder() as rec:
        m(x)
    q, k, _ = m.split_qkv(x)
    pos = torch.arange(45).expand(2, 45)
    own = moba_select(q, k, pos, pos, block=8, top_k=3)  # (B, H, T, K)
    assert torch.equal(rec.get("selected_blocks"), own)
    assert torch.equal(read_of(rec.get("block_slots"), 45), chosen_keys(own, 8, 45))
    dense = rec.get("dense_weights")  # (B, H, T, S): every key up to each query
    assert torch.allclose(dense.sum(-1), torch.ones(2, 4, 45, dtype=dense.dtype), atol=1e-9)
    assert torch.equal(dense > 0, torch.ones(45, 45, dtype=torch.bool).tril().expand_as(dense))


@torch.no_grad()
def test_an_nsa_layers_record_is_its_selected_branchs_choice_with_its_window_and_entries() -> None:
    m, x = nsa.layer(), nsa.x_in()
    with Recorder() as rec:
        m(x)
    pos = torch.arange(nsa.T).expand(2, nsa.T)
    q, keys, values = m.project(x, torch.arange(nsa.T))
    d, scale = nsa.D, nsa.D**-0.5
    entry_k, ends = compress(keys[..., :d], pos, m.compress_k, m.compress_k_pos, block=8, stride=4)
    entry_v, _ = compress(values[..., :d], pos, m.compress_v, m.compress_v_pos, block=8, stride=4)
    _, weights = compressed_attention(q, entry_k, entry_v, ends, pos, scale)
    own = nsa_select(weights, pos, nsa.T, kv_heads=2, compress_block=8, stride=4, select_block=8, select_n=4)
    assert torch.equal(rec.get("selected_blocks"), own)  # (B, Hk, T, K): one choice a key group
    assert torch.equal(read_of(rec.get("block_slots"), nsa.T), chosen_keys(own, 8, nsa.T))
    assert torch.equal(rec.get("entry_ends"), ends)
    t, s = torch.arange(nsa.T)[:, None], torch.arange(nsa.T)
    assert torch.equal(rec.get("window_slots"), ((s <= t) & (t - s < 12)).expand(2, nsa.T, nsa.T))


@torch.no_grad()
def test_a_planted_block_hides_the_key_the_dense_head_wants() -> None:
    """Blocks of 2, top 2: block 0 holds keys +10e and -10e (mean 0), block 1 keys e and e (mean e), queries e.
    Query 3 reads blocks 1 and 0 (all it sees): kept 1; queries 4 and 5 read their own block and block 1 and miss
    key 0, where nearly all their dense weight lies: kept written by hand."""
    m = MoBAAttention(block_size=2, top_k=2, d_in=2, num_heads=1, context_length=6)
    e = torch.tensor([1.0, 0.0])
    q = e.expand(1, 1, 6, 2)
    k = torch.stack([10 * e, -10 * e, e, e, 0 * e, 0 * e])[None, None]  # (1, 1, 6, 2)
    vis = Visibility(q_pos=torch.arange(6), k_pos=torch.arange(6), causal=True)
    with Recorder() as rec:
        m.attend(q, k, k, visibility=vis)
    read = read_of(rec.get("block_slots"), 6)[0, 0]  # (T, S)
    dense = rec.get("dense_weights")[0, 0]  # (T, S)
    kept = (dense * read).sum(-1) / dense.sum(-1)
    c = 2**-0.5  # the score of e . e
    every = math.exp(10 * c) + math.exp(-10 * c) + 2 * math.exp(c)
    by_hand = [1, 1, 1, 1, (2 * math.exp(c) + 1) / (every + 1), (2 * math.exp(c) + 2) / (every + 2)]
    assert kept.tolist() == pytest.approx(by_hand, abs=1e-6)
    assert by_hand[-1] < 0.01


@torch.no_grad()
def test_the_zoos_moba_keeps_all_the_dense_mass_while_its_blocks_cover_the_past() -> None:
    """zoo moba: 3 blocks of 16 a head. 22 bytes: every query reads every key, kept 1; 188 bytes: below 1."""
    torch.manual_seed(0)
    model, tok = GPT(zoo_config("moba")).eval(), ByteTokenizer()
    for choice in layer_choices(model, torch.tensor([tok.encode(SHORT)]), tok.tokens(SHORT)):
        assert torch.allclose(choice.kept(), torch.ones(4, 22), atol=1e-6)
        assert torch.equal(choice.read, torch.ones(22, 22, dtype=torch.bool).tril())
    for choice in layer_choices(model, torch.tensor([tok.encode(LONG)]), [str(i) for i in range(len(LONG))]):
        assert choice.head_read is not None and torch.equal(choice.read, choice.selected)
        assert float(choice.kept()[:, :48].min()) > 1 - 1e-6 and float(choice.kept()[:, 48:].max()) < 1


@torch.no_grad()
@pytest.mark.parametrize("name, kind", [("moba", "MoBA, top 3 blocks of 16 a head"), ("nsa", "NSA's selected branch")])
def test_the_report_names_the_zoos_block_sparse_layers(name: str, kind: str) -> None:
    torch.manual_seed(0)
    model = GPT(zoo_config(name)).eval()
    report = model_report(model, ByteTokenizer(), LONG[:60], name=name, figures=False)
    (section,) = [s for s in report.sections if s.key == "selection"]
    assert section.value is not None
    layers = [line for line in section.value.splitlines() if line.startswith("layer")]
    assert [line.split(" (")[0] for line in layers] == ["layer 0", "layer 1", "layer 2", "layer 3"]
    assert all(kind in line for line in layers)


@torch.no_grad()
@pytest.mark.parametrize("name", ["dsa", "moba", "compressed"])
def test_the_zoo_comparison_keeps_all_where_top_k_covers_the_context_and_less_past_it(name: str) -> None:
    """dsa reads 32 keys, moba 3 blocks of 16, compressed a window of 16 and 8 entries of 4: 22 bytes fit each."""
    torch.manual_seed(0)
    model = GPT(zoo_config(name)).eval()
    short, long = zoo_kept_mass(model, SHORT), zoo_kept_mass(model, LONG)
    assert list(short) == list(long) and short
    assert list(short.values()) == pytest.approx([1.0] * len(short), abs=1e-6)
    assert all(0 < kept < 1 for kept in long.values())


def test_the_zoo_comparison_refuses_bad_text() -> None:
    model = GPT(zoo_config("moba")).eval()
    with pytest.raises(ValueError, match="text must be a non-empty string"):
        zoo_kept_mass(model, "")
    with pytest.raises(ValueError, match="past the model's context_length=4096"):
        zoo_kept_mass(model, "x" * 4097)
