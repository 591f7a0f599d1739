"""What the interactive view's page is made of besides its data: its words in each language, its colours, its
style and its script (the script reads the data block that render.view writes, see its docstring)."""

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
        "model_hint": "Every layer × head; click one (or focus it and press Enter) to open it above. Under each, its "
        "first-token share on this text; a head above {threshold} is marked a sink head (outlined in red).",
        "head": "L{layer} H{head}",
        "focus": "query {i}: {token}",
        "weight": "{key}: {w}",
        "held": "the {cache} cache holds {n} of {t} keys in this layer (the rest struck out)",
        "sink": "the learned sinks take {p} of this row",
        "kinds": "Each layer's kind: {kinds}. A sliding layer's window is outlined on its patterns.",
        "first_token": "first token {share}",
        "sink_head": "sink head",
        "learned_share": "learned sink {share}",
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
        "model_hint": "每一层 × 每个头；点一个（或选中后按回车）在上方打开。每个下面是它在这段文本上的首个 Token 份额；"
        "高于 {threshold} 的头标为汇聚头 (红框)。",
        "head": "第{layer}层 头{head}",
        "focus": "查询 {i}：{token}",
        "weight": "{key}：{w}",
        "held": "{cache} 缓存在这一层保留了 {t} 个键中的 {n} 个（其余划掉）",
        "sink": "可学习的注意力汇聚点 (sink) 拿走这一行的 {p}",
        "kinds": "每层的种类：{kinds}。滑动窗口层的窗口在它的图案上用框线标出。",
        "first_token": "首个 Token {share}",
        "sink_head": "汇聚头",
        "learned_share": "可学习汇聚点 {share}",
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
.attnview .cell.sinkhead canvas { border-color: #c5221f; }
.attnview .cell.sinkhead .mark { color: #c5221f; }
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
