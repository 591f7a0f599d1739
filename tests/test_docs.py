"""The docs show what the code does: mask pictures are regenerated and compared."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
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


def test_the_decoders_section_is_what_the_script_renders_from_its_result_file() -> None:
    """docs/benchmarks.md's decode table and its verdicts come from the run's committed file, not typed by hand."""
    import json

    from benchmark_scripts import load

    root = DOCS.parent
    script = load("decoders")  # as run: its helpers beside it (_verdicts) importable
    text = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    runs = sorted((root / "benchmarks" / "results").glob("decoders-*.json"))
    assert runs, "no result file of benchmarks/decoders.py in benchmarks/results/"
    for run in runs:
        assert script.render(json.loads(run.read_text(encoding="utf-8"))) in text, f"docs do not quote {run.name}"


CONTINUES = "continuing the example above"  # said in the prose before a block that needs the one before it
ELSEWHERE = re.compile(r"needs (several processes|GPUs)", re.I)  # said before a block that cannot run in-process


def python_blocks(page: str) -> list[tuple[str, str]]:
    """Each ```python block of a page, with the prose between it and the block before it."""
    found, end = [], 0
    for match in re.finditer(r"```python\n(.*?)```", page, flags=re.S):
        found.append((page[end : match.start()], match.group(1)))
        end = match.end()
    return found


@pytest.mark.parametrize("name", ["README.md", "docs/backends.md", "docs/mods.md", "docs/caches.md", "docs/ring.md"])
def test_every_python_example_runs_as_written_alone_or_after_the_one_it_says_it_continues(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader copies one block into a fresh interpreter, in a folder of their own: each block runs so, in a
    fresh namespace, unless the prose before it says it continues the example above (then after that one). A
    block the prose says needs several processes or GPUs runs elsewhere: tests/test_ring.py, and the GPU one
    on a lent GPU (docs/ring.md says whether it ran)."""
    monkeypatch.chdir(tmp_path)
    page = (DOCS.parent / name).read_text(encoding="utf-8")
    blocks = python_blocks(page)
    assert blocks, f"{name} has no python example"
    namespace: dict[str, object] = {}
    for n, (prose, block) in enumerate(blocks):
        if ELSEWHERE.search(prose.strip().split("\n\n")[-1]):
            continue
        if CONTINUES not in " ".join(prose.lower().split()):
            namespace = {"__name__": "__main__"}
        elif n == 0:
            raise AssertionError(f"{name}'s first example says it continues one above it")
        exec(compile(block, f"{name} example {n + 1}", "exec"), namespace)  # our own docs, run as a reader would


@pytest.mark.slow  # two real processes under torchrun
def test_the_ring_pages_script_runs_under_torchrun_as_the_page_says(tmp_path: Path) -> None:
    import subprocess
    import sys

    page = (DOCS / "ring.md").read_text(encoding="utf-8")
    prose, script = next((p, b) for p, b in python_blocks(page) if "ring_example.py" in p)
    (tmp_path / "ring_example.py").write_text(script, encoding="utf-8")
    command = "torchrun --standalone --nproc-per-node 2 ring_example.py"
    assert command in prose
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run(
        [str(torchrun), *command.split()[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]


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


def test_the_readmes_latent_figures_are_what_the_memory_meter_counts_for_deepseek_v3() -> None:
    """README's "576 for V3's shape, against N for the keys and values of its 128 full heads": both figures are
    the meter's (attnlab.bench.kv_bytes, what `attnlab memory` reports), and the meter's are DeepSeek-V3's
    published config worked by hand: a 512 latent and a 64 RoPE key; 128 heads each keeping a key of 128 + 64
    and a value of 128."""
    from attnlab.bench.kv_bytes import expanded_head_values
    from attnlab.models.families.shapes import shape

    text = " ".join((DOCS.parent / "README.md").read_text(encoding="utf-8").split())
    found = re.search(
        r"([\d,]+) for V3's shape, against ([\d,]+) for the keys and values of its (\d+) full heads", text
    )
    assert found, "README.md no longer states V3's latent against its full heads"
    latent, full, heads = (int(g.replace(",", "")) for g in found.groups())
    v3 = shape("deepseek-v3")
    assert (latent, full, heads) == (v3.kv_lora_rank + v3.qk_rope_head_dim, expanded_head_values(v3), v3.n_heads)
    assert (latent, full) == (512 + 64, 128 * (128 + 64) + 128 * 128)  # 40,960, not 2 x 128 x 128 = 32,768
