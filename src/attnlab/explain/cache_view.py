"""The KV-cache lab made visible: what a cache holds as a model generates, in a report's sections.

``cache_sections(model, tokenizer, text, cache)`` runs the text through the
model with the named cache and greedy-generates a few tokens, watching the
cache after every step:

- paged: which block holds each token (a new block when one fills);
- prefix: the text twice, as two sequences sharing one tree: the second
  takes the first's full blocks (the same block ids) and computes the rest;
- sink, h2o, snapkv: which tokens are held at each step, and which were let
  go (for the eviction policies, per layer at the end as well);
- int8, int4: each layer's quantization error on the keys at every position
  (against the same tokens through the exact cache), the latest exact;
- plain: every token, kept.

Every figure is a grid of steps (or sequences, or layers) by token.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from attnlab.cache import (
    CACHES,
    EvictingCache,
    KVCache,
    PagedKVCache,
    PrefixCache,
    QuantizedKVCache,
    SinkCache,
    capabilities_of,
)
from attnlab.cache.state import StateCache
from attnlab.explain.render.figure_output import page_figure
from attnlab.explain.render.heatmap import heatmap
from attnlab.explain.render.html import Section
from attnlab.explain.report_text import REPORT_TEXT
from attnlab.models.generation import Request, Stop, decode, prefill
from attnlab.models.gpt import GPT
from attnlab.models.tokenizer import TextTokenizer, character_groups, part_labels

NEW_TOKENS = 8
MAX_PROMPT = 48  # a grid of steps x tokens stays readable
# sizes that show something on a short text: a window of 16 after the sinks, groups of 8 with the latest 8 exact
SHOWN: dict[str, Any] = {
    "sink": functools.partial(CACHES["sink"], recent=16),
    "int8": functools.partial(CACHES["int8"], group_size=8, residual=8),
    "int4": functools.partial(CACHES["int4"], group_size=8, residual=8),
}


def check_cache_name(cache: object) -> None:
    if cache not in CACHES:
        raise ValueError(f"--cache {cache!r} is not a cache; the caches are {list(CACHES)}")


def check_cache_args(cache: str, model: GPT, tokenizer: TextTokenizer, text: str) -> list[int]:
    """The prompt's ids, or the error that says what to change (before anything runs)."""
    check_cache_name(cache)
    ids = tokenizer.encode(text)
    if not ids:
        raise ValueError(f"the text has no tokens: {text!r}")
    limit = min(MAX_PROMPT, model.config.context_length - NEW_TOKENS)
    if len(ids) > limit:
        raise ValueError(f"the text has {len(ids)} tokens; the cache view shows at most {limit}: shorten it")
    return ids


@torch.no_grad()
def cache_sections(
    model: GPT, tokenizer: TextTokenizer, text: str, cache: str, *, lang: str = "en", figures: bool = True
) -> list[Section]:
    """One section: the cache ``cache`` as ``model`` reads ``text`` and generates ``NEW_TOKENS`` tokens."""
    txt = REPORT_TEXT[lang]
    ids = check_cache_args(cache, model, tokenizer, text)
    caps = capabilities_of(cache)
    if caps.shares_prefixes:
        grid, rows, value = _prefix(model, ids, txt)
    else:
        grid, rows, value, ids = _watch(model, ids, cache, txt)
    labels = cache_labels(tokenizer, ids)
    title = txt["cache_title"].format(cache=cache)
    drawn = []
    if figures:
        fig = heatmap(
            grid,
            rows,
            labels[: grid.shape[1]],
            title=title,
            axes=(txt["cache_tokens"], ""),
            wide=True,
            annotate=caps.rows,  # block ids
            limits=None,
        )
        drawn = [page_figure(fig, title)]
    return [
        Section(
            key=f"cache-{cache}",
            title=title,
            text=txt[f"cache_{cache}"],
            code=f'model.generate(ids, {NEW_TOKENS}, cache="{cache}")',
            value=value,
            figures=drawn,
            checks=[],
            wide=True,  # steps x tokens, wrapped into panels as wide as the section
        )
    ]


def cache_labels(tokenizer: TextTokenizer, ids: list[int]) -> list[str]:
    """A column label per token: a token that is a part of a character (as a reader sees it) labelled by the
    character and its place (字 1/3, 🇨🇳 5/8), never by a byte's U+FFFD."""
    return part_labels([(members, _short(text)) for members, text in character_groups(tokenizer, ids)])


def _short(label: str) -> str:
    """A token as a column label: a space or a new line drawn as a sign (a blank label reads as a missing one)."""
    return label.replace("\n", "⏎").replace(" ", "␣") or "·"


def _watch(
    model: GPT, ids: list[int], cache: str, txt: dict[str, str]
) -> tuple[torch.Tensor, list[str], str, list[int]]:
    """Generate greedily through ``cache`` and an exact cache fed the same tokens; a grid of what it holds."""
    total = len(ids) + NEW_TOKENS
    caches = model.make_caches(batch_size=1, max_len=total, cache=SHOWN.get(cache, cache))
    tokens = list(ids)
    snapshots: list[torch.Tensor] = []  # per step: (T,) 1 held, 0.5 let go / block ids for paged
    said: list[str] = []  # per step: what the cache holds, said then (a paged row is given back at the end)
    for drawn in decode(model, Request(prompts=(tuple(ids),), stop=Stop(max_new_tokens=NEW_TOKENS), cache=caches)):
        snapshots.append(_held(caches[0], len(tokens), total))  # after the pass that fed every token so far
        said.append(_describe(caches[0], snapshots[-1], txt))
        tokens += [token for _, token in drawn]
    exact = model.make_caches(batch_size=1, max_len=total, cache="plain")
    prefill(model, torch.tensor([tokens[:-1]]), exact)  # the tokens the cache was fed (the last one never is)
    grid = torch.stack(snapshots)  # (steps, total)
    rows = [txt["cache_step"].format(n=len(ids) + s) for s in range(NEW_TOKENS)]
    colon = txt["colon"]
    lines = [f"{r}{colon}{line}" for r, line in zip(rows, said, strict=True)]
    first = caches[0]
    if isinstance(first, QuantizedKVCache):
        errors = torch.stack([_key_error(c, e, len(tokens) - 1) for c, e in zip(caches, exact, strict=True)])
        grid = errors  # (layers, tokens)
        rows = [txt["cache_layer"].format(n=n) for n in range(len(caches))]
        lines = [f"{r}{colon}{txt['cache_error']} {float(e.max()):.4f}" for r, e in zip(rows, errors, strict=True)]
    elif isinstance(first, EvictingCache):
        lines += [
            f"{txt['cache_layer'].format(n=n)}{colon}{txt['cache_kept']} {c.positions[0].tolist()}"  # type: ignore[attr-defined]
            for n, c in enumerate(caches)
        ]
    return grid, rows, "\n".join(lines), tokens


@torch.no_grad()
def held_by_layer(model: GPT, ids: list[int], cache: str) -> torch.Tensor:
    """(layers, T) bool: which of the text's tokens each layer's ``cache`` still holds once it has read them all
    (with the sizes the cache view shows; an evicting cache chooses per layer)."""
    if capabilities_of(cache).rows:  # blocks of every token: nothing let go
        return torch.ones(model.config.n_layers, len(ids), dtype=torch.bool)
    caches = model.make_caches(batch_size=1, max_len=len(ids) + 1, cache=SHOWN.get(cache, cache))
    prefill(model, torch.tensor([ids]), caches)
    return torch.stack([_held(c, len(ids), len(ids)) == 1.0 for c in caches])


def _held(cache: Any, seen: int, total: int) -> torch.Tensor:
    """(total,): 1 for a token the cache holds, 0.5 for one it let go, 0 for one not seen; block ids for paged."""
    out = torch.zeros(total)
    if isinstance(cache, PagedKVCache):
        table = cache.block_table[0]
        for p in range(seen):
            out[p] = float(table[p // cache.block_size])
        return out
    out[:seen] = 0.5
    if isinstance(cache, SinkCache):
        held = [p for p in cache.held_positions().tolist() if p >= 0]
    elif isinstance(cache, EvictingCache):
        held = cache.positions[0].tolist()
    elif isinstance(cache, StateCache):  # a recurrent layer holds no token, only the state they were folded into
        held = []
    else:  # plain, quantized: every token
        held = list(range(seen))
    out[held] = 1.0
    return out


def _describe(cache: Any, snapshot: torch.Tensor, txt: dict[str, str]) -> str:
    if isinstance(cache, PagedKVCache):
        return txt["cache_blocks"].format(
            blocks=cache.block_table[0][cache.block_table[0] >= 0].tolist(), waste=cache.waste()
        )
    held = (snapshot == 1).nonzero().flatten().tolist()
    gone = (snapshot == 0.5).nonzero().flatten().tolist()
    return txt["cache_held"].format(n=len(held), gone=gone)


def _key_error(cache: Any, exact: Any, seen: int) -> torch.Tensor:
    """(seen,): the largest error of each token's keys over heads and channels (a QuantizedKVCache against a
    KVCache fed the same tokens)."""
    assert isinstance(cache, QuantizedKVCache) and isinstance(exact, KVCache)
    keys, _ = cache.read()
    return (keys[0, :, :seen] - exact.k_cache[0, :, :seen]).abs().amax(dim=(0, 2))


def _prefix(model: GPT, ids: list[int], txt: dict[str, str]) -> tuple[torch.Tensor, list[str], str]:
    """The text as two sequences of one tree: the block ids each holds, and how much the second reused."""
    store = PrefixCache.for_model(model, batch_size=2, max_len=len(ids) + 1, num_blocks=4 * (len(ids) // 16 + 1))
    grid = torch.zeros(2, len(ids))
    rows, lines = [], []
    for row in (0, 1):
        done = store.admit(row, ids)  # the first finds an empty tree; the second, the first's full blocks
        model(torch.tensor([ids[done:]]), caches=store.views([row]), last_only=True)
        store.written(row, ids)
        table = store.blocks.table[row]
        for p in range(len(ids)):
            grid[row, p] = float(table[p // store.block_size])
        rows.append(txt["cache_sequence"].format(n=row))
        lines.append(txt["cache_reused"].format(seq=rows[-1], blocks=table[table >= 0].tolist(), n=done))
    lines.append(txt["cache_hit_rate"].format(rate=store.hit_rate))
    return grid, rows, "\n".join(lines)
