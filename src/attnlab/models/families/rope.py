"""RoPE's settings in a Hugging Face config.json: every key read as transformers 5 reads it, or refused by name.

transformers keeps them in ``rope_parameters`` (v4: ``rope_theta`` beside a ``rope_scaling`` object): one entry
for the model, or, in Gemma 3, one per layer type (``full_attention``, ``sliding_attention``), each with its own
theta and scaling. An entry is read whole by :func:`entry`: its ``rope_type`` says which keys it may hold
(``KEYS``), and a key outside them, or a type whose frequencies change with the length seen, is refused before
any weight is read, rather than loaded into a model that computes something else. :func:`written` is the way
back: the entry that reads as the same theta and scaling.

The defaults are transformers': ``original_max_position_embeddings`` is ``max_position_embeddings`` when absent
(a top-level ``original_max_position_embeddings`` wins over the entry's in a single-entry config, as Phi-3 has
it); YaRN's ``attention_factor`` is mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set
and non-zero, else 0.1 ln(factor) + 1; its ``factor`` when null is max_position_embeddings over the original.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from attnlab.functional.rotary import RopeScaling

BASE_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})
KEYS: dict[str, frozenset[str]] = {  # per rope_type, what an entry may hold (what transformers reads of it)
    "default": BASE_KEYS,
    "linear": BASE_KEYS | {"factor"},
    "llama3": BASE_KEYS | {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "yarn": BASE_KEYS
    | {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "truncate"}
    | {"mscale", "mscale_all_dim"},
}
MOVING = {  # rope types whose frequencies are not fixed: attnlab's rotary embedding has one set per layer
    "dynamic": "dynamic NTK recomputes theta once a sequence passes max_position_embeddings",
    "longrope": "LongRoPE switches its factors once a sequence passes original_max_position_embeddings",
}


def _file(where: Path) -> str:
    return repr(str(where / "config.json"))


def mscale(factor: float, m: float = 1.0) -> float:
    """YaRN's magnitude correction: 0.1 m ln(factor) + 1 (1 when the factor does not stretch)."""
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def entry(
    given: dict[str, Any], where: Path, *, theta: float, max_positions: int | None, layer: str | None = None
) -> tuple[float, RopeScaling | None]:
    """RoPE's theta and scaling for one ``rope_parameters`` entry (``layer``: its layer type, when nested).

    ``theta`` is the base when the entry has no ``rope_theta``; ``max_positions`` the config's
    max_position_embeddings (None: the config has none), the default for ``original_max_position_embeddings``.

    Raises:
        ValueError: a rope_type or key attnlab does not read, or a value the scaling cannot take, by name.
    """
    at = f"{_file(where)}: rope_parameters" + (f"[{layer!r}]" if layer else "")
    if not isinstance(given, dict):
        raise ValueError(f"{at} must be an object, got {given!r:.60}")
    kind = given.get("rope_type", given.get("type", "default"))
    if "type" in given and given["type"] != kind:  # v4's name for it, merged into an entry that has one
        raise ValueError(
            f"{at}: type={given['type']!r} is not read beside rope_type={kind!r} (transformers reads rope_type)"
        )
    if kind in MOVING:
        raise ValueError(
            f"{at}: rope_type {kind!r} is not supported: {MOVING[kind]}, and attnlab's RoPE keeps one set of "
            f"frequencies per layer (it reads {sorted(KEYS)})"
        )
    if kind not in KEYS:
        raise ValueError(f"{at}: rope_type {kind!r} is not supported (attnlab reads {sorted(KEYS)})")
    unread = sorted(set(given) - KEYS[kind])
    if unread:
        raise ValueError(
            f"{at}: {', '.join(f'{k}={given[k]!r}' for k in unread)} not read by attnlab with rope_type "
            f"{kind!r} (an entry of that type holds {sorted(KEYS[kind] - {'type'})})"
        )
    share = given.get("partial_rotary_factor", 1.0)
    if share != 1.0:  # transformers' models of these families ignore it unscaled and fail on it scaled
        raise ValueError(
            f"{at}: partial_rotary_factor={share!r} is not supported: these families' transformers models turn "
            "the whole head with default RoPE and fail with a scaled one (attnlab reads only 1.0)"
        )
    base = given.get("rope_theta", theta)
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
        raise ValueError(f"{at}: rope_theta must be a number > 1, got {base!r}")
    if kind == "default":
        return float(base), None
    original = given.get("original_max_position_embeddings", max_positions)
    if kind in ("llama3", "yarn") and original is None:
        raise ValueError(
            f"{at}: rope_type {kind!r} needs original_max_position_embeddings (or max_position_embeddings beside it)"
        )
    factor = given.get("factor")
    if factor is None and kind == "yarn" and max_positions is not None and original is not None:
        factor = max_positions / original  # transformers' YaRN: the stretch from the original length
    if factor is None:
        raise ValueError(f"{at}: rope_type {kind!r} needs a factor")
    try:
        return float(base), _scaling(given, kind, float(factor), original, layer)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{at}: {error}") from None


def _scaling(given: dict[str, Any], kind: str, factor: float, original: Any, layer: str | None) -> RopeScaling:
    if kind == "linear":
        return RopeScaling(kind="linear", factor=factor)
    if isinstance(original, float) and original.is_integer():
        original = int(original)
    if kind == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            if key not in given:
                raise ValueError(f"rope_type 'llama3' needs {key}")
        return RopeScaling(
            kind="llama3",
            factor=factor,
            low_freq_factor=given["low_freq_factor"],
            high_freq_factor=given["high_freq_factor"],
            original_context_length=original,
        )
    truncate = given.get("truncate", True)
    if layer is not None and truncate is not True:  # transformers reads truncate off the outer dict, never here
        raise ValueError(f"truncate={truncate!r} is not read by transformers in a per-layer-type entry (it truncates)")
    attention_factor = given.get("attention_factor")
    m, m_all = given.get("mscale"), given.get("mscale_all_dim")
    if attention_factor is None and m and m_all:
        attention_factor = mscale(factor, m) / mscale(factor, m_all)
    return RopeScaling(
        kind="yarn",
        factor=factor,
        original_context_length=original,
        beta_fast=float(given.get("beta_fast") or 32.0),  # transformers' defaults, for a missing or a 0
        beta_slow=float(given.get("beta_slow") or 1.0),
        truncate=bool(truncate),  # null reads as false in transformers
        attention_factor=None if attention_factor is None else float(attention_factor),
    )


def flat(raw: dict[str, Any], where: Path, *, theta: float = 10000.0) -> dict[str, Any]:
    """``rope_base`` and ``rope_scaling`` of a config with one RoPE for every layer: ``rope_scaling`` (v4, which
    transformers 5 prefers when set) or ``rope_parameters``, with the top-level ``rope_theta`` and
    ``partial_rotary_factor`` as their defaults (``theta``: the family's own when there is none)."""
    given = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    if not isinstance(given, dict):
        raise ValueError(f"{_file(where)}: rope_parameters must be an object, got {given!r:.60}")
    given = dict(given)
    if raw.get("partial_rotary_factor") is not None:
        given.setdefault("partial_rotary_factor", raw["partial_rotary_factor"])
    kind = given.get("rope_type", given.get("type", "default"))
    if kind in ("llama3", "yarn") and raw.get("original_max_position_embeddings") is not None:
        given["original_max_position_embeddings"] = raw["original_max_position_embeddings"]  # Phi-3's place wins
    top = raw.get("rope_theta")
    base, scaling = entry(given, where, theta=theta if top is None else top, max_positions=max_positions(raw))
    return {"rope_base": base, "rope_scaling": scaling}


def max_positions(raw: dict[str, Any]) -> int | None:
    """The config's max_position_embeddings (None when it has none): the default original length."""
    value = raw.get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def written(base: float, scaling: RopeScaling | None) -> dict[str, Any]:
    """The ``rope_parameters`` entry that :func:`entry` reads back as ``base`` and ``scaling``."""
    out: dict[str, Any] = {"rope_theta": float(base), "rope_type": "default"}
    if scaling is None:
        return out
    out |= {"rope_type": scaling.kind, "factor": scaling.factor}
    if scaling.kind == "llama3":
        out |= {"low_freq_factor": scaling.low_freq_factor, "high_freq_factor": scaling.high_freq_factor}
    if scaling.kind == "yarn":
        out |= {"beta_fast": scaling.beta_fast, "beta_slow": scaling.beta_slow, "truncate": scaling.truncate}
        if scaling.attention_factor is not None:
            out["attention_factor"] = scaling.attention_factor
    if scaling.kind in ("llama3", "yarn"):
        out["original_max_position_embeddings"] = scaling.original_context_length
    return out


def typed_entry(
    given: dict[str, Any], where: Path, kind: str, raw: dict[str, Any]
) -> tuple[float, RopeScaling | None, float | None]:
    """One layer type's ``rope_parameters`` entry (``kind``) as theta, scaling and proportion: :func:`entry`'s, or a
    proportional RoPE's (Gemma 4's and LFM3's full layers: rope_theta, partial_rotary_factor, factor, the frequencies
    over the whole head and all but that share zero, then divided by factor as transformers does)."""
    if given.get("rope_type") != "proportional":
        theta, scaling = entry(given, where, theta=10000.0, max_positions=max_positions(raw), layer=kind)
        return theta, scaling, None
    unread = sorted(set(given) - {"rope_type", "rope_theta", "partial_rotary_factor", "factor"})
    share, factor, base = given.get("partial_rotary_factor", 1.0), given.get("factor", 1.0), given.get("rope_theta")
    if unread or not (isinstance(base, (int, float)) and base > 1) or not 0 < share <= 1 or not factor > 0:
        raise ValueError(
            f"{str(where / 'config.json')!r}: rope_parameters[{kind!r}] is a proportional RoPE attnlab reads with "
            f"rope_theta > 1, partial_rotary_factor in (0, 1] and factor > 0 only; got {given!r:.120}"
        )
    return float(base), None if factor == 1 else RopeScaling(kind="linear", factor=float(factor)), float(share)
