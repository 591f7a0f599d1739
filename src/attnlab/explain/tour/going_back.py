"""Tour, part 4, going back: a sliding window's ring and a recurrent state take back a refused guess.

Speculative decoding (``lookup=``, ``draft=``) writes a pass of guesses into every layer's cache, and the model
may refuse some of them: they must then leave no trace (``docs/caches.md``, "Going back"). Both steps play the
same pass on the chapter's six tokens: the prompt "Your journey starts" is held for certain; the pass reads
"with", the last token held for certain, and the guesses "one journey starts"; the model keeps "one", refuses
"journey" (and "starts", which came after it) and gives "step" itself. Each step checks its cache against one
that never saw the refused guesses, built here by the same calls without them.

Shapes: B = batch, Hkv = key/value heads, D = head size, C = the ring's slots (window + spare).
"""

from __future__ import annotations

import torch

from attnlab.book import WORDS
from attnlab.cache import ModelCache, SlidingWindowCache
from attnlab.cache.state import StateCache
from attnlab.cache.ways import going_back_as
from attnlab.explain.tour.core import Add, Checker
from attnlab.nn.attention import Attention
from attnlab.nn.recurrent import GatedDeltaNet

PROMPT = [0, 1, 2]  # "Your journey starts": held for certain
PASS = [3, 4, 1, 2]  # "with" (the last token held for certain), then the guesses "one", "journey", "starts"
KEPT = 5  # tokens held after the pass: the prompt, "with" and the one guess the model kept, "one"
TAKEN, REFUSED = PASS[: KEPT - len(PROMPT)], PASS[KEPT - len(PROMPT) :]  # "with one"; "journey starts"
NEXT = 5  # the model's own token after "one": "step"
WINDOW, SPARE = 3, 3  # the ring's window, and a slot more for each guess a pass may refuse


def going_back(add: Add, c: Checker, x: torch.Tensor) -> None:
    _ring_back(add, c, x)
    _state_back(add, c, x)


def _said(ids: list[int]) -> str:
    return " ".join(WORDS[i] for i in ids)


def _slots(ring: SlidingWindowCache, keys: torch.Tensor) -> list[str]:
    """Each slot as word@position: the word whose key (of ``keys``, (Hkv, T, D)) it holds, the position it reads
    as; "-" for nothing."""
    cells = []
    for slot, position in enumerate(ring.positions().tolist()):
        held = ring.k_cache[0, :, slot]  # (Hkv, D)
        word = next((WORDS[i] for i in range(keys.shape[1]) if torch.allclose(keys[:, i], held, atol=1e-6)), "-")
        cells.append("-" if word == "-" and position < 0 else f"{word}@{position if position >= 0 else '-'}")
    return cells


def _window(ring: SlidingWindowCache) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """What the newest token's window reads: its positions, in order, and their keys and values (B, Hkv, W, D)."""
    positions = ring.positions()
    newest = ring.length - 1
    order = sorted((p, s) for s, p in enumerate(positions.tolist()) if p >= 0 and newest - ring.window < p <= newest)
    slots = torch.tensor([s for _, s in order], dtype=torch.long)
    return [p for p, _ in order], ring.k_cache[:, :, slots], ring.v_cache[:, :, slots]


def _ring_back(add: Add, c: Checker, x: torch.Tensor) -> None:
    torch.manual_seed(123)
    local = Attention(d_in=3, d_out=8, num_heads=4, window=WINDOW, backend="eager")
    keys = local.split_qkv(x)[1][0]  # (Hkv, T, D): each word's key, to name what a slot holds
    caches = [ModelCache.build([local.layer_state()], rows=1, capacity=7, spare=SPARE) for _ in range(2)]
    ring, clean = (cache[0] for cache in caches)
    assert isinstance(ring, SlidingWindowCache) and isinstance(clean, SlidingWindowCache)
    rows = []
    local(x[:, PROMPT], cache=ring)
    rows.append((_slots(ring, keys), c.say("ring_prompt")))
    local(x[:, PASS], cache=ring)  # the pass: "with" and three guesses
    rows.append((_slots(ring, keys), c.say("ring_pass")))
    held = caches[0].crop(KEPT)  # back to 5 tokens: "journey" and "starts" refused
    rows.append((_slots(ring, keys), c.say("ring_crop", n=KEPT, held=held)))
    out = local(x[:, NEXT : NEXT + 1], cache=ring)
    rows.append((_slots(ring, keys), c.say("ring_next", word=WORDS[NEXT])))
    local(x[:, PROMPT], cache=clean)  # the same calls, without the refused guesses
    local(x[:, TAKEN], cache=clean)
    clean_out = local(x[:, NEXT : NEXT + 1], cache=clean)
    seen, seen_clean = _window(ring), _window(clean)

    def named(window: tuple[list[int], torch.Tensor, torch.Tensor], cache: SlidingWindowCache) -> str:
        cells = dict(zip(cache.positions().tolist(), _slots(cache, keys), strict=True))
        return " ".join(cells[p] for p in window[0])

    add(
        "ring_back",
        f"ring = ModelCache.build([local.layer_state()], rows=1, capacity=7, spare={SPARE})\n# "
        + c.say("cm_spare", window=WINDOW, spare=SPARE)
        + f"\nlocal(x[:, :{len(PROMPT)}], cache=ring[0])  # "
        + c.say("cm_prompt", said=_said(PROMPT))
        + "\n# "
        + c.say("cm_pass", certain=WORDS[PASS[0]], guesses=_said(PASS[1:]))
        + f"\nlocal(x[:, {PASS}], cache=ring[0])"
        + f"\nring.crop({KEPT})  # "
        + c.say("cm_refused", kept=_said(TAKEN[1:]), refused=_said(REFUSED))
        + f"\nlocal(x[:, {NEXT}:{NEXT + 1}], cache=ring[0])  # "
        + c.say("cm_own", word=WORDS[NEXT]),
        c.say("ring_slots", slots=ring.slots)
        + "\n"
        + "\n".join("".join(f"{cell:<10}" for cell in cells) + f"  {label}" for cells, label in rows)
        + "\n"
        + c.say("ring_sees", word=WORDS[NEXT], seen=named(seen, ring))
        + "\n"
        + c.say("ring_clean", seen=named(seen_clean, clean)),
        c.holds(
            "ring_back",
            seen[0] == seen_clean[0]
            and torch.allclose(seen[1], seen_clean[1], atol=1e-6)
            and torch.allclose(seen[2], seen_clean[2], atol=1e-6)
            and torch.allclose(out, clean_out, atol=1e-6),
            n=KEPT,
            word=WORDS[NEXT],
        ),
    )


def _numbers(state: StateCache) -> str:
    """Head 0's (D, D) state as one row of its D * D numbers, as the cache steps print a row."""
    return "[" + ", ".join(f"{v:7.4f}" for v in state.matrix[0, 0].flatten().tolist()) + "]"


def _state_back(add: Add, c: Checker, x: torch.Tensor) -> None:
    torch.manual_seed(123)
    layer = GatedDeltaNet(d_in=3, num_heads=2, head_dim=2, chunk_size=4)
    built = [ModelCache.build([layer.layer_state()], rows=1, capacity=7) for _ in range(2)]
    caches = [ModelCache(going_back_as(cache, "mark")) for cache in built]  # the way that re-runs (not the default)
    state, clean = (cache[0] for cache in caches)
    assert isinstance(state, StateCache) and isinstance(clean, StateCache)
    rows = []
    layer(x[:, PROMPT], cache=state)
    caches[0].mark()  # a copy of the state, before the pass
    at_mark = state.matrix.clone()  # (B, H, D, D)
    rows.append((_numbers(state), c.say("state_mark", said=_said(PROMPT))))
    layer(x[:, PASS], cache=state)
    after_pass = state.matrix.clone()
    rows.append((_numbers(state), c.say("state_pass", said=_said(PASS))))
    held = caches[0].crop(KEPT)  # the state cannot stop at 5 tokens: back to the mark
    restored = torch.equal(state.matrix, at_mark) and state.length == len(PROMPT)
    rows.append((_numbers(state), c.say("state_crop", n=KEPT, held=held)))
    ran = (PROMPT + TAKEN)[held:]  # what crop went back past and the model kept: run again
    if ran:
        layer(x[:, ran], cache=state)
    rows.append((_numbers(state), c.say("state_again", said=_said(ran))))
    layer(x[:, PROMPT], cache=clean)  # the same calls, without the refused guesses
    layer(x[:, TAKEN], cache=clean)
    rows.append((_numbers(clean), c.say("state_clean", said=_said(REFUSED))))
    add(
        "state_back",
        "cache = ModelCache(going_back_as(ModelCache.build([layer.layer_state()], rows=1, capacity=7), 'mark'))\n"
        f"layer(x[:, :{len(PROMPT)}], cache=cache[0])  # "
        + c.say("cm_prompt", said=_said(PROMPT))
        + "\ncache.mark()  # "
        + c.say("cm_mark")
        + "\n# "
        + c.say("cm_pass", certain=WORDS[PASS[0]], guesses=_said(PASS[1:]))
        + f"\nlayer(x[:, {PASS}], cache=cache[0])"
        + f"\ncache.crop({KEPT})  # -> {held}: "
        + c.say("cm_to_mark")
        + f"\nlayer(x[:, {held}:{KEPT}], cache=cache[0])  # "
        + c.say("cm_again", said=_said(ran)),
        c.say("state_head") + "\n" + "\n".join(f"{numbers}  {label}" for numbers, label in rows),
        c.holds("state_restored", restored, n=KEPT, held=len(PROMPT)),
        c.holds(
            "state_back",
            torch.equal(state.matrix, clean.matrix)
            and state.length == clean.length == KEPT
            and not torch.equal(after_pass, clean.matrix),
            said=_said(REFUSED),
        ),
    )
