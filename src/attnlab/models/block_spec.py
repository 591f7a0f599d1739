"""What block-sparse layers add to ``GPTConfig`` (its field ``sparse_blocks``): one frozen record for the
"moba" and "nsa" entries of ``layer_types`` (``attnlab.nn.moba``, ``attnlab.nn.nsa``), checked where the layers
are built (``attnlab.models.block_layers``), against the config's context.

- MoBA: ``block`` positions a block, ``top_k`` blocks a query (its own among them);
- NSA: ``compress_block`` and ``stride`` (the compressed branch), ``select_block`` and ``select_n`` (the
  selected branch), ``slide`` (the sliding branch's window).
"""

from __future__ import annotations

from dataclasses import dataclass

from attnlab._checks import check_positive_int


@dataclass(frozen=True, kw_only=True)
class SparseBlocks:
    block: int = 16
    top_k: int = 3
    compress_block: int = 16
    stride: int = 8
    select_block: int = 16
    select_n: int = 4
    slide: int = 32

    def __post_init__(self) -> None:
        for name in ("block", "top_k", "compress_block", "stride", "select_block", "select_n", "slide"):
            check_positive_int(name, getattr(self, name), limit=2**20)
