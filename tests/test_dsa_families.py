"""DeepSeek-V3.2 and GLM-5 read from Hugging Face folders (issue 59, step 1): exact against transformers'
DeepseekV32ForCausalLM and GlmMoeDsaForCausalLM on random weights from small configs where the indexer's top-k (8)
is smaller than the prompt (40 tokens), so every layer's queries read a chosen few keys.

Each layer has the lightning indexer (8 heads of 16, its LayerNorm's bias not zero) beside latent attention with a
query latent; a dense first layer, then 8 experts in 2 groups with a shared expert. Top-k choices on random weights
can tie (every indexer head's ReLU at 0) and then flip under any change of summation order: ``margins`` recomputes
every indexer's scores in float64 from transformers' own inputs to its indexers (a hook) over the prompt and the 16
tokens generated, and asserts a gap between the 8th and 9th score of every query that sees more than 8 keys; the
seeds below give one. A test takes the indexer out (top-k as large as the context) and watches the logits move.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from transformers import DeepseekV32Config, DeepseekV32ForCausalLM, GlmMoeDsaConfig, GlmMoeDsaForCausalLM

from attnlab.models import GPT
from attnlab.models.families import config_from_hf

pytestmark = pytest.mark.slow  # family parity: the second stage
VOCAB, TOPK = 128, 8
CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=16,
    q_lora_rank=24,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=12,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    n_group=2,
    topk_group=1,
    first_k_dense_replace=1,
    index_topk=TOPK,
    index_head_dim=16,
    index_n_heads=8,
    max_position_embeddings=256,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
)
FAMILIES: dict[str, tuple[Any, Any]] = {
    "deepseek_v32": (DeepseekV32Config, DeepseekV32ForCausalLM),
    "glm_moe_dsa": (GlmMoeDsaConfig, GlmMoeDsaForCausalLM),
}
IDS = torch.randint(0, VOCAB, (2, 56), generator=torch.Generator().manual_seed(5))
PROMPTS = IDS[:, :40]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("dsa"))


@functools.cache
def hf_dir(family: str, root: str) -> Path:
    """The family's model with weights drawn off their inits (norms around 1, the indexer's LayerNorm bias and the
    router's correction bias not zero), saved by transformers."""
    config_class, model_class = FAMILIES[family]
    torch.manual_seed(0)
    model = model_class(config_class(**CONFIG)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith("inv_freq"):  # RoPE's frequencies: a buffer, not a weight
                continue
            draw = torch.randn(p.shape, generator=g)
            if name.endswith(("e_score_correction_bias", "k_norm.bias")):
                p.copy_(draw * 0.3)
            elif p.dim() == 1:  # norms: they scale by w
                p.copy_(1 + 0.3 * draw)
            else:
                p.copy_(draw * (0.05 if name.endswith(("lm_head.weight", "embed_tokens.weight")) else 0.15))
    where = Path(root) / family
    model.save_pretrained(where)
    return where


@functools.cache
def hf(family: str, root: str) -> Any:
    return FAMILIES[family][1].from_pretrained(hf_dir(family, root)).eval()


def _turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """RoPE on x's first P values in float64 at transformers' angles (cos, sin (T, P): each angle twice)."""
    p = cos.shape[-1]
    c, s = cos[..., : p // 2].double(), sin[..., : p // 2].double()
    x = x.double().clone()
    one, two = (x[..., 0:p:2], x[..., 1:p:2]) if interleave else (x[..., : p // 2], x[..., p // 2 : p])
    a, b = one * c - two * s, two * c + one * s
    if interleave:
        x[..., 0:p:2], x[..., 1:p:2] = a, b
    else:
        x[..., : p // 2], x[..., p // 2 : p] = a, b
    return x


def margins(family: str, root: str, ids: torch.Tensor) -> float:
    """The least gap, over every layer and every query that sees more than TOPK keys, between its TOPK-th and next
    index score, I(t, s) = sum_j w_j * ReLU(q_j . k_s / sqrt(Di)), recomputed here in float64 from the inputs
    transformers hands each indexer (weights_proj's rows over sqrt(Hi) as w)."""
    model, gaps = hf(family, root), []

    def hook(indexer: Any, args: tuple[Any, ...]) -> None:
        x, q_resid, (cos, sin) = args[0][0].double(), args[1][0].double(), args[2]
        t, hi, di = x.shape[0], indexer.n_heads, indexer.head_dim
        q = (q_resid @ indexer.wq_b.weight.double().T).view(t, hi, di).transpose(0, 1)  # (Hi, T, Di)
        k = torch.nn.functional.layer_norm(
            x @ indexer.wk.weight.double().T, (di,), indexer.k_norm.weight.double(), indexer.k_norm.bias.double(), 1e-6
        )
        interleave = family == "glm_moe_dsa"
        q, k = _turn(q, cos[0], sin[0], interleave), _turn(k, cos[0], sin[0], interleave)
        w = x @ indexer.weights_proj.weight.double().T / math.sqrt(hi)  # (T, Hi)
        scores = torch.einsum("th,hts->ts", w, torch.relu(q @ k.T / math.sqrt(di)))  # (T, S)
        for row in range(TOPK, t):
            top = scores[row, : row + 1].sort(descending=True).values
            gaps.append(float(top[TOPK - 1] - top[TOPK]))

    handles = [m.register_forward_pre_hook(hook) for n, m in model.named_modules() if n.endswith("indexer")]
    try:
        with torch.no_grad():
            for row in ids:
                model(row[None])
    finally:
        for h in handles:
            h.remove()
    return min(gaps)


@torch.no_grad()
@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_and_greedy_tokens_equal_transformers(family: str, root: str) -> None:
    """Two prompts of 40 tokens in float32 within 1e-4 of transformers'; 16 greedy tokens as its generate gives
    them, on attnlab's cache and without one; the 8th index score of every query 1e-5 clear of the 9th (float32 sums differ by about 1e-6)."""
    ours = GPT.from_pretrained(hf_dir(family, root))
    c = ours.config
    assert (c.family, c.index_topk, c.index_heads, c.index_head_dim) == (family, TOPK, 8, 16)
    assert c.index_rope_interleave == (family == "glm_moe_dsa")
    theirs = hf(family, root)
    err = float((ours(PROMPTS) - theirs(PROMPTS).logits).abs().max())
    assert err < 1e-4, err
    prompt = PROMPTS[:1]
    expected = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False)
    assert margins(family, root, torch.cat([PROMPTS, expected[:, 40:].expand(2, 16)], 1)) > 1e-5
    assert ours.generate(prompt, 16).tolist() == expected.tolist()
    assert ours.generate(prompt, 16, use_cache=False).tolist() == expected.tolist()


@torch.no_grad()
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_selection_acts_taking_it_out_moves_the_logits(family: str, root: str) -> None:
    """With top-k as large as the context every query reads every key: the logits move by more than 1e-2, and
    each layer's keys-read meter shows 8 a query past the 8th token against every earlier key."""
    model = GPT.from_pretrained(hf_dir(family, root))
    sparse = model(PROMPTS)
    read = [int(b.att.keys_read) for b in model.blocks]
    assert read == [2 * sum(min(TOPK, t + 1) for t in range(40))] * 3
    for block in model.blocks:
        block.att.index_topk = 256
        block.att.reset_meter()
    assert float((model(PROMPTS) - sparse).abs().max()) > 1e-2
    assert [int(b.att.keys_read) for b in model.blocks] == [2 * 40 * 41 // 2] * 3


@torch.no_grad()
@pytest.mark.parametrize("family", list(FAMILIES))
def test_save_pretrained_writes_the_familys_names_and_transformers_reads_them(
    family: str, root: str, tmp_path: Path
) -> None:
    """Written under the family's names (the indexer's wq_b, wk, k_norm with its bias, weights_proj); transformers
    reads the folder with no key missing or left over and the same logits; config.json read back without attnlab's
    own copy gives the same config."""
    ours = GPT.from_pretrained(hf_dir(family, root))
    ours.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {
        f"model.layers.2.self_attn.indexer.{n}" for n in ("wq_b.weight", "k_norm.bias", "weights_proj.weight")
    } <= names
    loaded: Any = FAMILIES[family][1].from_pretrained(tmp_path, output_loading_info=True)
    again, info = loaded
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert float((again.eval()(PROMPTS).logits - hf(family, root)(PROMPTS).logits).abs().max()) < 1e-5
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["model_type"] == family and raw["index_topk"] == TOPK
    del raw["attnlab"]
    assert config_from_hf(raw, tmp_path) == ours.config


@pytest.mark.parametrize(
    ("family", "edit", "message"),
    [
        ("deepseek_v32", {"q_lora_rank": None}, "q_lora_rank is null"),
        ("deepseek_v32", {"attention_bias": True}, "attention_bias"),
        ("deepseek_v32", {"layer_types": ["full_attention"] * 3}, "every layer is 'indexed_attention'"),
        ("deepseek_v32", {"mlp_layer_types": ["sparse"] * 3}, "mlp_layer_types"),
        ("glm_moe_dsa", {"indexer_types": ["shared", "full", "full"]}, "the first has none before it to share"),
    ],
)
def test_what_cannot_be_read_is_refused_from_the_config_alone(
    family: str, edit: dict[str, Any], message: str, root: str, tmp_path: Path
) -> None:
    raw = json.loads((hf_dir(family, root) / "config.json").read_text())
    with pytest.raises(ValueError, match=message):
        config_from_hf({**raw, **edit}, tmp_path)


@torch.no_grad()
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_bridge_runs_transformers_model_with_its_selection(family: str, root: str) -> None:
    """attnlab.hf.use on transformers' own model: the keys its indexer chose reach attnlab as ``indices`` (not
    folded into the mask, as for eager and sdpa) and are applied: logits within 1e-4, 16 greedy tokens identical."""
    import attnlab.hf

    model = hf(family, root)
    prompt = PROMPTS[:1]
    reference = model(PROMPTS).logits
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False)
    with attnlab.hf.use(model):
        assert float((model(PROMPTS).logits - reference).abs().max()) < 1e-4
        got = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False)
    assert got.tolist() == expected.tolist()


@torch.no_grad()
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_left_padded_row_reads_as_transformers_reads_it(family: str, root: str) -> None:
    """Row 1 padded on the left by 7: the padding is hidden from the indexer's choice as from the attention, so its
    real positions' logits are within 1e-4 of transformers' with the same mask (this seed; its margins unasserted)."""
    mask = torch.ones_like(PROMPTS)
    mask[1, :7] = 0
    reference = hf(family, root)(PROMPTS, attention_mask=mask).logits
    ours = GPT.from_pretrained(hf_dir(family, root))(PROMPTS, attention_mask=mask)
    assert float((ours[0] - reference[0]).abs().max()) < 1e-4
    assert float((ours[1, 7:] - reference[1, 7:]).abs().max()) < 1e-4
