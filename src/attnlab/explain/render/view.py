"""An interactive view of a whole model's attention, in one offline HTML fragment (no network, no server).

Three panels read the same embedded weights:

* **the head view**: the tokens in two columns, queries on the left and keys on the right, and from the
  focused query a line to each key it attends, as thick and as opaque as its weight, one colour per head.
  Hover or tap a token to focus it (the arrow keys move it); choose the layer (or the rollout) and the heads;
* **the model view**: every layer x head as a small pattern, labelled with
  the head's name and best score; a click (or Enter) opens it in the head view;
* **the rollout** (Abnar & Zuidema, 2020): how much each token's last-layer
  representation draws on each input token through every layer, with the
  residual counted as half of each step: ``R = prod_l (0.5 * mean_h A_l + 0.5 * I)``,
  rows renormalised.

The weights go in as bytes, not JSON numbers: each in [0, 1] rounded to one
of 255 steps (uint8), and of a causal pattern only the lower triangle, base64
in the page. 12 layers x 12 heads x 256 tokens is 4.7 MB of weights and about
6.4 MB of page. Past MAX_VIEW_BYTES (a long text), each row keeps only its
keys of weight at least 0.01, exactly the lines the head view draws, and each
pattern's picture is pooled here to at most THUMB pixels a side: 12 x 12 heads
at 1024 tokens then make a page of about 10 MB. Every token and label reaches the page as JSON in a
``<script type="application/json">`` block with ``<``, ``>`` and ``&``
escaped, and the script writes them with ``textContent``: a token like
``<script>`` shows as text and runs nothing.

Shapes: L = layers, H = heads, T = tokens.
"""

from __future__ import annotations

import base64
import html
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnlab.explain.render.view_data import THUMB, ViewData
from attnlab.explain.render.view_page import _CSS, _SCRIPT, COLOURS, VIEW_TEXT
from attnlab.explain.sink_marks import SINK_THRESHOLD, cell_marks, is_sink_head
from attnlab.models.graphemes import visible

# a token's control characters, shown: a newline or tab would break its row, the rest are unreadable
_SHOWN = {0x0A: "\u21b5", 0x09: "\u21e5", 0x0D: "\u240d"} | {
    c: "\ufffd" for c in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F]
}


class ViewBuilder(ViewData):
    """An :class:`AttentionView` built one layer at a time: ``add`` each layer's weights (H, T, T) in order, then
    ``view(...)``. It holds the page's data as it grows and one layer's weights, never the (L, H, T, T) of them
    all: at 12 layers x 8 heads x 1024 tokens those are 384 MiB of float32, and the page's data about 10 MB.

    The page's data is byte for byte what ``AttentionView(weights=...)`` makes of the same weights (that
    constructor runs this builder over its layers).

    >>> builder = ViewBuilder(tokens=["a", "b"], layers=1, heads=1)
    >>> builder.add(torch.tensor([[[1.0, 0.0], [0.5, 0.5]]]))
    >>> builder.view().causal
    True
    """

    def view(
        self,
        *,
        names: list[list[str]] | None = None,
        lang: str = "en",
        title: str = "",
        held: torch.Tensor | None = None,
        cache: str = "",
        kinds: list[str] | None = None,
        windows: list[int | None] | None = None,
        sinks: bool = False,
        note: str = "",
    ) -> AttentionView:
        """The view of every layer added, with :class:`AttentionView`'s options (checked the same way).

        Raises:
            ValueError: layers missing, or an option that does not fit the view (named).
        """
        if self.added != self.shape[0]:
            raise ValueError(f"{self.added} of {self.shape[0]} layers were added: add every layer before view()")
        return AttentionView(
            tokens=self.tokens,
            weights=None,
            names=names,
            lang=lang,
            title=title,
            held=held,
            cache=cache,
            kinds=kinds,
            windows=windows,
            sinks=sinks,
            note=note,
            _built=self,
        )


def _json_for_html(value: object) -> str:
    """JSON that can sit inside a <script> element: no ``</script>``, no ``<!--``, no line separators."""
    text = json.dumps(value, ensure_ascii=False)
    for raw, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, escaped)
    return text


@dataclass
class AttentionView:
    """Every head of a model on one text, to explore in a browser or a notebook (see the module docstring).

    Args:
        tokens: the text's tokens as labels, T of them (at most MAX_VIEW_TOKENS).
        weights: (L, H, T, T), each row a distribution (``GPT.attention_weights(ids)[:, 0]``). To build a
            view without holding them all, add them a layer at a time to a :class:`ViewBuilder`; its view
            has ``weights`` None.
        names: per layer and head, a name shown under its pattern ("induction 0.93"), or None.
        lang: "en" or "zh".
        held: (L, T) bool, which keys each layer's KV cache holds (``cache`` names it): the rest are struck out.
        kinds: per layer, its kind as a label ("sliding window of 6", "full attention"), shown with the layer.
        windows: per layer, its sliding window (None: full), outlined on the layer's patterns.
        sinks: the model has learned sinks (gpt-oss): rows sum to less than 1, and the view says, for the
            focused row, the share the sinks took (1 minus the row's sum).
        note: a sentence shown above the tokens (what the labels are: characters merged, or marked as parts).
    """

    tokens: list[str]
    weights: torch.Tensor | None
    names: list[list[str]] | None = None
    lang: str = "en"
    title: str = ""
    held: torch.Tensor | None = None
    cache: str = ""
    kinds: list[str] | None = None
    windows: list[int | None] | None = None
    sinks: bool = False
    note: str = ""
    selection: str = ""  # a sparse model's selection panel (explain.selection_report)
    _built: ViewBuilder | None = field(default=None, repr=False)  # set by ViewBuilder.view()
    shape: tuple[int, int, int, int] = field(default=(0, 0, 0, 0), init=False)  # (L, H, T, T)
    rollout: torch.Tensor | None = field(default=None, init=False)
    causal: bool = field(default=False, init=False)  # nothing above the diagonal: only the lower triangle embedded
    _id: str = field(default="", init=False, repr=False)
    _packed: dict[str, object] = field(default_factory=dict, init=False, repr=False)
    _sink_steps: str = field(default="", init=False, repr=False)  # (L, H, T) uint8 steps of 1/255, base64
    first_token: list[list[float]] | None = field(default=None, init=False)  # (L, H) shares; None when T = 1
    learned_share: list[list[float]] | None = field(default=None, init=False)  # (L, H) with sinks, else None

    def __post_init__(self) -> None:
        if self.lang not in VIEW_TEXT:
            raise ValueError(f"lang must be one of {sorted(VIEW_TEXT)}, got {self.lang!r}")
        built = self._built
        if built is None:  # weights given whole: the builder runs over its layers
            w = self.weights
            if not isinstance(w, torch.Tensor) or w.dim() != 4 or w.shape[-1] != w.shape[-2]:
                got = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
                raise ValueError(f"weights must be (layers, heads, T, T), got {got}")
            if w.shape[-1] != len(self.tokens):
                raise ValueError(f"{len(self.tokens)} tokens but weights for {w.shape[-1]}: give one label per token")
            built = ViewBuilder(tokens=self.tokens, layers=w.shape[0], heads=w.shape[1])
            for layer in w:
                built.add(layer)
            self.weights = w.detach().float().cpu()
        layers, heads, t, _ = self.shape = built.shape
        if self.names is not None and (len(self.names) != layers or any(len(r) != heads for r in self.names)):
            raise ValueError(f"names must be {layers} lists of {heads} names, one per layer and head")
        if self.held is not None and tuple(self.held.shape) != (layers, t):
            raise ValueError(f"held must be (layers, T) = {(layers, t)}, got {tuple(self.held.shape)}")
        for what, given in (("kinds", self.kinds), ("windows", self.windows)):
            if given is not None and len(given) != layers:
                raise ValueError(f"{what} must give one entry per layer, {layers}, got {len(given)}")
        if self.windows is not None and any(x is not None and (type(x) is not int or x < 1) for x in self.windows):
            raise ValueError(f"windows must be positive ints or None (full attention), got {self.windows}")
        if self.sinks and built.rows_past_one:
            raise ValueError("with sinks, each row of weights sums to at most 1 (the rest is the sinks' share)")
        shown = [visible(str(token)).translate(_SHOWN) for token in self.tokens]  # never a lone U+0301 or U+200D
        self.tokens = [s if s.strip() else "\u2423" * len(s) or "\u00b7" for s in shown]  # a space shows as ␣
        self.rollout = built._rolled.float()
        self.causal = built.causal
        self._packed = built._packed()
        if self.sinks:
            steps = torch.stack(built._sink_steps).contiguous()  # (L, H, T)
            self._sink_steps = base64.b64encode(steps.numpy().tobytes()).decode("ascii")
        if t >= 2:  # each head's first-token share (explain.sinks), and with sinks the learned sink's, apart
            self.first_token = built.first_token
            self.learned_share = built.learned if self.sinks else None
        self._built = None  # the view keeps its page's data, not the builder's
        # its script finds its root by this id, wherever a notebook runs the script (jQuery moves it to <head>)
        self._id = f"attnview-{secrets.token_hex(6)}"

    def to_fragment(self) -> str:
        """The view as one ``<div>`` with its own style, data and script: to place inside any page."""
        e = html.escape
        txt = VIEW_TEXT[self.lang]
        layers, heads, _, _ = self.shape
        data = {
            "tokens": self.tokens,
            "layers": layers,
            "heads": heads,
            "causal": self.causal,
            "rollout": True,
            "colours": list(COLOURS),
            "thumb": THUMB,
            "text": {
                "focus": txt["focus"],
                "weight": txt["weight"],
                "held": txt["held"].replace("{cache}", self.cache),  # Python's replace: no replacement patterns
                "sink": txt["sink"],
            },
            "held": None if self.held is None else self.held.int().tolist(),
            "windows": self.windows,
            "sinks": self._sink_steps if self.sinks else None,
            "first_token": self.first_token,  # (L, H): each head's first-token share; None for one token
            "learned_share": self.learned_share,  # (L, H): the learned sink's share, named apart; None without
            "sink_heads": self._sink_heads(),  # (L, H) 0/1: over explain's threshold (sink_marks.is_sink_head)
            **self._packed,
        }
        kind = [f" · {k}" for k in self.kinds] if self.kinds else [""] * layers
        options = "".join(f'<option value="{i}">{e(txt["layer"])} {i}{e(kind[i])}</option>' for i in range(layers))
        options += f'<option value="{layers}">{e(txt["rollout"])}</option>'
        boxes = "".join(
            f'<label><input type="checkbox" class="head" value="{h}" checked>'
            f'<span class="swatch" style="background:{COLOURS[h % len(COLOURS)]}"></span>{h}</label>'
            for h in range(heads)
        )
        hint = txt["model_hint"].replace("{threshold}", f"{SINK_THRESHOLD.value:.2f}")  # the marks' threshold
        kinds_line = ""
        if self.kinds and len(set(self.kinds)) > 1:  # the layers differ: say how, once
            listed = ", ".join(f"{i} {k}" for i, k in enumerate(self.kinds))
            kinds_line = f'<p class="hint kinds">{e(txt["kinds"].format(kinds=listed))}</p>'
        cells = []
        for layer in range(layers):
            for head in range(heads):
                label = txt["head"].format(layer=layer, head=head)
                name = self.names[layer][head] if self.names else ""
                marks = self._marks(layer, head, txt)
                sunk = " sinkhead" if self.first_token and is_sink_head(self.first_token[layer][head]) else ""
                cells.append(
                    f'<div class="cell{sunk}" tabindex="0" role="button" data-layer="{layer}" data-head="{head}" '
                    f'title="{e(label + kind[layer])}" aria-label="{e(" ".join(x for x in [label + kind[layer], name, *marks] if x))}">'
                    f'<canvas></canvas><span class="name">{e(label)}</span><span class="name">{e(name)}</span>'
                    + "".join(f'<span class="name mark">{e(m)}</span>' for m in marks)
                    + "</div>"
                )
        return (
            f'<div class="attnview" id="{self._id}" lang="{e(self.lang)}" tabindex="0"><style>{_CSS}</style>'
            f'<script type="application/json" class="attnview-data">{_json_for_html(data)}</script>'
            f'<div class="headview"><h3>{e(txt["head_view"])}</h3><p class="hint">{e(txt["hint"])}</p>'
            + (f'<p class="hint note">{e(self.note)}</p>' if self.note else "")
            + f'<div class="controls"><label>{e(txt["layer"])} <select class="layer">{options}</select></label>'
            f'<span>{e(txt["heads"])}: {boxes}</span><button type="button" class="all">{e(txt["all"])}</button>'
            f'<button type="button" class="none">{e(txt["none"])}</button></div>'
            f'<div class="pane"><div class="columns"><div class="col q" aria-label="{e(txt["queries"])}"></div>'
            f'<div class="gap"></div><div class="col k" aria-label="{e(txt["keys"])}"></div>'
            '<canvas class="lines"></canvas></div></div><div class="status"></div></div>'
            f'<div class="modelview"><h3>{e(txt["model_view"])}</h3><p class="hint">{e(hint)}</p>'
            f"{kinds_line}"
            f'<div class="grid" style="grid-template-columns: repeat({heads}, 86px)">{"".join(cells)}</div></div>'
            f"{self.selection}<script>{_SCRIPT.replace('__ROOT__', self._id)}</script></div>"
        )

    def _sink_heads(self) -> list[list[int]] | None:
        if self.first_token is None:
            return None
        return [[int(is_sink_head(share)) for share in row] for row in self.first_token]

    def _marks(self, layer: int, head: int, txt: dict[str, str]) -> list[str]:
        """A head's marks under its pattern (:func:`cell_marks`); none for a text of one token."""
        if self.first_token is None:
            return []
        learned = None if self.learned_share is None else self.learned_share[layer][head]
        return cell_marks(self.first_token[layer][head], learned, txt)

    def to_html(self) -> str:
        """A whole page holding the view alone."""
        e = html.escape
        title = self.title or VIEW_TEXT[self.lang]["head_view"]
        return (
            f'<!DOCTYPE html>\n<html lang="{e(self.lang)}"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{e(title)}</title></head><body style="margin:16px;background:#fafafa">'
            f'<h1 style="font:600 20px system-ui,sans-serif">{e(title)}</h1>{self.to_fragment()}</body></html>\n'
        )

    def _repr_html_(self) -> str:
        """Jupyter shows the view inline: the fragment carries its own data and script."""
        return self.to_fragment()

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.to_html(), encoding="utf-8")
        return path
