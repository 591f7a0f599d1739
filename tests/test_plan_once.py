"""One place decides each layer's state (issue 55 item 1): attention modules declare a LayerState and make no
cache; ModelCache.build reads one table; capabilities are the classes' declarations; nothing outside
attnlab.cache branches on a cache's name; the paged layers of a build share one block table."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import Attention
from attnlab.cache import CACHES, LayerState, ModelCache, PagedKVCache, PrefixCache
from attnlab.cache.base import Cache, LayerCache
from attnlab.cache.plan import TABLE, Choice
from attnlab.cache.shared import SharedCache
from attnlab.models import GPT, GPTConfig
from attnlab.nn.latent import LatentAttention
from attnlab.nn.recurrent import GatedDeltaNet, LinearAttention

SRC = Path(__file__).resolve().parents[1] / "src" / "attnlab"


def modules() -> list[torch.nn.Module]:
    return [
        Attention(d_in=16, num_heads=2),
        Attention(d_in=16, num_heads=2, window=4, rope=True),
        LatentAttention(d_in=16, num_heads=2, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4),
        LinearAttention(d_in=16, num_heads=2),
        GatedDeltaNet(d_in=16, num_heads=2),
    ]


def test_attention_modules_declare_their_state_and_make_no_cache() -> None:
    kinds = []
    for module in modules():
        assert not hasattr(module, "make_cache"), type(module).__name__
        state = module.layer_state()  # type: ignore[operator]
        assert isinstance(state, LayerState)
        kinds.append(state.kind)
    assert kinds == ["full", "sliding", "latent", "recurrent", "recurrent"]


def layouts() -> dict[str, list[LayerState]]:
    full = LayerState(kind="full", kv_heads=2, head_dim=4)
    return {
        "full": [full, full],
        "mixed": [LayerState(kind="sliding", kv_heads=2, head_dim=4, window=4), full],
        "hybrid": [LayerState(kind="recurrent", kv_heads=2, head_dim=4, value_dim=4), full],
        "latent": [LayerState(kind="latent", kv_heads=1, head_dim=64, value_dim=48)],
        "shared": [full, LayerState(kind="shared", kv_heads=2, head_dim=4, source=0)],  # reads layer 0's keys
        "convolution": [LayerState(kind="convolution", kv_heads=1, head_dim=4, conv=(4, 2)), full],  # LFM's
        "indexed": [LayerState(kind="indexed", kv_heads=1, head_dim=64, value_dim=48, index_dim=16)],  # DSA
        "blocks": [LayerState(kind="blocks", kv_heads=2, head_dim=4)],  # MoBA, NSA: keys read by blocks
        "compressed": [  # DeepSeek-V4's compressed-sparse layer (its heavily compressed one has index_dim None)
            LayerState(kind="compressed", kv_heads=1, head_dim=16, window=4, index_dim=8, block=4, row_width=96)
        ],
    }


@pytest.mark.parametrize("name", list(CACHES))
@pytest.mark.parametrize("layout", list(layouts()))
def test_capabilities_are_the_classes_declarations_without_building(
    name: str, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ModelCache.plan makes nothing (every cache class's constructor refuses while it runs), and what it says
    is what the cache build then makes can do."""
    layers = layouts()[layout]
    made: list[str] = []
    real = LayerCache.__init__

    def counted(self: LayerCache, **kw: object) -> None:
        made.append(type(self).__name__)
        real(self, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(LayerCache, "__init__", counted)
    try:
        planned = ModelCache.plan(layers, name)
    except ValueError as refused:
        with pytest.raises(ValueError, match=re.escape(str(refused))):
            ModelCache.build(layers, name, rows=1, capacity=8)
        return
    assert made == []  # no probe
    built = ModelCache.build(layers, name, rows=1, capacity=8)
    assert made  # the build does make them
    assert built.capabilities == planned, (layout, name)


def test_each_choice_of_the_table_builds_the_class_it_names() -> None:
    """The plan reads capabilities off the class a choice names: a layer built by that choice is of that class."""
    checked = 0
    for (kind, name), entry in TABLE.items():
        if not isinstance(entry, Choice):
            assert isinstance(entry, str) and entry, (kind, name)  # a refusal says why
            continue
        if name is None:  # a factory of one's own: it builds what it builds, declared as nothing
            assert entry.cls is (SharedCache if kind == "shared" else LayerCache)  # a shared layer reads its source
            continue
        state = next(s for group in layouts().values() for s in group if s.kind == kind)
        layer = ModelCache.build([LayerState(kind="full", kv_heads=1, head_dim=2), state], name, rows=1, capacity=8)
        assert type(layer[1]) is entry.cls, (kind, name)
        checked += 1
    assert checked >= 20


def test_the_paged_layers_of_a_build_share_one_block_table() -> None:
    model = GPT(GPTConfig(vocab_size=64, context_length=32, emb_dim=16, n_heads=2, n_layers=3, rope=True))
    for name in ("paged", "prefix"):
        cache = model.make_caches(batch_size=2, max_len=16, cache=name)
        tables = {id(layer.table) for layer in cache if isinstance(layer, PagedKVCache)}
        assert tables == {id(cache.table)} and cache.table is not None and cache.table.layers == 3, name
    sized = functools.partial(CACHES["prefix"], num_blocks=5)
    prefix = model.make_caches(batch_size=1, max_len=16, cache=sized)
    assert isinstance(prefix, PrefixCache) and prefix.blocks is prefix.table and prefix.table.num_blocks == 5


def cache_name_compares(path: Path) -> list[str]:
    """Comparisons of a value with one of CACHES' names (or a tuple of them) in a module, as source text."""
    names = set(CACHES)

    def named(node: ast.expr) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value} & names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*(named(e) for e in node.elts)) if node.elts else set()
        return set()

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare) and any(named(side) for side in (node.left, *node.comparators)):
            found.append(ast.unparse(node))
    return found


# The same words meaning something else, or naming a results row: (file, comparison).
NOT_A_CACHE_CHOICE = {
    ("bench/zoo_result.py", "'sink' in v.heads"),  # attention sinks, a head's share of the weight
    ("models/gpt.py", "kind != 'int8'"),  # weight quantization
    ("bench/cache_verdicts.py", "'paged' in rows"),  # a verdict on the paged row of a results table
    ("bench/cache_verdicts.py", "'sink' not in {r.cache for r in table.rows} | set(table.left)"),
    ("bench/cache_verdicts.py", "'sink' in names"),
    # the front door's default: use_cache=False leaves it out, and refuses any cache named beside it
    ("models/generation/request.py", "cache != 'plain'"),
}


def test_no_code_outside_the_cache_package_branches_on_a_cache_name() -> None:
    found = {
        (path.relative_to(SRC).as_posix(), compare)
        for path in SRC.rglob("*.py")
        if path.relative_to(SRC).parts[0] != "cache"
        for compare in cache_name_compares(path)
    }
    assert found - NOT_A_CACHE_CHOICE == set()


def test_the_name_scan_sees_a_comparison(tmp_path: Path) -> None:
    """The scan is not blind: a module that compares with a cache name is caught, in each form."""
    probe = tmp_path / "probe.py"
    probe.write_text("if cache == 'prefix' or x in ('paged', 'y') or 'h2o' != z or a == 'b':\n    pass\n")
    assert cache_name_compares(probe) == ["cache == 'prefix'", "x in ('paged', 'y')", "'h2o' != z"]


def small_model(**changes: object) -> GPT:
    torch.manual_seed(0)
    base: dict[str, object] = dict(
        vocab_size=40, context_length=16, emb_dim=32, n_heads=2, n_layers=2, drop_rate=0.0, rope=True, norm="rmsnorm"
    )
    return GPT(GPTConfig(**(base | changes))).eval()  # type: ignore[arg-type]


def test_a_sink_cache_on_the_full_layers_runs_past_the_context_beside_sliding_ones() -> None:
    """A ring and a recurrent state run on past any length, so the layers the sink cache applies to decide
    (review of issue 55: the plan ANDed the ring's 'no past_context' in, and refused what ran before)."""
    ids = torch.randint(0, 40, (1, 10))
    for types in (("sliding", "full"), ("delta", "full")):
        model = small_model(layer_types=types, window=4)
        out = model.generate(ids, 20, cache="sink")  # 29 positions, past the context of 16
        assert out.shape == (1, 30)
        with pytest.raises(ValueError, match="more than the model's context_length 16"):
            model.generate(ids, 20)  # the plain cache on the full layer stops at the context


def test_a_factory_of_ones_own_is_checked_as_made() -> None:
    """A factory declares nothing until it is made: the request makes its caches first (fresh, no one's
    state) and checks what they can do, so speculation runs on a factory that makes croppable caches."""
    model = small_model()
    ids = torch.randint(0, 40, (1, 6))

    def mine(**args: Any) -> Cache:  # a factory of one's own (a partial of a named one is read as that name)
        return CACHES["plain"](**args)

    greedy = model.generate(ids, 8)
    assert torch.equal(model.generate(ids, 8, cache=mine, lookup=2), greedy)
    with pytest.raises(ValueError, match="this cache's layers keep room to go back by 0 \\(a ring's or a quantized"):
        model.generate(ids, 8, cache=lambda **args: CACHES["int8"](**args), lookup=2)  # made without spare slots


def test_no_cache_is_said_by_use_cache_and_a_cache_name_is_a_name() -> None:
    model = small_model()
    ids = torch.randint(0, 40, (1, 6))
    with pytest.raises(TypeError, match="cache=None is not a cache"):
        model.generate(ids, 4, cache=None)  # type: ignore[typeddict-item]
    assert torch.equal(model.generate(ids, 4, use_cache=False, cache="plain"), model.generate(ids, 4))
    with pytest.raises(ValueError, match="use_cache=False runs without a cache"):
        model.generate(ids, 4, use_cache=False, cache="int8")
