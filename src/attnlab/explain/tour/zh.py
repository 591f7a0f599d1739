"""中文导览：每一步的标题和讲解、每个校验的说明、其他所有文字。用语与阅读笔记一致。"""

from __future__ import annotations

from attnlab.explain.tour.zh_steps import STEPS as CHAPTER_STEPS
from attnlab.explain.tour.zh_steps_after import STEPS as AFTER_STEPS

STEPS: dict[str, tuple[str, str]] = {**CHAPTER_STEPS, **AFTER_STEPS}  # each step's title and explanation, in order

VALUES: dict[str, str] = {
    "after": "gqa, mqa       多个头共享键和值                      Llama 3, Qwen3\n"
    "mla            每个 Token 缓存一个潜在向量           DeepSeek-V2/V3\n"
    "sliding        只看最近的 Token；局部层与全局层      Mistral, Gemma 3, gpt-oss\n"
    "sinks          一行可以不关注任何 Token              gpt-oss\n"
    "qk-norm        对查询和键做 RMSNorm                  Qwen3, Gemma 3\n"
    "gated          每个头的输出乘以一个门                Qwen3-Next\n"
    "linear         不随长度增长，没有 softmax            Katharopoulos et al.\n"
    "deltanet       新值覆盖旧值，并逐渐遗忘              Qwen3-Next",
    "overview": "1. 简化自注意力 (Simplified self-attention)：核心思想，没有可训练权重\n"
    "2. 自注意力 (Self-attention)：带有可训练权重 Wq, Wk, Wv (缩放点积注意力)\n"
    "3. 因果注意力 (Causal attention)：只关注先前和当前的输入，保持文本生成的时间顺序\n"
    "4. 多头注意力 (Multi-head attention)：多个因果注意力头，同时关注不同表示子空间的信息",
    "summary": "简单注意力机制：\n"
    "  1. 计算 Token 之间的相似度分数(点积)\n"
    "  2. 相似度分数归一化(softmax)\n"
    "  3. 加权求和得到 context vector(和嵌入维度相同)\n"
    "引入 Wq, Wk, Wv 后：\n"
    "  1. 通过 Wk, Wv 算出所有 token 的 k, v 向量，用 Wq 算出当前 token 的 q 向量\n"
    "  2. 由 q 向量计算与每个 token 的 k 向量的注意力分数\n"
    "  3. 归一化注意力分数为注意力权重\n"
    "  4. 注意力权重与每个 token 的 v 向量加权求和得到上下文向量",
}

CHECKS: dict[str, str] = {
    "book": "{name} 与书中数值一致",
    "book_shape": "形状 {got} 与书中 {book} 不同",
    "inf": "-inf 的位置与书中不同",
    "diff": "最大误差 = {err:.1e}",
    "length_cosine": "点积 == |x1| * |x2| * cos(θ)，夹角由三边长度算出",
    "max_self": "x(2) 与自己的分数最高",
    "overflow_nan": "softmax_naive 上溢，得到 NaN",
    "underflow_nan": "softmax_naive 下溢，0 / 0 得到 NaN",
    "stable_finite": "稳定的 softmax 不溢出，总和为 1",
    "same_size": "z(2) 与嵌入维度相同",
    "transpose": ".T 行列互换：inputs.T[2, 4] == inputs[4, 2]，形状 (3, 6)",
    "inner_dims": "inputs @ inputs 报错：内维度 3 和 6 不相等",
    "rows_sum_1": "每行之和为 1",
    "row_2_loop": "第 2 行 == 循环算出的 z(2)",
    "grad_fn": "query_2 有 grad_fn",
    "grad_value": "W_query.grad 的每一列都是 x(2) (手算)",
    "frozen": "冻结的矩阵什么也不记录",
    "keys_shape": "keys 的形状为 (6, 2)",
    "values_shape": "values 的形状为 (6, 2)",
    "call_forward": "sa_v1(inputs) 就是 sa_v1.forward(inputs)",
    "negative": "有的分量是负的",
    "v1_with_v2": "V1 用 V2 转置后的权重，输出与 V2 相同",
    "upper_zero": "对角线以上全为 0",
    "same_as_renormalized": "与重新归一化的方法权重相同",
    "dropout_scale": "保留的值乘以 1/(1-p) = 2",
    "dropout_half": "大约一半被置 0",
    "dropout_eval": "eval() 时不改变输入",
    "future_ignored": "改变位置 4..5，位置 0..3 的输出不变",
    "shape": "形状为 {shape}",
    "gpt2_params": "GPT-2 规模：2,360,064 个参数",
    "keys_fixed": "Token 4、5 到来时，Token 0..3 的键向量不变",
    "kv_rows": "叠起来的行 == 完整的因果注意力权重",
    "lab_paged": "分页缓存：叠起来的行 == 完整的因果注意力权重",
    "lab_sink": "Sink 缓存：最后的输出 == 只对它保留的 Token 做注意力",
    "lab_int8": "int8：每个量化后的键向量与精确值相差不到半个量化间隔",
    "lab_h2o": "H2O：只保留预算内的 4 个键向量",
    "gqa_by_hand": "与手算的 softmax(q @ k.T / sqrt(2)) 相同，每个键值头重复给它的 2 个查询头",
    "gqa_half": "缓存只占 MHA 的一半字节",
    "mla_forms": "逐个 Token 的缓存解码 (吸收形式) == 整句一次算 (展开形式)",
    "mla_cache": "缓存每个 Token 存 {values} 个值：潜在向量和它的 RoPE 键",
    "window_rows": "每个查询最多看到 3 个键",
    "window_last": "最后一个 Token 的输出 == 只对最后 3 个 Token 做注意力",
    "window_cached": "逐个 Token 经过 3 个槽位的环形缓存 == 整句一次算；缓存里是 Token 3、4、5",
    "sinks_by_hand": "与手算的 exp(分数) / (exp(分数) 之和 + exp(汇聚点 logit)) 相同",
    "sinks_less": "每一行都分给汇聚点一部分 (在 0 和 1 之间)",
    "qk_norm_same": "有 QK 归一化时，输入放大 100 倍，权重不变",
    "plain_peaks": "没有它，每行几乎变成 one-hot (每行最大权重的均值 > 0.95)",
    "gate_by_hand": "与手算的 out_proj(sigmoid(gate(x)) * context_vec) 相同",
    "gate_silent": "所有门都关上：输出只剩 out_proj 的偏置项",
    "linear_forms": "循环形式 == 并行形式 == 分块形式 (float64)，模块的输出与它们相同",
    "linear_weights": "等价权重：模块记录的就是它们，用它们算出的就是模块的输出，每行之和为 1",
    "state_fixed": "100,000 个 Token 的状态和 6 个 Token 的一样大",
    "delta_replaces": "delta 规则读回第二个值；线性注意力的状态存的是两者之和",
    "delta_forms": "循环形式 == 分块形式 (float64)",
    "delta_negative": "即使每个 q · k >= 0，delta 规则仍给 v0 一个负权重：0.28 - 0.6 x 0.936",
    "kda_channels": "5 个 Token 之后，通道 0 存的是 0.6 x [1, 2] x e^-5，通道 1 仍是 0.8 x [1, 2]",
    "kda_scalar": "所有通道用同一个衰减时，它和门控 DeltaNet 的 delta 规则完全相同",
    "kda_forms": "逐步 == 分块（float64）",
    "share_by_hand": "== softmax(q_后层 @ k_前层.T / sqrt(2)) @ v_前层：后面的层读的是前一层的键",
    "share_cache": "后面那层的缓存是 0 字节：两层合起来只保存前一层自己保存的东西",
    "share_rows_fewer": "后面那层只投影查询：8 行，而不是 8 + 2 x 4 行",
    "conv_by_hand": "== out_proj(C * 逐个抽头写出的卷积)，模块给出的就是它",
    "conv_reach": "每个 Token 只读自己和前 2 个 Token，不再往前",
    "conv_state_held": "逐个 Token 计算 == 整句一起算；之后缓存里存的是最后 2 个输入 (B * x)",
    "zoo_all": "每个变体都在，步数和种子相同",
    "zoo_mla": "MLA 的缓存，在 {tokens} 个 Token 后实测：每个 Token {n} 字节，即 {layers} 层 x ({rank} + {rope}) x 4 字节",
    "zoo_hybrid": "混合模型实测：每个 Token {n} 字节 ({full} 个全注意力层 x 2 x {kv} x 4 字节)，外加 {state} 字节的状态",
    "zoo_budget": "每个变体的参数量与 mha 相差不超过 5%",
}

WORDS: dict[str, str] = {
    "heading": "第三章：编码注意力机制",
    "cache_bytes": "{what} 缓存 6 个 Token：{n} 字节",
    "llama_gqa": "Llama 3 8B 每个 Token 每层的值个数：MHA {mha:,}，8 个键值头时 {gqa:,}",
    "cm_latent": "每个 Token 一个潜在向量",
    "mla_values": "每个 Token 的值个数：潜在缓存 {latent} 个，若存每个头的键和值则 {heads} 个",
    "deepseek_values": "DeepSeek-V3：每个 Token {latent} 个值，若存 128 个头的键和值则 {heads} 个 ({ratio:.0f} 倍)",
    "cm_ring": "3 个槽位的环形缓存",
    "ring_holds": "6 个 Token 之后，环形缓存里是 Token {held}",
    "gemma_local": "Gemma 3 27B 在 32k 个 Token 时 (52 个窗口 1024 的局部层，10 个全局层)：缓存是全部全局层时的 {share:.0%}",
    "cm_sink_weight": "每一行分给键的，是汇聚点没拿走的那部分",
    "cm_sinks": "每个头一个 logit",
    "sink_share": "每个头第一行分给汇聚点的比例：{shares}",
    "cm_loud": "输入放大 100 倍",
    "peak": "{name:<8} 每行最大权重的均值：{quiet:.4f}，输入放大 100 倍后 {loud:.4f}",
    "cm_gate": "每个维度一个 (0, 1) 之间的数",
    "gate_shut": "out_proj.bias：{bias}\n所有门关上时，最后一个 Token 的输出：{out}",
    "cm_phi": "取正值",
    "state_shape": "S：{s}，z：{z}：共 {n} 个值，与长度无关",
    "cm_decay": "忘掉一点",
    "cm_delta": "写入误差",
    "delta_read": "写了两次的键读回：delta 规则 {delta}，线性注意力的状态 {linear}",
    "delta_taken": "k0 = [1, 0]，然后 k1 = [0.6, 0.8]，用 q = [0.28, 0.96] 读：每个 q · k >= 0，v0 的权重为 {w:.4f}",
    "cm_channel_decay": "每个键通道以自己的速度遗忘",
    "kda_kept": "5 个 Token 之后每个键通道还存着多少 [1, 2]：衰减的 {fast}，保留的 {kept}",
    "cm_share": "自己没有键和值",
    "share_rows": "W_qkv 的行数：前层 {first}，后层 {later}；缓存 6 个 Token：前层 {bytes} 字节，后层 {none} 字节",
    "cm_gates": "两个门和输入",
    "conv_state": "它保存的：每个通道最后 2 个输入，{shape}：共 {n} 个值，与长度无关",
    "cm_show": "完整的附带结果",
    "zoo_header": "附带的运行结果：{steps} 步，{seeds} 个种子，{threads} 个 CPU 线程，{minutes:.0f} 分钟",
    "zoo_columns": "变体          损失    每 Token KV 字节   32k 个 Token 时的缓存",
    "check": "校验",
    "terms": "术语",
    "passed": "{n} 项校验：本章与书中数值一致，每个变体都做到了它声称的效果",
    "mismatch": "{n} 处不一致",
    "kv_step": "第 {t} 步：缓存中有 {t} 个键向量；新的一行 (头 0)：[{row}]",
    "lab_paged": "分页，每块 2 个 Token：块表 {blocks}，{waste} 个空位",
    "lab_sink": "Sink，1 个汇聚点 + 最近 3 个：保留 Token {held}",
    "lab_int8": "int8，每组 2 个：键向量最大误差 {err:.4f} (一个量化间隔最多 {bound:.4f})",
    "lab_h2o": "H2O，预算 4：保留 Token {kept}，丢弃 {evicted}",
    "cm_overflow": "exp 上溢为 inf",
    "cm_underflow": "exp 下溢为 0",
    "cm_stable": "最大的一项是 exp(0) = 1",
    "overflow_naive": "上溢，softmax_naive",
    "underflow_naive": "下溢，softmax_naive",
    "overflow_stable": "上溢，稳定版",
    "underflow_stable": "下溢，稳定版",
    "apples": "苹果",
    "cm_shape_only": "只用到形状 (3,)",
    "cm_records": "autograd 记录 query_2 是怎么算出来的",
    "cm_backward": "损失对 W_query 的梯度存入 W_query.grad",
    "cm_frozen": "冻结：什么也不记录",
    "frozen_value": "冻结",
    "cm_forward": "nn.Module 会自动调用 forward()",
    "cm_linear": "W_query, W_key, W_value 都是 nn.Linear(d_in, d_out, bias=qkv_bias)",
    "cm_one_token": "每次输入一个 Token，得到一行注意力权重",
    "gpt2_size": "GPT-2 规模的参数个数",
    "keys": "键 (keys)",
    "queries": "查询 (queries)",
    "tokens": "Token",
    "features": "特征维度",
    "head": "头 {h}",
}
