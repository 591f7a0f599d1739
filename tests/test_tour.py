"""The guided tour: every step checked against the book, every idea of the notes covered, in both languages."""

from __future__ import annotations

import re

import pytest
import torch
from rich.cells import cell_len
from rich.console import Console

from attnlab import cli
from attnlab.book import golden
from attnlab.cli._wrap import wrap
from attnlab.cli.tour import render_tour
from attnlab.explain.tour import build_tour, en, mismatches, zh

CJK = re.compile(r"[\u4e00-\u9fff]")

# Every section and idea of the reading notes, with the step that covers it and a term that step must use
# in each language. The first column is quoted from the notes (the test fails if the notes do not say it).
NOTES = [
    ("自注意力机制 允许输入序列中的每个位置", "overview", "Self-attention", "自注意力"),
    ("- 简化的自注意力(Simplified self-attention)", "overview", "simplified self-attention", "简化自注意力"),
    ("- 因果注意力(Causal attention)", "overview", "causal attention", "因果注意力"),
    ("- 多头注意力(Multi-head attention)", "overview", "multi-head attention", "多头注意力"),
    ('而是会"环顾四周"', "overview", "look around the sentence", "环顾四周"),
    ("多是翻看前面的部分", "overview", "turn back to earlier pages", "翻看前面"),
    ("没有可训练权重的简单自注意力", "inputs", "context vector", "上下文向量"),
    ("计算两两 Token 嵌入向量之间的注意力分数", "scores_2", "dotted with every token", "注意力分数"),
    ("它表示两个向量夹角的余弦值", "dot", "cosine", "余弦"),
    ("和模长", "dot", "lengths", "模长"),
    ("两个人各有 6 和 4 个苹果", "sum_norm", "apples", "苹果"),
    ("sum normalization 或 simplex projection", "sum_norm", "sum normalization", "sum normalization"),
    ("- 放大差异", "softmax", "amplifies differences", "放大差异"),
    ("比如溢出和下溢", "softmax_overflow", "underflows", "下溢"),
    ("query = inputs[1] 可能会让人有点误解", "context_2", "query.shape", "query.shape"),
    ("矩阵乘法的规则是内维度相等", "scores_all", "inner dimensions", "内维度"),
    ("inputs.T 是矩阵的转置", "scores_all", "transposes", "转置"),
    ("拆解为两两点积计算 attention 分数的方式就要用两层循环", "scores_loop", "double loop", "两层循环"),
    ("缩放点积注意力(scaled dot-product attention)", "weights_init", "Scaled dot-product", "缩放点积注意力"),
    ("- 计算 Token 之间的相似度分数(点积)", "weights_init", "similarity scores", "相似度分数"),
    ("设置 requires_grad=True 以便在训练中更新这些矩阵，即不冻结该权重矩阵", "requires_grad", "frozen", "冻结"),
    ("Wq: 学会 “怎么提问”", "qkv_2", "how to ask", "怎么提问"),
    ("Wk: 学会 “怎么被匹配”", "qkv_2", "how to be matched", "怎么被匹配"),
    ('Wv: 学会 "提取什么内容"', "qkv_2", "what to extract", "提取什么内容"),
    ('Wv: 表示 "我能提供什么"', "qkv_2", "what can I give", "我能提供什么"),
    ('"权重" 是 "权重参数" 的简称', "keys_values", "weight parameters", "权重参数"),
    ("可防止点积值过大导致 softmax 梯度消失", "weights_2_scaled", "vanishing gradients", "梯度消失"),
    ("最后小结一下引入 Wq, Wk, 和 Wv", "recap_trainable", "four steps", "四步"),
    ("目前常被提及的 KV Cache", "recap_trainable", "KV cache", "KV Cache"),
    ("nn.Module 会自动调用前向传播方法 forward()", "sa_v1", "forward()", "forward()"),
    ("nn.Linear 提供了优化的权重初始化方案", "sa_v2", "weight initialization", "权重初始化"),
    ("上下文向量中分量值可以是负的", "sa_v2", "negative", "负的"),
    ("本文学习了两种注意力机制", "summary", "three steps", "简单注意力机制"),
]


def step_words(lang: str) -> dict[str, str]:
    return {s.key: " ".join((s.title, s.text, s.code, s.value)) for s in build_tour(lang)}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().out


def test_tour_check_passes_and_covers_the_chapter(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_cli(capsys, "tour", "--check")
    assert code == 0, out
    assert re.search(r"\d+ checks: the chapter matches the book, each variant does what it claims", out)
    keys = [s.key for s in build_tour("en")]
    assert keys[:2] == ["overview", "inputs"] and keys.index("summary") == keys.index("after") - 1
    after = ["after", "gqa", "mla", "sliding", "attention_sink", "sinks", "qk_norm", "gate", "linear", "deltanet"]
    after += ["kda"]
    after += ["kv_share", "short_conv", "ring_back", "state_back", "zoo_run"]
    assert keys[keys.index("after") :] == after  # what came after the chapter, past its summary
    order = ["softmax", "softmax_overflow", "weights_init", "requires_grad", "recap_trainable", "causal_inf", "mha"]
    assert [keys.index(k) for k in order] == sorted(keys.index(k) for k in order)
    for module in (en, zh):  # one entry per step and per check, in both languages
        assert set(module.STEPS) == set(keys)
    assert set(en.CHECKS) == set(zh.CHECKS) and set(en.WORDS) == set(zh.WORDS) and set(en.VALUES) == set(zh.VALUES)


def test_every_section_and_idea_of_the_notes_has_its_step(seed_text: str) -> None:
    words = {"en": step_words("en"), "zh": step_words("zh")}
    for quote, key, en_term, zh_term in NOTES:
        assert quote.replace("“", '"').replace("”", '"') in seed_text.replace("“", '"').replace("”", '"'), quote
        assert en_term.lower() in words["en"][key].lower(), (key, en_term)
        assert zh_term in words["zh"][key], (key, zh_term)


def test_every_number_in_the_notes_appears_in_the_tour(capsys: pytest.CaptureFixture[str], seed_text: str) -> None:
    _, out = run_cli(capsys, "tour")
    printed = set(re.findall(r"-?\d+\.\d{4}\b", seed_text))
    missing = {n for n in printed if n not in out}
    assert not missing, f"numbers from the notes missing in the tour: {sorted(missing)}"


def test_the_chinese_tour_is_chinese_throughout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_cli(capsys, "tour", "--lang", "zh", "--check")
    assert code == 0
    assert re.search(r"\d+ 项校验：本章与书中数值一致，每个变体都做到了它声称的效果", out)
    for step in build_tour("zh"):
        assert CJK.search(step.title) and CJK.search(step.text), step.key
        for c in step.checks:
            assert CJK.search(c.label) and (not c.detail or CJK.search(c.detail) or c.detail[0].isdigit()), c
        comments = re.findall(r"#\s*(.+)", step.code)
        assert all(CJK.search(m) or re.fullmatch(r"[\d\s\[\]x@>\-,.:()]+", m) for m in comments), comments
    for english in ("check:", "matches the book", "max |diff|", "rows sum to 1", "overflow, naive"):
        assert english not in out, english


def test_terminal_tour_wraps_and_never_cuts_at_80_columns() -> None:
    for lang in ("en", "zh"):
        console = Console(width=80, record=True, color_system=None)
        assert render_tour(console, lang, check=True) == 0
        lines = console.export_text().splitlines()
        assert max(cell_len(line) for line in lines) <= 80
        flat = re.sub(r"[\s│╭╮╰╯─]", "", "".join(lines))
        for step in build_tour(lang):
            for line in step.code.splitlines():  # every code line, closing parenthesis included, is all there
                assert re.sub(r"\s", "", line) in flat, (lang, step.key, line)


@pytest.mark.parametrize("width", [40, 47, 61])
def test_panel_titles_wrap_and_are_never_cut_at_any_width_from_40(width: int) -> None:
    for lang in ("en", "zh"):
        console = Console(width=width, record=True, color_system=None)
        assert render_tour(console, lang, check=False) == 0
        lines = console.export_text().splitlines()
        assert max(cell_len(line) for line in lines) <= width
        flat = re.sub(r"[\s│╭╮╰╯─]", "", "".join(lines))
        steps = build_tour(lang)
        for n, step in enumerate(steps, start=1):
            title = re.sub(r"\s", "", step.title)
            assert f"{n}.{title}" in flat, (lang, width, step.title)  # whole, with its number
            for line in step.code.splitlines():  # and no code line clipped at the box's edge
                assert re.sub(r"\s", "", line) in flat, (lang, width, step.key, line)


def test_wrap_breaks_chinese_between_characters_and_keeps_words_whole() -> None:
    text = "查询 x(2) 与每个 Token 做点积。它与自己的分数 1.4950 最高：自己与自己最相似，所以注意力分数最大。" * 3
    lines = wrap(text, 40)
    assert "".join(lines).replace(" ", "") == text.replace(" ", "")
    assert all(cell_len(line) <= 40 for line in lines)
    assert all(cell_len(line) >= 34 for line in lines[:-1]), lines  # filled lines, not odd fragments
    assert not any(line[0] in "，。：；" for line in lines)
    assert "1.4950" in "\n".join(lines) and "Token" in "\n".join(lines)  # no word split
    assert wrap("x" * 90, 40) == ["x" * 40, "x" * 40, "x" * 10]
    with pytest.raises(ValueError, match=r"width must be at least 8 cells, got 3"):
        wrap("abc", 3)


def test_check_fails_on_a_wrong_book_value(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = list(golden.CONTEXT_VECTOR_2)
    wrong[1] += 0.001  # one printed digit off
    monkeypatch.setattr(golden, "CONTEXT_VECTOR_2", wrong)
    assert [key for key, _ in mismatches(build_tour("en"))] == [
        "context_2_trainable",
        "recap_trainable",
        "sa_v1",
    ]
    code, out = run_cli(capsys, "tour", "--check")
    assert code == 1
    assert "3 mismatches" in out and "context_2_trainable" in out


def test_unknown_language_is_refused() -> None:
    with pytest.raises(ValueError, match=r"lang must be one of \['en', 'zh'\], got 'fr'"):
        build_tour("fr")
    with pytest.raises(SystemExit):
        cli.main(["tour", "--lang", "fr"])


def _after_failures() -> set[str]:
    """The keys of the checks that fail in the part after the chapter (a label with its words filled in too)."""
    labels = {
        re.compile(".*".join(map(re.escape, re.split(r"\{[^}]*\}", label)))): key for key, label in en.CHECKS.items()
    }
    steps = build_tour("en")
    after = [s for s in steps[[s.key for s in steps].index("after") :]]
    failed = [c.label for s in after for c in s.checks if not c.ok]
    return {next((key for p, key in labels.items() if p.fullmatch(label)), label) for label in failed}


def test_each_variant_after_the_chapter_is_checked_by_what_it_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken on purpose, each technique's check goes red (and only the checks of what was broken)."""
    import attnlab.explain.tour.after_state as after_state
    from attnlab.functional.recurrent import linear_attention
    from attnlab.nn.attention import Attention

    assert _after_failures() == set()
    with monkeypatch.context() as m:  # the output gate left open, whatever the token
        m.setattr(Attention, "gate_for", lambda self, x: None if self.gate is None else torch.ones_like(self.gate(x)))
        assert _after_failures() == {"gate_by_hand", "gate_silent"}
    with monkeypatch.context() as m:  # QK-norm that normalizes nothing
        m.setattr(torch.nn.RMSNorm, "forward", lambda self, x: x)
        assert _after_failures() == {"qk_norm_same"}
    with monkeypatch.context() as m:  # a "delta rule" that only adds, as linear attention does

        def adds(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: object, beta: object, form: str) -> object:
            out, (state, _) = linear_attention(q, k, v, form=form)
            return out, state

        m.setattr(after_state, "gated_delta_rule", adds)
        assert _after_failures() == {"delta_replaces"}
    with monkeypatch.context() as m:  # implicit weights without the delta rule's correction: q . k, scaled
        m.setattr(
            after_state,
            "gated_delta_weights",
            lambda q, k, g, beta: (q @ k.transpose(-1, -2)).tril() * beta[..., None, :],
        )
        assert _after_failures() == {"delta_negative"}
    from attnlab.cache import plan
    from attnlab.cache.state import ConvolutionCache

    with monkeypatch.context() as m:  # a layer that shares keys given a cache of its own
        m.setitem(plan.TABLE, ("shared", "plain"), plan.TABLE[("full", "plain")])
        assert _after_failures() == {"share_cache"}
    import attnlab.explain.tour.after_shared as after_shared

    with monkeypatch.context() as m:  # a per-channel decay that decays every channel by the first one's
        real = after_shared.kimi_delta_rule
        m.setattr(
            after_shared,
            "kimi_delta_rule",
            lambda q, k, v, g, beta, form: real(q, k, v, g[..., :1].expand_as(g), beta, form=form),
        )
        assert _after_failures() == {"kda_channels"}
    with monkeypatch.context() as m:  # a convolution that forgets its last inputs between calls
        m.setattr(ConvolutionCache, "conv_state", lambda self: None)
        assert _after_failures() == {"conv_state_held"}
    from attnlab.cache import ModelCache, SlidingWindowCache
    from attnlab.cache.going_back import ToMark

    with monkeypatch.context() as m:  # a ring whose crop takes nothing back: the refused guesses stay in the window
        m.setattr(SlidingWindowCache, "crop", lambda self, n: None)
        assert _after_failures() == {"ring_back"}
    with monkeypatch.context() as m:  # a ring of its window alone, cropped anyway: the pass wrote over "with"
        ring_init = SlidingWindowCache.__init__
        m.setattr(SlidingWindowCache, "__init__", lambda self, **kw: ring_init(self, **{**kw, "spare": 0}))
        m.setattr(SlidingWindowCache, "reach", lambda self, n: n)
        assert _after_failures() == {"ring_back"}
    with monkeypatch.context() as m:  # a state that goes back to its mark's length but keeps what the pass wrote
        m.setattr(ToMark, "crop", lambda self, n: self._length.fill_(self.reach(n)))  # the tour's way
        assert _after_failures() == {"state_restored", "state_back"}
    with monkeypatch.context() as m:  # a model cache that says it holds what was asked, not the mark it went back to
        model_crop = ModelCache.crop
        m.setattr(ModelCache, "crop", lambda self, n: (model_crop(self, n), n)[1])
        assert _after_failures() == {"state_back"}  # "with one" never runs again; the state was restored
    from attnlab.bench.zoo_result import DECODE, PROMPT

    assert after_state.HELD_AFTER == PROMPT + DECODE  # the tour reads the run's measured cache after these tokens
