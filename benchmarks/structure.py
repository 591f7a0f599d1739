"""Issue 55's targets, measured on the tree: how generation is planned, and how big the source is.

    .venv/bin/python benchmarks/structure.py [--base REV] [--json structure.json] [--smoke]

Not a speed benchmark: every figure is counted from the source (and one call stack), so it is the same on every
machine. ``tests/test_plan_depth.py`` and ``tests/test_floor.py`` hold the structural ones with these same
functions; the line counts are reported, with the baseline's where ``--base`` names a commit (read with git):

- depth: the frames of attnlab's own code from ``GPT.generate`` down to the cache's key write (target 8);
- temperature: where a parameter or field named ``temperature`` is declared (target 2);
- module circles and arrows up the floors (target 0 each), deferred imports included;
- capability probes: ``getattr``/``hasattr`` on a cache or module in ``models/`` and ``cache/`` (target 0);
- gpt.py's lines (target 320); generation and its planning (target 700): models/generation/, cache/model.py,
  plan.py, factories.py and __init__.py, gpt.py's generation methods, every ``make_cache``, ``for_model`` and
  cli/generate.py's checks; the whole source (.py and .cpp) and its files over 300 lines.

``--smoke`` is the same run (it takes seconds).
"""

from __future__ import annotations

import argparse
import ast
import graphlib
import inspect
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "attnlab"
# LAYOUT.md's floors; cli is the top. A module may import its own floor or lower ones, never a higher one.
FLOORS = {"_checks": 0, "observe": 0, "measured": 0, "book": 1, "functional": 1, "linear": 2, "nn": 3, "cache": 3}
FLOORS |= {"models": 4, "distributed": 4, "hf": 4, "explain": 5, "exercises": 5, "bench": 5, "cli": 6}
PLANNING_FILES = ("cache/model.py", "cache/plan.py", "cache/factories.py", "cache/__init__.py")
PLANNING_FUNCTIONS = {  # file: the functions of it that generate or plan (the rest of the file is something else)
    "models/gpt.py": ("generate", "stream", "generate_many", "step", "make_caches"),
    "cli/generate.py": ("check_flags", "in_flags", "check_cache"),
}
PROBES = ("getattr", "hasattr")
# attributes read by name that answer no capability question, each with its reason
NOT_A_PROBE = {
    "config": "which object was passed: an attnlab GPT is known by its GPTConfig, where the module that "
    "checks (checkpoints.py, families/book.py) sits below the model class and cannot import it"
}


def package(path: Path, src: Path = SRC) -> str:
    return path.relative_to(src).parts[0].removesuffix(".py")


def module_name(path: Path, src: Path = SRC) -> str:
    parts = ["attnlab", *path.relative_to(src).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(path: Path, modules: set[str]) -> set[str]:
    """The attnlab modules ``path`` imports, deferred (inside a function) and type-only imports included:
    ``from attnlab.x import y`` is the module x.y where y is one, else x."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("attnlab"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else str(node.module))
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("attnlab."))
    return found & modules


def sources(src: Path = SRC) -> dict[str, Path]:
    """Every module but the package root, which re-exports the public names."""
    return {module_name(p, src): p for p in sorted(src.rglob("*.py")) if p != src / "__init__.py"}


def arrows_up(src: Path = SRC) -> list[str]:
    """Imports from a higher floor than the importer's own."""
    paths = sources(src)
    up = []
    for name, path in paths.items():
        own = FLOORS[package(path, src)]
        for target in sorted(module_imports(path, set(paths) | {f"attnlab.{f}" for f in FLOORS})):
            floor = FLOORS.get(target.split(".")[1], -1)
            if floor > own:
                up.append(f"{name} imports {target} (floor {floor} > {own})")
    return up


def circles(src: Path = SRC, *, folders: bool = False) -> list[str]:
    """The first import circle found (empty: none), between modules or, ``folders``, between top-level folders."""
    paths = sources(src)
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        targets = module_imports(path, set(paths)) - {name}
        if folders:
            name, targets = name.split(".")[1], {t.split(".")[1] for t in targets} - {name.split(".")[1]}
        graph.setdefault(name, set()).update(targets)
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        return list(err.args[1])  # [a, b, ..., a]: each imported by the next
    return []


def temperature_declarations(src: Path = SRC) -> list[str]:
    """Functions with a ``temperature`` parameter and classes with a ``temperature`` field."""
    declared = []
    for path in sorted(src.rglob("*.py")):
        where = path.relative_to(src).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                if any(x.arg == "temperature" for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)):
                    declared.append(f"{where}:{node.name}()")
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and getattr(item.target, "id", None) == "temperature":
                        declared.append(f"{where}:{node.name}")
    return sorted(declared)


def probes(src: Path = SRC) -> list[str]:
    """``getattr``/``hasattr`` calls in models/ and cache/ that read an attribute named by a string on anything
    but ``self`` or a config: a question about what an object can do, which a declaration (a class's
    attribute, an isinstance) should answer. ``NOT_A_PROBE`` names the exceptions, with their reasons."""
    found = []
    for folder in ("models", "cache"):
        for path in sorted((src / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in PROBES:
                    target = ast.unparse(node.args[0]) if node.args else ""
                    name = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else None
                    if isinstance(name, str) and name not in NOT_A_PROBE and target not in ("self", "config", "c"):
                        found.append(f"{path.relative_to(src).as_posix()}:{node.lineno} {ast.unparse(node)}")
    return found


def planning_lines(src: Path = SRC) -> dict[str, int]:
    """Lines of generation and its planning, per file (the functions named in PLANNING_FUNCTIONS, every
    ``make_cache`` and ``for_model``, and whole files otherwise)."""
    counts: dict[str, int] = {}
    whole = [*sorted((src / "models" / "generation").glob("*.py")), *(src / f for f in PLANNING_FILES)]
    for path in whole:
        if path.is_file():
            counts[path.relative_to(src).as_posix()] = len(path.read_text(encoding="utf-8").splitlines())
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel in counts:
            continue
        wanted = (*PLANNING_FUNCTIONS.get(rel, ()), "make_cache", "for_model")
        spans = [
            node.end_lineno - node.lineno + 1 + len(node.decorator_list)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in wanted and node.end_lineno
        ]
        if spans:
            counts[rel] = sum(spans)
    return counts


def source_lines(src: Path = SRC) -> dict[str, int]:
    """Lines of every .py and .cpp file of the package."""
    files = sorted(p for p in src.rglob("*") if p.suffix in (".py", ".cpp") and "__pycache__" not in p.parts)
    return {p.relative_to(src).as_posix(): len(p.read_text(encoding="utf-8").splitlines()) for p in files}


@contextmanager
def frames_at_the_write(cls: type, seen: list[list[str]]) -> Iterator[None]:
    """While open, the first key write into a ``cls`` cache appends the frames of attnlab's own code from
    ``generate`` down to ``update`` (itself included) to ``seen``."""
    update = cls.update  # type: ignore[attr-defined]

    def recording(self: object, *args: object, **kwargs: object) -> object:
        if not seen:
            stack = [f for f in inspect.stack(context=0) if Path(f.filename).resolve().is_relative_to(SRC)]
            names = [f.function for f in reversed(stack)]  # outermost first
            seen.append([*names[names.index("generate") :], "update"])
        return update(self, *args, **kwargs)

    cls.update = recording  # type: ignore[attr-defined]
    try:
        yield
    finally:
        cls.update = update  # type: ignore[attr-defined]


def depth(cache: str) -> list[str]:
    """The frames from ``GPT.generate(cache=cache)`` to the first key write, on a tiny model."""
    import torch

    from attnlab.cache import CACHES, KVCache, PagedKVCache
    from attnlab.models import GPT, GPTConfig

    cls = {"plain": KVCache, "paged": PagedKVCache}[cache] if cache in CACHES else KVCache
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, context_length=32, emb_dim=16, n_heads=2, n_layers=2)).eval()
    seen: list[list[str]] = []
    with frames_at_the_write(cls, seen):
        model.generate(torch.tensor([[1, 2, 3, 4]]), 3, cache=cache)
    if not seen:
        raise RuntimeError(f"no {cls.__name__}.update was called by generate(cache={cache!r})")
    return seen[0]


def at(rev: str) -> Path:
    """The package's source at commit ``rev``, in a folder of its own (git archive)."""
    import io
    import tarfile
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="structure-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src/attnlab"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(where, filter="data")
    return where / "src" / "attnlab"


def measure(src: Path = SRC, *, calls: bool = True) -> dict[str, object]:
    """Every figure of the tree at ``src`` (``calls``: the call depths too, which run the installed package)."""
    lines = source_lines(src)
    planning = planning_lines(src)
    out: dict[str, object] = {
        "temperature": temperature_declarations(src),
        "module_circle": circles(src),
        "folder_circle": circles(src, folders=True),
        "arrows_up": arrows_up(src),
        "probes": probes(src),
        "gpt_py_lines": lines.get("models/gpt.py", 0),
        "planning_lines": sum(planning.values()),
        "planning_by_file": planning,
        "source_lines": sum(lines.values()),
        "files_over_300": sorted((n, f) for f, n in lines.items() if n > 300),
    }
    if calls:
        out["depth"] = {cache: depth(cache) for cache in ("plain", "paged")}
    return out


def report(now: dict[str, object], base: dict[str, object] | None, rev: str | None) -> str:
    """The figures as lines of text, each with its target (and the baseline's figure where one was measured)."""

    def was(key: str) -> str:
        return f" (at {rev}: {base[key]})" if base is not None and rev else ""

    depth_frames = now.get("depth", {})
    assert isinstance(depth_frames, dict)
    lines = [
        f"depth to the key write, {c}: {len(f)} frames (target <= 8): {' -> '.join(f)}" for c, f in depth_frames.items()
    ]
    temperature = now["temperature"]
    assert isinstance(temperature, list)
    lines.append(f"temperature declared in {len(temperature)} places (target 2): {', '.join(temperature)}")
    for key, what in (("module_circle", "module circles"), ("folder_circle", "folder circles")):
        circle = now[key]
        assert isinstance(circle, list)
        lines.append(f"{what}: {1 if circle else 0} (target 0)" + (": " + " <- ".join(circle) if circle else ""))
    for key, what in (("arrows_up", "arrows up the floors"), ("probes", "capability probes in models/ and cache/")):
        found = now[key]
        assert isinstance(found, list)
        lines.append(f"{what}: {len(found)} (target 0)" + (": " + "; ".join(found) if found else ""))
    lines.append(f"models/gpt.py: {now['gpt_py_lines']} lines (target <= 320){was('gpt_py_lines')}")
    lines.append(f"generation and its planning: {now['planning_lines']} lines (target <= 700){was('planning_lines')}")
    over = now["files_over_300"]
    assert isinstance(over, list)
    base_over = f" (at {rev}: {len(base['files_over_300'])})" if base is not None and rev else ""  # type: ignore[arg-type]
    lines.append(
        f"source: {now['source_lines']} lines{was('source_lines')}; files over 300 lines: {len(over)}{base_over}"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", metavar="REV", help="a commit to measure the same way (read with git archive)")
    parser.add_argument("--json", type=Path, help="write every figure here too")
    parser.add_argument("--smoke", action="store_true", help="the same run: it takes seconds")
    args = parser.parse_args()
    now = measure()
    base = measure(at(args.base), calls=False) if args.base else None
    print(report(now, base, args.base))
    if args.json:
        args.json.write_text(json.dumps({"now": now, "base": base, "base_rev": args.base}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
