"""The indexer's training objective (DeepSeek-V3.2's sparse stage; attnlab.nn.index_loss): KL from the main
attention's weights on each query's chosen keys to the indexer's softmax there.

The loss against a float64 implementation written here from the paper's formula; its gradient reaches the
indexer's weights and nothing else (the indexer's inputs and the main attention's side are detached); and its
effect: training an indexer by it makes the keys it chooses hold more of the dense attention than its first
choice did, and training by the inverted loss makes them hold less, for DSA's and for V4's compressed-sparse
layers. A top-k is a choice, so without this loss the indexer gets no gradient at all (tests/test_zoo_sparse.py).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from attnlab.functional.selection import Selection, chosen_scores, index_scores, indexer_loss
from attnlab.models import GPT
from attnlab.models.tasks import make_task
from attnlab.models.train import TrainConfig, train
from attnlab.models.zoo import zoo_config
from attnlab.nn.compressed import CompressedAttention
from attnlab.nn.index_loss import indexer_parameters, take_index_losses
from attnlab.nn.indexed import IndexedAttention
from test_dsa import SHAPE, parts


def reference(scores: list[list[float]], attended: list[list[float]], chosen: list[list[int]]) -> float:
    """sum_t KL(p_t || softmax(I_t)) on S_t over the queries that chose any key, / their number, in float64."""
    total, live = 0.0, 0
    for row_scores, row_weights, row in zip(scores, attended, chosen, strict=True):
        picked = [(row_scores[s], w) for s, w in zip(row, row_weights, strict=True) if s >= 0]
        if not picked:
            continue
        mass = sum(w for _, w in picked)
        norm = math.log(sum(math.exp(i) for i, _ in picked))
        total += sum((w / mass) * (math.log(w / mass) - (i - norm)) for i, w in picked if w > 0)
        live += 1
    return total / live


def test_the_loss_equals_the_papers_formula_in_float64() -> None:
    """Four queries of six slots: chosen sets of 3, 2 (and an empty slot), none, and one whose weight is 0 on a
    chosen key; a query that chose nothing adds nothing, a key of weight 0 adds 0 log 0 = 0. A query whose main
    attention gave its chosen keys no weight at all (a sink took it) adds no term either, and is not counted."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(1, 4, 6, generator=g, dtype=torch.float64)
    chosen = [[0, 3, 5], [2, 4, -1], [-1, -1, -1], [1, 0, 2]]
    attended = [[0.5, 0.2, 0.1], [0.3, 0.6, 0.0], [0.0, 0.0, 0.0], [0.0, 0.7, 0.1]]
    idx = torch.tensor([chosen])
    picked = scores.float().gather(-1, idx.clamp(min=0))  # (1, 4, 3): the chosen slots' scores
    got = indexer_loss(picked, torch.tensor([attended]), Selection(idx, 3))
    want = reference(scores[0].tolist(), attended, chosen)
    assert float(got) == pytest.approx(want, rel=1e-5)
    assert want > 0.05  # a figure with room to be wrong
    attended[2] = [0.0, 0.0, 0.0]
    idx[0, 2] = torch.tensor([1, 4, -1])  # chose keys, gave them nothing
    picked = scores.float().gather(-1, idx.clamp(min=0))
    assert indexer_loss(picked, torch.tensor([attended]), Selection(idx, 3)).item() == pytest.approx(want, rel=1e-5)


def test_the_chosen_keys_scores_are_the_full_scores_gathered() -> None:
    """chosen_scores (what the loss reads, K a query) equals index_scores (every slot) at the chosen slots, 0 at -1."""
    g = torch.Generator().manual_seed(3)
    q, k, w = torch.randn(2, 5, 3, 4, generator=g), torch.randn(2, 7, 4, generator=g), torch.randn(2, 5, 3, generator=g)
    idx = torch.randint(0, 7, (2, 5, 3), generator=g)
    idx[0, 1, 2] = -1
    full = index_scores(q, k, w, scale=0.5)
    got = chosen_scores(q, k, w, Selection(idx, 3), scale=0.5)
    want = full.gather(-1, idx.clamp(min=0)).masked_fill(idx < 0, 0.0)
    torch.testing.assert_close(got, want)


def test_the_loss_is_zero_where_the_indexers_softmax_is_the_attention() -> None:
    """Scores log p + c on the chosen keys give softmax(I) = p: KL 0, and a gradient of 0."""
    p = torch.tensor([[[0.6, 0.3, 0.1]]])
    scores = (torch.log(p) + 2.0).requires_grad_()  # (1, 1, 3): every slot chosen
    loss = indexer_loss(scores, p * 4.0, Selection(torch.tensor([[[0, 1, 2]]]), 3))  # any scale: L1-normalised
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    assert scores.grad is not None and float(scores.grad.abs().max()) < 1e-6


def dsa_layer(scale: float) -> IndexedAttention:
    """test_dsa's layer shape, top 8 of up to 48 keys, its main attention's weights times ``scale`` so that each
    query's attention is peaked (random weights at scale 1 spread it nearly flat: nothing to find)."""
    torch.manual_seed(0)
    made = IndexedAttention(index_topk=8, index_heads=8, index_head_dim=16, **SHAPE)
    with torch.no_grad():
        for name, p in made.named_parameters():
            if ".indexer." not in f".{name}" and p.dim() == 2:
                p.mul_(scale)
    return made.train()


def v4_layer() -> CompressedAttention:
    """A compressed-sparse layer (blocks of 4, top 3 entries, a window of 5), weights as tests/test_compressed's."""
    torch.manual_seed(0)
    made = CompressedAttention(d_model=32, num_heads=4, head_dim=16, rope_dim=8, q_lora_rank=12, window=5,
                               o_groups=2, o_lora_rank=6, compress_block=4, index_topk=3, index_heads=2,
                               index_head_dim=8)  # fmt: skip
    for p in made.parameters():
        torch.nn.init.normal_(p, std=0.3)
    with torch.no_grad():  # keys and entries 6x: peaked attention on the entries (at 1x it is nearly flat)
        made.kv_norm.weight.mul_(6.0)
        made.compressor.kv_norm.weight.mul_(6.0)
    return made.train()


@pytest.mark.parametrize("kind", ["dsa", "v4"])
def test_the_loss_trains_the_indexer_alone(kind: str) -> None:
    """Backward from the indexer loss alone: every indexer weight gets a gradient, and no other weight and not the
    layer's input (detached, as the paper's indexer input is): the language-model loss keeps the rest. (V4's
    compressors' rows travel together, so its main compressor may get a gradient of zeros.)"""
    m = dsa_layer(1.0) if kind == "dsa" else v4_layer()
    x = torch.randn(2, 24, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
    m(x)
    loss = take_index_losses(m)
    assert loss is not None and take_index_losses(m) is None  # taken once: the layer holds no graph after
    loss.backward()
    mine = {id(p) for p in indexer_parameters(m)}
    assert mine and all(p.grad is not None and p.grad.any() for p in indexer_parameters(m))
    assert all(p.grad is None or not p.grad.any() for p in m.parameters() if id(p) not in mine)
    assert x.grad is None or not x.grad.any()


def test_no_loss_is_kept_outside_training_or_without_gradients() -> None:
    """A loss belongs to the call that made it: none from a no_grad or an eval call, and a training call's is gone
    after any later call that keeps none (then the layer deep-copies, as speculation's draft models do); a V4
    layer called on fewer tokens than a block (no entry closed, nothing chosen) keeps none either."""
    m, x = dsa_layer(1.0), torch.randn(1, 24, 32)
    with torch.no_grad():
        m(x)
    m.eval()(x)
    assert take_index_losses(m) is None
    m.train()(x)
    assert m.index_loss is not None
    m.eval()(x)
    assert m.index_loss is None
    copy.deepcopy(m)
    v4 = v4_layer()
    v4(torch.randn(1, 24, 32))
    assert v4.index_loss is not None
    v4(torch.randn(1, 3, 32))  # blocks of 4: none closed
    assert take_index_losses(v4) is None


def test_training_keeps_the_indexers_scores_of_the_chosen_keys_only() -> None:
    """The indexer scores every key to choose (B, T, Hi, S), then drops that graph: what a training call keeps for
    backward is K keys a query (B, T, Hi, K), never S, the cost the selection exists to avoid."""
    m, x = dsa_layer(1.0), torch.randn(2, 48, 32)
    shapes: list[tuple[int, ...]] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        m(x)
    assert (2, 48, 8, 8) in shapes  # the indexer's 8 heads on the 8 chosen keys
    assert (2, 48, 8, 48) not in shapes, "the indexer's scores of every key were kept for backward"


def captured(m: IndexedAttention, x: torch.Tensor) -> float:
    """The share of the dense attention (summed over heads) that the indexer's chosen keys hold, averaged over
    the queries that see more keys than it chooses."""
    t = x.shape[1]
    with torch.no_grad():
        vis, pos, q_latent, q_nope, q_pe, latents = parts(m, x)
        slots = torch.arange(t).expand(x.shape[0], t, t)
        every = Selection(torch.where(slots <= torch.arange(t)[:, None], slots, -1), t)  # each query: all it sees
        dense = m.attended(q_nope, q_pe, latents, every, vis)  # (B, T, T), slot s at column s
        dense = dense / dense.sum(dim=-1, keepdim=True)
        chosen = m.select(x, q_latent, m.index_keys(x, pos), pos, vis).indices  # (B, T, K)
        held = dense.gather(-1, chosen.clamp(min=0)).masked_fill(chosen < 0, 0.0).sum(dim=-1)  # (B, T)
    return float(held[:, m.index_topk :].mean())


def train_indexer(m: torch.nn.Module, sign: float, steps: int, *, batches: int | None = None) -> list[float]:
    """``steps`` Adam steps on ``sign`` times the indexer loss, the indexer's weights alone, a fresh random batch a
    step (or ``batches`` fixed ones in turn); the losses seen."""
    opt = torch.optim.Adam(indexer_parameters(m), lr=1e-2)
    g, seen = torch.Generator().manual_seed(5), []
    fixed = [torch.randn(8, 48, 32, generator=g) for _ in range(batches or 0)]
    for step in range(steps):
        m(fixed[step % len(fixed)] if fixed else torch.randn(8, 48, 32, generator=g))
        loss = take_index_losses(m)
        assert loss is not None
        opt.zero_grad()
        (sign * loss).backward()
        opt.step()
        seen.append(loss.item())
    return seen


@pytest.mark.slow
def test_training_the_indexer_by_the_loss_chooses_the_keys_the_attention_weighs() -> None:
    """DSA, top 8: at first the indexer's keys hold about a third of each query's dense attention (0.34 here);
    150 steps on the loss raise it past 0.5; 100 on the inverted loss lower it."""
    held = torch.randn(4, 48, 32, generator=torch.Generator().manual_seed(99))
    first = captured(dsa_layer(3.0), held)
    trained = dsa_layer(3.0)
    train_indexer(trained, 1.0, 150)
    inverted = dsa_layer(3.0)
    train_indexer(inverted, -1.0, 100)
    assert captured(trained, held) > first + 0.12, (first, captured(trained, held))
    assert captured(inverted, held) < first - 0.02, (first, captured(inverted, held))


@pytest.mark.slow
def test_training_a_v4_indexer_by_the_loss_lowers_its_kl_on_the_batches_it_trains_on() -> None:
    """V4's compressed-sparse layer: its indexer (its own compressor included) takes the loss; over 4 batches in
    turn, the KL on the entries it chooses falls by more than a quarter in 120 steps (0.18 to 0.12 here), and
    rises under the inverted loss. This shows the loss reaches and moves a V4 indexer, not that its choice gets
    better: the KL is measured on entries the indexer picks itself, and on a fresh random batch a step this small
    indexer learns nothing in that time. The DSA test above is the one that measures the choice."""
    trained, inverted = v4_layer(), v4_layer()
    up, down = train_indexer(trained, 1.0, 120, batches=4), train_indexer(inverted, -1.0, 30, batches=4)
    first = sum(up[:10]) / 10
    assert sum(up[-10:]) / 10 < 0.75 * first, (first, up[-10:])
    assert sum(down[-5:]) / 5 > first, (first, down[-5:])


def test_train_reaches_every_indexer_weight_on_a_step_where_no_query_chose() -> None:
    """Sequences of 3 tokens leave a V4 layer (blocks of 4 and 16) no closed entry, so no indexer loss: train()
    still sends its indexers a gradient (of 0), as DistributedDataParallel needs of every parameter at each step,
    and logs the step's indexer loss as 0."""
    torch.manual_seed(0)
    model = GPT(zoo_config("compressed"))
    log = train(model, make_task("text", seq_len=3), TrainConfig(steps=1, batch_size=2, warmup=1, eval_batches=1))
    assert all(p.grad is not None for p in indexer_parameters(model))
    assert log.index_loss == [0.0]
