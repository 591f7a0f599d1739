"""A left-padded batch speculates (issue 57, item 2): rows accept different numbers of guesses each pass, and each
row gets the tokens it gets alone.

Rows that run together hold one cache length: a pass feeds every row as many slots (what its cache lacks, then
guesses), the cache goes back to the least any row kept, and what a row kept beyond that is fed again
(``attnlab.models.generation.speculation``). The reference is each row generated alone without speculation, and
the batch without a cache.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.models import GPT, GPTConfig
from attnlab.models.generation import decode
from attnlab.models.generation.request import request_for
from attnlab.models.zoo import zoo_config
from test_going_back import every_kind


def plain(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=64, context_length=128, emb_dim=32, n_heads=4, n_layers=2, rope=True, drop_rate=0.0)
    return GPT(config).eval()


def texts(vocab: int = 64) -> list[list[int]]:
    """Three prompts of 28, 15 and 17 tokens, each repeating itself: lookup finds guesses in every row."""
    part = torch.randint(0, vocab, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    return [part + part + part[:4], part[2:] + part[2:7], (part[5:] * 3)[:17]]


def padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts left-padded to one width (B, T), and the attention_mask (B, T) that says so."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    return ids, torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])


def alone(m: GPT, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Each row's new tokens, generated alone, greedy, without speculation."""
    return [m.generate(torch.tensor([p]), n)[0, len(p) :].tolist() for p in prompts]


def batched(m: GPT, prompts: list[list[int]], n: int, **options: object) -> list[list[int]]:
    ids, mask = padded(prompts)
    return m.generate(ids, n, attention_mask=mask, **options)[:, ids.shape[1] :].tolist()  # type: ignore[arg-type]


@torch.no_grad()
def test_a_padded_batch_with_lookup_gives_each_row_its_tokens_alone_in_fewer_passes() -> None:
    m, prompts, n = plain(), texts(), 40
    want = alone(m, prompts, n)
    assert batched(m, prompts, n, use_cache=False) == want
    ids, mask = padded(prompts)
    run = decode(m, request_for(m, ids, n, {"lookup": 4, "attention_mask": mask}))
    got: list[list[int]] = [[] for _ in prompts]
    for drawn in run:
        for index, token in drawn:
            got[index].append(token)
    assert got == want
    counts = run.counts
    assert counts.passes < n, counts  # 30 passes for 40 tokens a row here (without lookup: 40)
    differ = [kept for kept in counts.kept_each_pass if len(set(kept.values())) > 1]
    assert differ, counts.kept_each_pass  # rows of one pass kept different numbers of guesses ({2: 4, 0: 0, ...})
    assert counts.rerun > 0, counts  # what a row kept beyond the least ran again


@torch.no_grad()
def test_a_row_that_ends_at_eos_holds_no_one_back() -> None:
    m, prompts, n = plain(), texts(), 24
    eos = alone(m, prompts, n)[1][5]  # the middle row ends at its 6th token, the others later or not at all
    want = [m.generate(torch.tensor([p]), n, eos_id=eos)[0, len(p) :].tolist() for p in prompts]
    got = batched(m, prompts, n, lookup=4, eos_id=eos)
    assert len(want[1]) == 6 and max(map(len, want)) > 6
    assert [row[: len(w)] for row, w in zip(got, want, strict=True)] == want  # then eos_id again
    assert all(set(row[len(w) :]) <= {eos} for row, w in zip(got, want, strict=True))


def test_the_refusals_that_remain_name_why() -> None:
    m = plain()
    ids, mask = padded(texts())
    for cache, why in (
        ("h2o", "a refused guess may already have evicted a key"),
        ("snapkv", "a refused guess may already have evicted a key"),
        ("sink", "pushed the oldest recent token out of its window"),
    ):
        with pytest.raises(ValueError, match=f"goes back after a refused guess; .*{why}"):
            m.generate(ids, 4, attention_mask=mask, lookup=2, cache=cache)
    with pytest.raises(ValueError, match="use_cache=False keeps no cache to go back on: leave it out"):
        m.generate(ids, 4, attention_mask=mask, lookup=2, use_cache=False)
    for options in ({"lookup": 2}, {"draft": plain(1)}):
        with pytest.raises(ValueError, match="compile= decodes one token a step with the KV cache: leave out lookup"):
            m.generate(ids, 4, compile=True, **options)  # type: ignore[arg-type]


def sliding() -> GPT:
    """Sliding layers of window 4 beside full ones: every ring (4 + 5 spare slots) wraps on these prompts."""
    return every_kind(seed=6, layer_types=("sliding", "full", "sliding", "full", "sliding", "sliding"))


def latent() -> GPT:
    torch.manual_seed(1)
    return GPT(zoo_config("mla").with_(drop_rate=0.0)).eval()


def hybrid_conv() -> GPT:
    torch.manual_seed(2)
    return GPT(zoo_config("hybrid-conv").with_(drop_rate=0.0)).eval()


MODELS = {  # the model, a draft of another kind, the vocabulary
    "plain": (plain, lambda: every_kind(seed=1), 64),
    "sliding": (sliding, lambda: every_kind(seed=3, layer_types=("full",) * 6, window=None), 64),
    "every-kind": (lambda: every_kind(seed=1), lambda: every_kind(seed=3, layer_types=("full",) * 6, window=None), 64),
    "mla": (latent, hybrid_conv, 256),
}


@pytest.mark.slow  # seconds long: a draft guesses for each row on its own
@torch.no_grad()
@pytest.mark.parametrize("name", list(MODELS))
def test_a_padded_batch_speculates_exactly_on_every_kind_of_layer(name: str) -> None:
    make, make_draft, vocab = MODELS[name]
    m, prompts, n = make(), texts(vocab), 32
    want = alone(m, prompts, n)
    assert batched(m, prompts, n, use_cache=False) == want
    assert batched(m, prompts, n, lookup=4) == want
    assert batched(m, prompts, n, draft=make_draft(), draft_tokens=3) == want


@pytest.mark.slow  # 300 draws
def test_sampling_a_padded_batch_through_a_draft_gives_each_row_the_models_distribution() -> None:
    """The first three new tokens of each row of a padded batch of two, drawn 300 times with a draft of one
    guess, against the model's own joint distribution p(x1) p(x2 | x1) p(x3 | x1, x2) for that row alone
    (chi-square over the 27 triples at the 0.1% level, seeded: about 4 and 9 here; a row that reads the logits of
    another row's guess count scores 137 and a million). Where one row keeps its guess and the other
    refuses it, the cache goes back to the refusing row's length and the first row's guess runs again before its
    third token is drawn: a cache that kept the refused guess, or a row that lost its own, draws from another
    distribution."""
    changes: dict[str, object] = dict(vocab_size=3, emb_dim=8, n_heads=2, n_layers=3, window=2)
    changes["layer_types"] = ("delta", "sliding", "kda")
    m, draft = every_kind(1, **changes), every_kind(2, **changes)
    with torch.no_grad():  # weights three times as large: the states sway the next token
        for p in m.parameters():
            p.mul_(3.0)
    prompts = [[0, 2, 1, 2], [2, 1]]
    ids, mask = padded(prompts)
    triples = torch.cartesian_prod(*[torch.arange(3)] * 3)  # (27, 3): every x1, x2, x3
    joints = []
    with torch.no_grad():
        for prompt in prompts:
            text = torch.cat([torch.tensor([prompt]).repeat(27, 1), triples], dim=1)  # (27, T + 3)
            p = torch.softmax(m(text)[:, -4:-1], dim=-1)  # (27, 3, 3): p(x_i | what came before)
            joints.append(p.gather(-1, triples[:, :, None])[..., 0].prod(dim=-1))  # (27,)
    generator, n, counts, differ = torch.Generator().manual_seed(0), 300, torch.zeros(2, 27), 0
    options = {"attention_mask": mask, "draft": draft, "draft_tokens": 1, "temperature": 1.0, "generator": generator}
    for _ in range(n):
        run = decode(m, request_for(m, ids, 3, options))
        rows: list[list[int]] = [[], []]
        for drawn in run:
            for index, token in drawn:
                rows[index].append(token)
        for row, (x1, x2, x3) in enumerate(rows):
            counts[row, x1 * 9 + x2 * 3 + x3] += 1
        differ += any(len(set(kept.values())) > 1 for kept in run.counts.kept_each_pass)
    assert differ > n // 2, differ  # one row kept its guess and the other refused it: in 213 runs of 300 here
    for row, joint in enumerate(joints):
        chi2 = float(((counts[row] / n - joint) ** 2 / joint).sum()) * n
        assert chi2 < 54.05, (row, chi2, counts[row] / n, joint)  # 26 degrees of freedom, p = 0.001


@pytest.mark.slow  # seconds long
@torch.no_grad()
def test_a_padded_bfloat16_batch_speculates_exactly_on_every_kind_of_layer() -> None:
    m, prompts, n = every_kind(seed=1).to(torch.bfloat16), texts(), 32
    want = alone(m, prompts, n)
    assert batched(m, prompts, n) == want
    assert batched(m, prompts, n, lookup=4) == want
