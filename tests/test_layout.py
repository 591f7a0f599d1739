"""Weight layout (issue 24, part 2): rows or columns, chosen by measuring; the same values, shapes and files;
"auto" picks what its own probe measured fastest, for each weight's shape (issue 30)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab.models import GPT, GPTConfig
from attnlab.nn import layout
from attnlab.nn.layout import LAYOUTS


def small() -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=96, context_length=32, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0)
    return GPT(config).eval()


def test_columns_store_the_same_matrix_and_generate_the_same_tokens(tmp_path: Path) -> None:
    model = small()
    idx = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(idx)
    tokens = model.generate(idx, 12)
    got = model.set_layout("columns")
    head = model.out_head.weight
    assert got["out_head.weight"] == "columns" and head.shape == (96, 32)
    assert not head.is_contiguous() and head.t().is_contiguous()  # (in, out) storage: Conv1D's
    with torch.no_grad():
        torch.testing.assert_close(model(idx), before, rtol=1e-5, atol=1e-5)
    assert torch.equal(model.generate(idx, 12), tokens)
    model.save_pretrained(tmp_path)  # files hold values, not strides
    again = GPT.from_pretrained(tmp_path)
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    model.set_layout("rows")
    assert model.out_head.weight.is_contiguous()


def test_auto_measures_each_shape_and_a_wrong_layout_is_refused() -> None:
    model = small()
    got = model.set_layout("auto")
    assert len(got) == 2 * 4 + 1 and set(got.values()) <= set(LAYOUTS)  # qkv, out_proj, two ff per block; out_head
    with pytest.raises(ValueError, match="layout must be one of \\('rows', 'columns', 'auto'\\), got 'diagonal'"):
        model.set_layout("diagonal")


def test_auto_picks_the_layout_its_probe_measured_fastest_for_each_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rates injected where the probe reports them, the fastest never listed first: wider than tall streams
    fastest by columns, the others by rows. Each weight must be stored as its own shape's pick."""
    probed: list[tuple[int, int, torch.dtype]] = []

    def rates(d_in: int, d_out: int, *, dtype: torch.dtype) -> dict[str, float]:
        probed.append((d_in, d_out, dtype))
        return {"rows": 3.0, "columns": 7.0} if d_out > d_in else {"columns": 3.0, "rows": 7.0}

    monkeypatch.setattr(layout, "stream_rates", rates)
    monkeypatch.setattr(layout, "_CHOSEN", {})
    assert layout.fastest_layout(32, 96) == "columns" and layout.fastest_layout(128, 32) == "rows"
    model = small()  # qkv 32 -> 96, out_proj 32 -> 32, ff 32 -> 128 -> 32, out_head 32 -> 96
    values = {name: w.clone() for name, w in model.state_dict().items()}
    got = model.set_layout("auto")
    weights = {f"{name}.weight": m.weight for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(got) == set(weights) and len(weights) == 9
    for name, w in weights.items():
        out_f, in_f = w.shape
        want = "columns" if out_f > in_f else "rows"
        assert got[name] == want, name
        assert w.stride() == ((1, out_f) if want == "columns" else (in_f, 1)), name  # where its numbers lie
        assert torch.equal(w, values[name]), name  # the same values
    assert {"rows", "columns"} == set(got.values())
    assert sorted(probed, key=str) == sorted(
        [(32, 96, torch.float32), (128, 32, torch.float32), (32, 32, torch.float32), (32, 128, torch.float32)],
        key=str,
    )  # each shape measured once
