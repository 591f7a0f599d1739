"""Characters, not bytes (issue 35, part 3): a token that is a part of a character is labelled by the character
and its place ("字 1/3"), never by a byte; a view can merge each character's tokens (keys summed, queries
averaged) and says so. Chinese and emoji, on the byte-level models and on a BPE tokenizer, in the browser."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from attnlab.explain.model_report import attention_view, by_character, model_report
from attnlab.models import GPT, ByteTokenizer, load_tokenizer
from attnlab.models.checkpoints import locate
from attnlab.models.tokenizer import Tokenizer, character_groups, part_labels
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
