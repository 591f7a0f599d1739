"""An interactive view of a whole model's attention, in one offline HTML fragment (no network, no server).

Three panels read the same embedded weights:

* **the head view**: the tokens in two columns, queries on the left and keys
  on the right, and from the focused query a line to each key it attends,
  as thick and as opaque as its weight, one colour per head. Hover or tap a
  token to focus it (the arrow keys move it); choose the layer (or the
  rollout) and the heads;
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlab.models.graphemes import visible

MAX_VIEW_TOKENS = 1024  # the head view scrolls; past this the page grows past what a browser draws at ease
MAX_VIEW_BYTES = 32 * 2**20  # bytes of weights in one page, before base64; past it a browser takes seconds to open it
THUMB = 128  # the model view draws each head in at most this many pixels a side (max over each block of weights)

VIEW_TEXT = {
    "en": {
        "head_view": "Head view",
        "model_view": "Model view",
        "layer": "layer",
        "rollout": "rollout",
        "heads": "heads",
        "all": "all",
        "none": "none",
        "queries": "queries",
        "keys": "keys",
        "hint": "Hover or tap a query token to see where it looks; ↑ ↓ move it, ← → change the layer.",
        "model_hint": "Every layer × head; click one (or focus it and press Enter) to open it above.",
        "head": "L{layer} H{head}",
        "focus": "query {i}: {token}",
        "weight": "{key}: {w}",
        "held": "the {cache} cache holds {n} of {t} keys in this layer (the rest struck out)",
        "sink": "the learned sinks take {p} of this row",
        "kinds": "Each layer's kind: {kinds}. A sliding layer's window is outlined on its patterns.",
    },
    "zh": {
        "head_view": "注意力头视图",
        "model_view": "模型视图",
        "layer": "层",
        "rollout": "注意力累积（rollout）",
        "heads": "头",
        "all": "全部",
        "none": "全不选",
        "queries": "查询",
        "keys": "键",
        "hint": "把鼠标移到（或点一下）左列的查询 Token，看它关注哪里；↑ ↓ 换 Token，← → 换层。",
        "model_hint": "每一层 × 每个头；点一个（或选中后按回车）在上方打开。",
        "head": "第{layer}层 头{head}",
        "focus": "查询 {i}：{token}",
        "weight": "{key}：{w}",
        "held": "{cache} 缓存在这一层保留了 {t} 个键中的 {n} 个（其余划掉）",
        "sink": "可学习的注意力汇聚点 (sink) 拿走这一行的 {p}",
        "kinds": "每层的种类：{kinds}。滑动窗口层的窗口在它的图案上用框线标出。",
    },
}

COLOURS = (
    "#1a73e8", "#d93025", "#188038", "#f9ab00", "#9334e6", "#e8710a",
    "#129eaf", "#c5221f", "#5f6368", "#b31412", "#0d652d", "#7627bb",
)  # fmt: skip

_CSS = """
.attnview { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", "Noto Sans", "PingFang SC", sans-serif;
            color: #1d1d1f; border: 1px solid #dadce0; border-radius: 8px; padding: 12px; background: white; }
.attnview h3 { margin: 4px 0 6px; font-size: 15px; }
.attnview .hint { color: #5f6368; font-size: 12px; margin: 0 0 8px; }
.attnview .controls { display: flex; flex-wrap: wrap; gap: 8px 14px; align-items: center; margin-bottom: 8px; }
.attnview .controls label { white-space: nowrap; }
.attnview .swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 3px; }
.attnview .pane { position: relative; max-height: 560px; overflow: auto; border: 1px solid #eee; border-radius: 6px; }
.attnview .columns { position: relative; display: grid; grid-template-columns: minmax(60px, 220px) 180px minmax(60px, 220px); }
.attnview .col div { height: 18px; line-height: 18px; padding: 0 6px; white-space: pre; overflow: hidden;
                     text-overflow: ellipsis; cursor: pointer; border-radius: 3px; }
.attnview .col.q div { text-align: right; }
.attnview .col div.focus { background: #e8f0fe; outline: 1px solid #1a73e8; }
.attnview .col div.gone { color: #9aa0a6; text-decoration: line-through; }
.attnview canvas.lines { position: absolute; left: 0; top: 0; pointer-events: none; }
.attnview .status { min-height: 18px; color: #5f6368; font-size: 12px; margin-top: 4px; }
.attnview .grid { display: grid; gap: 6px; overflow-x: auto; padding-bottom: 4px; }
.attnview .cell { cursor: pointer; text-align: center; font-size: 11px; border: 1px solid transparent; border-radius: 4px; }
.attnview .cell:focus, .attnview .cell.open { border-color: #1a73e8; outline: none; }
.attnview .cell canvas { width: 72px; height: 72px; image-rendering: pixelated; border: 1px solid #dadce0; }
.attnview .cell .name { display: block; max-width: 84px; margin: 0 auto; white-space: nowrap; overflow: hidden;
                        text-overflow: ellipsis; color: #5f6368; }
"""

_SCRIPT = r"""
(function (root) {
  var data = JSON.parse(root.querySelector("script.attnview-data").textContent);
  var T = data.tokens.length, L = data.layers, H = data.heads, txt = data.text;
  function decode(text) {
    var raw = atob(text), out = new Uint8Array(raw.length);
    for (var n = 0; n < raw.length; n++) { out[n] = raw.charCodeAt(n); }
    return out;
  }
  var sparse = data.sparse, bytes = null, offsets = null, keys = null, vals = null, thumbs = null;
  if (sparse) {  // each row's keys of weight >= 0.01 (the lines drawn), and each pattern's picture made in Python
    offsets = new Uint32Array(decode(sparse.offsets).buffer);
    keys = new Uint16Array(decode(sparse.keys).buffer);
    vals = decode(sparse.values);
    thumbs = decode(sparse.thumbs);
  } else {
    bytes = decode(data.weights);
  }
  var sinkBytes = data.sinks ? decode(data.sinks) : null;  // (L, H, T) shares in steps of 255
  var rowStart = new Int32Array(T + 1);  // offsets of each query row inside one head's block (dense)
  for (var i = 0; i < T; i++) { rowStart[i + 1] = rowStart[i] + (data.causal ? i + 1 : T); }
  var block = rowStart[T];
  function eachKey(layer, head, q, fn) {  // fn(key, step of 255) for the keys query q holds; layer L: the rollout
    var p = layer < L ? layer * H + head : L * H;
    if (sparse) {
      for (var e = offsets[p * T + q]; e < offsets[p * T + q + 1]; e++) { fn(keys[e], vals[e]); }
      return;
    }
    var start = p * block + rowStart[q], end = data.causal ? q + 1 : T;
    for (var k = 0; k < end; k++) { fn(k, bytes[start + k]); }
  }
  // every placeholder in one pass, by a function: a token's "$&" (a replacement pattern) or "{w}" stays as it is
  function fill(template, values) {
    return template.replace(/\{(\w+)\}/g, function (whole, name) {
      return Object.prototype.hasOwnProperty.call(values, name) ? values[name] : whole;
    });
  }
  var state = { layer: 0, heads: [], focus: T - 1 };
  for (var h = 0; h < H; h++) { state.heads.push(true); }
  var qcol = root.querySelector(".col.q"), kcol = root.querySelector(".col.k");
  var canvas = root.querySelector("canvas.lines"), columns = root.querySelector(".columns");
  var status = root.querySelector(".status"), layerSelect = root.querySelector("select.layer");
  function row(col, i) {
    var d = document.createElement("div");
    d.textContent = data.tokens[i];
    d.title = i + ": " + data.tokens[i];
    d.setAttribute("data-i", String(i));
    col.appendChild(d);
    return d;
  }
  var qrows = [], krows = [];
  for (var t = 0; t < T; t++) { qrows.push(row(qcol, t)); krows.push(row(kcol, t)); }
  function draw() {
    var rowH = 18, mid = canvas.parentNode.querySelector(".gap");
    var x0 = mid.offsetLeft, x1 = mid.offsetLeft + mid.offsetWidth;
    canvas.width = columns.offsetWidth; canvas.height = T * rowH;
    canvas.style.width = canvas.width + "px"; canvas.style.height = canvas.height + "px";
    var ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    var q = state.focus, heads = state.layer < L ? H : 1, drawn = 0;
    for (var h = 0; h < heads; h++) {
      if (state.layer < L && !state.heads[h]) { continue; }
      ctx.strokeStyle = data.colours[h % data.colours.length];
      eachKey(state.layer, h, q, function (k, step) {
        var w = step / 255;
        if (w < 0.01) { return; }
        ctx.globalAlpha = Math.min(1, 0.15 + w);
        ctx.lineWidth = 0.5 + 4 * w;
        ctx.beginPath();
        ctx.moveTo(x0, q * rowH + rowH / 2);
        ctx.lineTo(x1, k * rowH + rowH / 2);
        ctx.stroke();
        drawn++;
      });
    }
    ctx.globalAlpha = 1;
    qrows.forEach(function (d, i) { d.classList.toggle("focus", i === q); });
    var best = -1, bestW = -1, sums = new Float64Array(T), c = 0;
    for (var h2 = 0; h2 < heads; h2++) {  // each key shaded by its mean weight over the heads shown
      if (state.layer === L || state.heads[h2]) { c++; eachKey(state.layer, h2, q, function (k, step) { sums[k] += step / 255; }); }
    }
    for (var j = 0; j < T; j++) {
      var m = c ? sums[j] / c : 0;
      krows[j].style.background = m >= 0.01 ? "rgba(26, 115, 232, " + (0.6 * Math.sqrt(m)).toFixed(3) + ")" : "";
      if (c && m > bestW) { bestW = m; best = j; }
    }
    var kept = -1;
    if (data.held) {  // keys this layer's cache let go, struck out (the rollout spans every layer: none)
      kept = 0;
      krows.forEach(function (d, j) {
        var gone = state.layer < L && !data.held[state.layer][j];
        d.classList.toggle("gone", gone); if (!gone) { kept++; }
      });
    }
    var sink = -1;
    if (sinkBytes && state.layer < L && c) {  // the share of the focused row the learned sinks took, heads shown
      sink = 0;
      for (var h3 = 0; h3 < H; h3++) { if (state.heads[h3]) { sink += sinkBytes[(state.layer * H + h3) * T + q] / 255; } }
      sink /= c;
    }
    status.textContent = fill(txt.focus, { i: String(q), token: data.tokens[q] }) +
      (best >= 0 ? " · " + fill(txt.weight, { key: data.tokens[best], w: bestW.toFixed(2) }) : "") +
      (kept >= 0 && state.layer < L ? " · " + fill(txt.held, { n: String(kept), t: String(T) }) : "") +
      (sink >= 0 ? " · " + fill(txt.sink, { p: Math.round(100 * sink) + "%" }) : "");
    root.setAttribute("data-sink", sink >= 0 ? sink.toFixed(3) : "");
    root.querySelectorAll(".cell").forEach(function (c) {  // the patterns the head view shows now
      var l = +c.getAttribute("data-layer");
      c.classList.toggle("open", l === state.layer && state.heads[+c.getAttribute("data-head")]);
    });
    root.setAttribute("data-lines", String(drawn));
    root.setAttribute("data-focus", String(q));
    root.setAttribute("data-layer", String(state.layer));
  }
  function focusOn(i) { state.focus = Math.max(0, Math.min(T - 1, i)); draw(); }
  qcol.addEventListener("mouseover", function (e) { var i = e.target.getAttribute("data-i"); if (i !== null) { focusOn(+i); } });
  qcol.addEventListener("click", function (e) { var i = e.target.getAttribute("data-i"); if (i !== null) { focusOn(+i); } });
  layerSelect.addEventListener("change", function () { state.layer = +layerSelect.value; draw(); });
  root.querySelectorAll("input.head").forEach(function (box) {
    box.addEventListener("change", function () { state.heads[+box.value] = box.checked; draw(); });
  });
  function setHeads(on) {
    root.querySelectorAll("input.head").forEach(function (box) { box.checked = on(+box.value); state.heads[+box.value] = box.checked; });
  }
  root.querySelector("button.all").addEventListener("click", function () { setHeads(function () { return true; }); draw(); });
  root.querySelector("button.none").addEventListener("click", function () { setHeads(function () { return false; }); draw(); });
  root.addEventListener("keydown", function (e) {
    if (e.target.tagName === "SELECT" || e.target.tagName === "INPUT") { return; }
    if (e.key === "ArrowDown" || e.key === "ArrowUp") { focusOn(state.focus + (e.key === "ArrowDown" ? 1 : -1)); e.preventDefault(); }
    if (e.key === "ArrowRight" || e.key === "ArrowLeft") {
      var last = data.rollout ? L : L - 1;
      state.layer = Math.max(0, Math.min(last, state.layer + (e.key === "ArrowRight" ? 1 : -1)));
      layerSelect.value = String(state.layer); draw(); e.preventDefault();
    }
  });
  // the model view: every head as a small picture of its pattern; a click opens it in the head view
  // a pattern as at most THUMB x THUMB pixels, each the largest weight of the block it covers (long texts too)
  var R = Math.min(T, data.thumb), shade = new Uint8Array(256);
  for (var v = 0; v < 256; v++) { shade[v] = 255 - Math.round(255 * Math.sqrt(v / 255)); }
  function paint(cv, layer, head) {
    cv.width = R; cv.height = R;
    var ctx = cv.getContext("2d"), img = ctx.createImageData(R, R), px = img.data, most = new Uint8Array(R * R);
    var base = layer < L ? (layer * H + head) * block : L * H * block;
    if (sparse) { most = thumbs.subarray((layer * H + head) * R * R, (layer * H + head + 1) * R * R); }
    for (var q = 0; q < (sparse ? 0 : T); q++) {
      var a = Math.floor(q * R / T) * R, start = base + rowStart[q], end = data.causal ? q + 1 : T;
      for (var k = 0; k < end; k++) {
        var b = a + Math.floor(k * R / T), x = bytes[start + k];
        if (x > most[b]) { most[b] = x; }
      }
    }
    for (var c = 0; c < R * R; c++) {
      var s = shade[most[c]];
      px[4 * c] = s; px[4 * c + 1] = s; px[4 * c + 2] = 255; px[4 * c + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    var w = layer < L && data.windows ? data.windows[layer] : null;
    if (w !== null && w < T) {  // the band: each query's last w keys, outlined on the pattern
      var f = R / T;
      ctx.strokeStyle = "#e37400"; ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(0, 0); ctx.lineTo(R, R);  // the diagonal: each query's own key
      ctx.moveTo(0, w * f); ctx.lineTo((T - w) * f, R);  // the band's far edge: the key w - 1 before the query
      ctx.stroke();
      cv.setAttribute("data-window", String(w));
    }
  }
  function open(layer, head) {
    state.layer = layer; layerSelect.value = String(layer);
    if (layer < L) { setHeads(function (h) { return h === head; }); }
    draw();
    root.querySelector(".headview").scrollIntoView({ block: "nearest" });
  }
  root.querySelectorAll(".cell").forEach(function (cell) {
    var layer = +cell.getAttribute("data-layer"), head = +cell.getAttribute("data-head");
    paint(cell.querySelector("canvas"), layer, head);
    cell.addEventListener("click", function () { open(layer, head); });
    cell.addEventListener("keydown", function (e) { if (e.key === "Enter" || e.key === " ") { open(layer, head); e.preventDefault(); } });
  });
  draw();
  root.setAttribute("data-ready", "1");
})(document.getElementById("__ROOT__"));
"""


# a token's control characters, shown: a newline or tab would break its row, the rest are unreadable
_SHOWN = {0x0A: "\u21b5", 0x09: "\u21e5", 0x0D: "\u240d"} | {
    c: "\ufffd" for c in [*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F]
}


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


class ViewBuilder:
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
    _built: ViewBuilder | None = field(default=None, repr=False)  # set by ViewBuilder.view()
    shape: tuple[int, int, int, int] = field(default=(0, 0, 0, 0), init=False)  # (L, H, T, T)
    rollout: torch.Tensor | None = field(default=None, init=False)
    causal: bool = field(default=False, init=False)  # nothing above the diagonal: only the lower triangle embedded
    _id: str = field(default="", init=False, repr=False)
    _packed: dict[str, object] = field(default_factory=dict, init=False, repr=False)
    _sink_steps: str = field(default="", init=False, repr=False)  # (L, H, T) uint8 steps of 1/255, base64

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
        kinds_line = ""
        if self.kinds and len(set(self.kinds)) > 1:  # the layers differ: say how, once
            listed = ", ".join(f"{i} {k}" for i, k in enumerate(self.kinds))
            kinds_line = f'<p class="hint kinds">{e(txt["kinds"].format(kinds=listed))}</p>'
        cells = []
        for layer in range(layers):
            for head in range(heads):
                label = txt["head"].format(layer=layer, head=head)
                name = self.names[layer][head] if self.names else ""
                cells.append(
                    f'<div class="cell" tabindex="0" role="button" data-layer="{layer}" data-head="{head}" '
                    f'title="{e(label + kind[layer])}" aria-label="{e(label + kind[layer] + " " + name)}"><canvas></canvas>'
                    f'<span class="name">{e(label)}</span><span class="name">{e(name)}</span></div>'
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
            f'<div class="modelview"><h3>{e(txt["model_view"])}</h3><p class="hint">{e(txt["model_hint"])}</p>'
            f"{kinds_line}"
            f'<div class="grid" style="grid-template-columns: repeat({heads}, 86px)">{"".join(cells)}</div></div>'
            f"<script>{_SCRIPT.replace('__ROOT__', self._id)}</script></div>"
        )

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
