"""Exercise 3.3, a reference solution: GPT-2 small's attention, 768 wide in 12 heads of 64, over 1024 tokens."""

from attnlab.book import MultiHeadAttention


def build() -> MultiHeadAttention:
    return MultiHeadAttention(d_in=768, d_out=768, context_length=1024, dropout=0.0, num_heads=12)
