"""The tour in English: the chapter's steps, each one's title and explanation, in the tour's order (en_steps_after.py
holds what came after, en.py the rest)."""

from __future__ import annotations

STEPS: dict[str, tuple[str, str]] = {
    "overview": (
        "Self-attention, and the four variants of this chapter",
        "When you read a word, you do not read it alone: you look around the sentence and decide which other "
        "words help most to understand it, and attend to those. Self-attention does the same: every position "
        "of a sequence weighs every position of the same sequence. When you read a book you mostly turn back to "
        "earlier pages to understand the current one, and rarely look ahead: that is causal attention. The "
        "chapter goes from simple to real, in four variants.",
    ),
    "inputs": (
        "The sentence, embedded",
        '"Your journey starts with one step", split into words: six tokens, each a 3-dimensional embedding '
        'x(i). For each token we compute a context vector z(i), starting with x(2), "journey": an enriched '
        "embedding that holds information about x(2) and every other token.",
    ),
    "dot": (
        "One dot product: length times cosine",
        "A dot product multiplies two vectors element by element and sums: 0.43*0.55 + 0.15*0.87 + 0.89*0.66 "
        "= 0.9544. It is also |x1| * |x2| * cos(theta): the lengths times the cosine of the angle between the "
        "vectors. The cosine is largest (1) when they point the same way, so the larger the dot product, the "
        "more alike the tokens, and the more attention one pays to the other.",
    ),
    "scores_2": (
        "Attention scores of the query x(2)",
        "The query x(2) is dotted with every token. Its score with itself, 1.4950, is the highest: a token is "
        "most similar to itself.",
    ),
    "sum_norm": (
        "Normalize by the sum",
        "Normalizing sounds grand but only means: bring the values into [0, 1], summing to 1. Two people have "
        "6 and 4 apples; as weights, 6/(6+4) = 0.6 and 4/(6+4) = 0.4. Dividing the scores by their total does "
        "the same (sum normalization). Simple, but softmax handles extreme values better and gives better "
        "gradients in training.",
    ),
    "softmax": (
        "Normalize with softmax",
        "softmax(x)_i = exp(x_i) / sum_j exp(x_j). exp does two things: it makes every number positive (e^x > 0) "
        "and it amplifies differences (large values grow exponentially, small ones go to 0). These are the "
        "attention weights of x(2).",
    ),
    "softmax_naive": (
        "Softmax by hand",
        "The naive formula gives the same weights as torch.softmax on these small scores.",
    ),
    "softmax_overflow": (
        "Overflow and underflow: why PyTorch's softmax is safer",
        "On large scores exp overflows to inf, and inf / inf is NaN. On very negative scores exp underflows to "
        "0 for every token, and 0 / 0 is NaN too. Subtracting the maximum first changes nothing mathematically "
        "(the factor cancels) but the largest term becomes exp(0) = 1: no overflow, and never all zeros. "
        "PyTorch's softmax does this, tested and optimized.",
    ),
    "context_2": (
        "The context vector z(2)",
        "Weight each token's embedding by its attention weight and sum: z(2) has the embedding's size, 3. "
        "The book's `query = inputs[1]` can mislead here: this step uses query only through "
        "torch.zeros(query.shape), a zero vector of the embedding's size. What ties z(2) to x(2) are the "
        "weights attn_weights_2, computed from x(2) against every token.",
    ),
    "scores_loop": (
        "All scores by a double loop",
        "Repeat the dot product for every pair (i, j): a 6x6 table of attention scores.",
    ),
    "scores_all": (
        "All scores as one matrix product: @ and .T",
        "@ is matrix multiplication; its rule is that the inner dimensions match: [m x n] @ [p x q] needs "
        "n == p. inputs is [6 x 3], so inputs @ inputs fails; .T transposes (rows become columns), [3 x 6], "
        "and inputs @ inputs.T is [6 x 6], the same table as the loop. Row 2 is the scores of x(2).",
    ),
    "weights_all": (
        "All attention weights",
        "Softmax along the last dimension (dim=-1) normalizes each row; each row sums to 1.",
    ),
    "context_all": (
        "All context vectors",
        "attn_weights @ inputs gives every z(i) at once: a weighted sum, row by row. Row 2 equals z(2) from "
        "the loop. Self-attention without trainable weights has little practical use, but it holds the core "
        "idea; the next part builds on it.",
    ),
    "weights_init": (
        "Trainable weight matrices W_q, W_k, W_v",
        "So far: 1. similarity scores (dot products), 2. normalize (softmax), 3. weighted sum (the context "
        "vector). Scaled dot-product attention, the self-attention of the original Transformer and of GPT, "
        "adds three weight matrices updated in training; trained, they steer attention toward good context "
        "vectors. With torch.manual_seed(123), torch.rand(3, 2) gives these values, drawn in the order query, "
        "key, value. Here d_in=3 and d_out=2 differ to make the steps easy to follow; in GPT they are equal.",
    ),
    "requires_grad": (
        "requires_grad: what training updates",
        "requires_grad=True means the matrix is not frozen: autograd records every operation that uses it "
        "(query_2 gets a grad_fn), so backward() can compute how the loss changes with each entry and the "
        "optimizer can update it. A frozen matrix (requires_grad=False) records nothing and never changes.",
    ),
    "qkv_2": (
        "Query, key and value of x(2)",
        "x(2) @ W_query projects the 3-dimensional token into 2 dimensions: a question. In training, through "
        "backpropagation, W_q learns how to ask, W_k learns how to be matched, and W_v learns what to extract. "
        'At inference, for the current token: the query says "what am I looking for", the key "what do I '
        'have" (to be matched with queries), the value "what can I give".',
    ),
    "keys_values": (
        "Keys and values of all tokens",
        "To compute z(2) we still need the keys and values of every token: one matrix product projects all six "
        "from 3 to 2 dimensions. A word on words: the 'weights' in a weight matrix are weight parameters, "
        "optimized in training; attention weights are computed for each input and say how much a context "
        "vector takes from each token. Two different things.",
    ),
    "score_22": (
        "The attention score omega_22",
        "The query of x(2) dotted with its own key.",
    ),
    "scores_2_trainable": (
        "Attention scores of query 2",
        "query_2 @ keys.T scores query 2 against every key; the second entry is omega_22 again, 1.8524. From "
        "here on it is the simple attention of the first part: softmax, then a weighted sum.",
    ),
    "weights_2_scaled": (
        "Scaled attention weights",
        "Divide the scores by sqrt(d_k), the square root of the keys' dimension, before the softmax, so large "
        "dot products do not push the softmax into regions of vanishing gradients. Hence 'scaled' dot-product "
        "attention.",
    ),
    "context_2_trainable": (
        "Context vector z(2), with trainable weights",
        "The attention weights sum the value vectors: z(2) now has d_out=2 dimensions.",
    ),
    "recap_trainable": (
        "Recap: four steps to every context vector",
        "1. W_k and W_v give the k and v vectors of every token (itself included), W_q the q vector of the "
        "current token; 2. q against every k gives the attention scores; 3. normalized, the attention weights; "
        "4. the weighted sum of the v vectors is the context vector. Training adjusts W_q, W_k, W_v, which "
        "changes step 1 and so every context vector. The KV cache one hears about stores exactly these k and v "
        "vectors, so generating text does not recompute them for every new token.",
    ),
    "sa_v1": (
        "SelfAttentionV1: the steps as an nn.Module",
        "The same steps as a PyTorch class. It subclasses torch.nn.Module: __init__ creates the three weight "
        "matrices, and calling the module on an input calls its forward() method, which computes the context "
        "vectors. With seed 123 its second row is the z(2) we computed by hand.",
    ),
    "sa_v2": (
        "SelfAttentionV2: nn.Linear",
        "nn.Linear replaces the raw parameters: it multiplies (and adds a bias if asked) and has a better "
        "weight initialization, which makes training more stable. Other weights, so other numbers; components "
        "of the context vectors can be negative. Given V2's transposed weights, V1 gives the same output "
        "(exercise 3.1).",
    ),
    "causal_simple": (
        "Causal attention: hide the future",
        "A language model predicting the next word must not look ahead, as a reader turns back but not "
        "forward. One way: take the softmax weights, zero everything above the diagonal, renormalize each row.",
    ),
    "causal_inf": (
        "Causal attention with -inf",
        "The efficient way: set the scores above the diagonal to -inf before the softmax; exp(-inf) = 0. Same "
        "weights as the renormalized ones, in one pass.",
    ),
    "dropout": (
        "Dropout on the attention weights",
        "During training, dropout zeroes each weight with probability p (here 0.5) and scales the survivors by "
        "1/(1-p) = 2 so the expected sum is unchanged. It is off in eval().",
    ),
    "causal_class": (
        "The CausalAttention class",
        "Batched input (2, 6, 3), a mask registered as a buffer, dropout on the weights: context vectors of "
        "shape (2, 6, 2). Changing a later token never changes an earlier output.",
    ),
    "mha_wrapper": (
        "Multi-head attention: stacked heads",
        "Two independent causal heads, outputs concatenated: width d_out * num_heads = 4. Each head can attend "
        "to information from a different representation subspace.",
    ),
    "mha": (
        "Multi-head attention in one module",
        "One projection per Q, K, V, split into heads by view and transpose, then out_proj mixes them. At "
        "GPT-2 size (768 dims, 12 heads) it has 2,360,064 parameters.",
    ),
    "kv_cache": (
        "Why a KV cache works",
        "With a causal mask, the keys and values of earlier tokens never depend on later ones. So when "
        "generating, keep them (the KV cache) and compute only the new token's.",
    ),
    "kv_steps": (
        "The KV cache, token by token",
        "The same multi-head weights, fed one token at a time: each step appends one key and one value to the "
        "cache and adds one row of weights over what the cache holds. Stacked, the rows are exactly the causal "
        "weight matrix of the whole sentence.",
    ),
    "kv_lab": (
        "The KV-cache lab: four ways to keep keys and values",
        "The same sentence, one token at a time, through four caches. Paged: keys live in blocks of 2 tokens "
        "taken from a pool, with a table of which block holds what (vLLM). Sinks: keep the first token and the "
        "latest 3, forget the middle, and generation can go on forever (StreamingLLM). int8: store each key "
        "channel in 8 bits with a scale per group of 2 tokens, the latest 2 exact (KIVI). H2O: keep 4 keys, the "
        "latest 2 and the 2 that received the most attention. The first is exact; the others trade exactness "
        "for memory. The heatmap shows H2O's choice at each step: yellow = kept, teal = let go, dark = not read yet.",
    ),
    "summary": (
        "Summary",
        "The goal of attention is a context vector for every input token. Without trainable weights it takes "
        "three steps; with W_q, W_k and W_v, four. Causal attention hides the future; multi-head attention runs "
        "several heads side by side; the KV cache keeps k and v so generation computes each only once.",
    ),
}
