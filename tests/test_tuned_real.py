"""The default path measured for real on a small model: the layouts' stream probe and a real torch.compile of the
decode step, then a second process that finds both kept and measures nothing (tests/test_tuned.py checks the
rules with the timings replaced)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.models import GPT, GPTConfig
from attnlab.models.generation import reference_greedy, tuned

pytestmark = pytest.mark.slow  # a real compile of the decode step, and a second process

SCRIPT = """
import json, logging, sys, torch
from attnlab.models import GPT, GPTConfig
torch.manual_seed(0)
config = GPTConfig(vocab_size=96, context_length=64, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0)
model = GPT(config).eval()
out = model.generate(torch.tensor([[5, 17, 3, 60, 9, 41]]), {n})
print(json.dumps({{"tokens": out[0].tolist(), "why": model.tuning.why, "compiled": model.tuning.compiled}}))
"""


def test_a_real_measurement_is_kept_and_a_second_process_measures_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    monkeypatch.setenv("ATTNLAB_MEASURE", "1")
    monkeypatch.setattr(tuned, "PROBE_TOKENS", 8)  # the probe as shipped, shorter: the rules, not the figures
    monkeypatch.setattr(tuned, "REPEATS", 3)
    caplog.set_level(logging.WARNING, logger="attnlab")
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=96, context_length=64, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0)
    model = GPT(config).eval()
    idx = torch.tensor([[5, 17, 3, 60, 9, 41]])
    out = model.generate(idx, 12)
    expected = reference_greedy(model, idx[0].tolist(), 12, model.make_caches(batch_size=1, max_len=18))
    assert out[0, 6:].tolist() == expected  # the default path's tokens are eager's
    assert sum("measuring" in r.getMessage() for r in caplog.records) == 2  # the layouts, then the compile
    kept = json.loads(next((tmp_path / "measured").glob("*.json")).read_text())["entries"]
    (compile_entry,) = kept["compile"].values()
    assert compile_entry["why"] and isinstance(compile_entry["wins"], bool)
    if "times" in compile_entry:  # it compiled: both ways timed in every repeat, the compile's seconds kept
        assert len(compile_entry["times"]["eager"]) == len(compile_entry["times"]["compiled"]) == 3
        assert compile_entry["first_compile_s"] > 0 and compile_entry["compile_s"] >= 0
    assert model.tuning is not None

    threads = str(torch.get_num_threads())  # the same machine as measured it: its thread count is part of that
    env = {**os.environ, "ATTNLAB_CACHE": str(tmp_path), "ATTNLAB_MEASURE": "1", "OMP_NUM_THREADS": threads}
    second = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(n=12)], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert second.returncode == 0, second.stderr
    assert "measuring" not in second.stderr  # a later process pays nothing to measure
    got = json.loads(second.stdout)
    assert got["tokens"] == out[0].tolist() and got["why"] == model.tuning.why
