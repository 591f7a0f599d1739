"""The docs show what the code does: mask pictures are regenerated and compared."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from attnlab.functional import Visibility, causal_mask, padding_mask, sliding_window_mask

DOCS = Path(__file__).resolve().parents[1] / "docs"


def picture(m: torch.Tensor) -> str:
    return "\n".join(" ".join("■" if x else "·" for x in row) for row in m.tolist())


def test_mask_pictures_in_backends_doc_are_true() -> None:
    text = (DOCS / "backends.md").read_text(encoding="utf-8")
    pad = padding_mask(torch.tensor([4]), 6, left=True)[0, 0]
    for m in (
        causal_mask(6, 6),
        causal_mask(2, 6),
        Visibility.from_lengths(2, 6, q_start=0, causal=True).dense()[0][0, 0],
        sliding_window_mask(6, 6, 3),
        pad.expand(6, 6),
        causal_mask(6, 6) & pad,
    ):
        assert f"```\n{picture(m)}\n```" in text


def test_architecture_doc_names_every_module() -> None:
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    src = Path(__file__).resolve().parents[1] / "src" / "attnlab"
    for path in sorted(src.rglob("*.py")):
        if path.name != "__init__.py":
            assert path.name in text, f"docs/architecture.md does not mention {path.relative_to(src)}"


def test_docs_python_examples_run() -> None:
    """The runnable ```python blocks (those that start with an import) of the pages on attention and mods run as
    written, in order, one namespace per page. (The ring's need processes: tests/test_ring.py runs that path.)"""
    for name in ("backends.md", "mods.md", "caches.md"):
        namespace: dict[str, object] = {}
        text = (DOCS / name).read_text(encoding="utf-8")
        for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
            if block.startswith(("import ", "from ")) or "namespace_started" in namespace:
                namespace["namespace_started"] = True
                exec(compile(block, name, "exec"), namespace)


def test_readme_python_examples_run() -> None:
    """Every ```python block of the README runs as written, in order, in one namespace."""
    import re

    readme = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert len(blocks) >= 4
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)  # our own README, run as a user would


PICTURE_NAMES = {
    "doc_ids": torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2]]),
    "lengths": torch.tensor([5]),
    "ramp": torch.arange(8)[None, :] - torch.arange(8)[:, None] + 0.0,  # scores j - i
    "table": torch.tensor([[-1.0, -0.5, 0.0, 0.5, 1.0]]),
}
BUILT_INS = ("causal", "sliding_window", "prefix_lm", "document", "padding", "alibi", "softcap", "relative_bias")


def test_every_built_in_mod_is_pictured_and_each_picture_is_what_the_code_draws() -> None:
    from attnlab.functional import mods

    page = (DOCS / "mods.md").read_text(encoding="utf-8")
    found = re.findall(r"<!-- picture: (.+?) -->\n```\n(.*?)\n```", page, flags=re.S)
    assert len(found) >= len(BUILT_INS)
    names = {n: getattr(mods, n) for n in dir(mods) if not n.startswith("_")} | PICTURE_NAMES
    for expr, drawn in found:
        assert eval(f"picture({expr})", names) == drawn, expr  # the page's own expression, redrawn now
    pictured = " ".join(expr for expr, _ in found)
    for name in (*BUILT_INS, "and_masks", "or_masks"):
        assert f"{name}(" in pictured, f"docs/mods.md has no picture of {name}"
