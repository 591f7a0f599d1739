"""The glossary: every term the tour, the reports and the CLI use, in the notes' Chinese, the other Chinese in
use, English, and the names the code gives it.

A reader of the Chinese translation meets two sets of terms for the same ideas (注意力分数 and 注意力得分 for
scores, 掩码 and 遮蔽 for the mask, Token and 词元, ...). The tour writes the reading notes' set; this table
maps each term to the other set, to the English word, to the names in the book's code and attnlab's
(``attn_scores``, ``attn_weights``, ``context_vec``, ``mask``, ...) and to the tour step where it first appears.

It is the one source of truth: the tour links each term here on first use (the HTML report and the terminal),
``attnlab glossary`` prints it, and the tests fail when the tour introduces a term (a word with its English in
brackets) that is not here, or when a term's first step is not where the tour first uses it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Term:
    """One term. ``zh``: as the reading notes and the tour write it; ``zh_other``: the other renderings in use
    (empty when readers meet only one); ``en``: the book's English; ``code``: the names the book's code and
    attnlab's give it; ``first``: the tour step where it first appears (None: used past the tour, in the
    reports and the CLI: ``where`` says where); ``en_other``: the other English written for it."""

    key: str
    zh: str
    en: str
    zh_other: tuple[str, ...] = ()
    code: tuple[str, ...] = ()
    first: str | None = None
    where: str = ""
    en_other: tuple[str, ...] = ()  # other English the tour or the book writes for it
    where_zh: str = ""  # ``where``, in Chinese

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# The book's order: the chapter's terms as the tour meets them, then those of the reports past it.
TERMS: tuple[Term, ...] = (
    Term(
        "self_attention", "自注意力", "self-attention", code=("SelfAttention_v1", "SelfAttention_v2"), first="overview"
    ),
    Term(
        "causal_attention",
        "因果注意力",
        "causal attention",
        ("掩码注意力", "遮蔽注意力"),
        ("CausalAttention",),
        "overview",
    ),
    Term("multi_head", "多头注意力", "multi-head attention", code=("MultiHeadAttention",), first="overview"),
    Term("token", "Token", "token", ("词元", "令牌"), ("token_ids", "idx"), "inputs"),
    Term("embedding", "嵌入", "embedding", ("词嵌入", "嵌入向量"), ("inputs", "tok_emb"), "inputs"),
    Term("context_vector", "上下文向量", "context vector", code=("context_vec", "z_2"), first="inputs"),
    Term("dot_product", "点积", "dot product", ("内积", "数量积"), ("torch.dot",), "overview"),
    Term("attention_scores", "注意力分数", "attention scores", ("注意力得分",), ("attn_scores", "omega"), "dot"),
    Term(
        "normalization",
        "归一化",
        "normalization",
        ("规范化",),
        ("attn_weights_2_tmp",),
        "sum_norm",
        en_other=("normalize", "sum normalization"),
    ),
    Term("attention_weights", "注意力权重", "attention weights", code=("attn_weights",), first="softmax"),
    Term("softmax", "softmax", "softmax", ("归一化指数函数",), ("torch.softmax", "softmax_naive"), "sum_norm"),
    Term("overflow", "溢出", "overflow", ("上溢",), ("inf",), "softmax_overflow"),
    Term("underflow", "下溢", "underflow", code=("0 / 0",), first="softmax_overflow"),
    Term("matmul", "矩阵乘法", "matrix multiplication", ("矩阵乘",), ("@", "torch.matmul"), "scores_all"),
    Term("transpose", "转置", "transpose", code=(".T", "transpose(1, 2)"), first="scores_all"),
    Term("weight_matrix", "权重矩阵", "weight matrix", code=("W_query", "W_key", "W_value"), first="weights_init"),
    Term("scaled_dot_product", "缩放点积注意力", "scaled dot-product attention", code=("d_k**0.5",), first="overview"),
    Term("seed", "随机数种子", "random seed", ("种子",), ("torch.manual_seed(123)",), "weights_init"),
    Term("gradient", "梯度", "gradient", code=("grad", "grad_fn"), first="sum_norm"),
    Term("backward", "反向传播", "backpropagation", code=("backward()",), first="qkv_2"),
    Term("frozen", "冻结", "frozen", code=("requires_grad=False",), first="requires_grad"),
    Term("query", "查询向量", "query", ("查询",), ("query_2", "queries"), "qkv_2"),
    Term("key", "键向量", "key", ("键",), ("key_2", "keys"), "qkv_2"),
    Term("value", "值向量", "value", ("值",), ("value_2", "values"), "qkv_2"),
    Term("forward", "前向传播", "forward pass", ("正向传播",), ("forward()",), "sa_v1"),
    Term("bias", "偏置项", "bias", ("偏置",), ("qkv_bias",), "sa_v2"),
    Term("mask", "掩码", "mask", ("遮蔽",), ("mask", "masked_fill"), "causal_class"),
    Term("dropout", "dropout", "dropout", ("暂退法", "随机失活"), ("nn.Dropout", "dropout"), "dropout"),
    Term("buffer", "buffer", "buffer", ("缓冲区",), ("register_buffer",), "causal_class"),
    Term("head", "头", "head", ("注意力头",), ("num_heads", "head_dim"), "overview"),
    Term("subspace", "表示子空间", "representation subspace", first="overview"),
    Term(
        "kv_cache",
        "KV Cache",
        "KV cache",
        ("KV 缓存", "键值缓存"),
        ("use_cache", "cache", "KVCache"),
        "recap_trainable",
    ),
    Term("paged", "分页", "paged cache", code=("PagedKVCache",), first="kv_lab", en_other=("paged",)),
    Term(
        "sink",
        "注意力汇聚点",
        "attention sink",
        ("注意力汇聚",),
        ("SinkCache", "sinks"),
        "kv_lab",
        en_other=("sink",),
    ),
    Term("quantization", "量化", "quantization", code=("QuantizedKVCache", "int8"), first="kv_lab"),
    Term(
        "gqa",
        "分组查询注意力",
        "grouped-query attention (GQA)",
        (),
        ("n_kv_heads", "num_kv_heads"),
        "gqa",
        en_other=("GQA",),
    ),
    Term(
        "mqa",
        "多查询注意力",
        "multi-query attention (MQA)",
        (),
        ("num_kv_heads=1",),
        "gqa",
        en_other=("MQA",),
    ),
    Term(
        "latent_attention",
        "潜在注意力",
        "multi-head latent attention (MLA)",
        ("多头潜在注意力",),
        ("LatentAttention", "kv_lora_rank"),
        "mla",
        en_other=("MLA", "latent"),
    ),
    Term("absorbed", "吸收形式", "absorbed form", code=("absorbed",), first="mla", en_other=("absorbed",)),
    Term(
        "sliding_window",
        "滑动窗口",
        "sliding window",
        ("局部注意力",),
        ("window", "SlidingWindowCache"),
        "sliding",
    ),
    Term(
        "full_attention",
        "全注意力",
        "full attention",
        ("全局注意力",),
        ("layer_types",),
        "sliding",
    ),
    Term(
        "first_token_share",
        "首 Token 份额",
        "first-token share",
        ("首词元份额",),
        ("first_token_share", "first_token"),
        "attention_sink",
    ),
    Term("value_drain", "值向量消减", "value-state drain", ("值状态消减",), ("value_norm_ratio",), "attention_sink"),
    Term(
        "massive_activation",
        "巨量激活",
        "massive activations",
        ("大规模激活",),
        ("residual_peak", "Peak"),
        "attention_sink",
        en_other=("massive activation",),
    ),
    Term(
        "residual_peak",
        "残差峰值",
        "residual-state peak",
        ("残差状态峰值",),
        ("norm_ratio",),
        "attention_sink",
    ),
    Term("sink_rate", "汇聚率", "sink rate", ("汇点率",), ("sink_rate", "THRESHOLDS"), "attention_sink"),
    Term(
        "learned_sink",
        "可学习的注意力汇聚点",
        "learned sink",
        (),
        ("sinks=True", "sink_weight"),
        "sinks",
        en_other=("learned sinks",),
    ),
    Term("rmsnorm", "均方根归一化", "RMSNorm", ("RMS 归一化",), ("nn.RMSNorm",), "qk_norm"),
    Term("qk_norm", "QK 归一化", "QK-norm", ("查询键归一化",), ("qk_norm", "q_norm", "k_norm"), "qk_norm"),
    Term(
        "output_gate",
        "输出门控",
        "output gate",
        ("门控注意力",),
        ("output_gate", "attn_output_gate"),
        "gate",
        en_other=("gated attention",),
    ),
    Term("feature_map", "特征映射", "feature map", ("核特征映射",), ("feature_map",), "linear"),
    Term(
        "linear_attention",
        "线性注意力",
        "linear attention",
        ("线性化注意力",),
        ("LinearAttention", "linear_attention"),
        "linear",
    ),
    Term(
        "state", "状态", "state", ("隐状态",), ("StateCache", "state_values"), "linear", en_other=("recurrent state",)
    ),
    Term("delta_rule", "delta 规则", "delta rule", ("增量规则",), ("gated_delta_rule",), "deltanet"),
    Term("decay", "衰减", "decay", ("遗忘门",), ("A_log", "dt_bias"), "deltanet"),
    Term("gated_deltanet", "门控 DeltaNet", "Gated DeltaNet", ("门控增量网络",), ("GatedDeltaNet",), "deltanet"),
    Term(
        "rope",
        "旋转位置编码",
        "rotary position embedding (RoPE)",
        ("旋转位置嵌入",),
        ("rope", "RotaryEmbedding"),
        where="the models past GPT-2 (Llama, Qwen, Gemma 3, gpt-oss, DeepSeek)",
        where_zh="GPT-2 之后的模型 (Llama、Qwen、Gemma 3、gpt-oss、DeepSeek)",
    ),
    Term(
        "induction_head",
        "归纳头",
        "induction head",
        code=("induction",),
        where="attnlab heads: a head's name",
        where_zh="attnlab heads：一个头的名字",
    ),
)

BY_KEY: dict[str, Term] = {term.key: term for term in TERMS}

HEADINGS = {
    "en": ("term", "the notes' Chinese", "the other Chinese", "in the code", "first in the tour"),
    "zh": ("术语", "笔记的译法", "另一种译法", "代码中的名字", "导览中首次出现"),
}


def lookup(word: str) -> list[Term]:
    """The terms whose English, Chinese (either rendering) or code name is ``word``, or contains it (case-folded)."""
    if not isinstance(word, str) or not word.strip():
        raise ValueError(f"give a word to look up (English, Chinese or a name in the code), got {word!r}")
    want = word.strip().casefold()
    names = lambda t: (t.en, t.zh, *t.en_other, *t.zh_other, *t.code)
    exact = [t for t in TERMS if want in {s.casefold() for s in (t.key, *names(t))}]
    if exact:
        return exact
    return [t for t in TERMS if any(want in s.casefold() for s in names(t))]


def rows(
    lang: str, terms: tuple[Term, ...] | list[Term] = TERMS, *, steps: dict[str, str] | None = None
) -> list[list[str]]:
    """The table's rows in ``lang``'s order of columns (its headings: ``HEADINGS[lang]``); ``steps`` names each
    tour step by its title (a step's key where not given)."""
    if lang not in HEADINGS:
        raise ValueError(f"lang must be one of {sorted(HEADINGS)}, got {lang!r}")
    out = []
    for t in terms:
        first = (steps or {}).get(t.first, t.first) if t.first else (t.where_zh if lang == "zh" else t.where)
        out.append([t.en, t.zh, "、".join(t.zh_other) or "—", ", ".join(t.code) or "—", first])
    return out


def first_uses(lang: str, texts: list[tuple[str, str]]) -> dict[str, list[Term]]:
    """Per step key, the terms whose word (``zh`` or ``en``, by ``lang``) the step's text is the first to use:
    what the tour links to this table. ``texts``: (step key, text) in the tour's order."""
    found: dict[str, list[Term]] = {}
    for term in TERMS:
        for key, text in texts:
            if phrase_in(term, lang, text) is not None:
                found.setdefault(key, []).append(term)
                break
    return found


def phrase_in(term: Term, lang: str, text: str) -> str | None:
    """The term's word as ``text`` first writes it, or None: Chinese as is; English in any case, as a whole word
    ("head" is not in "ahead")."""
    if lang == "zh":
        return term.zh if term.zh in text else None
    found = re.search(rf"(?<![\w-]){re.escape(term.en)}(?![\w-])", text, flags=re.IGNORECASE)
    return found.group(0) if found else None


def term_line(term: Term, lang: str) -> str:
    """One term in a line, as the terminal tour gives it on first use."""
    other = "、".join(term.zh_other)
    code = ", ".join(term.code)
    if lang == "zh":
        return f"{term.zh} = {term.en}" + (f"（另译：{other}）" if other else "") + (f"，代码：{code}" if code else "")
    return f"{term.en} = {term.zh}" + (f" (also {other})" if other else "") + (f"; code: {code}" if code else "")
