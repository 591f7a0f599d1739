"""Today's decoders: Llama 3, Mistral, Qwen2 and Qwen3 read from Hugging Face directories, and the book's own
Llama 3 and Qwen3, exact against their references on random weights from small configs where every feature acts.

Each config makes its family's features matter: Llama 3's frequency scaling with an original length below the
prompt, a window shorter than the prompt (Mistral; Qwen2's sliding layers), QK-norm weights that are not ones
(Qwen3, whose heads are wider than emb_dim / n_heads), and norms that are not ones everywhere. A test removes
each feature and watches the logits move by more than 1e-3, so the parity is not parity by default.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from attnlab import Recorder
from attnlab.cache import CACHES, ModelCache
from attnlab.functional.registry import BACKENDS
from attnlab.linear.products import LAYOUTS
from attnlab.models import GPT

VOCAB = 96
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=80,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
)
SCALING = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
FAMILIES: dict[str, tuple[type[PreTrainedModel], Callable[[], object]]] = {
    "llama": (
        LlamaForCausalLM,
        lambda: LlamaConfig(
            **COMMON, rope_theta=500000.0, rope_scaling={**SCALING, "original_max_position_embeddings": 16}
        ),
    ),
    "mistral": (MistralForCausalLM, lambda: MistralConfig(**COMMON, sliding_window=6)),
    "qwen2": (
        Qwen2ForCausalLM,
        lambda: Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=6, max_window_layers=1),
    ),
    "qwen3": (
        Qwen3ForCausalLM,
        lambda: Qwen3Config(**{**COMMON, "tie_word_embeddings": True}, head_dim=24, rope_theta=1e6),
    ),
    "gemma3_text": (  # local and global layers alternate here (5 : 1 in the real ones), global ones scaled
        Gemma3ForCausalLM,
        lambda: Gemma3TextConfig(
            **{**COMMON, "num_hidden_layers": 4, "tie_word_embeddings": True},
            head_dim=16,
            sliding_window=6,
            sliding_window_pattern=2,
            query_pre_attn_scalar=24,
            rope_scaling={"rope_type": "linear", "factor": 4.0},
            final_logit_softcapping=3.0,
        ),
    ),
    "qwen3_moe": (  # 2 of 6 experts per token, not renormalized; layer 1 dense
        Qwen3MoeForCausalLM,
        lambda: Qwen3MoeConfig(
            **COMMON,
            head_dim=24,
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            mlp_only_layers=[1],
            norm_topk_prob=False,
            rope_theta=1e6,
        ),
    ),
    "gpt_oss": (  # banded and full layers alternate; 2 of 6 experts; learned sinks; YaRN
        GptOssForCausalLM,
        lambda: GptOssConfig(
            **{**COMMON, "intermediate_size": 32, "num_hidden_layers": 4},
            head_dim=16,
            num_local_experts=6,
            num_experts_per_tok=2,
            sliding_window=6,
            rope_theta=150000.0,
            rope_scaling={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
            | {"original_max_position_embeddings": 16},
        ),
    ),
    "deepseek_v3": (  # latent attention with a query latent, YaRN with its mscales; 2 of 8 experts in 1 of 2
        DeepseekV3ForCausalLM,  # groups, a shared expert, a dense first layer
        lambda: DeepseekV3Config(
            **{**COMMON, "intermediate_size": 32, "num_key_value_heads": 4},
            q_lora_rank=24,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=4,
            v_head_dim=8,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            n_shared_experts=1,
            moe_intermediate_size=16,
            first_k_dense_replace=1,
            rope_scaling={"rope_type": "yarn", "factor": 8.0, "mscale": 0.707, "mscale_all_dim": 1.0}
            | {"original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1},
        ),
    ),
}
IDS = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(3))  # longer than every window


@functools.cache
def hf_dir(family: str, root: str) -> Path:
    """A Hugging Face directory of ``family`` with random weights, its norms and biases moved off their defaults."""
    cls, make_config = FAMILIES[family]
    torch.manual_seed(0)
    model = cls(make_config()).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1 or (p.dim() == 2 and p.shape[0] == 6):  # norms (ones), biases and sinks (zeros)
                p.add_(torch.randn_like(p) * 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek's router correction (zeros)
                b.add_(torch.randn_like(b) * 0.3)
    where = Path(root) / family
    model.save_pretrained(where)
    return where


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("families"))


@functools.cache
def hf(family: str, root: str) -> PreTrainedModel:
    return FAMILIES[family][0].from_pretrained(hf_dir(family, root)).eval()


@functools.cache
def hf_logits(family: str, root: str) -> torch.Tensor:
    with torch.no_grad():
        return hf(family, root)(IDS).logits


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_hugging_faces_on_every_backend(family: str, root: str) -> None:
    reference = hf_logits(family, root)
    for backend in BACKENDS:
        ours = GPT.from_pretrained(hf_dir(family, root), backend=backend)
        if ours.config.sinks and backend in ("sdpa", "flex"):  # a sink is read off each row's log-sum-exp
            with pytest.raises(ValueError, match=f"which the {backend} backend does not return"):
                ours(IDS)
            continue
        assert ours.config.family == family
        err = float((ours(IDS) - reference).abs().max())
        assert err < 1e-4, (family, backend, err)


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_equal_hugging_faces_generate(family: str, root: str) -> None:
    prompt = IDS[:1]  # an attention mask given, or transformers masks the prompt's token 0 as padding
    theirs = hf(family, root).generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16, do_sample=False, eos_token_id=None
    )
    ours = GPT.from_pretrained(hf_dir(family, root)).generate(prompt, 16)
    assert ours.tolist() == theirs.tolist()


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_save_pretrained_writes_what_the_same_hugging_face_class_loads(family: str, root: str, tmp_path: Path) -> None:
    ours = GPT.from_pretrained(hf_dir(family, root))
    ours.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == family and written["architectures"] == [type(hf(family, root)).__name__]
    again = FAMILIES[family][0].from_pretrained(tmp_path).eval()
    assert float((again(IDS).logits - hf_logits(family, root)).abs().max()) < 1e-5
    assert float((GPT.from_pretrained(tmp_path)(IDS) - ours(IDS)).abs().max()) == 0.0


def _without(family: str, root: str, **changes: object) -> torch.Tensor:
    """Logits of the family's model with one feature taken out (its weights otherwise the same)."""
    loaded = GPT.from_pretrained(hf_dir(family, root))
    bare = GPT(loaded.config.with_(**changes)).eval()
    missing, unexpected = bare.load_state_dict(loaded.state_dict(), strict=False)
    taken = (".q_norm.", ".k_norm.", ".post_norm", ".sinks", ".shared.")
    if changes.get("mlp") == "swiglu":  # gpt-oss's experts without their clamp are Qwen's, biases gone too
        taken = (*taken, ".bias")
    assert all(any(n in k for n in taken) for k in [*missing, *unexpected])
    return bare(IDS)


@torch.no_grad()
@pytest.mark.parametrize(
    ("family", "changes"),
    [
        ("llama", {"rope_scaling": None}),  # Llama 3's frequency scaling
        ("mistral", {"window": None}),  # the window
        ("qwen2", {"layer_types": None, "window": None}),  # the sliding layers of the pattern
        ("qwen2", {"layer_types": ("sliding",) * 3}),  # ... and the full first layer
        ("qwen3", {"qk_norm": False}),  # QK-norm
        ("qwen3", {"rope_base": 10000.0}),  # the family's RoPE base
        ("gemma3_text", {"norm_placement": "pre"}),  # the sandwich's post norms
        ("gemma3_text", {"emb_scale": None}),  # embeddings times sqrt(hidden_size)
        ("gemma3_text", {"attn_scale": None}),  # query_pre_attn_scalar's softmax scale
        ("gemma3_text", {"rope_local_base": None}),  # the local layers' own RoPE
        ("gemma3_text", {"rope_scaling": None}),  # the global layers' linear scaling
        ("gemma3_text", {"final_softcap": None}),  # the softcapped logits
        ("gemma3_text", {"mlp": "swiglu"}),  # GeGLU
        ("qwen3_moe", {"norm_topk_prob": True}),  # the router's weights as they are
        ("qwen3_moe", {"num_experts_per_tok": 1}),  # two experts per token
        ("gpt_oss", {"sinks": False}),  # the learned sinks
        ("gpt_oss", {"layer_types": None, "window": None}),  # the bands
        ("gpt_oss", {"rope_scaling": None}),  # YaRN
        ("gpt_oss", {"mlp": "swiglu"}),  # the clamped SwiGLU
        ("deepseek_v3", {"rope_interleave": False}),  # RoPE on interleaved pairs
        ("deepseek_v3", {"attn_scale": None}),  # YaRN's mscale on the softmax scale
        ("deepseek_v3", {"routed_scaling_factor": 1.0}),  # the routed experts' factor
        ("deepseek_v3", {"topk_group": 2}),  # the group-limited choice
        ("deepseek_v3", {"n_shared_experts": 0}),  # the shared expert
    ],
)
def test_removing_a_feature_moves_the_logits(family: str, changes: dict[str, object], root: str) -> None:
    """Each feature the parity relies on acts in these configs: without it the logits move by more than 1e-3."""
    assert float((_without(family, root, **changes) - hf_logits(family, root)).abs().max()) > 1e-3


@pytest.mark.slow  # every cache on every family, mixtures of experts among them: two minutes on 2 cores
@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_every_cache_that_applies_gives_the_uncached_tokens(family: str, root: str) -> None:
    """Lossless caches always; the lossy ones sized to hold all 31 positions (their loss is the cache lab's to
    measure). A sliding layer keeps its window's ring whichever cache is named but 'paged' and 'prefix' (every key in
    blocks, the window masking the rest), which then applies to the full layers (Qwen2's first); a cache that would
    apply to no layer (Mistral's every layer slides) is refused. MLA's latents are kept plain, coded, or in blocks."""
    model = GPT.from_pretrained(hf_dir(family, root))
    prompt = IDS[:1]
    uncached = model.generate(prompt, 12, use_cache=False)
    sized = {
        "h2o": functools.partial(CACHES["h2o"], budget=64),
        "snapkv": functools.partial(CACHES["snapkv"], budget=64),
    }
    sliding = model.config.window is not None
    every_layer_slides = sliding and model.config.layer_types is None
    for name in CACHES:
        if name not in ("plain", "paged", "prefix") and every_layer_slides:
            with pytest.raises(ValueError, match=f"the {name} cache does not keep a sliding window's ring"):
                model.generate(prompt, 12, cache=sized.get(name, name))  # type: ignore[arg-type]
            continue
        if model.config.kv_lora_rank is not None and name in ("int8", "int4"):  # a latent is coded per token
            latent = functools.partial(CACHES[name], group_size=4)  # 20 values a token: five groups of 4
            assert model.generate(prompt, 12, cache=latent).tolist() == uncached.tolist(), name
            continue
        if name not in ("plain", "paged", "prefix") and model.config.kv_lora_rank is not None:
            match = r"cache is not built for latents; use 'plain', 'int8', 'int4', 'paged' or 'prefix'"
            with pytest.raises(ValueError, match=match):
                model.generate(prompt, 12, cache=sized.get(name, name))  # type: ignore[arg-type]
            continue
        assert model.generate(prompt, 12, cache=sized.get(name, name)).tolist() == uncached.tolist(), name  # type: ignore[arg-type]
    many = model.generate_many([IDS[0].tolist(), IDS[1, :7].tolist()], 6, slots=1)  # rows of every kind, paged
    assert many[0] == uncached[0, 20 : 18 + 8].tolist()[:6]


@torch.no_grad()
def test_a_sliding_layer_keeps_only_its_window_whatever_cache_is_named(root: str) -> None:
    model = GPT.from_pretrained(hf_dir("qwen2", root))  # layer 0 full, layers 1 and 2 slide over 6
    caches = model.make_caches(batch_size=1, max_len=40, cache="int8")
    kinds = [type(layer).__name__ for layer in caches]
    assert kinds == ["QuantizedKVCache", "SlidingWindowCache", "SlidingWindowCache"]
    assert [getattr(layer, "window", None) for layer in caches][1:] == [6, 6]


@pytest.mark.slow  # two proposers on three families
@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "qwen3", "deepseek_v3"])  # the last crops its latent cache
def test_speculative_decoding_gives_greedy_tokens(family: str, root: str) -> None:
    model = GPT.from_pretrained(hf_dir(family, root))
    prompt = torch.cat([IDS[:1, :10], IDS[:1, :10]], dim=1)  # repeats, so that lookup finds guesses
    greedy = model.generate(prompt, 16)
    assert model.generate(prompt, 16, lookup=3).tolist() == greedy.tolist()
    assert model.generate(prompt, 16, draft=model, draft_tokens=3).tolist() == greedy.tolist()


@torch.no_grad()
def test_speculative_decoding_on_a_sliding_model_gives_greedy_tokens(root: str) -> None:
    """Mistral's window of 6 on a 20-token prompt: the ring wraps, and a refused guess's slot is taken back."""
    model = GPT.from_pretrained(hf_dir("mistral", root))
    prompt = torch.cat([IDS[:1, :10], IDS[:1, :10]], dim=1)
    greedy = model.generate(prompt, 16)
    assert model.generate(prompt, 16, lookup=3).tolist() == greedy.tolist()
    assert model.generate(prompt, 16, draft=model, draft_tokens=3).tolist() == greedy.tolist()


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_layouts_and_int8_weights_keep_the_logits(family: str, root: str) -> None:
    model = GPT.from_pretrained(hf_dir(family, root))
    reference = model(IDS)
    for layout in LAYOUTS[1:]:  # columns, and oneDNN's product where this build has it
        model.set_layout(layout)
        assert float((model(IDS) - reference).abs().max()) < 1e-5, layout
    model.set_layout("rows")
    kernels = model.quantize("int8", kernel="dequantize")
    assert any(".ff.fc1" in name for name in kernels)  # the gated MLP's (and experts') linears are quantized too
    moved = model(IDS) - reference
    assert 0 < float(moved.abs().max()) < 0.05 * float(reference.abs().max())


@torch.no_grad()
def test_recorded_weights_show_each_layers_own_window(root: str) -> None:
    """Qwen2's pattern: layer 0 sees every earlier key, layers 1 and 2 the last 6 only."""
    model = GPT.from_pretrained(hf_dir("qwen2", root))
    weights = model.attention_weights(IDS[:1])  # (L, B, H, T, T)
    assert weights.shape == (3, 1, 4, 20, 20)
    seen = (weights[:, 0] > 0).sum(dim=-1)  # (L, H, T): keys each query sees
    assert seen[0, :, -1].tolist() == [20] * 4
    assert seen[1:, :, -1].flatten().tolist() == [6] * 8
    with Recorder(names=["attn_weights"]) as rec:  # what attention_weights reads, by each layer's dotted name
        model(IDS[:1])
    assert torch.equal(rec.get("attn_weights", module="trf_blocks.1.att"), weights[1])


@pytest.mark.slow  # two models trained for 80 steps
def test_a_small_qwen3_style_model_trains_like_the_gpt() -> None:
    """The same bytes, steps and budget: both fall far below a uniform guess (ln 256 = 5.55), and the Qwen3-style
    block (RMSNorm, SwiGLU, GQA, QK-norm, RoPE) ends no worse than GPT-2's by more than a quarter nat."""
    from attnlab.models import GPTConfig
    from attnlab.models.tasks import TextTask, stdlib_text
    from attnlab.models.train import TrainConfig, train

    task = TextTask(stdlib_text()[:20000], seq_len=32)
    budget = TrainConfig(steps=80, batch_size=16, eval_every=40, warmup=10)
    gpt = GPTConfig(vocab_size=256, context_length=32, emb_dim=32, n_heads=4, n_layers=2, drop_rate=0.0)
    qwen = GPTConfig.preset(
        "qwen3-0.6b", vocab_size=256, context_length=32, emb_dim=32, n_heads=4, n_kv_heads=2, head_dim=16
    ).with_(n_layers=2, hidden_dim=64, tie_weights=False)
    final = {}
    for name, config in (("gpt", gpt), ("qwen3", qwen)):
        torch.manual_seed(0)
        final[name] = train(GPT(config), task, budget).eval_loss[-1]
    assert final["gpt"] < 3.5 and final["qwen3"] < 3.5, final
    assert final["qwen3"] < final["gpt"] + 0.25, final


BOOK_LLAMA = dict(
    vocab_size=VOCAB,
    context_length=64,
    emb_dim=64,
    n_heads=4,
    n_layers=2,
    hidden_dim=96,
    n_kv_groups=2,
    rope_base=500000.0,
    dtype=torch.float32,
    rope_freq=dict(factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context_length=16),
)
BOOK_QWEN = dict(
    vocab_size=VOCAB,
    context_length=64,
    emb_dim=64,
    n_heads=4,
    n_layers=2,
    hidden_dim=96,
    n_kv_groups=2,
    rope_base=1e6,
    dtype=torch.float32,
    head_dim=24,
    qk_norm=True,
)


@torch.no_grad()
@pytest.mark.parametrize("which", ["llama3", "qwen3"])
def test_the_books_llama3_and_qwen3_equal_ours_with_and_without_their_kv_cache(which: str, tmp_path: Path) -> None:
    if which == "llama3":
        from llms_from_scratch.kv_cache.llama3 import KVCache
        from llms_from_scratch.kv_cache.llama3 import Llama3Model as Cached
        from llms_from_scratch.llama3 import Llama3Model as Plain

        cfg = BOOK_LLAMA
    else:
        from llms_from_scratch.kv_cache.qwen3 import KVCache
        from llms_from_scratch.kv_cache.qwen3 import Qwen3Model as Cached
        from llms_from_scratch.qwen3 import Qwen3Model as Plain

        cfg = BOOK_QWEN
    torch.manual_seed(0)
    book = Plain(cfg).eval()
    for p in book.parameters():
        if p.dim() == 1:
            p.add_(torch.randn_like(p) * 0.5)
    torch.save(book.state_dict(), tmp_path / "book.pth")
    ours = GPT.from_book(tmp_path / "book.pth", cfg)
    assert float((ours(IDS) - book(IDS)).abs().max()) < 1e-4
    cached = Cached(cfg).eval()
    cached.load_state_dict(book.state_dict())
    cache, tokens = KVCache(n_layers=cfg["n_layers"]), []
    cached.reset_kv_cache()
    logits = cached(IDS[:1], cache=cache)
    for _ in range(16):  # the book's own cached greedy loop
        token = logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(int(token))
        logits = cached(token, cache=cache)
    assert ours.generate(IDS[:1], 16)[0, 20:].tolist() == tokens
    without = GPT(ours.config.with_(rope_scaling=None) if which == "llama3" else ours.config.with_(qk_norm=False))
    without.load_state_dict(ours.state_dict(), strict=False)
    assert float((without.eval()(IDS) - book(IDS)).abs().max()) > 1e-3  # the feature acts


def test_the_books_config_dict_is_checked_by_name() -> None:
    with pytest.raises(ValueError, match=r"the book's config dict lacks \['hidden_dim', 'n_kv_groups', 'rope_base'\]"):
        GPT.from_book({}, {k: v for k, v in BOOK_LLAMA.items() if k not in ("hidden_dim", "n_kv_groups", "rope_base")})
    with pytest.raises(ValueError, match=r"neither rope_freq \(Llama 3\) nor qk_norm \(Qwen3\)"):
        GPT.from_book({}, {k: v for k, v in BOOK_QWEN.items() if k != "qk_norm"})


@pytest.fixture(scope="module")
def qwen2_with_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2 directory as Hugging Face saves one, with a byte-level BPE tokenizer.json trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    where = tmp_path_factory.mktemp("qwen2-tok")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(["the cat sat on the mat. the dog sat on the log."] * 20, trainer)
    torch.manual_seed(0)
    config = FAMILIES["qwen2"][1]()
    config.vocab_size = bpe.get_vocab_size()  # type: ignore[attr-defined]
    Qwen2ForCausalLM(config).save_pretrained(where)  # type: ignore[arg-type]
    bpe.save(str(where / "tokenizer.json"))
    return where


def test_the_cli_generates_and_explains_a_hugging_face_decoder(
    qwen2_with_tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from attnlab import cli
    from attnlab.models.tokenizer import load_tokenizer

    where = str(qwen2_with_tokenizer)
    assert cli.main(["generate", "--model", where, "the cat sat", "--max-new-tokens", "5"]) == 0
    tokenizer = load_tokenizer(where)
    ids = torch.tensor([tokenizer.encode("the cat sat")])
    expected = tokenizer.decode(GPT.from_pretrained(where).generate(ids, 5)[0].tolist())
    assert expected in capsys.readouterr().out
    assert cli.main(["explain", "--model", where, "the cat sat on the mat"]) == 0
    out = capsys.readouterr().out
    assert "Layer 0 · full attention" in out and "Layer 2 · sliding window of 6" in out
    assert "✓ each query sees at most its window's 6 keys" in out
    assert cli.main(["explain", "--model", where, "the cat sat on the mat", "--lang", "zh"]) == 0
    assert "6 个 Token 的滑动窗口" in capsys.readouterr().out


LOAD_AND_MEASURE = """
import sys
import torch
from attnlab.models import GPT, GPTConfig
from attnlab.models.checkpoints import read_checkpoint

with torch.device("meta"):  # the meta device's first use imports its kernels (tens of MB of code, once)
    GPT(GPTConfig(vocab_size=8, context_length=8, emb_dim=8, n_heads=2, n_layers=1))

def anon():  # resident bytes not backed by a file: what a copy of the weights would take
    status = open("/proc/self/status").read()
    return int(status.split("RssAnon:")[1].split()[0]) * 1024

before = anon()
checkpoint = read_checkpoint(sys.argv[1])
read = anon() - before
model = GPT.from_pretrained(sys.argv[1])
print(read, anon() - before)
"""


@pytest.mark.slow  # seconds long: stage 1 keeps its 4-minute budget
def test_safetensors_are_read_lazily_so_loading_holds_one_copy(tmp_path: Path) -> None:
    """A 29 MB Llama: reading its checkpoint allocates almost nothing (the file is memory-mapped, and q, k and v
    are copied into the fused rows only when the model is filled); the loaded model holds one copy."""
    import subprocess
    import sys

    torch.manual_seed(0)
    config = LlamaConfig(**{**COMMON, "hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 16})
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    size = (tmp_path / "model.safetensors").stat().st_size
    out = subprocess.run(
        [sys.executable, "-c", LOAD_AND_MEASURE, str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout
    read, loaded = map(int, out.split())
    assert read < 0.05 * size, (read, size)
    assert loaded < 1.3 * size, (loaded, size)


@pytest.mark.slow  # slow by nature (a process, a compile or a whole view): stage 1 keeps its budget
@torch.no_grad()
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_a_compiled_decode_step_is_one_graph_over_full_and_sliding_layers(family: str, root: str) -> None:
    """Qwen2's pattern puts a static cache and two window rings in one graph; Qwen3's QK-norm is in it too."""
    from torch._dynamo.testing import CompileCounter

    model = GPT.from_pretrained(hf_dir(family, root))
    counter = CompileCounter()
    torch._dynamo.reset()
    compiled = model.generate(IDS[:1], 12, compile=counter)
    assert compiled.tolist() == model.generate(IDS[:1], 12).tolist()
    assert counter.frame_count == 1


@pytest.mark.slow  # a real inductor compile: tens of seconds on 2 cores
@torch.no_grad()
def test_an_inductor_compiled_qwen3_decodes_hugging_faces_tokens(root: str) -> None:
    model = GPT.from_pretrained(hf_dir("qwen3", root))
    prompt = IDS[:1]
    theirs = hf("qwen3", root).generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False, eos_token_id=None
    )
    assert model.generate(prompt, 12, compile=True).tolist() == theirs.tolist()


def test_partial_rotation_turns_the_first_dimensions_and_passes_the_rest() -> None:
    """rotary_dim=R: the first R dimensions of each head turn as a head of R would, the rest pass through, and
    q . k still depends on m - n alone."""
    from attnlab.functional.rotary import RotaryEmbedding

    x = torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(5)
    partial, whole = RotaryEmbedding(head_dim=8, rotary_dim=4), RotaryEmbedding(head_dim=4)
    turned = partial.rotate(x, positions)
    assert torch.equal(turned[..., 4:], x[..., 4:])
    torch.testing.assert_close(turned[..., :4], whole.rotate(x[..., :4].contiguous(), positions))
    assert not torch.allclose(turned[..., :4], x[..., :4])
    moved = partial.rotate(x, positions + 7)  # every position moved by 7: each m - n the same
    dot = lambda t: (t[..., 4, :] * t[..., 1, :]).sum(-1)  # (B, H): query 4 against key 1
    torch.testing.assert_close(dot(moved), dot(turned))
    with pytest.raises(ValueError, match=r"rotary_dim must be an even int in \[2, head_dim=8\], got 5"):
        RotaryEmbedding(head_dim=8, rotary_dim=5)


@torch.no_grad()
def test_post_norm_normalizes_each_sublayers_output_before_it_is_added() -> None:
    """OLMo 2's placement, x + norm1(att(x)) then x + norm2(ff(x)), written out beside the block."""
    from attnlab.models import GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=32, context_length=16, emb_dim=16, n_heads=2, n_layers=1, drop_rate=0.0, rope=True,
        norm="rmsnorm", mlp="swiglu", bias=False,
    )  # fmt: skip
    post, pre = GPT(config.with_(norm_placement="post")).eval(), GPT(config).eval()
    pre.load_state_dict(post.state_dict())
    block, ids = post.blocks[0], torch.randint(0, 32, (1, 6))
    x = post.tok_emb(ids)
    x = x + block.norm1(block.att(x))
    x = x + block.norm2(block.ff(x))
    torch.testing.assert_close(post(ids), post.out_head(post.final_norm(x)))
    assert float((post(ids) - pre(ids)).abs().max()) > 1e-3  # the placement acts


def test_the_decoders_config_refuses_what_does_not_fit_by_name() -> None:
    from attnlab.models import GPTConfig

    base = dict(vocab_size=32, context_length=16, emb_dim=16, n_heads=2, n_layers=2)
    with pytest.raises(ValueError, match=r"norm must be one of \['layernorm', 'rmsnorm'\], got 'batchnorm'"):
        GPTConfig(**base, norm="batchnorm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"layer_types has 'sliding' layers but window is None"):
        GPTConfig(**base, layer_types=("full", "sliding"))
    with pytest.raises(ValueError, match=r"layer_types must be a tuple of n_layers=2 entries"):
        GPTConfig(**base, window=4, layer_types=("sliding",))
    with pytest.raises(ValueError, match=r"rope_scaling and rotary_dim shape RoPE: set rope=True"):
        GPTConfig(**base, rotary_dim=4)
    with pytest.raises(ValueError, match=r"rope_type .longrope. is not supported"):
        from attnlab.models.families.llama import rope

        rope({"rope_parameters": {"rope_type": "longrope", "factor": 4.0}}, Path("x"))


@torch.no_grad()
def test_gpt_oss_weights_give_their_sinks_what_hugging_face_gives_them(root: str) -> None:
    """attention_weights equal transformers' output_attentions (eager), rows short of 1 by the sinks' share."""
    model = GPT.from_pretrained(hf_dir("gpt_oss", root))
    ours = model.attention_weights(IDS[:1])  # (L, 1, H, T, T)
    theirs = GptOssForCausalLM.from_pretrained(hf_dir("gpt_oss", root), attn_implementation="eager").eval()
    attentions = torch.stack(theirs(IDS[:1], output_attentions=True).attentions)  # (L, 1, H, T, T)
    assert float((ours - attentions).abs().max()) < 1e-5
    assert float(ours.sum(-1).max()) < 0.999  # every row gave some of its attention to its sink


def test_learned_sinks_equal_the_appended_column_with_gradients_on_eager_and_flash() -> None:
    """The sink as gpt-oss writes it (a column appended to the scores, softmaxed, dropped), in float64."""
    from attnlab.functional.attention import attention

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 9, 8, dtype=torch.float64, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 2, 9, 8, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(2))
    sinks = torch.randn(4, dtype=torch.float64, generator=g, requires_grad=True)

    def appended() -> torch.Tensor:
        scores = q @ k.repeat_interleave(2, 1).mT / 8**0.5  # (B, H, T, T)
        scores = scores.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
        scores = torch.cat([scores, sinks[None, :, None, None].expand(2, 4, 9, 1)], dim=-1)
        return scores.softmax(-1)[..., :-1] @ v.repeat_interleave(2, 1)

    upstream = torch.randn(2, 4, 9, 8, dtype=torch.float64, generator=g)
    expected = torch.autograd.grad(appended(), [q, k, v, sinks], upstream)
    for backend in ("eager", "flash"):
        out = attention(q, k, v, is_causal=True, sinks=sinks, backend=backend)
        torch.testing.assert_close(out, appended())
        for got, want in zip(torch.autograd.grad(out, [q, k, v, sinks], upstream), expected, strict=True):
            torch.testing.assert_close(got, want)
    plain = attention(q, k, v, is_causal=True)
    assert float((plain - appended()).detach().abs().max()) > 1e-3  # the sinks act
    with pytest.raises(ValueError, match=r"which the sdpa backend does not return: use backend='flash' or 'eager'"):
        attention(q, k, v, is_causal=True, sinks=sinks, backend="sdpa")


def test_the_mixture_of_experts_runs_each_expert_on_its_tokens_as_the_readable_form_does() -> None:
    from attnlab.models.parts import MoEFeedForward

    torch.manual_seed(0)
    for clamped in (False, True):
        moe = MoEFeedForward(emb_dim=16, hidden_dim=24, num_experts=6, num_experts_per_tok=2, clamped=clamped)
        x = torch.randn(2, 7, 16, requires_grad=True)
        routed, every = moe(x), moe.every_expert(x)
        torch.testing.assert_close(routed, every)
        upstream = torch.ones_like(routed)
        params = [x, moe.gate.weight, moe.fc1[0].weight, moe.fc3[5].weight]
        got, want = torch.autograd.grad(routed, params, upstream), torch.autograd.grad(every, params, upstream)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
        chosen, _ = moe.route(x)
        assert chosen.unique().numel() > 2  # the tokens go to different experts


@torch.no_grad()
def test_latent_attention_decodes_in_the_absorbed_form_what_the_expanded_form_computes() -> None:
    """MLA: W_UK folded into the queries and W_UV into the output, over the latents alone, within 1e-5."""
    from attnlab.nn.latent import LatentAttention

    torch.manual_seed(0)
    att = LatentAttention(
        d_in=32, num_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, q_lora_rank=12
    )
    x = torch.randn(2, 10, 32)
    q_nope, q_pe, latents = att.project(x, torch.arange(10))
    visibility = att.visibility_for(x)
    expanded = att.expanded(q_nope, q_pe, latents, visibility=visibility)
    assert float((att.absorbed(q_nope, q_pe, latents, visibility=visibility) - expanded).abs().max()) < 1e-5
    cache = ModelCache.build([att.layer_state()], rows=2, capacity=12)[0]
    steps = [att(x[:, :6], cache=cache)] + [att(x[:, t : t + 1], cache=cache) for t in range(6, 10)]
    assert float((torch.cat(steps, dim=1) - expanded).abs().max()) < 1e-5  # the absorbed decode, step by step
    assert float((torch.cat(steps, dim=1) - att(x)).abs().max()) < 1e-5


@torch.no_grad()
def test_a_latent_decode_step_runs_pytorchs_fused_kernel_not_its_math_path() -> None:
    """The absorbed form hands the whole latents [c, k_pe] over as its values, so keys and values have one width:
    PyTorch's fused CPU kernel takes the step. Values of kv_lora_rank alone (c) send it to SDPA's math path, which
    copies the one latent head out to every query head at each step (a 16k-token zoo decode: 4.7x slower). And
    the cache hands over the latents it holds, not its whole capacity, which a step would otherwise read."""
    from attnlab.nn.latent import LatentAttention

    torch.manual_seed(0)
    att = LatentAttention(d_in=32, num_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    x = torch.randn(1, 9, 32)
    cache = ModelCache.build([att.layer_state()], rows=1, capacity=4096)[0]  # far more room than it holds
    att(x[:, :8], cache=cache)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        step = att(x[:, 8:], cache=cache)
    calls = {e.key: e.count for e in prof.key_averages()}
    assert calls.get("aten::_scaled_dot_product_flash_attention_for_cpu", 0) == 1
    assert calls.get("aten::_scaled_dot_product_attention_math", 0) == 0
    fused = next(e for e in prof.events() if e.name == "aten::_scaled_dot_product_flash_attention_for_cpu")
    assert fused.input_shapes[1] == [1, 1, 9, 16 + 4]  # the 9 latents held, not the cache's 4,096 slots
    assert float((step - att(x)[:, 8:]).abs().max()) < 1e-5  # and the step is the expanded form's


def test_deepseek_v3s_latent_cache_holds_576_values_per_token_and_layer() -> None:
    """The paper's count: kv_lora_rank 512 + qk_rope_head_dim 64, against 128 heads x (128 + 128) = 32,768."""
    from attnlab.cache import stored_bytes
    from attnlab.nn.latent import LatentAttention

    with torch.device("meta"):
        att = LatentAttention(
            d_in=7168, num_heads=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
            q_lora_rank=1536,
        )  # fmt: skip
        one, ten = (ModelCache.build([att.layer_state()], rows=1, capacity=n)[0] for n in (1, 10))
    per_token = (stored_bytes(ten) - stored_bytes(one)) // 9 // 4  # float32 values
    assert per_token == 576
    assert 128 * (128 + 128) // per_token == 56  # 57x fewer as the paper rounds it: 32,768 / 576 = 56.9


def test_a_quantized_latent_cache_codes_each_latent_once_in_the_formulas_bytes() -> None:
    """int8 on DeepSeek-V3's latent: 576 codes and 18 groups' float16 scale and zero a token (648 bytes, against
    1,152 in bfloat16); int4 half the codes. A group size that does not divide the latent is refused by name."""
    from attnlab.cache import stored_bytes
    from attnlab.nn.latent import LatentAttention

    with torch.device("meta"):
        att = LatentAttention(
            d_in=7168, num_heads=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
            q_lora_rank=1536,
        )  # fmt: skip
        for name, codes in (("int8", 576), ("int4", 288)):
            one, ten = (ModelCache.build([att.layer_state()], name, rows=1, capacity=n)[0] for n in (1, 10))
            assert type(one).__name__ == "QuantizedLatentCache"
            assert (stored_bytes(ten) - stored_bytes(one)) // 9 == codes + 2 * 2 * 576 // 32, name
        with pytest.raises(ValueError, match=r"kv_lora_rank \+ rope_dim = 576 values .* got group_size=100"):
            ModelCache.build(
                [att.layer_state()], functools.partial(CACHES["int8"], group_size=100), rows=1, capacity=4
            )[0]
        with pytest.raises(ValueError, match=r"takes group_size only, got \['residual'\]"):
            ModelCache.build([att.layer_state()], functools.partial(CACHES["int8"], residual=8), rows=1, capacity=4)[0]
        with pytest.raises(ValueError, match=r"the h2o cache is not built for latents"):
            ModelCache.build([att.layer_state()], "h2o", rows=1, capacity=4)[0]


@torch.no_grad()
def test_a_quantized_latent_cache_reads_this_calls_latents_exact_and_the_past_coded() -> None:
    """The effect: what was written by an earlier call comes back within half a code step of its group, not
    exact (it was coded; int4's error is larger than int8's), while the current call's latents come back
    exact; the values are the keys' first kv_lora_rank columns."""
    from attnlab.cache.latent import QuantizedLatentCache

    torch.manual_seed(0)
    errors = {}
    for bits in (8, 4):
        cache = QuantizedLatentCache(batch_size=2, kv_lora_rank=12, rope_dim=4, max_len=8, bits=bits, group_size=8)
        first, second = torch.randn(2, 1, 5, 16), torch.randn(2, 1, 2, 16)
        keys, values, positions = cache.update(first, first[..., :12])
        assert torch.equal(keys, first) and positions.tolist() == [0, 1, 2, 3, 4]  # the filled slots only
        keys, values, positions = cache.update(second, second[..., :12])
        assert torch.equal(keys[:, :, 5:7], second) and torch.equal(values, keys[..., :12])
        past = first.reshape(2, 1, 5, 2, 8)  # (B, 1, T, groups, G)
        step = (past.amax(-1) - past.amin(-1)) / (2**bits - 1)  # each group's code step
        error = (keys[:, :, :5].reshape(2, 1, 5, 2, 8) - past).abs()
        assert bool((error <= step.unsqueeze(-1) / 2 + 1e-3).all()) and float(error.max()) > 0
        errors[bits] = float(error.mean())
    assert errors[4] > 4 * errors[8]


@torch.no_grad()
@pytest.mark.parametrize(("family", "kind"), [("deepseek_v3", "latent attention, 20 values a token cached (its heads' keys and values: 80)"),
                                              ("gpt_oss", "sliding window of 6")])  # fmt: skip
def test_the_model_report_names_each_layers_kind_and_checks_what_it_shows(family: str, kind: str, root: str) -> None:
    from attnlab.explain.model_report import model_report
    from attnlab.models.tokenizer import ByteTokenizer

    torch.manual_seed(0)
    model = GPT(GPT.from_pretrained(hf_dir(family, root)).config.with_(vocab_size=256)).eval()
    report = model_report(model, ByteTokenizer(), "the cat sat", name="m", figures=False)
    titles = [section.title for section in report.sections]
    assert any(title.endswith(kind) for title in titles), titles
    checks = [check for section in report.sections for check in section.checks]
    assert checks and all(check.ok for check in checks), [c for c in checks if not c.ok]
    if family == "gpt_oss":  # the rows give part of their attention to the sinks, and say how much
        assert any("the learned sinks take" in check.label for check in checks)


def test_the_ring_refuses_what_it_would_drop_silently() -> None:
    """Learned sinks and latent attention are not on the ring yet: refused by name, before any collective."""
    from attnlab.distributed import ContextParallelAttention
    from attnlab.nn import Attention
    from attnlab.nn.latent import LatentAttention

    latent = LatentAttention(d_in=16, num_heads=2, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4)
    with pytest.raises(ValueError, match=r"LatentAttention \(latent attention\) does not run on the ring yet"):
        ContextParallelAttention.from_attention(latent)
    sinks = ContextParallelAttention.from_attention(Attention(d_in=16, num_heads=2, sinks=True))
    with pytest.raises(ValueError, match=r"does not take learned sinks \(gpt-oss\) yet: its ring would drop them"):
        sinks(torch.randn(1, 4, 16))
