"""Characters, not bytes (issue 35, part 3): a token that is a part of a character is labelled by the character
and its place ("字 1/3"), never by a byte; a view can merge each character's tokens (keys summed, queries
averaged) and says so. Chinese and emoji, on the byte-level models and on a BPE tokenizer, in the browser."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from attnlab import cli
from attnlab.cli._wrap import wrap
from attnlab.explain.cache_view import cache_labels
from attnlab.explain.model_report import model_report
from attnlab.explain.model_view import attention_view, by_character, model_weights
from attnlab.explain.render.heatmap import head_grid, safe_label
from attnlab.explain.render.html import text_width
from attnlab.explain.render.view import AttentionView
from attnlab.models import GPT, ByteTokenizer, load_tokenizer
from attnlab.models.graphemes import graphemes, visible
from attnlab.models.locate import locate
from attnlab.models.tokenizer import CharTokenizer, Tokenizer, character_groups, part_labels
from test_report import _chromium

POEM = "床前明月光，疑是地上霜。"


def test_byte_tokens_of_a_character_are_labelled_by_it_and_their_place() -> None:
    byte = ByteTokenizer()
    assert byte.tokens("床前 a😀") == [
        "床 1/3", "床 2/3", "床 3/3", "前 1/3", "前 2/3", "前 3/3", " ", "a", "😀 1/4", "😀 2/4", "😀 3/4", "😀 4/4",
    ]  # fmt: skip
    groups = character_groups(byte, byte.encode("床前 a😀"))
    assert [(members, text) for members, text in groups] == [
        ([0, 1, 2], "床"), ([3, 4, 5], "前"), ([6], " "), ([7], "a"), ([8, 9, 10, 11], "😀"),
    ]  # fmt: skip
    unfinished = byte.encode("好")[:2]  # generation stopped inside a character: its bytes, as they decode
    assert part_labels(character_groups(byte, unfinished)) == ["\ufffd 1/2", "\ufffd 2/2"]


def _bpe_on_chinese(where: Path) -> Tokenizer:
    """A byte-level BPE trained here on Chinese and emoji, small enough that some characters stay split."""
    bpe = HFTokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=262, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([POEM * 4 + "😀 你好"] * 10, trainer)
    bpe.model.save(str(where))
    return Tokenizer.from_dir(where)


def test_a_bpe_tokenizer_splits_characters_and_the_labels_say_which(tmp_path: Path) -> None:
    bpe = _bpe_on_chinese(tmp_path)
    text = "明月 你好 😀"
    ids = bpe.encode(text)
    groups = character_groups(bpe, ids)
    assert "".join(t for _, t in groups) == text  # the groups cover the text, in order, whole characters each
    sizes = {len(members) for members, _ in groups}
    assert 2 in sizes and 1 in sizes  # a merge inside a character: 2 tokens (not 3 bytes), and whole tokens
    labels = bpe.tokens(text)
    assert len(labels) == len(ids) and not any("\ufffd" in label for label in labels)
    for members, part in groups:
        if len(members) > 1:
            assert [labels[m] for m in members] == [f"{part} {k}/{len(members)}" for k in range(1, len(members) + 1)]


def test_by_character_sums_a_characters_keys_and_averages_its_queries() -> None:
    """Tokens a | 字(1) 字(2) 字(3): a query's row over characters is the mean of its tokens' rows, each key the
    sum over its tokens; worked by hand."""
    w = torch.tensor(
        [
            [1.0, 0.0, 0.0, 0.0],
            [0.5, 0.5, 0.0, 0.0],
            [0.2, 0.4, 0.4, 0.0],
            [0.1, 0.3, 0.3, 0.3],
        ]
    ).expand(1, 1, 4, 4)
    merged = by_character(w, [[0], [1, 2, 3]])
    want = torch.tensor([[1.0, 0.0], [(0.5 + 0.2 + 0.1) / 3, (1.0 / 1 * 0.5 + 0.8 + 0.9) / 3]])
    torch.testing.assert_close(merged[0, 0], want)
    torch.testing.assert_close(merged.sum(-1), torch.ones(1, 1, 2))


@pytest.mark.slow  # slow by nature: a real browser over every shipped model
def test_every_shipped_models_view_of_a_poem_labels_whole_characters_in_the_browser(tmp_path: Path) -> None:
    """The shipped text model reads bytes: 36 tokens for 12 characters. By token, each is marked as a part of its
    character; by character, one row each, the weights merged and the view saying so. The poems model reads
    characters: 12 tokens, 12 labels. The induction model reads ASCII only and refuses the poem by name."""
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    model, tokenizer = GPT.from_pretrained("text"), load_tokenizer(locate("text"))
    parts = attention_view(model, tokenizer, POEM, lang="zh")
    merged = attention_view(model, tokenizer, POEM, lang="zh", characters=True)
    assert len(parts.tokens) == 36 and len(merged.tokens) == 12
    assert merged.weights.shape[-2:] == (12, 12)
    torch.testing.assert_close(merged.weights.sum(-1), torch.ones(4, 4, 12))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        for view, want in ((parts, [f"{c} {k}/3" for c in POEM for k in (1, 2, 3)]), (merged, list(POEM))):
            page.goto(view.save(tmp_path / f"poem-{len(view.tokens)}.html").as_uri())
            page.wait_for_selector(".attnview[data-ready='1']", timeout=10_000)
            assert page.locator(".col.q div").all_text_contents() == want
            assert page.locator(".col.k div").all_text_contents() == want
            note = page.locator(".note").text_content() or ""
            assert ("按字显示：这段文字的 36 个 Token 是 12 个字" in note) == (view is merged)
            assert ("字 1/3" in note) == (view is parts)
        browser.close()
    poems = attention_view(GPT.from_pretrained("poems"), load_tokenizer(locate("poems")), POEM, lang="zh")
    assert poems.tokens == list(POEM)  # the poems model reads characters: one token, one label, each
    with sync_playwright() as p:  # and the browser shows them so
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(poems.save(tmp_path / "poems.html").as_uri())
        page.wait_for_selector(".attnview[data-ready='1']", timeout=10_000)
        assert page.locator(".col.q div").all_text_contents() == list(POEM)
        assert page.locator(".note").count() == 0  # nothing to say: no character is split
        browser.close()
    with pytest.raises(ValueError, match=r"this model knows the 128 ASCII characters only; the text has '[^']*床"):
        attention_view(GPT.from_pretrained("induction"), load_tokenizer(locate("induction")), POEM)
    with pytest.raises(ValueError, match="characters merges each character's tokens, and a cache holds tokens"):
        model_report(model, tokenizer, POEM, name="text", cache="h2o", characters=True)


def test_a_stray_byte_is_a_group_of_its_own_and_never_swallows_the_text_after_it() -> None:
    """Bytes no character finishes (a lead byte whose character never comes, a continuation byte alone): each
    is a group as it decodes, U+FFFD, and the characters after it are their own groups, whole."""
    byte = ByteTokenizer()
    ids = [*b"a", 0xE5, *b"bc", 0x80, *"字".encode(), 0xE5, 0xA5, *b"d"]  # 0xE5 0xA5: 好 without its last byte
    assert character_groups(byte, ids) == [
        ([0], "a"), ([1], "\ufffd"), ([2], "b"), ([3], "c"), ([4], "\ufffd"), ([5, 6, 7], "字"),
        ([8, 9], "\ufffd"), ([10], "d"),
    ]  # fmt: skip
    assert part_labels(character_groups(byte, ids)) == [
        "a", "\ufffd", "b", "c", "\ufffd", "字 1/3", "字 2/3", "字 3/3", "\ufffd 1/2", "\ufffd 2/2", "d",
    ]  # fmt: skip


# What a reader sees as one character though it is several code points (issue 54, item 5): each with its UTF-8
# bytes counted by hand.
FLAG = "\U0001f1e8\U0001f1f3"  # 🇨🇳: two regional indicators, 4 + 4 bytes
SKIN = "\U0001f44d\U0001f3fd"  # 👍🏽: a thumb and a skin tone, 4 + 4
FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # 👨‍👩‍👧: three people joined by U+200D, 4 + 3 + 4 + 3 + 4
KEYCAP = "1\ufe0f\u20e3"  # 1️⃣: a digit, a variation selector, a keycap, 1 + 3 + 3
ACCENT = "e\u0301"  # é as e and a combining acute, 1 + 2
KANA = "\u304b\u3099"  # が as か and a combining voicing mark, 3 + 3
JAMO = "\u1100\u1161\u11a8"  # 각 as three conjoining jamo, L V T, 3 + 3 + 3
CASES = [(FLAG, 8), (SKIN, 8), (FAMILY, 18), (KEYCAP, 7), (ACCENT, 3), (KANA, 6), (JAMO, 9)]
ALL = "x" + "".join(c for c, _ in CASES) + "y"
ALL_BYTES = 1 + 8 + 8 + 18 + 7 + 3 + 6 + 9 + 1  # 61
ALL_SHOWN = ["x", FLAG, SKIN, FAMILY, KEYCAP, ACCENT, KANA, JAMO, "y"]  # one label each, as a reader sees them


@pytest.mark.parametrize(("cluster", "n"), CASES, ids=["flag", "skin", "family", "keycap", "accent", "kana", "jamo"])
def test_what_a_reader_sees_as_one_character_is_one_group_of_its_bytes(cluster: str, n: int) -> None:
    byte = ByteTokenizer()
    ids = byte.encode(f"x{cluster}y")
    assert len(ids) == n + 2  # the bytes as counted by hand
    assert character_groups(byte, ids) == [([0], "x"), (list(range(1, n + 1)), cluster), ([n + 1], "y")]
    assert byte.tokens(f"x{cluster}y") == ["x", *[f"{cluster} {k}/{n}" for k in range(1, n + 1)], "y"]
    assert graphemes(f"x{cluster}y") == ["x", cluster, "y"]


def test_tokens_that_decode_alone_join_when_a_reader_sees_one_character() -> None:
    """A tokenizer of one token per code point: e then U+0301 are two tokens, each whole alone, one character
    together; a part the vocabulary lacks is marked, and the model reads it as □."""
    chars = CharTokenizer(["x", "e", "\u0301", "\u304b", "\u3099", "\u1100", "\u1161", "\u11a8"])
    text = f"x{ACCENT}{KANA}{JAMO}"
    ids = chars.encode(text)
    assert character_groups(chars, ids) == [([0], "x"), ([1, 2], ACCENT), ([3, 4], KANA), ([5, 6, 7], JAMO)]
    assert chars.tokens(text) == [
        "x", f"{ACCENT} 1/2", f"{ACCENT} 2/2", f"{KANA} 1/2", f"{KANA} 2/2", f"{JAMO} 1/3", f"{JAMO} 2/3", f"{JAMO} 3/3",
    ]  # fmt: skip
    assert CharTokenizer(["e"]).tokens(ACCENT) == [f"{ACCENT} 1/2", f"{ACCENT}? 2/2"]


@pytest.fixture(scope="module")
def text_model() -> tuple[GPT, ByteTokenizer]:
    tokenizer = load_tokenizer(locate("text"))
    assert isinstance(tokenizer, ByteTokenizer)
    return GPT.from_pretrained("text"), tokenizer


def test_by_character_every_view_has_one_row_per_character_as_a_reader_sees_it(
    text_model: tuple[GPT, ByteTokenizer],
) -> None:
    """The text model reads bytes: 61 tokens, 9 characters. The rows, the heatmaps' labels and the view's labels
    are the 9; each merged weight is the per-character rule (a key summed over its tokens, a query's row the mean
    of its tokens' rows), worked here with plain sums over the hand-counted byte positions."""
    model, tokenizer = text_model
    labels, merged = model_weights(model, tokenizer, ALL, characters=True)
    assert labels == ALL_SHOWN
    tokens = model.attention_weights(torch.tensor([tokenizer.encode(ALL)]))[:, 0]  # (L, H, 61, 61)
    assert tokens.shape[-1] == ALL_BYTES
    starts = [0, 1, 9, 17, 35, 42, 45, 51, 60, 61]  # where each character's bytes begin, and the end
    spans = [range(a, b) for a, b in itertools.pairwise(starts)]
    want = torch.empty(*tokens.shape[:2], 9, 9)
    for i, queries in enumerate(spans):
        for j, keys in enumerate(spans):
            want[..., i, j] = tokens[..., queries, :][..., keys].sum(-1).mean(-1)
    torch.testing.assert_close(merged, want)
    grid = head_grid(merged[0], labels)  # what the report draws for layer 0
    heads = [ax for ax in grid.axes if ax.images]  # the colour bars aside
    assert len(heads) == 4
    for ax in heads:
        for ticks in (ax.get_xticklabels(), ax.get_yticklabels()):
            assert [t.get_text() for t in ticks] in ([], [safe_label(s) for s in ALL_SHOWN])  # a grid shares axes
    assert any(ax.get_yticklabels() for ax in heads) and any(ax.get_xticklabels() for ax in heads)
    view = attention_view(model, tokenizer, ALL, characters=True)
    assert view.tokens == ALL_SHOWN
    assert "61 tokens are 9 characters" in view.note
    data = view.to_fragment().split('class="attnview-data">')[1].split("</script>")[0]
    assert json.loads(data)["tokens"] == ALL_SHOWN  # what the page's script writes in its rows


def test_by_token_every_part_of_a_character_is_labelled_by_the_whole_character(
    text_model: tuple[GPT, ByteTokenizer],
) -> None:
    model, tokenizer = text_model
    want = ["x", *[f"{c} {k}/{n}" for c, n in CASES for k in range(1, n + 1)], "y"]
    labels, weights = model_weights(model, tokenizer, ALL)
    assert labels == want and weights.shape[-1] == ALL_BYTES
    assert attention_view(model, tokenizer, ALL).tokens == want


def test_the_terminal_counts_the_characters_a_reader_sees(
    text_model: tuple[GPT, ByteTokenizer], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["explain", "--model", "text", "--characters", ALL]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "the text's 61 tokens are 9 characters" in shown


def test_a_label_that_draws_nothing_alone_is_never_shown_alone(text_model: tuple[GPT, ByteTokenizer]) -> None:
    """A text that starts with a combining mark, a lone joiner or variation selector: shown on ◌, or by name."""
    assert visible("\u0301") == "\u25cc\u0301"
    assert visible("\u200d") == "[ZERO WIDTH JOINER]"
    assert visible("\ufe0f") == "[VARIATION SELECTOR-16]"
    assert visible(ACCENT) == ACCENT and visible(FAMILY) == FAMILY  # a mark with its character: as it is
    byte = ByteTokenizer()
    assert byte.tokens("\u0301a") == ["\u25cc\u0301 1/2", "\u25cc\u0301 2/2", "a"]
    view = AttentionView(tokens=["\u200d", "\u0301", "a"], weights=torch.eye(3).expand(1, 1, 3, 3))
    assert view.tokens == ["[ZERO WIDTH JOINER]", "\u25cc\u0301", "a"]
    assert "\u25cc" in safe_label("\u0301")  # the heatmaps' labels too
    labels, _ = model_weights(*text_model, "\u0301a", characters=True)  # merged by character: the same
    assert labels == ["\u25cc\u0301", "a"]


def test_the_cache_views_columns_are_labelled_by_character_never_by_a_byte() -> None:
    byte = ByteTokenizer()
    assert cache_labels(byte, byte.encode(f"a {FLAG}")) == ["a", "\u2423", *[f"{FLAG} {k}/8" for k in range(1, 9)]]


def test_widths_and_line_breaks_count_what_a_reader_sees_as_one_character() -> None:
    assert text_width(ACCENT) == 1 and text_width(KANA) == 2 and text_width("ab") == 2
    assert wrap(f"abcdefg{FLAG}", 8) == ["abcdefg", FLAG]  # the flag is never cut in two
