"""Ring attention over real torch.distributed processes (gloo, CPU): equal to one process, forward and backward."""

from __future__ import annotations

import copy
import os
import socket
import traceback
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from attnlab import Attention, attention
from attnlab.distributed import ContextParallelAttention, gather_sequence, ring_attention, shard_sequence

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def _rank_main(rank: int, size: int, port: int, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=size)
        errors = {}
        for name, t, h, hkv, causal, window, layout in CASES:
            g = torch.Generator().manual_seed(7)  # the same global tensors on every rank
            q = torch.randn(2, h, t, 8, generator=g, dtype=torch.float64)
            k, v = (torch.randn(2, hkv, t, 8, generator=g, dtype=torch.float64) for _ in range(2))
            grad = torch.randn(2, h, t, 8, generator=g, dtype=torch.float64)
            q1, k1, v1 = (x.clone().requires_grad_() for x in (q, k, v))
            expected = attention(q1, k1, v1, is_causal=causal, window=window, backend="eager")
            expected.backward(grad)
            local = [shard_sequence(x, 2, layout=layout).requires_grad_() for x in (q, k, v)]
            out = ring_attention(*local, is_causal=causal, window=window, layout=layout, seq_len=t)
            out.backward(shard_sequence(grad, 2, layout=layout))
            full = gather_sequence(out.detach(), 2, length=t, layout=layout)
            grads = [gather_sequence(x.grad, 2, length=t, layout=layout) for x in local]
            err = max(
                (full - expected).abs().max().item(),
                *((a - b.grad).abs().max().item() for a, b in zip(grads, (q1, k1, v1), strict=True)),
            )
            errors[name] = err
        # float32, causal zigzag: to 1e-5
        g = torch.Generator().manual_seed(3)
        q, k, v = (torch.randn(1, 2, 32, 16, generator=g) for _ in range(3))
        expected = attention(q, k, v, is_causal=True, backend="eager")
        out = ring_attention(*(shard_sequence(x, 2) for x in (q, k, v)), is_causal=True)
        errors["float32"] = (gather_sequence(out, 2, length=32) - expected).abs().max().item()
        errors.update(_model_on_the_ring(size))
        # a rank with another shape: an error on every rank, not a hang
        mismatched = torch.zeros(1, 2, 4 + (rank == 0) * 2, 8)
        try:
            ring_attention(mismatched, mismatched, mismatched)
            errors["mismatch"] = "no error"
        except ValueError as err:
            errors["mismatch"] = str(err)
        results.put((rank, errors))
        dist.destroy_process_group()
    except Exception:  # the parent reports it
        results.put((rank, traceback.format_exc()))


@pytest.mark.parametrize("size", [2, 3, 4])
def test_ring_attention_equals_one_process(size: int) -> None:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, size, port, results)) for r in range(size)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(size):
            rank, errors = results.get(timeout=TIMEOUT_S)
            got[rank] = errors
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for rank, errors in got.items():
        assert isinstance(errors, dict), f"rank {rank} failed:\n{errors}"
        for name, err in errors.items():
            if name == "mismatch":
                assert "needs the same q, k, v shapes on every rank" in err, err
            elif name == "float32":
                assert err < 1e-5, (rank, name, err)
            else:
                assert err < 1e-10, (rank, name, err)


def test_the_ring_command_runs_checks_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    from attnlab import cli

    assert cli.main(["ring", "--nproc", "2", "--seq-len", "300", "--check-len", "40", "--heads", "2", "--memory"]) == 0
    said = capsys.readouterr().out
    assert "ring attention, 300 tokens over 2 processes" in said and "sent MiB" in said and "tensors" in said
    assert "agreement with one process at 40 tokens" in said
    assert cli.main(["ring", "--nproc", "0"]) == 2
    assert "--nproc must be >= 1, got 0" in capsys.readouterr().err
    assert cli.main(["ring", "--seq-len", "999999999999"]) == 2
    assert "--seq-len must be <=" in capsys.readouterr().err
