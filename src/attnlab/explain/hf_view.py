"""The interactive view of a transformers model: every head's weights on a text, while the model runs attnlab's
flash kernel (``attnlab.hf``), not transformers' eager path.

``transformers_view(model, tokenizer, text)`` runs the model once with attnlab's attention and a
``Recorder(heads=...)`` naming every head; each layer's weights are formed from q, k and the kernel's
log-sum-exp, exactly (``benchmarks/hf_view.py`` measures the time and memory of this beside eager). The model's
own attention comes back after. Layers are named by kind (full, or the window of a sliding layer, outlined);
a model with learned sinks (gpt-oss) shows each row short of 1 by the share its sink took.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab import Recorder
from attnlab.explain.model_report import layer_kind
from attnlab.explain.render.view import MAX_VIEW_TOKENS, AttentionView
from attnlab.explain.report_text import REPORT_TEXT


def transformers_view(model: Any, tokenizer: Any, text: str, *, lang: str = "en") -> AttentionView:
    """Every layer and head of a transformers causal LM on ``text``; ``tokenizer`` is its transformers tokenizer.

    Raises:
        ValueError: a text of no tokens or of more than MAX_VIEW_TOKENS, or a model attnlab cannot run inside
            (named by :func:`attnlab.hf.use`).
    """
    import attnlab.hf

    if lang not in REPORT_TEXT:
        raise ValueError(f"lang must be one of {sorted(REPORT_TEXT)}, got {lang!r}")
    ids = [int(i) for i in tokenizer(text)["input_ids"]]
    if not 0 < len(ids) <= MAX_VIEW_TOKENS:
        raise ValueError(
            f"the view shows 1 to {MAX_VIEW_TOKENS} tokens; {text[:40]!r}... has {len(ids)}: give a shorter text"
        )
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n_layers, n_heads = int(config.num_hidden_layers), int(config.num_attention_heads)
    every = [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    with attnlab.hf.use(model, backend="flash"), Recorder(heads=every) as rec, torch.no_grad():
        model(torch.tensor([ids]))
    layers = []
    sinks = rec.all("sink_weight")  # {module: (B, H, T)}: gpt-oss's learned sinks, by layer in order
    shares = list(sinks.values()) if len(sinks) == n_layers else None
    for layer in range(n_layers):
        w = torch.stack([rec.head(layer, head)[0] for head in range(n_heads)])  # (H, T, T), rows summing to 1
        if shares is not None:  # what a row gives its sink is given to no key
            w = w * (1 - shares[layer][0, :, :, None])
        layers.append(w)
    window = getattr(config, "sliding_window", None)
    types = list(getattr(config, "layer_types", None) or [("sliding" if window else "full") + "_attention"] * n_layers)
    windows = [window if kind == "sliding_attention" else None for kind in types]  # Mistral: every layer slides
    txt = REPORT_TEXT[lang]
    return AttentionView(
        tokens=[tokenizer.decode([i]) for i in ids],
        weights=torch.stack(layers),  # (L, H, T, T)
        lang=lang,
        kinds=[layer_kind(w, None, txt) for w in windows],
        windows=windows,
        sinks=shares is not None,
    )
