"""The tour in English: every step's title and explanation, in the tour's order (en.py holds the rest)."""

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
    "after": (
        "What came after: attention since GPT-2",
        "The chapter ends with multi-head attention and a KV cache that keeps every head's keys and values for "
        "every token. At 128k tokens that cache outgrows the model, so every model since has changed attention "
        "itself, mostly to keep less, or to see further. Each step below builds one change with attnlab's own "
        "module on the chapter's six tokens and checks what it claims; `attnlab zoo` trains them all side by side.",
    ),
    "gqa": (
        "Grouped-query attention (GQA): heads share keys and values",
        "Four query heads, but only two key/value heads: heads 0 and 1 read key head 0, heads 2 and 3 key head 1. "
        "This is grouped-query attention (GQA). "
        "Each head still asks its own question (its own W_q), but the answers it can find are shared, and the KV "
        "cache holds half as much. With one key/value head for all, it is multi-query attention (MQA). Llama 3 8B "
        "keeps 8 key/value heads for 32 query heads.",
    ),
    "mla": (
        "Multi-head latent attention (MLA): cache one latent a token",
        "DeepSeek's MLA compresses each token's keys and values into one small latent vector, and the cache keeps "
        "only that (and a small key that carries the position). Every head's keys and values are rebuilt from "
        "it, or, when decoding, never built at all: W_UK is folded into the queries and W_UV into the output "
        "(the absorbed form), which gives the same numbers.",
    ),
    "sliding": (
        "Sliding window: each token sees only the latest ones",
        "A sliding window of 3: every query attends to itself and the two tokens before it, a band along the diagonal. "
        "The cache becomes a ring of 3 slots, each new token overwriting the oldest. Stacked layers still pass "
        "information further than one window. Mistral 7B slides on every layer; Gemma 3 has 5 local layers to 1 "
        "global (full attention) layer, and gpt-oss alternates banded and full layers.",
    ),
    "sinks": (
        "Learned sinks: somewhere to put attention a head does not need",
        "Softmax makes every row sum to 1, so a head with nothing to find must still put its weight somewhere; "
        "trained models dump it on the first token (the attention sink of the KV-cache lab). gpt-oss gives each "
        "head a learned sink logit that enters the softmax's sum but has no value: a row may now give part of its "
        "attention to nothing. Here the sink logits are set to 0, 1, 2 and -1.",
    ),
    "qk_norm": (
        "QK-norm: keep the scores in bounds",
        "Scores are dot products, and they grow with the size of the queries and keys; large scores push "
        "softmax towards one-hot rows and training becomes unstable. QK-norm, in Qwen3 and Gemma 3, applies RMSNorm "
        "to each head's queries and keys before the dot product, so only their directions count. Here the inputs "
        "are made 100 times larger.",
    ),
    "gate": (
        "Gated attention: an output gate on each head",
        "Qwen3-Next multiplies each head's context vector by an output gate, sigmoid(gate(x)), a number between 0 and 1 per "
        "dimension, computed from the token itself. A head can then say nothing for a token, which softmax alone "
        "cannot: its weights always sum to 1. With every gate shut, only out_proj's bias is left.",
    ),
    "linear": (
        "Linear attention: a state of fixed size instead of a cache",
        "Replace exp(q . k) by phi(q) . phi(k) with a positive feature map phi, and the weighted sum can be "
        "regrouped, and that is linear attention: S = sum of outer(phi(k), v) and z = sum of phi(k) are updated once per token, and each output "
        "reads S and z. The state has the same size at 6 tokens and at 100,000: no cache grows. The weights it "
        "equals can still be written down, row by row, and they sum to 1.",
    ),
    "deltanet": (
        "Gated DeltaNet: the delta rule writes over what a key held",
        "Linear attention only adds: write two values under the same key and its state holds their sum (the "
        "normalizer then reads their mean). The delta "
        "rule first reads what the key holds, then writes beta times the difference (the error), so with beta = 1 "
        "the new value replaces the old. A decay exp(g) lets the state forget: that is Gated DeltaNet, which "
        "Qwen3-Next mixes with a few full attention layers. The weights it equals can be negative even where every "
        "q . k is positive: a later write under a similar key took back part of an earlier one.",
    ),
    "kda": (
        "Kimi Delta Attention: each key channel forgets at its own rate",
        "Gated DeltaNet decays a head's whole state by one number a token. Kimi Linear's KDA gives every key "
        "channel, every row of the state, its own decay, computed from the token: a head can keep some features for "
        "thousands of tokens and forget others within a few. Here a key of two channels is written once; after five "
        "tokens the channel that decays holds almost nothing of it and the other all of it.",
    ),
    "kv_share": (
        "KV sharing: later layers read an earlier layer's keys",
        "Gemma 4's last layers compute no keys or values at all: each reads those of the last earlier layer of its "
        "kind, the ones that layer attended over. Its queries are its own; its cache is empty, so the cache of the "
        "whole model is that of its first layers. Here a second layer shares the first one's two key/value heads.",
    ),
    "short_conv": (
        "Gated short convolution: a layer that does not attend",
        "LFM2 and LFM3 put layers between their attention layers that mix each token only with its last two: a "
        "projection gives two gates, B and C, and the input x; the layer convolves B * x over three tokens, each "
        "channel with its own three weights, and multiplies by C. It keeps no keys, only its last two inputs. Seen "
        "as attention, its weights are zero beyond two tokens back (drawn here: their mean over the channels).",
    ),
    "zoo_run": (
        "The attention zoo: every variant trained side by side",
        "`attnlab zoo` trains each variant on the same text, with the same parameters (within 5%), batches, "
        "schedule and seeds, and measures the held-out loss, the cache, decode speed and the heads it grew. This "
        "is the run that ships with attnlab; `attnlab zoo --show` prints all of it, with which differences are "
        "larger than the spread over seeds. `explain --model zoo:NAME` shows a variant's heads on any text.",
    ),
}
