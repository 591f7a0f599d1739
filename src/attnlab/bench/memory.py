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
from torch.utils._pytree import tree_flatten


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

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = _key(t)
        entry = self._live.get(key)
        if entry is None:
            entry = self._live[key] = [storage.nbytes(), 0]
            self.current_bytes += entry[0]
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        given = {_key(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and (_key(t) in self._live or _key(t) not in given):
                self._track(t)  # not a view or in-place result of a tensor made before the block: that is not new
        return out
