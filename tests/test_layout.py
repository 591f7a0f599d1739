"""Weight layout (issue 24, part 2): rows or columns, chosen by measuring; the same values, shapes and files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab.models import GPT, GPTConfig
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
