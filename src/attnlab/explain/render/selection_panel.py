"""The selection panel: for a chosen query of a sparse layer, the keys its layer read marked, its dense weights
beside the weights it used, and the dense mass it kept; one offline HTML fragment (no network), placed in the
interactive view and the model report (``attnlab.explain.selection`` makes its data).

Its data reaches the page as JSON in a ``<script type="application/json">`` block with ``<``, ``>`` and ``&``
escaped (as ``render.view`` writes its own), the weights as uint16 steps of 1/65535, base64, and every label is
written with ``textContent``. The root carries ``data-ready="1"`` once drawn, and each key row ``data-col``, its
class "chosen" (the selection's), "window" (read, not chosen) or "skipped". Inside the interactive view it follows
the head view: the query focused there, and its layer where that layer selects.

Shapes: T = queries, C = columns of a layer's dense axis (its tokens, then a compressed layer's entries).
"""

from __future__ import annotations

import base64
import html
import secrets

import torch

from attnlab.explain.render.view import _json_for_html

PANEL_TEXT = {
    "en": {
        "title": "Selection",
        "hint": "A sparse layer's query reads only the keys marked ✓ (its selection; a V4 layer's window marked w). "
        "Beside each, its dense weight (every key the query may see, the selection taken away) and the weight "
        "used, each the mean over the heads (DSA and V4 choose once for every head of a query; MoBA and NSA choose per "
        "head or key group, and a key is marked where any head read it).",
        "layer": "layer",
        "query": "query",
        "key": "key",
        "chosen": "chosen",
        "dense": "dense",
        "used": "used",
        "status": "query {q}: {token} read {read} of {visible} keys; the selection kept {kept} of the dense mass",
    },
    "zh": {
        "title": "选择",
        "hint": "稀疏层的查询只读标了 ✓ 的键 (它的选择；V4 层的窗口标为「窗」)。每个键旁边是它的稠密权重 (查询看得到的全部键，"
        "去掉选择) 和实际用到的权重，都是对各个头的平均 (DSA 与 V4 为一个查询的所有头选一次；MoBA 与 NSA 按头或键组各自选择，"
        "任何一个头读过的键都会标出)。",
        "layer": "层",
        "query": "查询",
        "key": "键",
        "chosen": "选中",
        "dense": "稠密",
        "used": "实际",
        "status": "查询 {q}：{token} 读了 {visible} 个键中的 {read} 个；选择保留了 {kept} 的稠密份额",
    },
}

_CSS = """
.selview { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", "Noto Sans", "PingFang SC", sans-serif;
           color: #1d1d1f; border-top: 1px solid #dadce0; margin-top: 12px; padding-top: 8px; }
.selview h3 { margin: 4px 0 6px; font-size: 15px; }
.selview .hint { color: #5f6368; font-size: 12px; margin: 0 0 8px; }
.selview .status { font-weight: 600; margin: 6px 0; }
.selview .rows { max-height: 420px; overflow: auto; border: 1px solid #eee; border-radius: 6px; }
.selview table { border-collapse: collapse; width: 100%; }
.selview td, .selview th { padding: 1px 6px; text-align: left; white-space: nowrap; font-size: 12px; }
.selview tr.chosen td.mark { color: #188038; font-weight: 700; }
.selview tr.window td.mark { color: #1a73e8; }
.selview tr.skipped td { color: #9aa0a6; }
.selview .bar { display: inline-block; height: 9px; vertical-align: middle; margin-right: 4px; }
.selview .dense .bar { background: #9aa0a6; }
.selview .used .bar { background: #188038; }
"""

_SCRIPT = r"""
(function (root) {
  var data = JSON.parse(root.querySelector("script.selview-data").textContent), txt = data.text;
  function steps(text) {
    var raw = atob(text), out = new Uint16Array(raw.length / 2);
    for (var n = 0; n < out.length; n++) { out[n] = raw.charCodeAt(2 * n) | (raw.charCodeAt(2 * n + 1) << 8); }
    return out;
  }
  var layers = data.layers.map(function (l) {
    return { l: l, dense: steps(l.dense), used: steps(l.used), C: l.columns.length };
  });
  var layerSel = root.querySelector("select.sel-layer"), querySel = root.querySelector("select.sel-query");
  var body = root.querySelector("tbody"), status = root.querySelector(".status");
  function fill(template, values) {
    return template.replace(/\{(\w+)\}/g, function (whole, name) {
      return Object.prototype.hasOwnProperty.call(values, name) ? values[name] : whole;
    });
  }
  function bar(cls, w) {
    var td = document.createElement("td"), b = document.createElement("span");
    td.className = cls; b.className = "bar"; b.style.width = Math.round(120 * w) + "px";
    td.appendChild(b); td.appendChild(document.createTextNode(w.toFixed(3)));
    return td;
  }
  function draw() {
    var x = layers[+layerSel.value], l = x.l, q = +querySel.value, C = x.C;
    var read = l.read[q], chosen = l.selected[q];
    body.textContent = "";
    var visible = 0;
    for (var c = 0; c < C; c++) {
      var d = x.dense[q * C + c] / 65535, u = x.used[q * C + c] / 65535;
      var isRead = read.indexOf(c) >= 0, isChosen = chosen.indexOf(c) >= 0;
      if (!(l.visible[q].indexOf(c) >= 0)) { continue; }
      visible++;
      var tr = document.createElement("tr");
      tr.className = isChosen ? "chosen" : isRead ? "window" : "skipped";
      tr.setAttribute("data-col", String(c));
      var label = document.createElement("td");
      label.textContent = c < l.read.length ? c + " " + l.columns[c] : l.columns[c];  // a token with its position
      var mark = document.createElement("td"); mark.className = "mark";
      mark.textContent = isChosen ? "\u2713" : isRead ? txt.window : "\u00b7";
      tr.appendChild(label); tr.appendChild(mark); tr.appendChild(bar("dense", d)); tr.appendChild(bar("used", u));
      body.appendChild(tr);
    }
    status.textContent = fill(txt.status, { q: String(q), token: l.columns[q], read: String(read.length),
                                            visible: String(visible), kept: l.kept[q].toFixed(3) });
  }
  function queries() {
    var l = layers[+layerSel.value].l, keep = querySel.value === "" ? l.read.length - 1 : +querySel.value;
    querySel.textContent = "";
    for (var q = 0; q < l.read.length; q++) {
      var o = document.createElement("option");
      o.value = String(q); o.textContent = q + ": " + l.columns[q];
      querySel.appendChild(o);
    }
    querySel.value = String(Math.min(keep, l.read.length - 1));
  }
  layerSel.addEventListener("change", function () { queries(); draw(); });
  querySel.addEventListener("change", draw);
  var view = root.closest(".attnview");  // inside the interactive view: follow its focused query and its layer
  if (view) {
    var follow = function (event) {
      var i = event.target && event.target.getAttribute && event.target.getAttribute("data-i");
      if (i !== null && i !== undefined && i !== "") { querySel.value = i; draw(); }
    };
    view.querySelector(".col.q").addEventListener("mouseover", follow);
    view.querySelector(".col.q").addEventListener("click", follow);
    view.querySelector("select.layer").addEventListener("change", function (event) {
      for (var n = 0; n < layers.length; n++) {
        if (String(layers[n].l.layer) === event.target.value) { layerSel.value = String(n); queries(); draw(); }
      }
    });
  }
  queries(); querySel.value = String(data.query); draw();
  root.setAttribute("data-ready", "1");
})(document.getElementById("__ROOT__"));
"""


def _steps(weights: torch.Tensor) -> str:
    """(T, C) weights in [0, 1] as little-endian uint16 steps of 1/65535, base64."""
    steps = torch.clamp(weights.float(), 0, 1).mul(65535).round().to(torch.int32).numpy().astype("<u2")
    return base64.b64encode(steps.tobytes()).decode("ascii")


def panel_layer(
    *,
    layer: int,
    kind: str,
    columns: list[str],
    dense: torch.Tensor,
    used: torch.Tensor,
    read: torch.Tensor,
    selected: torch.Tensor,
    visible: torch.Tensor,
    kept: torch.Tensor,
) -> dict[str, object]:
    """One layer's data for :func:`selection_fragment`: weights (T, C), the bool marks (T, C), kept (T,)."""
    cols = lambda mask: [row.nonzero()[:, 0].tolist() for row in mask]  # (T, C) -> per query, its columns
    return {
        "layer": layer,
        "kind": kind,
        "columns": columns,
        "dense": _steps(dense),
        "used": _steps(used),
        "read": cols(read),
        "selected": cols(selected),
        "visible": cols(visible),
        "kept": [round(float(x), 4) for x in kept],
    }


def selection_fragment(layers: list[dict[str, object]], *, lang: str, query: int) -> str:
    """The panel as one ``<div>`` with its own style, data and script; ``query``: the row shown first."""
    if lang not in PANEL_TEXT:
        raise ValueError(f"lang must be one of {sorted(PANEL_TEXT)}, got {lang!r}")
    e, txt, root = html.escape, PANEL_TEXT[lang], f"selview-{secrets.token_hex(6)}"
    window = "窗" if lang == "zh" else "w"
    data = {"layers": layers, "query": query, "text": {"status": txt["status"], "window": window}}
    options = "".join(f'<option value="{n}">{e(txt["layer"])} {x["layer"]} · {e(str(x["kind"]))}</option>'
                      for n, x in enumerate(layers))  # fmt: skip
    heads = "".join(f"<th>{e(txt[k])}</th>" for k in ("key", "chosen", "dense", "used"))
    return (
        f'<div class="selview" id="{root}" lang="{e(lang)}"><style>{_CSS}</style>'
        f'<script type="application/json" class="selview-data">{_json_for_html(data)}</script>'
        f'<h3>{e(txt["title"])}</h3><p class="hint">{e(txt["hint"])}</p>'
        f'<label>{e(txt["layer"])} <select class="sel-layer">{options}</select></label> '
        f'<label>{e(txt["query"])} <select class="sel-query"></select></label>'
        f'<div class="status"></div><div class="rows"><table><thead><tr>{heads}</tr></thead><tbody></tbody>'
        f"</table></div><script>{_SCRIPT.replace('__ROOT__', root)}</script></div>"
    )
