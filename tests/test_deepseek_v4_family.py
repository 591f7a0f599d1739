"""DeepSeek-V4 read from Hugging Face folders (issue 59, step 2): exact against transformers' DeepseekV4ForCausalLM
on random weights from a small config where every part acts: a sliding layer alone (the main RoPE), compressed-sparse
layers (blocks of 4, the indexer's top 3 of up to 11 closed entries), a heavily compressed one (blocks of 8), a window
of 4 with sinks, the grouped output, YaRN on the compressed RoPE, 2 hyper-connection streams, a hash-routed first layer, then routed experts.
Prompts of 30 tokens leave a block open in every layer (30 is no multiple of 4 or 8).

Top-k choices on random weights can tie (every indexer head's ReLU at 0: then transformers' cached decode and its
full forward may pick differently, as attnlab's do) and flip under any change of summation order: ``margins`` reads
transformers' own indexer scores (a hook on its scorer) over the prompts and the 16 tokens generated and asserts a
gap between the 3rd and 4th score of every query that sees more than 3 closed entries; the seeds below give one.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

from attnlab.models import GPT
from attnlab.models.families import config_from_hf
from attnlab.models.moe_v4 import DeepseekV4MoE

pytestmark = pytest.mark.slow  # family parity: the second stage
VOCAB, TOPK, EXPERTS, T = 64, 3, 4, 30
KINDS = [
    "sliding_attention",
    "compressed_sparse_attention",
    "heavily_compressed_attention",
    "compressed_sparse_attention",
]
CONFIG: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    moe_intermediate_size=16,
    num_hidden_layers=4,
    num_attention_heads=4,
    head_dim=16,
    q_lora_rank=8,
    num_experts_per_tok=2,
    n_routed_experts=EXPERTS,
    hc_mult=2,
    hc_sinkhorn_iters=3,
    sliding_window=4,
    o_groups=2,
    o_lora_rank=8,
    index_n_heads=32,  # 32 heads: a score of exactly 0 (every ReLU at 0) all but never
    index_head_dim=16,
    index_topk=TOPK,
    layer_types=KINDS,
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
    partial_rotary_factor=0.5,
    rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    max_position_embeddings=256,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
)
IDS = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("v4"))


@functools.cache
def hf_dir(root: str) -> Path:
    """Weights drawn off their inits (norms, scales around 1; biases, sinks not zero), a random expert table."""
    torch.manual_seed(0)
    model = DeepseekV4ForCausalLM(DeepseekV4Config(**CONFIG)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if "inv_freq" in name:  # RoPE's frequencies: a buffer, not a weight
                continue
            if name.endswith("tid2eid"):
                p.copy_(torch.stack([torch.randperm(EXPERTS, generator=g)[:2] for _ in range(VOCAB)]))
                continue
            draw = torch.randn(p.shape, generator=g)
            if name.endswith(("e_score_correction_bias", "sinks", "base", "position_bias")):
                p.copy_(draw * 0.3)
            elif p.dim() == 1:  # norms and the connections' scales: they scale by w
                p.copy_(1 + 0.3 * draw)
            else:
                p.copy_(draw * (0.05 if name.endswith(("lm_head.weight", "embed_tokens.weight")) else 0.15))
    where = Path(root) / "deepseek_v4"
    model.save_pretrained(where)
    return where


@functools.cache
def hf(root: str) -> Any:
    return DeepseekV4ForCausalLM.from_pretrained(hf_dir(root)).eval()


def margins(root: str, ids: torch.Tensor) -> float:
    """The least gap, over every compressed-sparse layer and every query that sees more than TOPK closed entries
    (entry j closes at position 4j + 3), between its TOPK-th and next score, as transformers' scorer gives them."""
    gaps: list[float] = []

    def hook(_: Any, args: tuple[Any, ...], scores: torch.Tensor) -> None:
        for row in scores:  # (T, n) over a whole sequence from position 0
            for p in range(row.shape[0]):
                closed = row[p, : (p + 1) // 4]
                if closed.numel() > TOPK:
                    top = closed.sort(descending=True).values
                    gaps.append(float(top[TOPK - 1] - top[TOPK]))

    model = hf(root)
    handles = [m.register_forward_hook(hook) for n, m in model.named_modules() if n.endswith("scorer")]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for h in handles:
            h.remove()
    assert gaps  # some query saw more than TOPK entries
    return min(gaps)


@torch.no_grad()
def test_logits_and_greedy_tokens_equal_transformers(root: str) -> None:
    """Two prompts of 30 tokens in float32 within 1e-4 of transformers'; 16 greedy tokens as its generate gives
    them, on attnlab's cache and without one; the 3rd index score of every query 1e-5 clear of the 4th."""
    ours = GPT.from_pretrained(hf_dir(root))
    spec = ours.config.deepseek_v4
    assert spec is not None
    assert spec.layer_kinds == ("sliding", "compressed_sparse", "heavily_compressed", "compressed_sparse")
    assert (spec.index_topk, spec.hash_layers, spec.hc_mult) == (TOPK, (0,), 2)
    theirs = hf(root)
    err = float((ours(IDS) - theirs(IDS).logits).abs().max())
    assert err < 1e-4, err
    prompt = IDS[:1]
    expected = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False)
    assert margins(root, torch.cat([IDS, expected[:, T:].expand(2, 16)], 1)) > 1e-5
    assert ours.generate(prompt, 16, compile=False).tolist() == expected.tolist()
    assert ours.generate(prompt, 16, use_cache=False, compile=False).tolist() == expected.tolist()


@torch.no_grad()
def test_the_indexer_reads_fewer_entries_than_closed(root: str) -> None:
    """Each compressed-sparse layer's meter: min(3, closed) entries a query, fewer than the closed entries; the
    heavily compressed layer reads every closed entry (30 // 8 blocks close; the last 6 tokens' stays open)."""
    model = GPT.from_pretrained(hf_dir(root))
    model(IDS)
    read = [int(b.att.keys_read) for b in model.blocks]
    closed = [(p + 1) // 4 for p in range(T)]
    assert read[1] == read[3] == 2 * sum(min(TOPK, c) for c in closed) < 2 * sum(closed)
    assert read[2] == 2 * sum((p + 1) // 8 for p in range(T))
    assert read[0] == 0  # the sliding layer reads no entries


@torch.no_grad()
def test_hyper_connections_act_a_plain_residual_moves_the_logits(root: str) -> None:
    """The streams replaced by one plain residual (x + attention, x + mlp): the logits move by more than 1e-2."""
    model = GPT.from_pretrained(hf_dir(root))
    mixed = model(IDS)

    def plain(x: torch.Tensor, attention: Any, mlp: Any) -> torch.Tensor:
        x = x + attention(x)
        return x + mlp(x)

    for block in model.blocks:
        assert block.hyper is not None
        block.hyper.forward = plain  # type: ignore[method-assign]
    assert float((model(IDS) - mixed).abs().max()) > 1e-2


@torch.no_grad()
def test_hash_routing_acts_another_table_moves_the_logits(root: str) -> None:
    """The first layer routes by its token table: the table shifted by one expert moves the logits by 1e-3."""
    model = GPT.from_pretrained(hf_dir(root))
    hashed = model(IDS)
    ff = model.blocks[0].ff
    assert isinstance(ff, DeepseekV4MoE) and ff.hashed
    ff.gate.tid2eid.copy_((ff.gate.tid2eid + 1) % EXPERTS)
    assert float((model(IDS) - hashed).abs().max()) > 1e-3


@torch.no_grad()
def test_yarn_on_the_compressed_rope_acts(root: str) -> None:
    """The compressed layers' frequencies set back to plain RoPE's at compress_rope_theta: the logits move."""
    model = GPT.from_pretrained(hf_dir(root))
    scaled = model(IDS)
    for block in model.blocks[1:]:  # the compressed layers (the first slides at the main RoPE)
        r = block.att.rope_dim
        block.att.inv_freq.copy_(160000.0 ** (-torch.arange(0, r, 2, dtype=torch.float32) / r))
    assert float((model(IDS) - scaled).abs().max()) > 1e-3


@torch.no_grad()
def test_the_experts_fast_form_equals_the_readable_one(root: str) -> None:
    model = GPT.from_pretrained(hf_dir(root))
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(3))
    ids = IDS[:, :7]
    for block in model.blocks:
        ff = block.ff
        assert isinstance(ff, DeepseekV4MoE)
        torch.testing.assert_close(ff(x, ids), ff.every_expert(x, ids), atol=1e-6, rtol=1e-5)


@torch.no_grad()
def test_save_pretrained_writes_the_familys_names_and_transformers_reads_them(root: str, tmp_path: Path) -> None:
    """Written under the names transformers' save_pretrained writes (DeepSeek's); transformers reads the folder
    with no key missing or left over and the same logits; config.json reads back as the same config."""
    ours = GPT.from_pretrained(hf_dir(root))
    ours.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    with safe_open(str(hf_dir(root) / "model.safetensors"), "pt") as f:
        assert names == set(f.keys())
    loaded: Any = DeepseekV4ForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    again, info = loaded
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert float((again.eval()(IDS).logits - hf(root)(IDS).logits).abs().max()) < 1e-5
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["model_type"] == "deepseek_v4"
    raw.pop("attnlab", None)
    assert config_from_hf(raw, tmp_path) == ours.config


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"layer_types": ["full_attention", *KINDS[1:]]}, "DeepSeek-V4's layers are"),
        ({"rope_parameters": {"main": {"rope_type": "yarn", "factor": 2.0}, "compress": {}}}, "main RoPE unscaled"),
        ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
        ({"attention_bias": True}, "attention_bias"),
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"scoring_func": "relu"}, "scoring_func"),
        (
            {
                "rope_parameters": {
                    "main": {},
                    "compress": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 2.0},
                }
            },
            "attention_factor 1.0",
        ),
    ],
)
def test_what_cannot_be_read_is_refused_from_the_config_alone(
    edit: dict[str, Any], message: str, root: str, tmp_path: Path
) -> None:
    raw = json.loads((hf_dir(root) / "config.json").read_text())
    with pytest.raises(ValueError, match=message):
        config_from_hf({**raw, **edit}, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**raw, **edit}))
    (tmp_path / "model.safetensors").write_bytes(b"not weights")  # never read: the refusal comes first
    with pytest.raises(ValueError, match=message):
        GPT.from_pretrained(tmp_path)


@torch.no_grad()
def test_the_kv_bytes_meter_counts_the_compressed_state(root: str) -> None:
    """In float32 after 30 tokens, a compressed-sparse layer: its window 4 x 16 x 4 B, 7 closed entries of
    (16 + 16) x 4 B, the last 2 x 4 tokens' rows of 2 x (32 + 32) x 4 B; a heavily compressed one: 4 x 16 x 4 B,
    3 entries of 16 x 4 B, 2 x 8 rows of 32 x 4 B. The entries' growth and the rows agree with the model's own
    cache (its bytes_a_token, its rows buffer)."""
    from attnlab.bench.kv_bytes import cache_at, kv_report, layer_kinds

    model = GPT.from_pretrained(hf_dir(root))
    kinds = layer_kinds(model.config, dtype="float32")
    sliding, sparse, heavy = kinds
    assert (sparse.kind, sparse.layers, heavy.kind, heavy.layers) == ("compressed_sparse", 2, "heavily_compressed", 1)
    assert (sliding.kind, sliding.layers, sliding.layer_bytes(30)) == ("sliding", 1, 4 * 16 * 4)
    assert sparse.layer_bytes(30) == 256 + 7 * 128 + 8 * 128 * 4
    assert heavy.layer_bytes(30) == 256 + 3 * 64 + 16 * 32 * 4
    assert cache_at(kinds, 30, context_length=256).total == 256 + 2 * sparse.layer_bytes(30) + heavy.layer_bytes(30)
    caches = model.make_caches(batch_size=1, max_len=64)
    model(IDS[:1], caches=caches)
    for layer, kind in enumerate((sparse, heavy, sparse), start=1):
        cache = caches[layer]
        assert kind.layer_bytes(40) - kind.layer_bytes(32) == 8 * cache.bytes_a_token()
        assert kind.rows_bytes == cache.rows[:, : 2 * kind.block].numel() * 4
    assert "a window token" in kv_report(model.config, name="v4", tokens=(30,), dtype="float32").formula


@torch.no_grad()
def test_speculation_goes_back_on_every_part_and_gives_greedys_tokens(root: str) -> None:
    """A draft's refused guesses are taken back from the window, the entries, the open block and the compressor's
    rows: the tokens are transformers' greedy ones."""
    model, draft = GPT.from_pretrained(hf_dir(root)), GPT.from_pretrained(hf_dir(root))
    ff = draft.blocks[0].ff
    assert isinstance(ff, DeepseekV4MoE)
    ff.gate.tid2eid.copy_((ff.gate.tid2eid + 1) % EXPERTS)  # a draft that guesses otherwise now and then
    prompt = IDS[:1]
    expected = hf(root).generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
    assert draft.generate(prompt, 12, compile=False).tolist() != expected.tolist()  # some guess is refused
    assert model.generate(prompt, 12, compile=False, draft=draft, draft_tokens=3).tolist() == expected.tolist()


def test_a_padded_batch_is_refused_by_name(root: str) -> None:
    model = GPT.from_pretrained(hf_dir(root))
    mask = torch.ones_like(IDS)
    mask[1, :5] = 0
    with pytest.raises(ValueError, match="a padded row, packed documents or a mask_mod"):
        model(IDS, attention_mask=mask)
