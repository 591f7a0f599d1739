"""attnlab inside Hugging Face models (issue 38): attn_implementation="attnlab" on every family of today's decoders,
against transformers' own attention (sdpa; eager for gpt-oss, which has no sdpa), and the weights of chosen heads
recomputed from the fused kernel's log-sum-exp, against transformers' eager weights.

The models are the small random ones of tests/test_families.py, whose windows are shorter than the prompt and
whose norms, biases and sinks are moved off their defaults, so the masks and sinks act.
"""

from __future__ import annotations

import base64
import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import DynamicCache, PreTrainedModel

import attnlab.hf
from attnlab import Recorder
from attnlab.cache import EvictingCache
from attnlab.explain.render.view import AttentionView
from attnlab.functional import mods
from attnlab.hf.caches import AttnlabLayer
from test_families import BOOK_LLAMA, BOOK_QWEN, COMMON, FAMILIES, IDS, hf_dir

OWN = {"gpt_oss": "eager"}  # transformers' own attention for each family: sdpa where it has one


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("bridge"))


def load(family: str, root: str, attn: str) -> PreTrainedModel:
    return FAMILIES[family][0].from_pretrained(hf_dir(family, root), attn_implementation=attn).eval()


PADDED = torch.tensor([[0, 0, 0, 5, 9, 17, 33, 2, 8, 41, 7, 3], [4, 11, 19, 23, 6, 1, 30, 12, 27, 15, 38, 9]])
PADDING = torch.tensor([[0, 0, 0] + [1] * 9, [1] * 12])  # the first row left-padded by 3


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_greedy_tokens_equal_transformers_own_attention(family: str, root: str) -> None:
    own = load(family, root, OWN.get(family, "sdpa"))
    ours = load(family, root, "attnlab")  # from_pretrained(..., attn_implementation="attnlab"): flash
    assert ours.config._attn_implementation == "attnlab"
    want = own(IDS).logits
    backends = ["flash", "eager"] + ([] if family == "gpt_oss" else ["sdpa"])
    for backend in backends:
        attnlab.hf.use(ours, backend=backend)
        assert (ours(IDS).logits - want).abs().max().item() < 1e-5, backend
    attnlab.hf.use(ours, backend="flash")
    padded = own(PADDED, attention_mask=PADDING).logits
    got = ours(PADDED, attention_mask=PADDING).logits
    assert (got - padded)[PADDING.bool()].abs().max().item() < 1e-5  # the padded slots' own rows are not compared
    greedy = dict(max_new_tokens=16, do_sample=False, attention_mask=PADDING)
    assert torch.equal(ours.generate(PADDED, **greedy), own.generate(PADDED, **greedy))


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_mods_act_in_the_layers_given_and_a_with_block_puts_the_model_back(family: str, root: str) -> None:
    own = load(family, root, "sdpa")
    ours = load(family, root, "attnlab")
    want = own(IDS).logits
    diagonal = mods.and_masks(mods.causal(), lambda b, h, q, kv: q == kv)  # each token sees itself alone
    with attnlab.hf.use(ours, mask_mod={1: diagonal}):
        with Recorder(heads=[(0, 0), (1, 0)]) as rec:
            moved = ours(IDS).logits
    assert (moved - want).abs().max().item() > 1e-3  # the mod acts
    eye = torch.eye(IDS.shape[1]).expand(IDS.shape[0], -1, -1)
    assert torch.allclose(rec.head(1, 0), eye, atol=1e-6)  # layer 1 sees only itself
    assert not torch.allclose(rec.head(0, 0), eye)  # layer 0 keeps the model's own mask
    assert (ours(IDS).logits - want).abs().max().item() < 1e-5  # the block ended: the model is as it was


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_chosen_heads_weights_equal_transformers_eager_weights(family: str, root: str) -> None:
    eager = load(family, root, "eager")
    out = eager(PADDED, attention_mask=PADDING, output_attentions=True)
    ours = load(family, root, "attnlab")
    chosen = [(0, 1), (2, 3), (2, 0)]
    with Recorder(heads=chosen) as rec:
        got = ours(PADDED, attention_mask=PADDING).logits
    assert (got - out.logits)[PADDING.bool()].abs().max().item() < 1e-5
    rows = PADDING.bool()[:, None, :, None]  # (B, 1, Tq, 1): a padded query's own row is not compared
    for layer, head in chosen:
        want = out.attentions[layer][:, head]  # (B, Tq, Tk)
        weights = rec.head(layer, head)
        if family == "gpt_oss":  # the rows are what the keys got, the sink's share recorded beside them
            sink = rec.get("sink_weight", module=f"model.layers.{layer}.self_attn")[:, head]  # (B, Tq)
            assert ((weights.sum(-1) + sink - 1) * rows[:, 0, :, 0]).abs().max().item() < 1e-6
            assert sink[PADDING.bool()].min().item() > 1e-3  # the sinks took a share the comparison would miss
        assert ((weights - want) * rows[:, 0]).abs().max().item() < 1e-6, (layer, head)
    # only the chosen heads were formed: every recorded weight is of chosen heads, the model ran its fused path
    steps = [s for s in rec.steps if s.name == "attn_weights"]
    assert {(s.layer, h) for s in steps for h in (s.heads or ())} == set(chosen)
    assert all(s.tensor.shape[1] == len(s.heads or ()) < 4 for s in steps)
    with pytest.raises(KeyError, match=r"layer 1, head 1 was recorded; it is not among heads="):
        rec.head(1, 1)


def test_a_recorder_with_heads_gets_nothing_from_transformers_own_attention_and_says_why(root: str) -> None:
    own = load("llama", root, "sdpa")
    with Recorder(heads=[(0, 0)]) as rec, torch.no_grad():
        own(IDS)
    with pytest.raises(KeyError, match=r"attnlab\.hf\.use\(model\)"):
        rec.head(0, 0)


def test_bad_arguments_are_refused_by_name_and_leave_the_model_as_it_was(root: str) -> None:
    model = load("gpt_oss", root, "eager")
    with pytest.raises(ValueError, match="backend"):
        attnlab.hf.use(model, backend="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"layer index: mod.*\['one'\]"):
        attnlab.hf.use(model, mask_mod={"one": mods.causal()})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="score_mod must be a function"):
        attnlab.hf.use(model, score_mod=3.0)
    with pytest.raises(TypeError, match=r"transformers PreTrainedModel or the book.s GPTModel.*got Linear"):
        attnlab.hf.use(torch.nn.Linear(2, 2))
    assert model.config._attn_implementation == "eager"
    with pytest.raises(ValueError, match=r"sinks are read off each row's log-sum-exp.*backend='flash'"):
        attnlab.hf.use(model, backend="sdpa")  # refused when asked, not at the first layer of the first forward
    assert model.config._attn_implementation == "eager"
    with pytest.raises(ValueError, match=r"\(layer, head\) pairs"):
        Recorder(heads=[(0, -1)])
    with pytest.raises(ValueError, match="chooses no head"):
        Recorder(heads=[])


@torch.no_grad()
def test_a_head_dependent_mod_reaches_each_chosen_head_under_its_own_index(root: str) -> None:
    """The chosen heads are formed alone, so a mod that reads h must see each one's own index: the same weights as
    every head formed by the eager backend, where h runs over all of them."""
    model = load("qwen3", root, "attnlab")
    tilt = lambda score, b, h, q, kv: score + 0.1 * h * (q - kv)
    hides = lambda b, h, q, kv: (kv != 2) | (h == 3)  # key 2 hidden from every head but 3
    attnlab.hf.use(model, backend="eager", mask_mod=hides, score_mod=tilt)
    with Recorder(names=["attn_weights"]) as every:
        model(IDS)
    attnlab.hf.use(model, backend="flash", mask_mod=hides, score_mod=tilt)
    with Recorder(heads=[(1, 3), (1, 0), (2, 2)]) as chosen:
        model(IDS)
    for layer, head in [(1, 3), (1, 0), (2, 2)]:
        want = every.get("attn_weights", module=f"model.layers.{layer}.self_attn")[:, head]
        assert (chosen.head(layer, head) - want).abs().max().item() < 1e-6
    assert chosen.head(1, 0)[:, 3:, 2].abs().max() == 0 and chosen.head(1, 3)[:, 3:, 2].min() > 0


# ---- attnlab's caches as transformers Cache objects ----

GREEDY = dict(max_new_tokens=24, do_sample=False)
# a full layer each (Mistral: none); llama and gemma3 (its bands on transformers' ring) in the first stage
CACHED = ["llama", "gemma3_text"] + [
    pytest.param(f, marks=pytest.mark.slow) for f in ("qwen2", "qwen3", "qwen3_moe", "gpt_oss")
]  # slow: a generate of every family twice over, 2 s each


@torch.no_grad()
@pytest.mark.parametrize("family", CACHED)
def test_the_plain_cache_gives_dynamic_caches_tokens_and_int8_keeps_them_here(family: str, root: str) -> None:
    own = load(family, root, OWN.get(family, "sdpa"))
    ours = load(family, root, "attnlab")
    want = own.generate(IDS, cache=DynamicCache(config=own.config), **GREEDY)
    made = attnlab.hf.cache("plain", ours)
    assert torch.equal(ours.generate(IDS, cache=made, **GREEDY), want)
    full = [layer for layer in made.layers if isinstance(layer, AttnlabLayer)]
    assert full and all(layer.get_seq_length() == IDS.shape[1] + GREEDY["max_new_tokens"] - 1 for layer in full)
    assert len(full) < len(made.layers) or family not in ("gemma3_text", "gpt_oss", "qwen2")  # bands keep their ring
    # int8 is lossy, yet keeps these models' greedy tokens (int4 does not always: its error is measured below)
    assert torch.equal(ours.generate(IDS, cache=attnlab.hf.cache("int8", ours), **GREEDY), want)


@torch.no_grad()
def test_quantized_caches_return_past_keys_coded_int4_coarser_than_int8(root: str) -> None:
    """The effect: a prompt longer than the exact ring (32) leaves older keys coded, so the next token's logits
    move off the exact cache's, by more in int4 than in int8."""
    model = load("llama", root, "attnlab")
    prompt = torch.randint(0, 96, (1, 60), generator=torch.Generator().manual_seed(5))
    step = torch.tensor([[7]])

    def next_logits(past: object) -> torch.Tensor:
        model(prompt, cache=past, use_cache=True)
        return model(step, cache=past, use_cache=True).logits[0, -1]

    exact = next_logits(DynamicCache(config=model.config))
    assert (next_logits(attnlab.hf.cache("plain", model)) - exact).abs().max().item() < 1e-5
    err8 = (next_logits(attnlab.hf.cache("int8", model)) - exact).abs().max().item()
    err4 = (next_logits(attnlab.hf.cache("int4", model)) - exact).abs().max().item()
    assert 1e-5 < err8 < err4 / 4, (err8, err4)


@torch.no_grad()
def test_h2o_keeps_its_budget_of_the_keys_attention_weighed_heaviest(root: str) -> None:
    model = load("llama", root, "attnlab")
    made = attnlab.hf.cache("h2o", model, budget=16)
    model.generate(IDS[:1], cache=made, **GREEDY)
    layer = made.layers[0]
    assert isinstance(layer, AttnlabLayer) and isinstance(layer.inner, EvictingCache)
    kept = layer.inner.positions[0]
    assert kept.numel() == 16 and len(layer.inner.evicted[0]) == IDS.shape[1] + GREEDY["max_new_tokens"] - 1 - 16
    scores, cutoff = layer.inner.scores[0], kept.numel() - layer.inner.recent
    heavy = scores[:cutoff]  # the kept candidates outside the recent window
    assert heavy.min() > 0 and 0 in kept.tolist()  # the first token, a sink, is among the heavy hitters


@pytest.mark.slow  # slow by nature (seconds: a whole run, a process or a memory probe); stage 1 keeps its budget
@torch.no_grad()
def test_a_sink_cache_in_transformers_goes_past_the_context_as_attnlabs_own_does() -> None:
    """The shipped text model as a transformers GPT-NeoX reads 400 tokens through a sink cache of 4 + 124 (its
    window slides 272 times): its perplexity is attnlab's own sink cache's to 1e-6, which holds only if the sinks
    are turned on by the model's rotation as the window slides (left unturned, 0.8% apart)."""
    from attnlab.bench.cache_metrics import perplexity
    from attnlab.cache import CACHES
    from attnlab.models import GPT
    from attnlab.models.tasks import TextTask, stdlib_text
    from benchmark_scripts import load as load_script

    model = GPT.from_pretrained(Path(attnlab.__file__).parent / "data" / "text").eval()
    script = load_script("hf_caches")
    hf = script.neox_copy(model)
    text = TextTask(stdlib_text(), seq_len=400).batch(1, torch.Generator().manual_seed(0), split="eval")[0]
    made = attnlab.hf.cache("sink", hf, recent=124)
    theirs = script.hf_perplexity(hf, made, text, 32)
    ours = perplexity(model, functools.partial(CACHES["sink"], recent=124), text, 32)
    assert abs(theirs / ours - 1) < 1e-6, (theirs, ours)
    held = made.layers[0].inner
    assert held.k_cache.shape[2] == 4 + 124 and made.get_seq_length() == 399  # flat memory, every token seen


@pytest.mark.slow  # 16 s: two families, each generating through three sink caches
@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "gpt_oss"])  # gpt-oss: YaRN, whose cos and sin carry a scaling
def test_a_sink_cache_gives_attnlabs_own_tokens_past_its_window_and_refuses_what_it_cannot_hold(
    family: str, root: str
) -> None:
    """Past a window of 4 + 8, transformers' generate through attnlab.hf.cache("sink") gives the tokens attnlab's
    own model gives through its sink cache; a left-padded batch (pads among the sinks) and a prompt longer than
    the window in one chunk are refused by name, and the chunk one token at a time gives attnlab's tokens."""
    from attnlab.cache import CACHES
    from attnlab.models import GPT

    folder = hf_dir(family, root)
    hf = FAMILIES[family][0].from_pretrained(folder, attn_implementation="attnlab").eval()
    own = GPT.from_pretrained(folder).eval()
    sink = functools.partial(CACHES["sink"], recent=8)
    greedy = {"do_sample": False, "eos_token_id": None, "pad_token_id": 0}
    prompt = IDS[:1, :10]
    want = own.generate(prompt, 30, cache=sink)[0, 10:]
    got = hf.generate(prompt, max_new_tokens=30, cache=attnlab.hf.cache("sink", hf, recent=8), **greedy)[0, 10:]
    assert torch.equal(got, want)
    padded = torch.ones(2, 10, dtype=torch.long)
    padded[0, :3] = 0
    with pytest.raises(
        ValueError, match=r"left padding \(attention_mask\) put pad tokens among the sink cache's 4 sinks"
    ):
        hf.generate(
            IDS[:2, :10],
            attention_mask=padded,
            max_new_tokens=4,
            cache=attnlab.hf.cache("sink", hf, recent=8),
            **greedy,
        )
    long = IDS[:1, :20]
    with pytest.raises(ValueError, match=r"holds 12 more of these 20 tokens at once.*prefill_chunk_size=1"):
        hf.generate(long, max_new_tokens=4, cache=attnlab.hf.cache("sink", hf, recent=8), **greedy)
    one_by_one = hf.generate(
        long, max_new_tokens=4, cache=attnlab.hf.cache("sink", hf, recent=8), prefill_chunk_size=1, **greedy
    )
    assert torch.equal(one_by_one[0, 20:], own.generate(long, 4, cache=sink)[0, 20:])


def test_caches_refuse_what_they_cannot_do_by_name(root: str) -> None:
    sdpa = load("llama", root, "sdpa")
    with pytest.raises(ValueError, match=r"weighs the attention.*runs 'sdpa'.*attn_implementation='attnlab'"):
        attnlab.hf.cache("h2o", sdpa)
    with torch.no_grad():  # the plain cache hands over its filled slots alone: transformers' own attention reads them
        want = sdpa.generate(IDS, **GREEDY)
        assert torch.equal(sdpa.generate(IDS, cache=attnlab.hf.cache("plain", sdpa), **GREEDY), want)
    for name, why in (("paged", "decode loop"), ("prefix", "token ids")):
        with pytest.raises(ValueError, match=rf"cache\('{name}'\) is refused: .*{why}"):
            attnlab.hf.cache(name, sdpa)
    with pytest.raises(
        ValueError, match=r"sink cache moves its sinks' keys.*runs 'sdpa'.*attn_implementation='attnlab'"
    ):
        attnlab.hf.cache("sink", sdpa)
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    gpt2 = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=32, bos_token_id=0, eos_token_id=0)
    )
    gpt2.set_attn_implementation("attnlab")
    with pytest.raises(ValueError, match="turns its sinks by the model's rotary embedding, and this model has 0"):
        attnlab.hf.cache("sink", gpt2)
    dynamic = LlamaConfig(**COMMON, rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    moving = LlamaForCausalLM(dynamic)
    moving.set_attn_implementation("attnlab")
    with pytest.raises(ValueError, match=r"RoPE is 'dynamic', whose frequencies change with the length seen"):
        attnlab.hf.cache("sink", moving)
    with pytest.raises(ValueError, match=r"unknown cache 'lru'.*'int8'"):
        attnlab.hf.cache("lru", sdpa)
    with pytest.raises(ValueError, match=r"unknown cache <function.*attnlab.hf.cache takes a name"):
        attnlab.hf.cache(lambda **args: None, sdpa)  # type: ignore[arg-type]  # a factory: names only here
    with pytest.raises(ValueError, match="every layer of this model slides"):
        attnlab.hf.cache("int8", load("mistral", root, "sdpa"))
    with pytest.raises(ValueError, match="latent attention"):
        attnlab.hf.cache("int8", load("deepseek_v3", root, "sdpa"))
    with pytest.raises(ValueError, match=r"max_len must be"):
        attnlab.hf.cache("plain", sdpa, max_len=0)
    ours = load("llama", root, "attnlab")
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"beam search.*num_beams=1"):
            ours.generate(IDS[:1], cache=attnlab.hf.cache("int8", ours), max_new_tokens=4, num_beams=2)
        with pytest.raises(ValueError, match=r"max_len=20 positions and has 20.*prompt's length plus every token"):
            ours.generate(IDS[:1], cache=attnlab.hf.cache("plain", ours, max_len=20), max_new_tokens=4)
        made = attnlab.hf.cache("h2o", ours, budget=8)
        ours(IDS[:1], cache=made, use_cache=True)
        ours.set_attn_implementation("sdpa")  # switched away: the keys are not weighed, and the next write says so
        ours(IDS[:1, :1], cache=made, use_cache=True)
        with pytest.raises(
            ValueError, match="keys sit at positions only attnlab's attention reads, and its last keys were"
        ):
            ours(IDS[:1, :1], cache=made, use_cache=True)


@torch.no_grad()
def test_a_finished_cache_is_not_kept_alive_by_the_bridge(root: str) -> None:
    import gc
    import weakref

    model = load("llama", root, "attnlab")
    made = attnlab.hf.cache("h2o", model, budget=8)  # its keys go to the bridge with their positions
    model.generate(IDS[:1], cache=made, max_new_tokens=3, do_sample=False)
    gone = weakref.ref(made.layers[0].inner)
    del made
    gc.collect()
    assert gone() is None


# ---- the book's own models, by module replacement ----

BOOK_GPT = dict(vocab_size=96, context_length=32, emb_dim=64, n_heads=4, n_layers=3, drop_rate=0.0, qkv_bias=True)


def book_model(which: str) -> torch.nn.Module:
    """The book's GPTModel, Llama3Model or Qwen3Model (llms-from-scratch), random, its norms moved off ones."""
    torch.manual_seed(0)
    if which == "gpt":
        from llms_from_scratch.ch04 import GPTModel

        model = GPTModel(BOOK_GPT)
    elif which == "llama3":
        from llms_from_scratch.llama3 import Llama3Model

        model = Llama3Model(BOOK_LLAMA)
    else:
        from llms_from_scratch.qwen3 import Qwen3Model

        model = Qwen3Model(BOOK_QWEN)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.5)
    return model.eval()


@torch.no_grad()
@pytest.mark.parametrize("which", ["gpt", "llama3", "qwen3"])
def test_the_books_models_run_attnlab_by_module_replacement(which: str) -> None:
    book = book_model(which)
    want, keys = book(IDS), list(book.state_dict())
    chosen = [(0, 1), (1, 3), (1, 0)]
    handle = attnlab.hf.use(book, backend="eager")
    with Recorder(names=["attn_weights"]) as every:
        assert (book(IDS) - want).abs().max().item() < 1e-5
    attnlab.hf.use(book, backend="flash")
    with Recorder(heads=chosen) as rec:
        assert (book(IDS) - want).abs().max().item() < 1e-5
    for layer, head in chosen:
        eager = every.get("attn_weights", module=f"trf_blocks.{layer}.att")[:, head]
        assert (rec.head(layer, head) - eager).abs().max().item() < 1e-6
    assert list(book.state_dict()) == keys  # the book's weights, untouched
    diagonal = mods.and_masks(mods.causal(), lambda b, h, q, kv: q == kv)
    with attnlab.hf.use(book, mask_mod={1: diagonal}):
        assert (book(IDS) - want).abs().max().item() > 1e-3  # the mod acts
    handle.undo()
    assert all("forward" not in block.att.__dict__ for block in book.trf_blocks)
    assert torch.equal(book(IDS), want)  # the book's own forward again


@torch.no_grad()
def test_assisted_generation_crops_the_plain_cache_and_keeps_the_greedy_tokens(root: str) -> None:
    ours, own = load("llama", root, "attnlab"), load("llama", root, "sdpa")
    helper = load("llama", root, "sdpa")
    want = own.generate(IDS[:1], **GREEDY)
    got = ours.generate(IDS[:1], cache=attnlab.hf.cache("plain", ours), assistant_model=helper, **GREEDY)
    assert torch.equal(got, want)


@torch.no_grad()
def test_a_mod_reads_each_rows_own_positions_through_a_sliding_layers_cache_and_left_padding(root: str) -> None:
    """kv != 2 hides the third token of each row, wherever its cache put it: a decode with transformers'
    DynamicCache (gemma3's sliding layers keep a window of keys) equals the whole sequence read at once, and a
    left-padded row numbered as generate numbers it (position_ids) reads as the row alone."""
    model = load("gemma3_text", root, "attnlab")
    hide = lambda b, h, q, kv: kv != 2
    attnlab.hf.use(model, mask_mod=hide)
    whole = model(IDS[:1], use_cache=False).logits[0, -1]
    past = DynamicCache(config=model.config)
    model(IDS[:1, :-1], cache=past, use_cache=True)
    assert (model(IDS[:1, -1:], cache=past, use_cache=True).logits[0, -1] - whole).abs().max().item() < 1e-5
    alone = model(PADDED[:1, 3:]).logits[0, -1]
    row_positions = (PADDING[:1].cumsum(-1) - 1).clamp(min=0)  # as generate numbers a left-padded row
    padded = model(PADDED[:1], attention_mask=PADDING[:1], position_ids=row_positions).logits[0, -1]
    assert (padded - alone).abs().max().item() < 1e-5
    assert (model(PADDED[:1, 3:], use_cache=False).logits[0, -1] - whole).abs().max().item() > 1e-3  # not trivial
    right = torch.cat([IDS[:1, :9], torch.zeros(1, 3, dtype=torch.long)], dim=1)  # a right-padded batch of one
    padded_right = model(torch.cat([right, IDS[1:, :12]]), attention_mask=torch.tensor([[1] * 9 + [0] * 3, [1] * 12]))
    assert (padded_right.logits[0, 8] - model(IDS[:1, :9]).logits[0, -1]).abs().max().item() < 1e-5
    from transformers import StaticCache

    with pytest.raises(ValueError, match=r"a static cache's buffer \(transformers' StaticCache\) does not say which"):
        model.generate(IDS[:1], cache=StaticCache(config=model.config, max_cache_len=64), max_new_tokens=2)


@torch.no_grad()
def test_use_reaches_a_composite_models_parts_and_leaves_its_config_saveable(tmp_path: Path) -> None:
    """Llava's language model reads its own sub-config: the mod must reach it, and save_pretrained must still work
    (transformers saves every attribute a config has)."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=37, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=8
    )
    text = LlamaConfig(**{**COMMON, "num_hidden_layers": 2})
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(LlavaConfig(vision_config=vision, text_config=text, image_token_index=95))
    model.eval()
    before = model(IDS[:1]).logits
    attnlab.hf.use(model, mask_mod=mods.and_masks(mods.causal(), lambda b, h, q, kv: q == kv))
    assert (model(IDS[:1]).logits - before).abs().max().item() > 1e-3
    model.save_pretrained(tmp_path)
    assert "_attnlab" not in (tmp_path / "config.json").read_text(encoding="utf-8")


def test_heads_and_layers_out_of_range_are_refused_by_name(root: str) -> None:
    model = load("llama", root, "attnlab")
    with pytest.raises(ValueError, match=r"chose head 9 of layer 0, which has 4 heads \(0 to 3\)"):
        with Recorder(heads=[(0, 9)]), torch.no_grad():
            model(IDS)
    with pytest.raises(ValueError, match=r"score_mod names layers \[99\], but the model has 3 \(0 to 2\)"):
        attnlab.hf.use(model, score_mod={99: mods.softcap(5.0)})


def test_the_docs_quote_the_recovered_weights_benchmarks_run() -> None:
    import json

    from benchmark_scripts import load as load_script

    view = load_script("hf_view")
    root = Path(__file__).resolve().parents[1]
    runs = sorted((root / "benchmarks" / "results").glob("hf_view-*.json"))
    assert runs, "no result file of benchmarks/hf_view.py"
    result = json.loads(runs[-1].read_text(encoding="utf-8"))
    assert result["schema"] == view.SCHEMA and result["model"]["layers"] == 12 and result["model"]["tokens"] == 1024
    assert all(row["max_error_vs_eager"] <= 1e-6 for row in result["rows"])
    assert view.render(result) in (root / "docs" / "benchmarks.md").read_text(encoding="utf-8")


def test_the_docs_quote_the_caches_in_transformers_run_and_it_judges_them() -> None:
    """The saved run of benchmarks/hf_caches.py is the one docs/benchmarks.md shows; in it each cache measured the
    same in transformers as on attnlab's model, the plain one as recomputing, and the lossy ones lost something
    (a cache that did nothing would read as plain)."""
    import json

    from benchmark_scripts import load as load_script

    script = load_script("hf_caches")
    root = Path(__file__).resolve().parents[1]
    runs = sorted((root / "benchmarks" / "results").glob("hf_caches-*.json"))
    assert runs, "no result file of benchmarks/hf_caches.py"
    result = json.loads(runs[-1].read_text(encoding="utf-8"))
    assert result["schema"] == script.SCHEMA and result["held_out"] == 128 and script.parted(result) == []
    rows = {row["cache"]: row["transformers"] for row in result["rows"]}
    assert rows["plain"]["agreement"] == 1.0
    assert abs(rows["plain"]["perplexity"] / result["recompute_perplexity"] - 1) <= 1e-5
    for lossy in ("int4", "h2o 25%", "snapkv 25% of prompt"):
        assert rows[lossy]["agreement"] < 1.0 and rows[lossy]["perplexity"] != rows["plain"]["perplexity"], lossy
    assert script.render(result) in (root / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    apart = json.loads(json.dumps(result))
    next(r for r in apart["rows"] if r["cache"] == "h2o 25%")["transformers"]["agreement"] = 1.0  # every key kept
    assert script.parted(apart) == [
        "h2o 25%: 100.0% agree and perplexity 2.49964 in transformers, 78.9% and 2.49964 on attnlab's model"
    ]


@torch.no_grad()
@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss"])
def test_the_view_of_a_transformers_model_holds_its_eager_weights_while_it_runs_flash(
    family: str, root: str, tmp_path: Path
) -> None:
    """The view's page holds, byte for byte, what a view of transformers' eager weights holds (its rollout within
    1e-6), though it never held them all; each sliding layer's window is outlined; the model's own attention is
    back after; gpt-oss's rows fall short of 1 by what its sinks took."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from attnlab.explain.hf_view import transformers_view

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(96)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words)
    text = " ".join(f"w{int(i)}" for i in IDS[0])
    model = load(family, root, "sdpa" if family != "gpt_oss" else "eager")
    view = transformers_view(model, tokenizer, text, lang="zh")
    assert model.config._attn_implementation == ("sdpa" if family != "gpt_oss" else "eager")
    eager = load(family, root, "eager")(IDS[:1], output_attentions=True).attentions  # L x (1, H, T, T)
    whole = torch.stack([a[0] for a in eager])  # (L, H, T, T)
    forced = AttentionView(tokens=view.tokens, weights=whole, sinks=family == "gpt_oss")
    assert view.weights is None and view.shape == tuple(whole.shape)
    assert view._packed == forced._packed and view._sink_steps == forced._sink_steps
    assert view.rollout is not None and forced.rollout is not None
    assert (view.rollout - forced.rollout).abs().max().item() < 1e-6
    assert view.tokens[:2] == ["w" + str(int(IDS[0, 0])), "w" + str(int(IDS[0, 1]))]
    kinds = FAMILIES[family][1]().layer_types  # type: ignore[attr-defined]
    assert [w is not None for w in view.windows or []] == [k == "sliding_attention" for k in kinds]
    assert view.sinks == (family == "gpt_oss")
    if family == "gpt_oss":
        assert whole.sum(-1).max() < 1 - 1e-3 and any(base64.b64decode(view._sink_steps))  # shares shown
    view.save(tmp_path / "view.html")
    assert (tmp_path / "view.html").stat().st_size > 10_000


@torch.no_grad()
def test_a_recorder_of_every_head_never_takes_another_recorders_chosen_heads_for_all(root: str) -> None:
    model = load("llama", root, "attnlab")  # flash: the weights are formed only for the chosen heads
    with Recorder() as every, Recorder(heads=[(0, 1)]) as chosen:
        model(IDS)
    assert chosen.head(0, 1).shape == (2, IDS.shape[1], IDS.shape[1])
    with pytest.raises(KeyError, match=r"formed only the heads a Recorder\(heads=...\) chose"):
        every.get("attn_weights")


def _word_tokenizer(n: int) -> Any:
    """A transformers tokenizer of the words w0 .. w{n-1}, one id each."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(n)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words)


@torch.no_grad()
def test_explain_runs_a_transformers_checkpoint_in_transformers_and_shows_every_head_recovered(
    root: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``attnlab explain --model DIR --transformers --html``: the page's weights are, byte for byte, those of a view
    of transformers' eager weights, though the model ran attnlab's flash kernel; its text is the reader's
    language; what does not fit is refused by name before anything loads."""
    import json
    import re

    from attnlab import cli

    folder = hf_dir("gpt_oss", root)
    _word_tokenizer(96).save_pretrained(folder)
    text = " ".join(f"w{int(i)}" for i in IDS[0])
    out = tmp_path / "gpt_oss.html"
    assert (
        cli.main(["explain", text, "--model", str(folder), "--transformers", "--html", str(out), "--lang", "zh"]) == 0
    )
    page = out.read_text(encoding="utf-8")
    config = FAMILIES["gpt_oss"][1]()
    shape = f"(gpt_oss：{config.num_hidden_layers} 层，{config.num_attention_heads} 个头)"  # type: ignore[attr-defined]
    assert "注意力换成了 attnlab 的 flash 内核" in page and shape in page
    found = re.search(r'<script type="application/json" class="attnview-data">(.*?)</script>', page)
    assert found is not None
    data = json.loads(found.group(1))
    eager = load("gpt_oss", root, "eager")(IDS[:1], output_attentions=True).attentions  # L x (1, H, T, T)
    forced = AttentionView(
        tokens=[f"w{int(i)}" for i in IDS[0]], weights=torch.stack([a[0] for a in eager]), sinks=True
    )
    packed = next(iter(forced._packed))
    assert data[packed] == forced._packed[packed] and data["sinks"] == forced._sink_steps
    capsys.readouterr()
    from transformers import Phi3Config, Phi3ForCausalLM  # a family attnlab does not load itself

    torch.manual_seed(0)
    phi3 = Phi3ForCausalLM(
        Phi3Config(
            vocab_size=96,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
    ).eval()
    phi3.save_pretrained(tmp_path / "phi3")
    _word_tokenizer(96).save_pretrained(tmp_path / "phi3")
    assert cli.main(["explain", text, "--model", str(tmp_path / "phi3")]) == 2
    assert "attnlab reads model_type" in (err := capsys.readouterr().err) and "add --transformers" in err
    out = tmp_path / "phi3.html"
    from transformers.models.phi3 import modeling_phi3

    def no_eager(*args: object, **kwargs: object) -> None:
        raise AssertionError("transformers' eager attention ran")

    with pytest.MonkeyPatch.context() as patch:  # the flash kernel ran each layer, never transformers' eager path
        patch.setattr(modeling_phi3, "eager_attention_forward", no_eager)
        assert cli.main(["explain", text, "--model", str(tmp_path / "phi3"), "--transformers", "--html", str(out)]) == 0
    found = re.search(r'<script type="application/json" class="attnview-data">(.*?)</script>', out.read_text())
    assert found is not None and "(phi3: 2 layers, 4 heads)" in out.read_text()
    phi3.set_attn_implementation("eager")
    eager = phi3(IDS[:1], output_attentions=True).attentions  # L x (1, H, T, T)
    forced = AttentionView(tokens=[f"w{int(i)}" for i in IDS[0]], weights=torch.stack([a[0] for a in eager]))
    packed = next(iter(forced._packed))
    assert json.loads(found.group(1))[packed] == forced._packed[packed]
    capsys.readouterr()
    for args, message in [
        (["--transformers", "--html", "x.html"], "--transformers runs a transformers checkpoint: give --model DIR"),
        (["--model", str(folder), "--transformers"], "--transformers shows every head in an interactive page: give"),
        (["--model", str(folder), "--transformers", "--html", "x.html", "--cache", "int8"], "--cache works on a "),
        (["--model", str(tmp_path), "--transformers", "--html", "x.html"], "is no transformers checkpoint (no config"),
        (["--model", str(folder), "--transformers", "--html", "x.txt"], "'x.txt' should end in .html or .htm"),
    ]:
        assert cli.main(["explain", "w1 w2", *args]) == 2, args
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (args, err)
    assert (
        cli.main(
            [
                "explain",
                "w1 w2",
                "--model",
                str(folder),
                "--transformers",
                "--html",
                str(tmp_path / "a.html"),
                "--tokenizer",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "transformers found no tokenizer in" in capsys.readouterr().err
    from transformers import T5Config  # no causal LM: transformers' long answer comes back as one line

    T5Config(vocab_size=96, d_model=16, num_layers=1, num_heads=2, d_ff=32).save_pretrained(tmp_path / "t5")
    _word_tokenizer(96).save_pretrained(tmp_path / "t5")
    assert cli.main(["explain", "w1", "--model", str(tmp_path / "t5"), "--transformers", "--html", str(out)]) == 2
    err = capsys.readouterr().err
    assert "could not load --model" in err and "as a causal LM: Unrecognized configuration class" in err
    assert err.count("\n") == 1 and len(err) < 500, err
    _word_tokenizer(300).save_pretrained(tmp_path / "phi3")  # a tokenizer past the model's 96 tokens
    assert cli.main(["explain", "w250", "--model", str(tmp_path / "phi3"), "--transformers", "--html", str(out)]) == 2
    assert "the tokenizer gives id 250 but the model knows 96 tokens" in capsys.readouterr().err
