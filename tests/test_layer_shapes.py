"""Per-layer-type shapes and KV sharing (issue 56: Gemma 4, MiMo-V2-Flash), in attnlab's own decoder.

A layer type may have its own head size, key/value heads, sinks, keys that serve as values and RoPE
(``GPTConfig.full_layers``, ``sliding_layers``); values may be sized, scaled and normed apart; the last layers may
read an earlier layer's keys and values (``kv_shared_layers``), keeping nothing of their own. Each is checked by
what it does: the shared layers hold no cache and attend over their source's keys exactly, the decode through
every cache equals the forward without one, a value scale is the same as scaling the output projection, and
proportional RoPE turns the pairs and frequencies the formula names.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from attnlab.cache import ModelCache
from attnlab.functional.attention import attention
from attnlab.functional.rotary import RotaryEmbedding, apply_rotary
from attnlab.models import GPT, GPTConfig
from attnlab.models.layer_shape import LayerShape

TYPES = ("sliding", "full", "sliding", "full", "sliding", "full")
BASE = dict(vocab_size=64, context_length=128, emb_dim=32, n_heads=4, n_kv_heads=2, n_layers=6, drop_rate=0.0)
BASE |= dict(rope=True, norm="rmsnorm", mlp="geglu", bias=False, qk_norm=True, window=6, layer_types=TYPES)


def config(**changes: object) -> GPTConfig:
    shapes = dict(
        full_layers=LayerShape(head_dim=16, n_kv_heads=1, keys_as_values=True, rope_proportion=0.25),
        sliding_layers=LayerShape(sinks=True),
        v_norm=True,
        kv_shared_layers=2,
        double_wide_shared=True,
    )
    return GPTConfig(**(BASE | shapes | changes))  # type: ignore[arg-type]


def model(cfg: GPTConfig, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    built = GPT(cfg).eval()
    with torch.no_grad():  # sinks that act: zeros would give every row the same small share
        for block in built.blocks:
            if block.att.sinks is not None:
                block.att.sinks.normal_()
    return built


IDS = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(1))


def test_each_layer_gets_its_types_shape_and_the_shared_ones_compute_no_keys() -> None:
    m = model(config())
    states = [block.att.layer_state() for block in m.blocks]
    assert [s.kind for s in states] == ["sliding", "full", "sliding", "full", "shared", "shared"]
    assert [s.source for s in states[4:]] == [2, 3]  # the last earlier layer of each one's type
    assert [(s.kv_heads, s.head_dim) for s in states[:2]] == [(2, 8), (1, 16)]
    q_rows = [4 * 8, 4 * 16]  # H * D of a sliding and a full layer
    # sliding: q, k, v; full: q and k only (keys are the values); shared: q only
    assert [b.att.qkv.weight.shape[0] for b in m.blocks] == [q_rows[0] + 32, q_rows[1] + 16] * 2 + q_rows
    assert [b.att.sinks is not None for b in m.blocks] == [True, False] * 3  # sinks on the sliding type only
    assert [b.ff.fc1.weight.shape[0] for b in m.blocks] == [128] * 4 + [256] * 2  # double-wide where shared


def test_a_shared_layer_attends_over_its_sources_keys_and_values() -> None:
    """The shared layer's output, recomputed by hand from its source's keys and values: what it reads."""
    m = model(config())
    seen: dict[int, torch.Tensor] = {}
    hooks = [
        m.blocks[i].att.register_forward_hook(lambda mod, args, out, i=i: seen.__setitem__(i, args[0])) for i in (3, 5)
    ]
    outs: dict[int, torch.Tensor] = {}
    hooks.append(m.blocks[5].att.register_forward_hook(lambda mod, args, out: outs.__setitem__(5, out)))
    with torch.no_grad():
        m(IDS)
        source, shared = m.blocks[3].att, m.blocks[5].att
        positions = torch.arange(IDS.shape[1])
        cos, sin = source.rotary(positions)
        _, keys, values = source.split_qkv(seen[3])
        keys = apply_rotary(keys, cos, sin)
        queries, _, _ = shared.split_qkv(seen[5])
        queries = apply_rotary(queries, cos, sin)
        context = attention(queries, keys, values, is_causal=True, backend="eager")  # (B, H, T, D)
        expected = shared.out_proj(context.transpose(1, 2).reshape(2, IDS.shape[1], -1))
    for hook in hooks:
        hook.remove()
    assert float((outs[5] - expected).abs().max()) < 1e-5
    with pytest.raises(ValueError, match="reads layer 3's keys and values"):
        shared(seen[5])  # alone, it has no keys to read


@pytest.mark.parametrize("name", ["plain", "paged", "int8", "sink"])
def test_decoding_through_each_cache_equals_the_forward_without_one(name: str) -> None:
    m = model(config())
    with torch.no_grad():
        whole = m(IDS)
        cache = m.make_caches(batch_size=2, max_len=32, cache=name)
        steps = [m(IDS[:, :12], caches=cache)] + [m(IDS[:, i : i + 1], caches=cache) for i in range(12, 20)]
    assert float((torch.cat(steps, dim=1) - whole).abs().max()) < 1e-4
    shared = [layer for layer in cache if not list(layer.buffers())]
    assert len(shared) == 2  # the shared layers hold no tensor at all: their keys are counted once


def test_shared_layers_hold_nothing_so_the_cache_weighs_only_its_sources() -> None:
    """The effect: a model whose last two layers share keys keeps 4 layers' caches, not 6."""
    shared, own = model(config()), model(config(kv_shared_layers=0, double_wide_shared=False))

    def weight(m: GPT) -> int:
        cache: ModelCache = m.make_caches(batch_size=1, max_len=64, cache="plain")
        return sum(b.numel() * b.element_size() for layer in cache for b in layer.buffers())

    per_layer = [
        sum(b.numel() * b.element_size() for b in layer.buffers())
        for layer in own.make_caches(batch_size=1, max_len=64, cache="plain")
    ]
    assert weight(shared) == sum(per_layer[:4]) < weight(own) == sum(per_layer)


def test_speculation_and_prefix_reuse_read_through_shared_layers() -> None:
    """Cropping a shared layer is its source's business; a full-attention model with sharing speculates and
    reuses prefixes as greedy decoding without them."""
    cfg = config(layer_types=None, window=None, sliding_layers=None, full_layers=None)
    m = model(cfg)
    prompt = torch.tensor([[3, 4, 5, 3, 4, 5, 3, 4]])
    greedy = m.generate(prompt, 12)
    assert torch.equal(m.generate(prompt, 12, lookup=3), greedy)
    prompts = [
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 20],
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 30],
    ]
    alone = [m.generate(torch.tensor([p]), 6)[0, len(p) :].tolist() for p in prompts]
    assert m.generate_many(prompts, 6, cache="prefix", slots=1) == alone


def test_a_value_scale_is_the_output_projection_scaled() -> None:
    """Attention is linear in its values: values times s attend to s times the context, whatever the weights."""
    cfg = config(kv_shared_layers=0, double_wide_shared=False, v_norm=False)
    scaled, plain = model(cfg.with_(value_scale=0.5)), model(cfg)
    with torch.no_grad():
        for block in plain.blocks:
            block.att.out_proj.weight.mul_(0.5)
        assert float((scaled(IDS) - plain(IDS)).abs().max()) < 1e-5
        assert float((model(cfg)(IDS) - plain(IDS)).abs().max()) > 1e-3  # and the scale acts


def test_values_are_normed_and_on_full_layers_are_the_raw_keys() -> None:
    m = model(config())
    x = torch.randn(1, 5, 32)
    full = m.blocks[1].att  # keys as values, v_norm
    with torch.no_grad():
        full.k_norm.weight.normal_()  # type: ignore[union-attr]  # a key norm that is not the identity
        _, keys, values = full.split_qkv(x)
        raw = full.qkv(x)[..., 64:].view(1, 5, 1, 16).transpose(1, 2)  # the key rows, before any norm
        assert torch.allclose(values, raw * torch.rsqrt(raw.pow(2).mean(-1, keepdim=True) + 1e-5), atol=1e-5)
        assert torch.allclose(values.pow(2).mean(-1), torch.ones(1, 1, 5), atol=1e-3)  # unit RMS, no weight
        assert not torch.allclose(keys, values, atol=1e-3)  # the keys got their own norm


def test_proportional_rope_turns_the_first_pairs_at_the_whole_heads_frequencies() -> None:
    """Gemma 4's full layers: frequencies base^(-2i/D) over the whole head, all but the first
    int(p * D / 2) set to zero, so pairs (i, i + D/2) past those do not turn."""
    rotary = RotaryEmbedding(head_dim=8, base=100.0, proportion=0.5)
    assert torch.allclose(rotary.inv_freq, torch.tensor([1.0, 100 ** (-2 / 8), 0.0, 0.0]))
    x = torch.randn(1, 1, 3, 8)
    turned = rotary.rotate(x, torch.tensor([0, 1, 2]))
    for kept in (2, 3, 6, 7):  # pairs (2, 6) and (3, 7): frequency 0
        assert torch.equal(turned[..., kept], x[..., kept])
    angle = 2 * 100 ** (-2 / 8)  # pair (1, 5) at position 2
    c, s = math.cos(angle), math.sin(angle)
    expected = x[0, 0, 2, 1] * c - x[0, 0, 2, 5] * s
    assert abs(float(turned[0, 0, 2, 1]) - expected) < 1e-5


def test_proportional_rope_equals_transformers() -> None:
    from transformers import Gemma4TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = Gemma4TextConfig(
        hidden_size=32,
        num_attention_heads=2,
        head_dim=8,
        global_head_dim=16,
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        },
    )
    theirs, _ = ROPE_INIT_FUNCTIONS["proportional"](hf, None, layer_type="full_attention")
    ours = RotaryEmbedding(head_dim=16, base=1e6, proportion=0.25).inv_freq
    assert torch.allclose(ours, theirs) and int((theirs > 0).sum()) == 2


def test_the_shapes_round_trip_through_attnlabs_own_folder(tmp_path: Path) -> None:
    m = model(config())
    m.save_pretrained(tmp_path / "m")
    again = GPT.from_pretrained(tmp_path / "m")
    assert again.config == m.config
    with torch.no_grad():
        assert torch.equal(again(IDS), m(IDS))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(kv_shared_layers=6), r"kv_shared_layers must be an int in \[0, n_layers=6\)"),
        (dict(kv_shared_layers=5), "reading an earlier full layer's keys .* and none of layers 0..0 is one"),
        (dict(full_layers=LayerShape(n_kv_heads=3)), r"choose num_kv_heads among \[1, 2, 4\]"),
        (dict(value_scale=0.0), "value_scale must be None or a number > 0"),
    ],
)
def test_settings_that_cannot_be_built_are_refused_by_name(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config(**changes)


def test_a_layer_shape_refuses_what_it_cannot_be() -> None:
    with pytest.raises(ValueError, match="give it or rotary_dim, not both"):
        LayerShape(rotary_dim=4, rope_proportion=0.5)
    with pytest.raises(ValueError, match="rope_proportion must be None or a fraction"):
        LayerShape(rope_proportion=1.5)
    with pytest.raises(ValueError, match="unknown LayerShape fields"):
        LayerShape.from_dict({"heads": 2})


def test_the_views_name_the_layer_whose_keys_a_shared_layer_reads() -> None:
    from attnlab.explain.model_view import layer_kinds
    from attnlab.explain.report_text import REPORT_TEXT

    m = model(config())
    en, zh = layer_kinds(m, REPORT_TEXT["en"]), layer_kinds(m, REPORT_TEXT["zh"])
    assert en[4] == "sliding window of 6 · reads layer 2's keys and values (KV sharing): it caches nothing of its own"
    assert "读取第 3 层的键和值" in zh[5] and "KV" not in zh[3]
    assert all("KV sharing" not in kind for kind in en[:4])


def test_values_of_their_own_size_decode_through_plain_and_paged_and_are_refused_elsewhere() -> None:
    """MiMo-V2-Flash's values are narrower than its keys: the plain and paged caches keep them at their own
    width; a cache that codes or moves values at the keys' width refuses the layer by name, before building."""
    m = model(config(v_head_dim=4, value_scale=0.7, kv_shared_layers=0, double_wide_shared=False, full_layers=None))
    with torch.no_grad():
        whole = m(IDS)
        for name in ("plain", "paged"):
            cache = m.make_caches(batch_size=2, max_len=32, cache=name)
            steps = [m(IDS[:, :12], caches=cache)] + [m(IDS[:, i : i + 1], caches=cache) for i in range(12, 20)]
            assert float((torch.cat(steps, dim=1) - whole).abs().max()) < 1e-4, name
    full_only = model(config(v_head_dim=4, layer_types=None, window=None, sliding_layers=None, full_layers=None))
    for name in ("int8", "sink", "h2o"):
        with pytest.raises(ValueError, match=f"the {name} cache keeps values as wide as keys; this layer's values"):
            full_only.make_caches(batch_size=1, max_len=16, cache=name)
