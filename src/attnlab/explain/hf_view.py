"""The interactive view of a transformers model: every head's weights on a text, while the model runs attnlab's
flash kernel (``attnlab.hf``), not transformers' eager path.

``transformers_view(model, tokenizer, text)`` runs the model once with attnlab's attention and a
``Recorder(heads=...)`` naming every head; each layer's weights are formed from q, k and the kernel's
log-sum-exp, exactly, and go into the view's page data as they come (``Recorder(on_step=...)`` and a
:class:`ViewBuilder`), so one layer's weights are held at a time, not the model's (``benchmarks/hf_view.py``
measures the time and memory of this beside eager). The model's
own attention comes back after. Layers are named by kind (full, or the window of a sliding layer, outlined);
a model with learned sinks (gpt-oss) shows each row short of 1 by the share its sink took.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab import Recorder
from attnlab.explain.model_view import layer_kind
from attnlab.explain.render.html import Report, Section
from attnlab.explain.render.view import AttentionView, ViewBuilder
from attnlab.explain.render.view_data import MAX_VIEW_TOKENS
from attnlab.explain.report_text import REPORT_TEXT
from attnlab.observe import TraceStep


def transformers_view(model: Any, tokenizer: Any, text: str, *, lang: str = "en") -> AttentionView:
    """Every layer and head of a transformers causal LM on ``text``; ``tokenizer`` is its transformers tokenizer.

    Raises:
        ValueError: a text of no tokens or of more than MAX_VIEW_TOKENS, ids past the model's vocabulary, a model
            attnlab cannot run inside (named by :func:`attnlab.hf.use`), or one with layers that are not attention.
    """
    import attnlab.hf

    if lang not in REPORT_TEXT:
        raise ValueError(f"lang must be one of {sorted(REPORT_TEXT)}, got {lang!r}")
    ids = [int(i) for i in tokenizer(text)["input_ids"]]
    if not ids:
        raise ValueError(f"the text has no tokens: {text!r}; give a text to look at")
    if len(ids) > MAX_VIEW_TOKENS:
        raise ValueError(
            f"the view shows 1 to {MAX_VIEW_TOKENS} tokens; {text[:40]!r}... has {len(ids)}: give a shorter text"
        )
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if max(ids) >= int(config.vocab_size):
        raise ValueError(
            f"the tokenizer gives id {max(ids)} but the model knows {config.vocab_size} tokens: pass the tokenizer "
            "the model was trained with"
        )
    n_layers, n_heads = int(config.num_hidden_layers), int(config.num_attention_heads)
    builder = ViewBuilder(tokens=[tokenizer.decode([i]) for i in ids], layers=n_layers, heads=n_heads)
    sunk_modules: set[str] = set()  # the modules that recorded a sink's share (gpt-oss)
    sunk: list[bool] = []  # per layer added, whether it has sinks

    def take(step: TraceStep) -> None:  # each layer's weights as the forward forms them, one layer held at a time
        if step.name == "sink_weight":  # recorded just before its layer's weights
            sunk_modules.add(step.module)
            return
        if step.name != "attn_weights" or step.layer is None:
            return
        if step.layer != builder.added:
            raise ValueError(
                f"layer {builder.added} ran no attention through attnlab.hf (layer {step.layer}'s came next): the view "
                "shows models whose every layer is attention, not hybrids of attention and other layers"
            )
        sunk.append(step.module in sunk_modules)
        builder.add(step.tensor[0])  # (H, T, T): what the softmax gave the keys, each row 1 minus its sink's share

    every = [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    with attnlab.hf.use(model, backend="flash"), Recorder(heads=every, on_step=take), torch.no_grad():
        model(torch.tensor([ids]))
    if builder.added != n_layers or len(set(sunk)) > 1:
        raise ValueError(
            f"the view got the weights of {builder.added} of {n_layers} layers (sinks on {sum(sunk)}): every "
            "layer's attention must run through attnlab.hf"
        )
    window = getattr(config, "sliding_window", None)
    types = list(getattr(config, "layer_types", None) or [("sliding" if window else "full") + "_attention"] * n_layers)
    windows = [window if kind == "sliding_attention" else None for kind in types]  # Mistral: every layer slides
    txt = REPORT_TEXT[lang]
    return builder.view(lang=lang, kinds=[layer_kind(w, None, txt) for w in windows], windows=windows, sinks=all(sunk))


def transformers_report(model: Any, tokenizer: Any, text: str, *, name: str, lang: str = "en") -> Report:
    """The report ``attnlab explain --transformers`` writes: what ran, and the view of every head
    (:func:`transformers_view`) of a transformers causal LM on ``text``.

    Raises:
        ValueError: as :func:`transformers_view`.
    """
    view = transformers_view(model, tokenizer, text, lang=lang)
    txt = REPORT_TEXT[lang]
    layers, heads, tokens, _ = view.shape
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    section = Section(
        key="view",
        title=txt["view_title"],
        text=txt["hf_view_text"],
        code="transformers_view(model, tokenizer, text)  # attnlab.explain.hf_view",
        view=view.to_fragment(),
    )
    return Report(
        title=txt["model_title"].format(name=name, text=text),
        intro=txt["hf_intro"].format(kind=config.model_type, layers=layers, heads=heads, tokens=tokens),
        lang=lang,
        sections=[section],
        labels={"contents": txt["contents"], "numbers": txt["numbers"], "enlarge": txt["enlarge"]},
    )
