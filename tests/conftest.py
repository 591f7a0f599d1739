from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SEED_DIR = REPO.parent / "shared" / "seed"
IN_CI = os.environ.get("CI") == "true"  # .ci/run exports it
os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here reaches a model hub: a hub name is read from a cache a test lays out
os.environ["ATTNLAB_MEASURE"] = "0"  # no test pays a machine's measurement unless it asks (tests/test_tuned*.py)
os.environ["ATTNLAB_CACHE"] = tempfile.mkdtemp(prefix="attnlab-cache-")  # nor reads or writes the user's measurements
atexit.register(shutil.rmtree, os.environ["ATTNLAB_CACHE"], ignore_errors=True)  # and leaves no folder behind


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """Under CI=true a skip is a failure: a test that cannot run there hides what it would have found."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every prerequisite must be there: {reason}"
    return None


@pytest.fixture(scope="session")
def tour_pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tour's HTML report in each language, as `attnlab tour --html` writes it, once for every test that reads
    it (the glossary's links, the report's checks in a browser)."""
    from attnlab import cli

    folder = tmp_path_factory.mktemp("tour-pages")
    for lang in ("zh", "en"):
        assert cli.main(["tour", "--lang", lang, "--html", str(folder / f"tour-{lang}.html")]) == 0
    return {lang: folder / f"tour-{lang}.html" for lang in ("zh", "en")}


@pytest.fixture
def seed_text() -> str:
    """The reading notes the golden numbers were transcribed from."""
    files = sorted(SEED_DIR.glob("*.txt"))
    if not files:
        message = f"the reading notes are not beside this checkout ({SEED_DIR}); the golden numbers come from them"
        pytest.skip(message)  # a failure under CI=true (pytest_runtest_makereport)
    return "\n".join(f.read_text(encoding="utf-8") for f in files)


def tiles(backend: str, block_q: int, block_k: int) -> object:
    """``backend``, with small flash tiles when it is flash (tile sizes belong to the flash backend alone)."""
    from attnlab.functional import Flash

    return Flash(block_q=block_q, block_k=block_k) if backend == "flash" else backend


def small(**overrides: object) -> object:
    """A small random-weight decoder config with what modern models use: RoPE, grouped-query heads (4 on 2)."""
    from attnlab.models import GPTConfig

    values: dict = dict(vocab_size=256, context_length=64, emb_dim=64, n_heads=4, n_kv_heads=2, n_layers=2)
    values |= dict(rope=True, drop_rate=0.0)
    return GPTConfig(**{**values, **overrides})


def compiled_op_calls(model: object, op: str, idx: object) -> tuple[int, object, object]:
    """How many times a compiled decode step called ``op`` over 6 new tokens (the step compiled first, then a
    second call profiled: 5 decode steps, the prompt's pass drawing the first token), with its tokens and the
    eager tokens."""
    from torch.profiler import ProfilerActivity, profile

    eager = model.generate(idx, 6)  # type: ignore[attr-defined]
    model.generate(idx, 6, compile=True)  # type: ignore[attr-defined]  # compiles the step
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        compiled = model.generate(idx, 6, compile=True)  # type: ignore[attr-defined]
    count = {e.key: e.count for e in prof.key_averages()}
    return count.get(op, 0), compiled, eager


def python_calls(fn: object) -> int:
    """How many Python functions one call of ``fn`` enters (sys.setprofile: a count, not a time): what a fast
    path's effect tests budget, where a time would be a timed unit test."""
    import sys

    entered = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal entered
        entered += event == "call"

    sys.setprofile(count)
    try:
        fn()  # type: ignore[operator]
    finally:
        sys.setprofile(None)
    return entered
