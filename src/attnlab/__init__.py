"""attnlab: learn, verify and use attention.

``attnlab.book`` is chapter 3, faithful; ``attnlab.functional.attention`` and
``attnlab.Attention`` are the production path.
"""

from attnlab.functional import attention
from attnlab.nn import Attention
from attnlab.observe import Recorder

__version__ = "0.1.0"
__all__ = ["Attention", "Recorder", "__version__", "attention", "train"]


def __getattr__(name: str) -> object:
    """``attnlab.train``, the training loop, imported on first use (it loads the whole-model layer)."""
    if name == "train":
        from attnlab.models.train import train

        return train
    raise AttributeError(f"module 'attnlab' has no attribute {name!r}")
