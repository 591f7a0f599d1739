"""Peak bytes of tensor storage allocated by PyTorch code, on any device.

``torch.cuda.max_memory_allocated`` exists only for CUDA. :class:`PeakMemory`
counts on the CPU too: a TorchDispatchMode sees every tensor an operator
returns, adds its storage's bytes the first time that storage appears, and
subtracts them when the last Python reference to a tensor on that storage is
collected. It measures allocated bytes, not time and not RSS.

>>> import torch
>>> with PeakMemory() as mem:
...     x = torch.ones(1024)  # 4 KiB
...     y = x * 2             # 4 KiB more
>>> mem.peak_bytes
8192
>>> with PeakMemory() as mem:
...     z = y[:10].mul_(3)    # a view of y, changed in place: nothing new
>>> mem.peak_bytes
0
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _tensors(tree: Any) -> list[torch.Tensor]:
    """The tensors in an operator's arguments or results: nested tuples, lists and dicts (what aten passes)."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (tuple, list)):
        return [t for item in tree for t in _tensors(item)]
    if isinstance(tree, dict):
        return [t for item in tree.values() for t in _tensors(item)]
    return []


def _key(t: torch.Tensor) -> int:
    storage = t.untyped_storage()
    return storage.data_ptr() if storage.data_ptr() else id(storage)


class PeakMemory(TorchDispatchMode):
    """Track live and peak storage bytes of tensors created inside the block."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: leave ``__torch_dispatch__`` unwrapped. PyTorch wraps a mode's handler so that torch.compile
        never traces it, and the wrapper imports all of torch._dynamo (about 2 s) on the first operation. A
        counter of bytes is not compiled, and every bench worker pays that import otherwise."""
        return False

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, list[int]] = {}  # storage id -> [bytes, number of live tensors]
        self.current_bytes = 0
        self.peak_bytes = 0

    def _release(self, key: int) -> None:
        entry = self._live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current_bytes -= entry[0]
            del self._live[key]

    def _track(self, t: torch.Tensor, key: int) -> None:
        entry = self._live.get(key)
        if entry is None:
            entry = self._live[key] = [t.untyped_storage().nbytes(), 0]
            self.current_bytes += entry[0]
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        made = _tensors(out)
        if made:
            given = {_key(t) for t in _tensors((args, kwargs))}
            for t in made:
                key = _key(t)
                if key in self._live or key not in given:
                    self._track(t, key)  # not a view or in-place result of a tensor made before the block: not new
        return out
