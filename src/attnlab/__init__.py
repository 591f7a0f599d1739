"""attnlab: learn, verify and use attention.

``attnlab.book`` is chapter 3, faithful; ``attnlab.functional.attention`` and
``attnlab.Attention`` are the production path.

The names below are imported on first use, so ``import attnlab`` (and the
``attnlab`` command's help, version and argument checks) does not wait for
PyTorch to load.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnlab.functional import attention
    from attnlab.models.train import train
    from attnlab.nn import Attention
    from attnlab.observe import Recorder

__version__ = "0.1.0"
__all__ = ["Attention", "Recorder", "__version__", "attention", "train"]

_WHERE = {  # name -> the module that defines it
    "attention": "attnlab.functional",
    "Attention": "attnlab.nn",
    "Recorder": "attnlab.observe",
    "train": "attnlab.models.train",  # the training loop: loads the whole-model layer
}


def __getattr__(name: str) -> object:
    """``attnlab.attention``, ``attnlab.Attention``, ``attnlab.Recorder`` and ``attnlab.train``, on first use."""
    if name in _WHERE:
        value = getattr(import_module(_WHERE[name]), name)
        globals()[name] = value  # the next lookup is a plain attribute
        return value
    raise AttributeError(f"module 'attnlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
