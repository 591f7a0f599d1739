"""Attention past one process: ring attention (context parallelism) over torch.distributed."""

from attnlab.distributed.collectives import RingStats, gather_sequence, sequence_positions, shard_sequence
from attnlab.distributed.launch import RankError, launch
from attnlab.distributed.module import ContextParallelAttention
from attnlab.distributed.ring import ring_attention

__all__ = [
    "ContextParallelAttention",
    "RankError",
    "RingStats",
    "gather_sequence",
    "launch",
    "ring_attention",
    "sequence_positions",
    "shard_sequence",
]
