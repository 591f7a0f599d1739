"""StreamingLLM (Xiao et al. 2023, arXiv 2309.17453) on the shipped text model, past its context.

The text model (``attnlab train text``: 4 layers, rotary positions, 256-byte context) reads held-out text
``contexts`` times longer than its context, one byte at a time, and predicts each next byte in six ways:

- ``recompute``: the last W bytes run from scratch for every prediction (W = the context): the oracle, at W
  times the work; the window's first byte always sits at position 0;
- ``dense``: every byte kept (a plain cache), so past the context the model meets distances it never trained on;
- ``window``: a cache of the latest W bytes and nothing else (StreamingLLM's "window attention");
- ``sinks-1``, ``sinks-2``, ``sinks-4``: attnlab's ``sink`` cache, the first k bytes kept for good beside the
  latest W - k (every cache holds W bytes).

Measured: each byte's negative log-likelihood; the perplexity of the bytes past the first W (where the ways
differ), per text, and the mean NLL in bins of ``BIN`` bytes for the plot. The texts are the seeds: each is
another stretch of held-out text, and the spread over them is what tells a difference from noise.

Shapes: B = texts, N = bytes a text, W = the window (the model's context), V = vocabulary.
"""

from __future__ import annotations

import datetime
import functools
import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from attnlab._checks import check_positive_int
from attnlab.bench.sinks_result import StreamingResult
from attnlab.cache import CACHES, Capabilities
from attnlab.cache.kv import SlidingWindowCache
from attnlab.explain.sinks.reading import read_gpt

ARMS = ("recompute", "dense", "window", "sinks-1", "sinks-2", "sinks-4")
BIN = 64  # bytes a bin of the plotted curve
CHUNK = 64  # windows recomputed in one batch


class WindowAttentionCache:
    """StreamingLLM's "window attention": the latest ``recent`` keys in a ring, the first ones let go for good.

    A cache of the Cache protocol around attnlab's ring (``SlidingWindowCache``). A full layer refuses the ring
    itself, rightly: it would lose keys. Here losing them is the experiment, so the ring is handed over without
    a ``window`` of its own to check; one token a call, so no query ever sees past the ring."""

    capabilities = Capabilities(past_context=True)

    def __init__(self, **kw: Any) -> None:
        self.ring = SlidingWindowCache(
            batch_size=kw["batch_size"],
            num_kv_heads=kw["num_kv_heads"],
            head_dim=kw["head_dim"],
            window=kw["recent"],
            dtype=kw["dtype"],
            device=kw["device"],
        )

    def next_positions(self, t: int) -> torch.Tensor:
        if t != 1:
            raise ValueError(f"window attention here takes one token a call (the experiment's); got {t}")
        return self.ring.next_positions(t)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.ring.update(k, v)

    def room(self) -> int | None:
        return 1

    def observe(self, *args: Any, **kwargs: Any) -> None:
        return None


def cache_for(arm: str, window: int) -> Any:
    """The cache factory of a cached arm, every one holding ``window`` tokens."""
    if arm == "dense":
        return "plain"
    if arm == "window":
        return lambda **kw: WindowAttentionCache(recent=window, **kw)
    if arm.startswith("sinks-"):
        sinks = int(arm.removeprefix("sinks-"))
        return functools.partial(CACHES["sink"], sinks=sinks, recent=window - sinks)
    raise ValueError(f"unknown arm {arm!r}; the arms are {list(ARMS)}")


@torch.no_grad()
def nll_cached(model: Any, text: torch.Tensor, cache: Any) -> torch.Tensor:
    """(B, N - 1): the NLL of bytes 1..N-1 of ``text`` (B, N), fed one at a time through ``cache``."""
    b, n = text.shape
    held = model.make_caches(batch_size=b, max_len=n, cache=cache)
    nll = []
    for p in range(n - 1):
        logits = model(text[:, p : p + 1], caches=held, last_only=True)[:, 0]  # (B, V)
        nll.append(F.cross_entropy(logits.double(), text[:, p + 1], reduction="none"))
    return torch.stack(nll, dim=1)


@torch.no_grad()
def nll_recomputed(model: Any, text: torch.Tensor, window: int) -> torch.Tensor:
    """(B, N - 1): byte p + 1 predicted from bytes max(0, p - W + 1)..p run from scratch (positions from 0)."""
    b, n = text.shape
    first = model(text[:, :window])  # (B, W, V): the predictions inside the first window need no sliding
    nll = [F.cross_entropy(first[:, :-1].double().transpose(1, 2), text[:, 1:window], reduction="none")]
    ends = list(range(window, n))  # predict byte e from bytes e - W .. e - 1
    for start in range(0, len(ends), CHUNK):
        part = ends[start : start + CHUNK]
        windows = torch.stack([text[:, e - window : e] for e in part], dim=1)  # (B, C, W)
        logits = model(windows.flatten(0, 1), last_only=True)[:, 0].view(b, len(part), -1)  # (B, C, V)
        targets = text[:, part]  # (B, C)
        nll.append(F.cross_entropy(logits.double().transpose(1, 2), targets, reduction="none"))
    return torch.cat(nll, dim=1)


def held_out_texts(model: Any, *, texts: int, length: int, seed: int = 0) -> torch.Tensor:
    """(texts, length): stretches of the held-out tenth of the text the model was trained on, apart from each
    other, at seeded places."""
    from attnlab.models.tasks import TextTask, stdlib_text

    data = TextTask(stdlib_text(), seq_len=model.config.context_length).splits["eval"]
    slots = data.numel() // length
    if slots < texts:
        raise ValueError(f"the held-out text holds {slots} stretches of {length} bytes; ask for {slots} or fewer")
    chosen = torch.randperm(slots, generator=torch.Generator().manual_seed(seed))[:texts].sort().values
    return torch.stack([data[s * length : (s + 1) * length] for s in chosen.tolist()])


Report = Callable[[str], None]


def run_streaming(
    model: Any,
    *,
    contexts: int = 4,
    texts: int = 3,
    arms: tuple[str, ...] = ARMS,
    caches: dict[str, Any] | None = None,
    report: Report | None = None,
    seed: int = 0,
    text: torch.Tensor | None = None,
    name: str = "text",
) -> StreamingResult:
    """Every arm on ``texts`` held-out texts of ``contexts`` x the model's context (or on ``text``, (texts, N),
    for a model of another task, named ``name``: "text" or "backcopy"). ``caches`` replaces an arm's cache by
    name."""
    check_positive_int("contexts", contexts, limit=64)
    check_positive_int("texts", texts, limit=64)
    if contexts < 2:
        raise ValueError(f"contexts must be >= 2: the ways differ only past the first context; got {contexts}")
    unknown = [a for a in arms if a not in ARMS]
    if unknown or "recompute" not in arms:
        raise ValueError(f"arms must be among {list(ARMS)} and include 'recompute'; got {list(arms)}")
    if not model.config.rope:
        raise ValueError("the streaming run needs rotary positions: learned ones end at the model's context")
    say = report or (lambda line: None)
    began = time.perf_counter()
    window = model.config.context_length
    if text is None:
        text = held_out_texts(model, texts=texts, length=contexts * window, seed=seed)
    elif tuple(text.shape) != (texts, contexts * window):
        raise ValueError(
            f"text must be ({texts}, {contexts * window}): texts x contexts x the context; got {tuple(text.shape)}"
        )
    shares = torch.tensor(read_gpt(model, text[:, :window]).first_token)  # (L, H): on the first context
    uniform = float((1.0 / torch.arange(2, window + 1, dtype=torch.float64)).mean())  # row i gives 1 / (i + 1)
    nll: dict[str, torch.Tensor] = {}
    interrupted = False
    try:  # Ctrl-C (or SIGTERM, which the CLI turns into one): the arms finished, every text each, are kept
        for arm in arms:
            start = time.perf_counter()
            if arm == "recompute":
                nll[arm] = nll_recomputed(model, text, window)
            else:
                nll[arm] = nll_cached(model, text, (caches or {}).get(arm, cache_for(arm, window)))
            say(f"{arm}: {time.perf_counter() - start:.1f} s")
    except KeyboardInterrupt:
        interrupted = True
    past = {arm: values[:, window - 1 :] for arm, values in nll.items()}  # bytes W..N-1: predicted past W
    n = text.shape[1] - 1  # bytes predicted in a text
    return StreamingResult(
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        model=name,
        context=window,
        contexts=contexts,
        texts=texts,
        seed=seed,
        bin=BIN,
        arms=list(nll),
        ppl={arm: [math.exp(float(row.mean())) for row in values] for arm, values in past.items()},
        curve={arm: [float(values[:, a : a + BIN].mean()) for a in range(0, n, BIN)] for arm, values in nll.items()},
        first_token=float(shares.mean()),
        largest_first=float(shares.max()),
        uniform=uniform,
        seconds=time.perf_counter() - began,
        interrupted=interrupted,
    )
