"""Ring attention over real torch.distributed processes (gloo, CPU): equal to one process, forward and backward."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from attnlab import Attention, attention
from attnlab.cache import ModelCache
from attnlab.distributed import ContextParallelAttention, gather_sequence, ring_attention, shard_sequence
from attnlab.distributed.collectives import padded_length
from attnlab.distributed.launch import RankError, launch
from attnlab.functional import mods

TIMEOUT_S = 120  # a deadlock fails the test instead of hanging CI

# (name, global length, q heads, kv heads, causal, window, layout)
CASES = [
    ("causal zigzag", 24, 4, 4, True, None, "zigzag"),
    ("causal contiguous", 24, 4, 4, True, None, "contiguous"),
    ("full zigzag", 24, 4, 4, False, None, "zigzag"),
    ("full contiguous GQA", 24, 4, 2, False, None, "contiguous"),
    ("window zigzag GQA", 24, 4, 1, True, 5, "zigzag"),
    ("uneven causal zigzag", 21, 2, 2, True, None, "zigzag"),
    ("shorter than the chunks", 3, 2, 2, True, None, "zigzag"),
]


def _documents(t: int) -> torch.Tensor:
    """(2, t) packed documents: row 0 cut in three, row 1 in two."""
    ids = torch.zeros(2, t, dtype=torch.long)
    ids[0, t // 4 :] = 1
    ids[0, (2 * t) // 3 :] = 2
    ids[1, t // 2 :] = 1
    return ids


# (name, global length, causal, mask_mod, score_mod factory): mods see global positions on the ring
MOD_CASES: list[tuple[str, int, bool, Any, Any]] = [
    ("documents, uneven", 21, True, lambda: mods.document(_documents(21)), None),
    ("prefix_lm and softcap", 24, False, lambda: mods.prefix_lm(7), lambda: mods.softcap(2.0)),
    ("sliding window or first token", 22, True, lambda: mods.or_masks(mods.sliding_window(4), _first), None),
    (
        "relative bias",
        24,
        True,
        None,
        lambda: mods.relative_bias(torch.linspace(-1, 1, 4 * 47, dtype=torch.float64).view(4, 47)),
    ),
]


def _first(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return k == 0


# The README's first form of a learnable score_mod, as users write it: a plain function reading a module-level
# tensor it does not declare. On the ring it trains as on one process (it was given no gradient at all).
TEMPERATURE = torch.tensor([1.0, 0.5, 2.0, 1.5], dtype=torch.float64, requires_grad=True)


def per_head_temperature(
    score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
) -> torch.Tensor:
    return score * TEMPERATURE[h]


def _a_global_trains_on_the_ring() -> float:
    t = 21  # uneven: the zigzag pads it to 24 on 2 and 4 ranks
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(1, 4, t, 8, generator=g, dtype=torch.float64) for _ in range(3))
    expected = attention(q, k, v, is_causal=True, score_mod=per_head_temperature, backend="eager")
    one = torch.autograd.grad(expected.sum(), TEMPERATURE)[0]
    out = ring_attention(
        *(shard_sequence(x, 2) for x in (q, k, v)), is_causal=True, seq_len=t, score_mod=per_head_temperature
    )
    share = torch.autograd.grad(out.sum(), TEMPERATURE)[0].clone()  # all ones upstream: the padding included
    dist.all_reduce(share)
    assert one.abs().sum() > 0
    return (share - one).abs().max().item()


def _uneven_with_all_ones_upstream() -> float:
    """A length that is not a multiple of the chunks, the gradient of out.sum(): the padded query rows output 0
    and add nothing to dk and dv (they gave mean(v) and dv off by 1.2 before)."""
    t = 21
    g = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(2, 2, t, 8, generator=g, dtype=torch.float64) for _ in range(3))
    q1, k1, v1 = (x.clone().requires_grad_() for x in (q, k, v))
    attention(q1, k1, v1, is_causal=True, backend="eager").sum().backward()
    local = [shard_sequence(x, 2).requires_grad_() for x in (q, k, v)]
    out = ring_attention(*local, is_causal=True, seq_len=t)
    out.sum().backward()
    full = gather_sequence(out.detach(), 2, length=padded_length(t, dist.get_world_size(), "zigzag"))
    err = full[:, :, t:].abs().max().item() if full.shape[2] > t else 0.0  # the padded rows themselves: zeros
    for mine, whole in zip(local, (q1, k1, v1), strict=True):
        assert mine.grad is not None and whole.grad is not None
        err = max(err, (gather_sequence(mine.grad, 2, length=t) - whole.grad).abs().max().item())
    return err


def _mods_on_the_ring() -> dict[str, float]:
    """Mask and score mods on the ring equal one process, forward and backward; a learnable ALiBi's slopes get,
    summed over the ranks, the gradient one process gives them."""
    errors = {}
    for name, t, causal, mask_mod, score_mod in [*MOD_CASES, ("learnable alibi", 24, True, None, "alibi")]:
        g = torch.Generator().manual_seed(11)
        q, k, v, grad = (torch.randn(2, 4, t, 8, generator=g, dtype=torch.float64) for _ in range(4))
        one_mask = mask_mod() if mask_mod else None
        if score_mod == "alibi":
            one_score, ring_score = (mods.alibi(4, learnable=True) for _ in range(2))
            for m in (one_score, ring_score):
                m.slopes.data = m.slopes.data.double()
        else:
            one_score = ring_score = score_mod() if score_mod else None
        q1, k1, v1 = (x.clone().requires_grad_() for x in (q, k, v))
        expected = attention(q1, k1, v1, is_causal=causal, mask_mod=one_mask, score_mod=one_score, backend="eager")
        (expected * grad).sum().backward()  # the gradient grad, from a scalar (no sympy import in the rank)
        local = [shard_sequence(x, 2).requires_grad_() for x in (q, k, v)]
        out = ring_attention(*local, is_causal=causal, seq_len=t, mask_mod=one_mask, score_mod=ring_score)
        (out * shard_sequence(grad, 2)).sum().backward()
        err = (gather_sequence(out.detach(), 2, length=t) - expected).abs().max().item()
        for mine, whole in zip(local, (q1, k1, v1), strict=True):
            assert mine.grad is not None and whole.grad is not None
            err = max(err, (gather_sequence(mine.grad, 2, length=t) - whole.grad).abs().max().item())
        if score_mod == "alibi":
            slopes = ring_score.slopes.grad.clone()
            dist.all_reduce(slopes)  # each rank's share: its queries' scores
            err = max(err, (slopes - one_score.slopes.grad).abs().max().item())
        errors[name] = err
    return errors


def _model_on_the_ring(size: int) -> dict[str, float]:
    """A small model whose attention runs on the ring (RoPE at global positions, GQA): its output equals
    Attention's on the whole sequence, and two SGD steps give the losses one process gives."""
    torch.manual_seed(0)
    t, vocab = 24, 32
    plain = torch.nn.ModuleDict(
        {
            "emb": torch.nn.Embedding(vocab, 16),
            "att": Attention(d_in=16, num_heads=4, num_kv_heads=2, rope=True),
            "head": torch.nn.Linear(16, vocab),
        }
    ).double()
    ring = copy.deepcopy(plain)
    ring["att"] = ContextParallelAttention.from_attention(plain["att"])
    tokens = torch.randint(0, vocab, (2, t + 1), generator=torch.Generator().manual_seed(5))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    x = plain["emb"](inputs)
    errors = {
        "module": (gather_sequence(ring["att"](shard_sequence(x, 1)), 1, length=t) - plain["att"](x)).abs().max().item()
    }
    ids = _documents(t)
    packed = ring["att"](shard_sequence(x, 1), document_ids=shard_sequence(ids, 1))
    errors["module, documents"] = (
        (gather_sequence(packed, 1, length=t) - plain["att"](x, document_ids=ids)).abs().max().item()
    )
    local_in, local_tg = shard_sequence(inputs, 1), shard_sequence(targets, 1)
    for step in range(2):
        one = F.cross_entropy(plain["head"](plain["att"](plain["emb"](inputs))).flatten(0, 1), targets.flatten())
        plain.zero_grad()
        one.backward()
        local = F.cross_entropy(
            ring["head"](ring["att"](ring["emb"](local_in))).flatten(0, 1), local_tg.flatten(), reduction="sum"
        ) / (2 * t)
        ring.zero_grad()
        local.backward()
        total = local.detach().clone()
        dist.all_reduce(total)  # the loss over the whole sequence
        for p in ring.parameters():  # each rank's loss covers its shard: the gradients add up
            assert p.grad is not None
            dist.all_reduce(p.grad)
        errors[f"loss step {step}"] = abs(total.item() - one.item())
        with torch.no_grad():
            for model in (plain, ring):
                for p in model.parameters():
                    p -= 0.5 * p.grad
    return errors


def _check_rank() -> dict[str, Any]:
    """One rank's errors against one process, by case (run by ``launch`` in each process)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    errors: dict[str, Any] = {}
    for name, t, h, hkv, causal, window, layout in CASES:
        g = torch.Generator().manual_seed(7)  # the same global tensors on every rank
        q = torch.randn(2, h, t, 8, generator=g, dtype=torch.float64)
        k, v = (torch.randn(2, hkv, t, 8, generator=g, dtype=torch.float64) for _ in range(2))
        grad = torch.randn(2, h, t, 8, generator=g, dtype=torch.float64)
        q1, k1, v1 = (x.clone().requires_grad_() for x in (q, k, v))
        expected = attention(q1, k1, v1, is_causal=causal, window=window, backend="eager")
        (expected * grad).sum().backward()  # the gradient grad, from a scalar (no sympy import in the rank)
        local = [shard_sequence(x, 2, layout=layout).requires_grad_() for x in (q, k, v)]
        out = ring_attention(*local, is_causal=causal, window=window, layout=layout, seq_len=t)
        (out * shard_sequence(grad, 2, layout=layout)).sum().backward()
        full = gather_sequence(out.detach(), 2, length=t, layout=layout)
        grads = [gather_sequence(x.grad, 2, length=t, layout=layout) for x in local]
        errors[name] = max(
            (full - expected).abs().max().item(),
            *((a - b.grad).abs().max().item() for a, b in zip(grads, (q1, k1, v1), strict=True)),
        )
    # float32, causal zigzag: to 1e-5
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 32, 16, generator=g) for _ in range(3))
    expected = attention(q, k, v, is_causal=True, backend="eager")
    out = ring_attention(*(shard_sequence(x, 2) for x in (q, k, v)), is_causal=True)
    errors["float32"] = (gather_sequence(out, 2, length=32) - expected).abs().max().item()
    errors.update(_mods_on_the_ring())
    errors.update(_model_on_the_ring(size))
    errors["a global score_mod tensor trains"] = _a_global_trains_on_the_ring()
    errors["uneven, all-ones upstream gradient"] = _uneven_with_all_ones_upstream()
    # a rank with another shape: an error on every rank, not a hang
    mismatched = torch.zeros(1, 2, 4 + (rank == 0) * 2, 8)
    try:
        ring_attention(mismatched, mismatched, mismatched)
        errors["mismatch"] = "no error"
    except ValueError as err:
        errors["mismatch"] = str(err)
    errors.update(_disagreements(rank))
    return errors


def _disagreements(rank: int) -> dict[str, str]:
    """Settings that differ across ranks: each a ValueError on every rank (they ran silently, or aborted in C++)."""
    x = torch.randn(1, 2, 8, 4)
    first = rank == 0
    calls = {
        "disagree is_causal": lambda: ring_attention(x, x, x, is_causal=first),
        "disagree layout": lambda: ring_attention(x, x, x, layout="zigzag" if first else "contiguous"),
        "disagree seq_len": lambda: ring_attention(x, x, x, seq_len=7 if first else None),
        "disagree dtype": lambda: ring_attention(*(x.double() if first else x for _ in range(3))),
        "disagree gather": lambda: gather_sequence(torch.zeros(1, 2, 3 + first, 4), 2, length=4),
        "disagree bool seq_len": lambda: ring_attention(x, x, x, seq_len=True),  # type: ignore[arg-type]
        "disagree document_ids": lambda: ContextParallelAttention(d_in=8, num_heads=2)(
            torch.randn(1, 4, 8), document_ids=torch.zeros(1, 4, dtype=torch.long) if first else None
        ),
    }
    said = {}
    for name, call in calls.items():
        try:
            call()
            said[name] = "no error"
        except ValueError as err:
            said[name] = str(err)
    return said


@pytest.mark.slow  # slow by nature (a process, a compile or a whole view): stage 1 keeps its budget
@pytest.mark.parametrize(
    "size",
    [2, pytest.param(3, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)],  # processes
)
def test_ring_attention_equals_one_process(size: int) -> None:
    got = dict(enumerate(launch(_check_rank, size, timeout_s=TIMEOUT_S)))
    for rank, errors in got.items():
        for name, err in errors.items():
            if name == "mismatch":
                assert "ring attention needs the same q shape[2], k shape[2], v shape[2] on every rank" in err, err
            elif name.startswith("disagree"):
                expected = {
                    "disagree is_causal": "needs the same is_causal on every rank; got rank 0: is_causal=1",
                    "disagree layout": "needs the same layout on every rank; got rank 0: layout='zigzag'",
                    "disagree seq_len": "needs the same seq_len on every rank; got rank 0: seq_len=7; rank 1: seq_len=None",
                    "disagree dtype": "needs the same dtype on every rank; got rank 0: dtype=torch.float64",
                    "disagree gather": "gather_sequence needs the same shape[2] on every rank",
                    "disagree document_ids": "document_ids must be given on every rank or on none",
                    "disagree bool seq_len": "seq_len must be an int number of tokens (the real global length), got True",
                }[name]
                assert expected in err, (rank, name, err)
            elif name == "float32":
                assert err < 1e-5, (rank, name, err)
            else:
                assert err < 1e-10, (rank, name, err)


@pytest.mark.slow  # slow by nature (a process, a compile or a whole view): stage 1 keeps its budget
def test_the_ring_command_starts_its_ranks_and_says_when_a_length_does_not_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each process capped at warm-up + 24 MiB: 65536 tokens (32768 a rank, 96 MiB of q, k, v) fail in an
    allocation, for real, and the command says so in one line; both ranks end."""
    from attnlab import cli

    args = ["ring", "--nproc", "2", "--seq-len", "65536", "--check-len", "16", "--heads", "4", "--memory-limit", "24"]
    assert cli.main(args) == 2
    said = capsys.readouterr()
    assert "2 processes (gloo), zigzag, causal, 4 heads x 64" in said.out
    assert "failed: MemoryError: 65536 tokens (32768 on this rank) do not fit in 24 MiB" in said.err, said.err
    assert cli.main(["ring", "--memory-limit", "0"]) == 2
    assert "--memory-limit must be >= 1, got 0" in capsys.readouterr().err
    assert cli.main(["ring", "--nproc", "0"]) == 2
    assert "--nproc must be >= 1, got 0" in capsys.readouterr().err
    assert cli.main(["ring", "--seq-len", "999999999999"]) == 2
    assert "--seq-len must be <=" in capsys.readouterr().err


def test_the_ring_module_refuses_a_mask_cache_or_visibility_before_it_reaches_the_group() -> None:
    """Attention's forward with the ring's own checks: what the ring cannot take is refused first, in this one
    process (no group yet); then the call needs torch.distributed."""
    ring = ContextParallelAttention(d_in=8, num_heads=2, rope=True)
    x = torch.randn(1, 4, 8)
    refused = {
        "mask": torch.ones(4, 4, dtype=torch.bool),
        "cache": ModelCache.build([ring.layer_state()], rows=1, capacity=4)[0],
        "visibility": ring.visibility_for(x),
    }
    for name, value in refused.items():
        with pytest.raises(ValueError, match=r"ContextParallelAttention takes no mask, cache or visibility"):
            ring(x, **{name: value})
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match=r"ring attention needs torch.distributed initialized"):
        ring(x)


# ---- the launcher: a failing or vanished rank ends the run at once, with its error ----


def _one_rank_vanishes() -> None:
    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()


def _one_rank_vanishes_and_the_other_reports_late() -> None:
    try:
        _one_rank_vanishes()
    except RuntimeError:
        time.sleep(0.5)  # one of the parent's 0.5 s waits: rank 1 is seen dead first, and this error drained
        raise


@pytest.mark.slow  # slow by nature (a process, a compile or a whole view): stage 1 keeps its budget
@pytest.mark.parametrize("fn", [_one_rank_vanishes, _one_rank_vanishes_and_the_other_reports_late])
def test_a_rank_that_vanishes_ends_every_rank(fn: Callable[[], None]) -> None:
    """Rank 1 exits without a word while rank 0 waits for it in a barrier: an error at once, naming rank 1, not
    rank 0's lost connection, however late rank 0's own error arrives (a CI run once named rank 0)."""
    with pytest.raises(RankError, match="rank 1 failed: ProcessExit: exited with code 3 before answering"):
        launch(fn, 2, timeout_s=TIMEOUT_S)
    with pytest.raises(ValueError, match="nproc must be a positive int, got 0"):
        launch(_one_rank_vanishes, 0)


@pytest.mark.slow  # slow by nature: torchrun starts a process per rank
def test_the_ring_command_under_torchrun_is_one_rank_per_process() -> None:
    """What docs/ring.md runs across machines: torchrun starts the ranks, the command joins its group."""
    command = ["ring", "--seq-len", "256", "--check-len", "32", "--heads", "2", "--memory", "--memory-limit", "64"]
    done = subprocess.run(
        [
            Path(sys.executable).with_name("torchrun"),
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "attnlab.cli",
            *command,
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr, done.stderr
    assert done.stdout.count("ring attention, 256 tokens over 2 processes") == 1, done.stdout  # rank 0 alone prints
    assert "tensors" in done.stdout and "sent" in done.stdout  # --memory (its column), within the 64 MiB cap
    assert "agreement with one process at 32 tokens" in done.stdout
