"""A model's attention on a text, read for a reader: the tokens' labels and every layer's weights (by token or
by character), each layer's kind, each head's name, and the interactive view of them all (``model_report``
puts them in the report)."""

from __future__ import annotations

import torch

from attnlab.explain.heads import SCORES, HeadScores, head_scores
from attnlab.explain.render.view import AttentionView
from attnlab.explain.render.view_data import MAX_VIEW_TOKENS
from attnlab.explain.report import MAX_TOKENS
from attnlab.explain.report_text import REPORT_TEXT
from attnlab.explain.selection import selecting_layers
from attnlab.explain.selection_report import selection_view
from attnlab.models.gpt import GPT
from attnlab.models.graphemes import visible
from attnlab.models.tokenizer import TextTokenizer, character_groups, part_labels


def model_weights(
    model: GPT,
    tokenizer: TextTokenizer,
    text: str,
    *,
    most: int = MAX_TOKENS,
    what: str = "the model report",
    characters: bool = False,
) -> tuple[list[str], torch.Tensor]:
    """The text's tokens (as labels: a part of a character as "字 1/3") and every layer's weights for it,
    (L, H, T, T); at most ``most`` tokens. ``characters``: one label and one row and column per character
    instead (:func:`by_character`), (L, H, C, C)."""
    ids = tokenizer.encode(text)
    if not ids:
        raise ValueError(f"the text has no tokens: {text!r}")
    limit = min(most, model.config.context_length)  # more rows than MAX_TOKENS make an unreadable heatmap
    if len(ids) > limit:
        raise ValueError(f"the text has {len(ids)} tokens; {what} shows at most {limit}, shorten it")
    if max(ids) >= model.config.vocab_size:
        raise ValueError(
            f"the tokenizer gives id {max(ids)} but the model knows {model.config.vocab_size} tokens: "
            "pass the tokenizer the model was trained with (--tokenizer)"
        )
    groups = character_groups(tokenizer, ids)
    labels = tokenizer.tokens(text)  # a part of a character marked as one (字 1/3), an unknown one as typed
    if len(labels) != len(ids):  # a tokenizer of one's own whose labels do not match its ids: from the ids
        labels = part_labels(groups)
    weights = model.attention_weights(torch.tensor([ids]))[:, 0]  # (L, H, T, T) of the one sequence
    if characters:  # one label per character as a reader sees it (a grapheme cluster): 🇨🇳, é, 1️⃣
        merged = [labels[members[0]] if len(members) == 1 else visible(text) for members, text in groups]
        return merged, by_character(weights, [members for members, _ in groups])
    return labels, weights


def by_character(weights: torch.Tensor, groups: list[list[int]]) -> torch.Tensor:
    """Weights (..., T, T) between tokens as weights (..., C, C) between the C groups of tokens (characters):
    a key's weight is the sum over its character's tokens (the attention the character gets), a query's row the
    mean over its character's tokens (each row still sums to what a token's row sums to)."""
    t = weights.shape[-1]
    member = torch.zeros(len(groups), t, dtype=weights.dtype)  # (C, T): which tokens make each character
    for c, tokens in enumerate(groups):
        member[c, tokens] = 1.0
    keys = weights @ member.T  # (..., T, C): summed over each character's tokens
    return (member / member.sum(dim=1, keepdim=True)) @ keys  # (..., C, C): queries averaged


def layer_kind(
    window: int | None,
    latent: tuple[int, int] | None,
    txt: dict[str, str],
    *,
    layer_type: str = "full",
    state: int | None = None,
    source: int | None = None,
) -> str:
    """A layer's kind as the report and the view name it: full attention, or a sliding window (Mistral, Qwen2's
    pattern, Gemma 3's local and gpt-oss's banded layers); DeepSeek's latent attention says what it caches; a
    recurrent layer (the zoo's linear attention and Gated DeltaNet) says the size of its state (``state``
    values, whatever the length) and that its weights are implicit; a layer that shares keys (Gemma 4) names
    the layer whose keys it reads (``source``)."""
    if layer_type in ("linear", "delta", "kda", "conv"):
        return txt[f"layer_{layer_type}"].format(values=f"{state:,}" if state is not None else "?")
    kind = txt["layer_full"] if window is None else txt["layer_sliding"].format(window=window)
    if source is not None:
        kind += " · " + txt["layer_shared"].format(source=source)
    if latent is not None:
        kind = txt["layer_latent"].format(values=latent[0], heads=f"{latent[1]:,}") + (
            "" if window is None else f" · {kind}"
        )
    return kind


def layer_kinds(model: GPT, txt: dict[str, str]) -> list[str]:
    """Every layer's kind (:func:`layer_kind`), read off the model's layers."""
    return [
        layer_kind(
            block.att.window,
            _latent(model),
            txt,
            layer_type=model.config.layer_type(i),
            state=_state(block),
            source=model.config.kv_source(i),
        )
        for i, block in enumerate(model.blocks)
    ]


def _state(block: torch.nn.Module) -> int | None:
    values = getattr(block.att, "state_values", None)
    return values if isinstance(values, int) else None


def _latent(model: GPT) -> tuple[int, int] | None:
    """MLA's cache a token: the latent and its RoPE key (what it keeps), and every head's keys and values (what
    full heads of the same sizes would keep)."""
    c = model.config
    if c.kv_lora_rank is None:
        return None
    return c.kv_lora_rank + c.qk_rope_head_dim, c.n_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim)


def head_names(scores: HeadScores, txt: dict[str, str]) -> list[list[str]]:
    """Each head's name and its best score, "induction 0.93", or "- 0.09" for a head no score names."""
    n_layers, n_heads = len(scores.induction), len(scores.induction[0])
    best = lambda i, j: max(getattr(scores, s)[i][j] for s in SCORES)
    name = lambda i, j: txt["name_" + (scores.label(i, j) or "none").replace("-", "_")]
    return [[f"{name(i, j)} {best(i, j):.2f}" for j in range(n_heads)] for i in range(n_layers)]


def attention_view(
    model: GPT,
    tokenizer: TextTokenizer,
    text: str,
    *,
    lang: str = "en",
    cache: str | None = None,
    characters: bool = False,
) -> AttentionView:
    """Every head of ``model`` on ``text`` (up to 1024 tokens), each named by its scores on the probe; with
    ``cache`` (a name in ``attnlab.cache.CACHES``), the keys each layer's cache lets go are shown struck out;
    with ``characters``, one row and column per character (:func:`by_character`), and the view says so.
    In a notebook it shows itself; ``.save("view.html")`` writes one offline page."""
    _check_characters(characters, cache)
    labels, weights = model_weights(
        model, tokenizer, text, most=MAX_VIEW_TOKENS, what="the view", characters=characters
    )
    names = head_names(head_scores(model), REPORT_TEXT[lang])
    return _view(model, tokenizer, text, labels, weights, names, lang, cache, characters=characters)


def _check_characters(characters: bool, cache: str | None) -> None:
    if characters and cache is not None:
        raise ValueError(
            "characters merges each character's tokens, and a cache holds tokens: show the cache by token "
            "(drop characters) or the characters without the cache"
        )


def characters_note(tokenizer: TextTokenizer, text: str, txt: dict[str, str], *, characters: bool) -> str:
    """What the labels are, when the text has characters of several tokens: merged, or marked as parts."""
    ids = tokenizer.encode(text)
    groups = character_groups(tokenizer, ids)
    if len(groups) == len(ids):
        return ""
    return txt["characters_note"].format(tokens=len(ids), chars=len(groups)) if characters else txt["parts_note"]


def _view(
    model: GPT,
    tokenizer: TextTokenizer,
    text: str,
    labels: list[str],
    weights: torch.Tensor,
    names: list[list[str]],
    lang: str,
    cache: str | None,
    *,
    characters: bool,
) -> AttentionView:
    held = None
    if cache is not None:
        from attnlab.explain.cache_view import check_cache_name, held_by_layer

        check_cache_name(cache)
        held = held_by_layer(model, tokenizer.encode(text), cache)
    windows = [block.att.window for block in model.blocks]
    kinds = layer_kinds(model, REPORT_TEXT[lang])
    signed = [bool((w < 0).any()) for w in weights]  # Gated DeltaNet's implicit weights: the delta rule subtracts
    if any(signed):  # the view draws sizes: each such layer is drawn by |w| and its label says so
        weights = torch.stack([w.abs() if s else w for w, s in zip(weights, signed, strict=True)])  # (L, H, T, T)
        kinds = [k + REPORT_TEXT[lang]["shown_by_size"] if s else k for k, s in zip(kinds, signed, strict=True)]
    selection = ""
    if selecting_layers(model) and not characters:  # the keys each sparse query chose, beside the dense weights
        selection = selection_view(model, torch.tensor([tokenizer.encode(text)]), labels, lang=lang)
    return AttentionView(
        selection=selection,
        tokens=labels,
        weights=weights,
        names=names,
        lang=lang,
        held=held,
        cache=cache or "",
        kinds=kinds,
        windows=windows,
        sinks=any(model.config.layer_shape(i).sinks for i in range(model.config.n_layers)),  # some types (MiMo)
        note=characters_note(tokenizer, text, REPORT_TEXT[lang], characters=characters),
    )
