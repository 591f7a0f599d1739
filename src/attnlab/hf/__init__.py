"""attnlab inside Hugging Face models: its attention as a transformers attention implementation.

    import attnlab.hf                      # registers attn_implementation="attnlab"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="attnlab")
    attnlab.hf.use(model, backend="flash", score_mod=attnlab.functional.mods.softcap(30.0))
    with attnlab.Recorder(heads=[(0, 3)]) as rec:
        model(ids)
    rec.head(0, 3)  # (B, T, T): layer 0 head 3's weights, recomputed exactly; the model ran flash

(the README's example runs as written, tests/test_docs.py)

``use`` returns a handle; as a context manager it puts back what the model ran before (mods for one call).
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.functional.registry import Backend
from attnlab.hf.bridge import NAME, PerLayer, Settings, check_settings, hf_attention, put
from attnlab.hf.checks import check_model, watch
from attnlab.hf.model_states import STATES, field

__all__ = ["NAME", "Use", "cache", "register", "use"]


def cache(name: str, model: torch.nn.Module, *, max_len: int | None = None, **options: Any) -> Any:
    """One of attnlab's KV caches as a transformers Cache, for ``model.generate(..., cache=...)``; see
    :func:`attnlab.hf.caches.cache` (imported on first use)."""
    from attnlab.hf.caches import cache as make

    return make(name, model, max_len=max_len, **options)


def register() -> None:
    """Make "attnlab" an attn_implementation transformers knows: the attention function, and the mask transformers
    builds for sdpa (boolean, True = may attend; left out where causal says it all), or for eager on a model that
    appends a bias of its own to it (:data:`ADDITIVE`). Idempotent."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as err:
        raise ImportError(f"attnlab.hf needs transformers >= 5.0 (pip install 'attnlab[hf]'): {err}") from err

    AttentionInterface.register(NAME, hf_attention)
    AttentionMaskInterface.register(NAME, bridge_mask)


# models whose attention appends its own additive bias to the mask it is given: DeepSeek-V4 casts its compressed
# entries' bias (0 for a closed, chosen entry, -inf for the rest) to the mask's dtype and concatenates it, which a
# boolean mask inverts (-inf becomes True) and a mask left out drops; they get eager's float mask, always made
ADDITIVE = ("deepseek_v4",)


def bridge_mask(**kwargs: Any) -> Any:
    """The mask transformers builds for "attnlab": sdpa's, or eager's for a model in :data:`ADDITIVE`."""
    from transformers.masking_utils import eager_mask, sdpa_mask

    config = kwargs.get("config")
    return (eager_mask if getattr(config, "model_type", None) in ADDITIVE else sdpa_mask)(**kwargs)


class Use:
    """What ``use`` changed on one model; ``undo()`` (or leaving a ``with`` block) puts back what was there."""

    def __init__(self, model: torch.nn.Module, before: str, settings: list[Any], *, book: bool = False) -> None:
        self.model, self._before, self._settings, self._book = model, before, settings, book

    def undo(self) -> None:
        if self._book:  # the book's modules get their own forward back
            from attnlab.hf.book import unhook

            unhook(self._settings)
            return
        for module, settings in self._settings:
            put([module], settings)
        if self._before != NAME:
            setter: Any = getattr(self.model, "set_attn_implementation")  # noqa: B009
            setter(self._before)

    def __enter__(self) -> Use:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def use(
    model: torch.nn.Module,
    *,
    backend: Backend = "flash",
    mask_mod: PerLayer = None,
    score_mod: Any = None,
) -> Use:
    """Run every attention layer of a transformers model through attnlab.

    Args:
        model: a transformers ``PreTrainedModel`` whose attention goes through ``AttentionInterface`` (Llama,
            Mistral, Qwen2/3, Gemma 3, gpt-oss, DeepSeek-V3, GPT-2, ...), or the book's own ``GPTModel``,
            ``Llama3Model`` or ``Qwen3Model`` (``llms-from-scratch``; each attention module gets attnlab's forward,
            :mod:`attnlab.hf.book`).
        backend: attnlab's backend: "flash" (tiled; returns the log-sum-exp that learned sinks and recovered
            weights are read from), "eager", "sdpa", "flex" or "auto".
        mask_mod, score_mod: FlexAttention-style mods (``attnlab.functional.mods``) added to the model's own
            masks in every layer, or ``{layer index: mod}`` for some layers. A mask_mod restricts the model's
            mask (AND); one that declares ``sees_future`` (``prefix_lm``) cannot widen it and is refused.

    Returns:
        A handle: ``undo()``, or use it in a ``with`` block, to put back the model's previous attention.

    Raises:
        ValueError, TypeError: a bad backend or mod, a mod that sees the future, a backend the model's sinks or
            softcap cannot run on, or a model that does not take an attn_implementation; the model is then
            unchanged. From then on each forward's mods and heads are checked before its first layer writes a
            cache (:mod:`attnlab.hf.checks`; the hook stays after ``undo()``, and checks what the model runs then).
    """
    check_settings(backend, mask_mod, score_mod)
    settings = Settings(backend=backend, mask_mod=mask_mod, score_mod=score_mod)
    from attnlab.hf.book import book_attention, hook

    modules = book_attention(model)
    if modules is not None:  # the book's GPTModel, Llama3Model or Qwen3Model: by module replacement
        _check_layers(mask_mod, score_mod, len(modules))
        check_model(model, None, settings, len(modules))
        return Use(model, NAME, hook(modules, settings), book=True)
    config: Any = getattr(model, "config", None)
    setter: Any = getattr(model, "set_attn_implementation", None)
    if config is None or not callable(setter):
        raise TypeError(
            f"attnlab.hf.use takes a transformers PreTrainedModel or the book's GPTModel, Llama3Model or Qwen3Model, "
            f"got {type(model).__name__}; for attnlab's own models pass backend= to GPT or Attention instead"
        )
    register()
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = int(getattr(text, "num_hidden_layers", 0) or 0) or None
    _check_layers(mask_mod, score_mod, layers, kinds=[str(kind) for kind in field(text, "layer_types") or []])
    check_model(model, text, settings, layers)
    before = config._attn_implementation
    if before != NAME:
        setter(NAME)
        if config._attn_implementation != NAME:
            raise ValueError(
                f"{type(model).__name__} kept attn_implementation={config._attn_implementation!r}: its attention "
                "does not go through transformers' AttentionInterface, so attnlab cannot run inside it"
            )
    # on every module that holds a config: each attention module (a composite model's, Llava's or Gemma 3's, each
    # part's) reads them in the bridge, and the decoder in its pre-hook (attnlab.hf.checks)
    settings_before = put((m for m in model.modules() if getattr(m, "config", None) is not None), settings)
    watch(model)  # each forward's mods, heads and cache checked before its first layer writes (attnlab.hf.checks)
    return Use(model, before, settings_before)


def _check_layers(mask_mod: Any, score_mod: Any, layers: int | None, *, kinds: list[str] | None = None) -> None:
    """Mods by layer index name layers the model has, and (given each layer's type) softmax attention layers: a
    mod on a Gated DeltaNet or convolution layer would change nothing, silently."""
    for name, mod in (("mask_mod", mask_mod), ("score_mod", score_mod)):
        if isinstance(mod, dict) and layers is not None and any(k >= layers for k in mod):
            raise ValueError(f"{name} names layers {sorted(mod)}, but the model has {layers} (0 to {layers - 1})")
        if not isinstance(mod, dict) or not kinds or len(kinds) != layers:
            continue
        others = [k for k in sorted(mod) if kinds[k] in STATES]
        if others:
            softmax = [k for k, kind in enumerate(kinds) if kind not in STATES]
            raise ValueError(
                f"{name} names layers {others}, of types {[kinds[k] for k in others]}, which compute no attention "
                f"scores for a mod to read (attnlab runs this model's softmax attention layers alone): name among "
                f"its attention layers {softmax}"
            )


try:  # "import attnlab.hf" is enough for from_pretrained(..., attn_implementation="attnlab")
    register()
except ImportError:  # transformers is not installed: use() says so when called
    pass
