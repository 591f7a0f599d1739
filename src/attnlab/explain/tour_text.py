"""The tour's words, in English and in Chinese (the reading notes' own terms).

One entry per step: (title, explanation). The code, the tensors and the checks
live in ``tour.py``; this file is only prose, so a translator reads it alone.
"""

from __future__ import annotations

LANGS = ("en", "zh")

EN: dict[str, tuple[str, str]] = {
    "inputs": (
        "The sentence, embedded",
        '"Your journey starts with one step": six tokens, each a 3-dimensional embedding '
        'x(i). We compute a context vector z(i) for each, starting with x(2), "journey".',
    ),
    "dot": (
        "One dot product",
        "A dot product multiplies two vectors element by element and sums: "
        "0.43*0.55 + 0.15*0.87 + 0.89*0.66. The larger it is, the more alike the tokens.",
    ),
    "scores_2": (
        "Attention scores of the query x(2)",
        "The query x(2) is dotted with every token. Its score with itself, 1.4950, is the "
        "highest: a token is most similar to itself.",
    ),
    "sum_norm": (
        "Normalize by the sum",
        "Dividing by the total gives weights that sum to 1. Simple, but softmax handles "
        "extreme values better and has better gradients.",
    ),
    "softmax": (
        "Normalize with softmax",
        "softmax(x)_i = exp(x_i) / sum_j exp(x_j): every weight positive, the sum 1, "
        "differences amplified. These are the attention weights of x(2).",
    ),
    "softmax_naive": (
        "Softmax by hand",
        "The naive formula gives the same weights on these small scores.",
    ),
    "softmax_overflow": (
        "Why PyTorch's softmax is safer",
        "On scores near 1000, exp overflows to inf and the naive softmax returns NaN. "
        "Subtracting the maximum first gives the same result with no overflow.",
    ),
    "context_2": (
        "The context vector z(2)",
        "Weight each token's embedding by its attention weight and sum: z(2) has the "
        "embedding's size, 3, and mixes information from the whole sentence.",
    ),
    "scores_loop": (
        "All scores by a double loop",
        "Repeat the dot product for every pair (i, j): a 6x6 table of attention scores.",
    ),
    "scores_all": (
        "All scores as one matrix product",
        "inputs @ inputs.T computes the same table at once. Row 2 is the scores of x(2).",
    ),
    "weights_all": (
        "All attention weights",
        "Softmax along the last dimension normalizes each row; each row sums to 1.",
    ),
    "context_all": (
        "All context vectors",
        "attn_weights @ inputs gives every z(i) at once. Row 2 equals z(2) from the loop.",
    ),
    "weights_init": (
        "Trainable weight matrices W_q, W_k, W_v",
        "Scaled dot-product attention projects each token with three trainable matrices. "
        "With torch.manual_seed(123), torch.rand(3, 2) gives these values, drawn in the order "
        "query, key, value. Here d_in=3, d_out=2.",
    ),
    "qkv_2": (
        "Query, key and value of x(2)",
        "query_2 = x(2) @ W_query: what x(2) looks for. key_2: what it can be matched by. "
        "value_2: what it contributes. Each maps 3 dimensions to 2.",
    ),
    "keys_values": (
        "Keys and values of all tokens",
        "One matrix product projects all six tokens: keys and values are both 6x2.",
    ),
    "score_22": (
        "The attention score omega_22",
        "The query of x(2) dotted with its own key.",
    ),
    "scores_2_trainable": (
        "Attention scores of query 2",
        "query_2 @ keys.T scores query 2 against every key; the second entry is omega_22 again.",
    ),
    "weights_2_scaled": (
        "Scaled attention weights",
        "Divide the scores by sqrt(d_k) before the softmax, so large dot products do not "
        "push the softmax into regions of tiny gradients. Hence 'scaled' dot-product attention.",
    ),
    "context_2_trainable": (
        "Context vector z(2), with trainable weights",
        "The attention weights sum the value vectors: z(2) now has d_out=2 dimensions.",
    ),
    "sa_v1": (
        "SelfAttentionV1",
        "The same steps as a PyTorch module with nn.Parameter weights. With seed 123 its "
        "second row is the z(2) we computed by hand.",
    ),
    "sa_v2": (
        "SelfAttentionV2",
        "nn.Linear replaces the raw parameters: better initialization, optional bias, and "
        "other weights, so other numbers. Given V2's transposed weights, V1 gives the same "
        "output (exercise 3.1).",
    ),
    "causal_simple": (
        "Causal attention: hide the future",
        "A language model predicting the next word must not look ahead. One way: take the "
        "softmax weights, zero everything above the diagonal, renormalize each row.",
    ),
    "causal_inf": (
        "Causal attention with -inf",
        "The efficient way: set the scores above the diagonal to -inf before the softmax; "
        "exp(-inf) = 0. Same weights as the renormalized ones, in one pass.",
    ),
    "dropout": (
        "Dropout on the attention weights",
        "During training, dropout zeroes each weight with probability p (here 0.5) and "
        "scales the survivors by 1/(1-p) = 2 so the expected sum is unchanged. It is off in eval().",
    ),
    "causal_class": (
        "The CausalAttention class",
        "Batched input (2, 6, 3), a mask registered as a buffer, dropout on the weights: "
        "context vectors of shape (2, 6, 2). Changing a later token never changes an earlier output.",
    ),
    "mha_wrapper": (
        "Multi-head attention: stacked heads",
        "Two independent causal heads, outputs concatenated: width d_out * num_heads = 4. "
        "Each head can attend to different relations.",
    ),
    "mha": (
        "Multi-head attention in one module",
        "One projection per Q, K, V, split into heads by view and transpose, then out_proj "
        "mixes them. At GPT-2 size (768 dims, 12 heads) it has 2,360,064 parameters.",
    ),
    "kv_cache": (
        "Why a KV cache works",
        "With a causal mask, the keys and values of earlier tokens never depend on later ones. "
        "So when generating, keep them (the KV cache) and compute only the new token's.",
    ),
}

ZH: dict[str, tuple[str, str]] = {
    "inputs": (
        "嵌入后的句子",
        '"Your journey starts with one step" 以单词分词，每个 Token 嵌入为 3 维向量 x(i)。'
        "我们要为每个 Token 计算上下文向量 z(i)，先以 x(2) (journey) 为例。",
    ),
    "dot": (
        "一次点积",
        "点积就是两个向量相同位置的值相乘再求和：0.43*0.55 + 0.15*0.87 + 0.89*0.66。点积越大，相似度越高。",
    ),
    "scores_2": (
        "查询 x(2) 的注意力分数",
        "查询 x(2) 与每个 Token 做点积。它与自己的分数 1.4950 最高：自己与自己最相似。",
    ),
    "sum_norm": (
        "除以总和归一化",
        "除以总和后权重之和为 1 (sum normalization)。简单，但 softmax 更能处理极值，训练时梯度特性也更好。",
    ),
    "softmax": (
        "用 softmax 归一化",
        "softmax(x)_i = exp(x_i) / sum_j exp(x_j)：把负数变成正数，放大差异，总和为 1。这就是 x(2) 的注意力权重。",
    ),
    "softmax_naive": (
        "手写 softmax",
        "在这些较小的分数上，softmax_naive 与 torch.softmax 结果一致。",
    ),
    "softmax_overflow": (
        "为什么用 PyTorch 的 softmax",
        "分数接近 1000 时 exp 上溢为 inf，softmax_naive 得到 NaN。先减去最大值，结果不变且不会溢出。",
    ),
    "context_2": (
        "上下文向量 z(2)",
        "用注意力权重对所有输入 Token 的嵌入向量加权求和：z(2) 与嵌入维度相同 (3)，包含了整句话的信息。",
    ),
    "scores_loop": (
        "两层循环计算所有注意力分数",
        "对每一对 (i, j) 做点积，得到 6x6 的注意力分数表。",
    ),
    "scores_all": (
        "矩阵乘法计算所有注意力分数",
        "inputs @ inputs.T 一次算出同一张表。第 2 行就是 x(2) 的分数。",
    ),
    "weights_all": (
        "所有注意力权重",
        "在最后一个维度上做 softmax 归一化，每行之和为 1。",
    ),
    "context_all": (
        "所有上下文向量",
        "attn_weights @ inputs 一次得到所有 z(i)。第 2 行与循环算出的 z(2) 一致。",
    ),
    "weights_init": (
        "可训练权重矩阵 W_q, W_k, W_v",
        "缩放点积注意力用三个可训练的权重矩阵投影每个 Token。torch.manual_seed(123) 固定了"
        "随机数种子，按 query、key、value 的顺序由 torch.rand(3, 2) 生成。这里 d_in=3, d_out=2。",
    ),
    "qkv_2": (
        "x(2) 的查询向量、键向量和值向量",
        'query_2 = x(2) @ W_query："我想找什么"；key_2："我有什么"；value_2："我能提供什么"。都从 3 维投影到 2 维。',
    ),
    "keys_values": (
        "所有 Token 的键向量和值向量",
        "一次矩阵乘法投影全部 6 个 Token：keys 和 values 的形状都是 6x2。",
    ),
    "score_22": (
        "注意力分数 omega_22",
        "x(2) 的查询向量与它自己的键向量做点积。",
    ),
    "scores_2_trainable": (
        "查询 2 的注意力分数",
        "query_2 @ keys.T 计算查询 2 与所有键向量的分数；第 2 个值同样是 1.8524。",
    ),
    "weights_2_scaled": (
        "缩放后的注意力权重",
        'softmax 之前把注意力分数除以 sqrt(d_k)，防止点积过大导致 softmax 梯度消失。这就是"缩放"点积注意力。',
    ),
    "context_2_trainable": (
        "带可训练权重的上下文向量 z(2)",
        "注意力权重对值向量加权求和：z(2) 现在是 d_out=2 维。",
    ),
    "sa_v1": (
        "SelfAttentionV1",
        "同样的步骤写成 PyTorch 模块，权重为 nn.Parameter。种子 123 下，第 2 行就是前面分步算出的 z(2)。",
    ),
    "sa_v2": (
        "SelfAttentionV2",
        "用 nn.Linear 代替原始参数：更好的权重初始化、可选偏置，权重不同所以输出不同。"
        "把 V2 的权重转置后交给 V1，两者输出相同 (练习 3.1)。",
    ),
    "causal_simple": (
        "因果注意力：看不到未来",
        "预测下一个词时不能偷看后面的内容。方法一：对 softmax 后的注意力权重，把对角线以上置 0，再按行重新归一化。",
    ),
    "causal_inf": (
        "用 -inf 实现因果注意力",
        "更高效的方法：softmax 之前把对角线以上的注意力分数设为 -inf，exp(-inf) = 0。"
        "一步得到与方法一相同的注意力权重。",
    ),
    "dropout": (
        "对注意力权重做 dropout",
        "训练时 dropout 以概率 p (这里 0.5) 把权重置 0，其余乘以 1/(1-p) = 2，期望之和不变。eval() 时关闭。",
    ),
    "causal_class": (
        "CausalAttention 类",
        "批量输入 (2, 6, 3)，掩码注册为 buffer，对注意力权重做 dropout："
        "上下文向量形状为 (2, 6, 2)。改变后面的 Token 不会改变前面的输出。",
    ),
    "mha_wrapper": (
        "多头注意力：堆叠多个头",
        "两个独立的因果注意力头，输出拼接：宽度 d_out * num_heads = 4。每个头可以关注来自不同表示子空间的信息。",
    ),
    "mha": (
        "一个模块实现多头注意力",
        "Q、K、V 各一次投影，用 view 和 transpose 拆分成多个头，最后 out_proj 合并。"
        "GPT-2 规模 (768 维, 12 个头) 共 2,360,064 个参数。",
    ),
    "kv_cache": (
        "KV Cache 为什么可行",
        "有了因果掩码，前面 Token 的键向量和值向量不依赖后面的 Token。"
        "生成文本时缓存它们 (KV Cache)，只计算新 Token 的 k, v 向量。",
    ),
}

TEXTS: dict[str, dict[str, tuple[str, str]]] = {"en": EN, "zh": ZH}

LABELS: dict[str, dict[str, str]] = {
    "en": {
        "heading": "Chapter 3: coding attention mechanisms",
        "check": "check",
        "all_ok": "all steps match the book",
        "mismatch": "mismatches",
    },
    "zh": {
        "heading": "第三章：编码注意力机制",
        "check": "校验",
        "all_ok": "所有步骤与书中数值一致",
        "mismatch": "不一致",
    },
}
