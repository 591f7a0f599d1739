"""A model named as on the Hugging Face Hub (``Qwen/Qwen3-0.6B``, ``gpt2``), read from huggingface_hub's own cache,
fetched into it first where the hub can be reached (with its progress bar).

Only what attnlab reads comes down: the JSON files (config, tokenizer), safetensors weights and tokenizer
vocabularies; never a pickle (``*.bin``, ``*.pt``, ``*.pth``), which runs code when loaded. ``HF_HUB_OFFLINE=1``
and ``HF_HUB_CACHE`` are read when the name is resolved; a revision (a branch, a tag, a commit) is given as
``revision=`` or, on the command line, ``NAME@REVISION``. Every failure is one ``ValueError`` naming the fix.
:func:`locate <attnlab.models.locate.locate>` asks here last: a local folder or file of that name comes first,
then the checkpoints that ship with attnlab.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

WANTED = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]  # config, weights, tokenizer files
PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def hub_name(name: object) -> bool:
    """Whether ``name`` reads as a hub repository id (``org/name`` or ``name``), not a path: a str of at most one
    ``/``, not absolute, relative (``./``) or home (``~``), without a file suffix attnlab reads locally."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(name, str) or not name or name.count("/") > 1 or "\\" in name:
        return False
    base = name.split("@", 1)[0]
    if base.startswith((".", "~", "/")) or base.endswith((*PICKLES, ".safetensors", ".json")):
        return False
    try:
        validate_repo_id(base)
    except HFValidationError:
        return False
    return True


def offline() -> bool:
    """``HF_HUB_OFFLINE`` as set now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import is_offline_mode

    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on") or is_offline_mode()


def from_hub(name: str, *, revision: str | None = None) -> Path:
    """The folder of ``name`` (``NAME@REVISION`` too) in huggingface_hub's cache, fetched first when the hub can be
    reached; refused, with what to run, where it cannot be had."""
    base, _, at = name.partition("@")
    if at and revision is not None and at != revision:
        raise ValueError(f"{name!r} names revision {at!r} and revision={revision!r} another: give one")
    return _snapshot(base, revision or at or None, os.environ.get("HF_HUB_CACHE") or None, offline())


@functools.lru_cache(maxsize=32)
def _snapshot(name: str, revision: str | None, cache: str | None, local_only: bool) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = "" if revision is None else f" at revision {revision!r}"
    fetch = f"hf download {name}" + ("" if revision is None else f" --revision {revision}")
    try:
        folder = Path(
            snapshot_download(
                name, revision=revision, cache_dir=cache, allow_patterns=WANTED, local_files_only=local_only
            )
        )
    except GatedRepoError:
        raise ValueError(
            f"{name!r} on the Hugging Face Hub is gated: accept its terms on huggingface.co, then `hf auth login`"
        ) from None
    except RevisionNotFoundError:
        raise ValueError(
            f"{name!r} on the Hugging Face Hub has no revision {revision!r}: give a branch, tag or commit it has"
        ) from None
    except RepositoryNotFoundError:
        raise ValueError(
            f"no folder or file {name!r} here, and no model {name!r} on the Hugging Face Hub (a private one needs "
            "`hf auth login`): check the name"
        ) from None
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if local_only else "the hub could not be reached"
        raise ValueError(
            f"no folder or file {name!r} here, and {name!r}{at} is not in the Hugging Face cache while {why}: "
            f"fetch it where the hub can be reached (`{fetch}`), or give a local folder"
        ) from None
    if not any(folder.glob("*.safetensors")):
        raise ValueError(
            f"{name!r}{at} on the Hugging Face Hub has no safetensors weights (only pickles, which attnlab does not "
            "load from a hub: loading one runs its code); convert it, or give a local folder"
        )
    return folder
