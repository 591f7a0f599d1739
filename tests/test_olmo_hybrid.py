"""OLMo-Hybrid read from Hugging Face directories, exact against transformers' OlmoHybridForCausalLM on random
weights from a small config where every feature acts (issue 56): pre-norm Gated DeltaNet layers with negative
eigenvalues (beta up to 2), grouped value heads wider than the keys and their own convolutions of q, k and v,
beside OLMo's post-norm softmax layers with QK-norm over all heads, with RoPE and without (NoPE). Prompts of 80
tokens pass transformers' 64-token chunk. A test takes each feature out and watches the logits move by more than
1e-3, so the parity is not parity by default."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import OlmoHybridConfig, OlmoHybridForCausalLM

from attnlab.functional.recurrent import gated_delta_rule
from attnlab.models import GPT

# family parity, as test_families' slow half: the second stage (the first stage's 240 s budget had 1 s to spare)
pytestmark = pytest.mark.slow
VOCAB = 128
CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # each key head serves 2 value heads
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    linear_conv_kernel_dim=4,
    max_position_embeddings=256,
    # OlmoHybridConfig's own ids are past this vocabulary; and a pad id would make generate mask those tokens
    pad_token_id=None,
    eos_token_id=None,
)
POSITIONS = {
    "rope": {"rope_type": "default", "rope_theta": 10000.0},
    "nope": {"rope_type": "default", "rope_theta": None},
}
IDS = torch.randint(0, VOCAB, (2, 80), generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("olmo_hybrid"))


@functools.cache
def hf_dir(positions: str, root: str) -> Path:
    """An OlmoHybridForCausalLM directory with weights drawn off their inits: norms around 1, decays from slow to
    fast, betas past 1 (so the negative eigenvalues act)."""
    torch.manual_seed(0)
    model = OlmoHybridForCausalLM(OlmoHybridConfig(**CONFIG, rope_parameters=POSITIONS[positions])).eval()  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g) * 5 - 4)
            elif p.dim() == 1:  # norms (scale by w) and dt_bias
                p.copy_(1 + 0.3 * noise)
            else:
                p.copy_(noise * (0.05 if name.endswith(("lm_head.weight", "embed_tokens.weight")) else 0.2))
    where = Path(root) / positions
    model.save_pretrained(where)
    # transformers' own save splits the three convolutions into equal thirds; the file is read as one either way
    return where


@functools.cache
def hf(positions: str, root: str) -> OlmoHybridForCausalLM:
    return OlmoHybridForCausalLM.from_pretrained(hf_dir(positions, root)).eval()


@functools.cache
def hf_logits(positions: str, root: str) -> torch.Tensor:
    with torch.no_grad():
        return hf(positions, root)(IDS).logits


@torch.no_grad()
@pytest.mark.parametrize("positions", list(POSITIONS))
def test_logits_and_greedy_tokens_equal_transformers(positions: str, root: str) -> None:
    ours = GPT.from_pretrained(hf_dir(positions, root))
    assert (ours.config.rope, ours.config.nope) == (positions == "rope", positions == "nope")
    assert (hf(positions, root).model.rotary_emb is None) == (positions == "nope")
    torch.testing.assert_close(ours(IDS), hf_logits(positions, root), atol=1e-4, rtol=0)
    theirs = hf(positions, root).generate(IDS[:1], max_new_tokens=16, do_sample=False)
    assert torch.equal(ours.generate(IDS[:1], 16), theirs)


@torch.no_grad()
@pytest.mark.parametrize("positions", list(POSITIONS))
def test_save_pretrained_writes_the_files_names_and_transformers_reads_them(
    positions: str, root: str, tmp_path: Path
) -> None:
    """Written back under OLMo-core's names, each convolution by its own q, k and v channels (16, 16, 48), and
    read by transformers with the same logits; NoPE stays NoPE."""
    GPT.from_pretrained(hf_dir(positions, root)).save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        convs = [f.get_slice(f"model.layers.0.linear_attn.{p}_conv1d.weight").get_shape() for p in "qkv"]
    assert convs == [[16, 1, 4], [16, 1, 4], [48, 1, 4]]
    assert {"model.layers.0.attention_layer_norm.weight", "model.layers.1.post_feedforward_layernorm.weight"} <= names
    raw = json.loads((tmp_path / "config.json").read_text())
    assert (
        raw["model_type"] == "olmo_hybrid"
        and raw["rope_parameters"]["rope_theta"] == POSITIONS[positions]["rope_theta"]
    )
    back = OlmoHybridForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(IDS).logits, hf_logits(positions, root), atol=1e-5, rtol=0)


@torch.no_grad()
def test_a_folder_under_transformers_own_names_reads_the_same(root: str, tmp_path: Path) -> None:
    """Released folders may hold transformers' own names (input_layernorm, post_attention_layernorm, one conv1d of
    q, k and v), which transformers reads as it reads OLMo-core's: so does attnlab, with the same logits."""
    tensors = load_file(str(hf_dir("rope", root) / "model.safetensors"))
    renamed = {}
    for key, tensor in tensors.items():
        key = key.replace(".attention_layer_norm.", ".input_layernorm.")
        renamed[key.replace(".feedforward_layer_norm.", ".post_attention_layernorm.")] = tensor
    for i in (0, 2, 3):  # the delta layers: q's, k's and v's filters as one tensor
        at = f"model.layers.{i}.linear_attn."
        renamed[at + "conv1d.weight"] = torch.cat([renamed.pop(f"{at}{p}_conv1d.weight") for p in "qkv"])
    (tmp_path / "config.json").write_text((hf_dir("rope", root) / "config.json").read_text())
    save_file(renamed, str(tmp_path / "model.safetensors"))
    assert "model.layers.0.input_layernorm.weight" in renamed
    torch.testing.assert_close(GPT.from_pretrained(tmp_path)(IDS), hf_logits("rope", root), atol=1e-4, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize(
    "changes",
    [
        {"delta_negative_eigenvalues": False},  # beta in [0, 1] instead of [0, 2]
        {"delta_norm_placement": None},  # the delta layers post-norm as the softmax ones, not pre-norm
        {"delta_norm_eps": None},  # the gated output norm's FLA epsilon 1e-5 replaced by rms_norm_eps
        {"conv_kernel": None},  # no convolution of q, k and v
    ],
    ids=lambda changes: next(iter(changes)),
)
def test_removing_a_feature_moves_the_logits(changes: dict[str, object], root: str) -> None:
    loaded = GPT.from_pretrained(hf_dir("rope", root))
    bare = GPT(loaded.config.with_(**changes)).eval()
    missing, unexpected = bare.load_state_dict(loaded.state_dict(), strict=False)
    assert all(".conv." in k for k in [*missing, *unexpected]), (missing, unexpected)
    assert float((bare(IDS) - hf_logits("rope", root)).abs().max()) > 1e-3


@torch.no_grad()
def test_rope_on_a_nope_model_moves_the_logits(root: str) -> None:
    loaded = GPT.from_pretrained(hf_dir("nope", root))
    turned = GPT(loaded.config.with_(nope=False, rope=True)).eval()
    turned.load_state_dict(loaded.state_dict())
    assert float((turned(IDS) - hf_logits("nope", root)).abs().max()) > 1e-3


def test_betas_past_one_only_with_negative_eigenvalues() -> None:
    """The delta rule refuses a beta past 1 unless it was asked for negative eigenvalues, and past 2 always."""
    q = k = torch.nn.functional.normalize(torch.randn(1, 1, 3, 4), dim=-1)
    v, g = torch.randn(1, 1, 3, 4), torch.full((1, 1, 3), -0.1)
    beta = torch.full((1, 1, 3), 1.5)
    with pytest.raises(ValueError, match=r"beta must be a share in \[0, 1\], such as sigmoid\(x\); got 1\.5"):
        gated_delta_rule(q, k, v, g, beta)
    out, _ = gated_delta_rule(q, k, v, g, beta, negative_eigenvalues=True)
    slow, _ = gated_delta_rule(q, k, v, g, beta, negative_eigenvalues=True, form="recurrent")
    torch.testing.assert_close(out, slow)
    with pytest.raises(ValueError, match=r"beta must be in \[0, 2\], such as 2 \* sigmoid\(x\); got 2\.5"):
        gated_delta_rule(q, k, v, g, beta + 1, negative_eigenvalues=True)


def test_a_config_it_cannot_read_is_refused_before_the_weights(root: str, tmp_path: Path) -> None:
    raw = json.loads((hf_dir("rope", root) / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(b"not weights")
    for edit, said in (
        ({"layer_types": ["mamba", *raw["layer_types"][1:]]}, r"\['mamba'\] not read by attnlab"),
        ({"quantization_config": {"quant_method": "fp8"}}, "is quantized"),
        ({"attention_bias": True}, "attention_bias=True is not supported"),
    ):
        (tmp_path / "config.json").write_text(json.dumps({**raw, **edit}))
        with pytest.raises(ValueError, match=said):
            GPT.from_pretrained(tmp_path)
