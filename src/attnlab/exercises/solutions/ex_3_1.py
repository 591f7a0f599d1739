"""Exercise 3.1, a reference solution: nn.Linear keeps (d_out, d_in) and computes x @ W.T, so V1's (d_in, d_out)
parameters take V2's weights transposed."""

import torch

from attnlab.book import SelfAttentionV1, SelfAttentionV2


def transfer(sa_v1: SelfAttentionV1, sa_v2: SelfAttentionV2) -> None:
    sa_v1.W_query = torch.nn.Parameter(sa_v2.W_query.weight.T)
    sa_v1.W_key = torch.nn.Parameter(sa_v2.W_key.weight.T)
    sa_v1.W_value = torch.nn.Parameter(sa_v2.W_value.weight.T)
