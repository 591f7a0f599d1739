"""The view's data, built one layer at a time: each pattern's weights as uint8 steps (dense, or past
MAX_VIEW_BYTES each row's keys the head view draws and each pattern's pooled picture), and the rollout.

Shapes: L = layers, H = heads, T = tokens, N = patterns, R = a picture's side.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from attnlab.explain.sinks.measures import first_token_share, learned_sink_share

MAX_VIEW_TOKENS = 1024  # the head view scrolls; past this the page grows past what a browser draws at ease
MAX_VIEW_BYTES = 32 * 2**20  # bytes of weights in one page, before base64; past it a browser takes seconds to open it
THUMB = 128  # the model view draws each head in at most this many pixels a side (max over each block of weights)


def rollout(weights: torch.Tensor) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema, 2020) of weights (L, H, T, T): (T, T), each row summing to 1.

    Each layer's heads are averaged and the residual stream counted as half: ``0.5 * A + 0.5 * I``,
    rows renormalised; the layers multiply, the first on the right.
    """
    t = weights.shape[-1]
    total, step = torch.eye(t, dtype=torch.float64), torch.empty(t, t, dtype=torch.float64)
    for layer in weights:  # (H, T, T), one layer at a time in float64 (not a float64 copy of them all)
        total = _rollout_step(layer, total, step=step)
    return total.float()


def _rollout_step(
    layer: torch.Tensor, total: torch.Tensor, *, step: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The rollout (T, T) float64 after one more layer (H, T, T); ``step`` (T, T) float64 is worked in place, the
    result goes into ``out`` when given."""
    step.copy_(layer[0])
    for head in layer[1:]:  # the heads' mean, summed in float64 head by head: no float64 copy of the layer
        step.add_(head)
    step.div_(layer.shape[0]).mul_(0.5).diagonal().add_(0.5)  # 0.5 * A + 0.5 * I
    step.div_(step.sum(dim=-1, keepdim=True))
    return torch.matmul(step, total, out=out)


SPARSE_STEP = 3  # 3 / 255 >= 0.01 > 2 / 255: the head view draws a line exactly for a step of at least this


class ViewData:
    """The page's data of an :class:`~attnlab.explain.render.view.ViewBuilder` (which adds ``view()``): it holds
    the data as it grows and one layer's weights, never the (L, H, T, T) of them all."""

    def __init__(self, *, tokens: Sequence[str], layers: int, heads: int) -> None:
        t = len(tokens)
        if not 0 < t <= MAX_VIEW_TOKENS:
            raise ValueError(f"the view shows 1 to {MAX_VIEW_TOKENS} tokens, got {t}; shorten the text")
        for what, n in (("layers", layers), ("heads", heads)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{what} must be an int >= 1, got {n!r}")
        self.tokens, self.shape = list(tokens), (layers, heads, t, t)
        self.added = 0  # layers so far
        self.causal = True  # nothing above any diagonal so far
        self.rows_past_one = False  # some row sums past 1: no sink's share explains that
        self._sink_steps: list[torch.Tensor] = []  # per layer (H, T) uint8: 1 minus each row's sum
        self.first_token: list[list[float]] = []  # per layer (H,): each head's first-token share (T >= 2)
        self.learned: list[list[float]] = []  # per layer (H,): the share a learned sink took (~0 without one)
        # Every step goes in the page when it fits MAX_VIEW_BYTES (of a causal view the lower triangles alone);
        # past that, each row's keys the head view draws. Settled now when the size does, else at view().
        self._sparse = self._dense_bytes(causal=True) > MAX_VIEW_BYTES
        self._dense: list[torch.Tensor] = []  # per layer (H, T, T) uint8 steps, while dense may be chosen
        self._entries: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # per layer, sparse
        self._pictures: list[torch.Tensor] = []  # per layer (H, R, R), sparse
        # Buffers worked in place layer after layer, and whole layers at a time: a new (T, T) temporary for each
        # pattern, among the small tensors kept, left the allocator holes it never gave back (a 12-layer view
        # at 1024 tokens grew the process by 200 MiB more, measured with ru_maxrss).
        self._rolled = torch.eye(t, dtype=torch.float64)  # the rollout of the layers so far (T, T)
        self._spare, self._step = torch.empty(t, t, dtype=torch.float64), torch.empty(t, t, dtype=torch.float64)
        self._scratch = torch.empty(t, t)
        self._page: dict[str, object] | None = None  # the page's data, once view() made it

    def held_bytes(self) -> int:
        """The bytes of the page's data the builder holds now (the weights added are not among them)."""
        tensors = [*self._dense, *self._pictures, *(x for entry in self._entries for x in entry)]
        return sum(x.numel() * x.element_size() for x in tensors)

    def _dense_bytes(self, *, causal: bool) -> int:
        layers, heads, t, _ = self.shape
        return (layers * heads + 1) * (t * (t + 1) // 2 if causal else t * t)  # the rollout too

    def add(self, weights: torch.Tensor) -> None:
        """The next layer's weights (H, T, T), each row a distribution (or short of 1 by what a sink took).

        Raises:
            ValueError: a layer past the last, of another shape, or weights not finite and non-negative.
        """
        layers, heads, t, _ = self.shape
        if self.added == layers or self._page is not None:
            raise ValueError(f"all {layers} layers were added; view() makes the view")
        if not isinstance(weights, torch.Tensor) or tuple(weights.shape) != (heads, t, t):
            got = tuple(weights.shape) if isinstance(weights, torch.Tensor) else type(weights).__name__
            raise ValueError(f"layer {self.added}: weights must be (heads, T, T) = {(heads, t, t)}, got {got}")
        w = weights.detach().float().cpu()
        sums = w.sum(-1)  # (H, T); a NaN or an infinity anywhere leaves its row's sum not finite
        if not bool(torch.isfinite(sums).all()) or float(w.min()) < 0:  # reductions: no (H, T, T) temporaries
            raise ValueError("weights must be finite and non-negative (attention weights, each row a distribution)")
        self.rows_past_one |= bool((sums > 1 + 1e-4).any())
        self._sink_steps.append(((1 - sums).clamp(0, 1) * 255).round().to(torch.uint8))
        if t >= 2:  # the measures of explain.sinks, on the weights as given (the view's marks)
            self.first_token.append(first_token_share(w).tolist())  # (H,)
            self.learned.append(learned_sink_share((1 - sums).clamp(0, 1)).tolist())  # (H, T) -> (H,)
        steps = torch.empty(heads, t, t, dtype=torch.uint8)
        for n, pattern in enumerate(w):  # (T, T), one at a time through the scratch buffer
            self.causal &= not bool(torch.triu(pattern, 1, out=self._scratch).any())
            steps[n].copy_(torch.clamp(pattern, 0, 1, out=self._scratch).mul_(255).round_())  # whole numbers
        self._rolled, self._spare = _rollout_step(w, self._rolled, step=self._step, out=self._spare), self._rolled
        self._take(steps, pictures=True)
        self.added += 1

    def _take(self, steps: torch.Tensor, *, pictures: bool) -> None:
        """Patterns' uint8 steps (N, T, T): kept whole while dense may be chosen; else only the keys of each row
        the head view draws, and for heads their pictures pooled to at most THUMB a side."""
        if not self._sparse:
            self._dense.append(steps)
            return
        entry, drawn = self._sparse_of(steps, pictures=pictures)
        self._entries.append(entry)
        self._pictures += drawn

    def _sparse_of(
        self, steps: torch.Tensor, *, pictures: bool
    ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], list[torch.Tensor]]:
        """Of steps (N, T, T): (each row's count of kept keys (N*T,), their keys (e,), their steps (e,)), and the
        heads' pictures [(N, R, R)] (none for the rollout)."""
        keep = steps >= SPARSE_STEP  # (N, T, T)
        kept, keys = keep.sum(dim=-1).to(torch.int32), keep.nonzero()[:, -1].to(torch.int16)  # keys < 1024 tokens
        if not pictures:
            return (kept.flatten(), keys, steps[keep]), []
        size = min(steps.shape[-1], THUMB)
        drawn = [F.adaptive_max_pool2d(self._scratch.copy_(x)[None], (size, size)) for x in steps]  # (1, R, R) each
        return (kept.flatten(), keys, steps[keep]), [torch.cat(drawn).to(torch.uint8)]  # (N, R, R)

    def _packed(self) -> dict[str, object]:
        """The page's data: the patterns, then the rollout (made once: a second view shares it)."""
        if self._page is None:
            self._page = self._pack_page()  # a page too big raises, and says so again on every later call
        return self._page

    def _pack_page(self) -> dict[str, object]:
        rolled = torch.clamp(self._rolled.float(), 0, 1).mul_(255).round_().to(torch.uint8)[None]  # (1, T, T)
        patterns = [pattern for layer in self._dense for pattern in layer]
        if not self._sparse and self._dense_bytes(causal=self.causal) <= MAX_VIEW_BYTES:
            return {"weights": _pack([*patterns, rolled[0]], self.causal)}
        entries, pictures = list(self._entries), list(self._pictures)  # this page's, the builder's left as they are
        late = [(steps, True) for steps in self._dense]  # the size was settled only now: these go sparse too
        for steps, drawn in [*late, (rolled, False)]:  # the rollout last, with no picture
            got = self._sparse_of(steps, pictures=drawn)
            entries.append(got[0])
            pictures += got[1]
        layers, heads, t, _ = self.shape
        counts = torch.cat([kept for kept, _, _ in entries])  # (N*T,)
        offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0, dtype=torch.int64)])
        found, thumbs = torch.cat([keys for _, keys, _ in entries]), torch.cat(pictures)  # (E,), (L*H, R, R)
        sparse_bytes = 4 * offsets.numel() + 3 * found.shape[0] + thumbs.numel()
        if sparse_bytes > MAX_VIEW_BYTES:
            raise ValueError(
                f"{layers} layers x {heads} heads x {t} tokens would embed "
                f"{self._dense_bytes(causal=self.causal) / 2**20:.1f} MiB of weights, and "
                f"{sparse_bytes / 2**20:.1f} MiB even keeping only those of at least 0.01; a page holds "
                f"{MAX_VIEW_BYTES / 2**20:.1f} MiB and opens quickly: shorten the text"
            )
        b64 = lambda a: base64.b64encode(a.tobytes()).decode("ascii")
        return {
            "sparse": {
                "offsets": b64(offsets.numpy().astype("<u4")),
                "keys": b64(found.numpy().astype("<u2")),
                "values": b64(torch.cat([values for _, _, values in entries]).numpy()),
                "thumbs": b64(thumbs.contiguous().numpy()),
            }
        }


def _pack(patterns: Sequence[torch.Tensor], causal: bool) -> str:
    """N patterns (T, T) of uint8 steps -> base64, pattern by pattern and row by row, only the lower triangle
    when causal. One pattern at a time: no temporary the size of them all."""
    t = patterns[0].shape[-1]
    rows, cols = torch.tril_indices(t, t)
    chunks = []
    for steps in patterns:
        if causal:
            steps = steps[rows, cols]  # (T (T + 1) / 2,): row by row, each row up to its diagonal
        chunks.append(steps.contiguous().numpy().tobytes())
    return base64.b64encode(b"".join(chunks)).decode("ascii")
