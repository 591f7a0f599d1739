"""中文导览：每一步的标题和讲解、每个校验的说明、其他所有文字。用语与阅读笔记一致。"""

from __future__ import annotations

STEPS: dict[str, tuple[str, str]] = {
    "overview": (
        "自注意力，以及本章的四种注意力变体",
        "当你读到一句话里某个词时，你的大脑不会孤立地看这个词，而是会“环顾四周”——看看其他词，决定哪些词对理解"
        "当前这个词最有帮助，然后把注意力集中在那些词上。自注意力(self-attention)做的正是同一件事：输入序列中的"
        "每个位置关注同一序列中的所有位置并权衡重要性。看书时多是翻看前面的部分帮助当前的理解，很少查阅后面的"
        "内容，这就是因果注意力。本章由浅入深介绍以下四种变体。",
    ),
    "inputs": (
        "嵌入后的句子",
        "“Your journey starts with one step” 以单词分词，每个 Token 嵌入为 3 维向量 x(i)。我们要为每个 Token "
        "计算上下文向量(context vector) z(i)，先以 x(2) (journey) 为例：z(2) 也是一个嵌入，包含了关于 x(2) "
        "及其他所有输入元素的信息。",
    ),
    "dot": (
        "一次点积：模长乘以夹角余弦",
        "点积(dot products)本质上就是两个向量相同位置的值相乘再求和：0.43*0.55+0.15*0.87+0.89*0.66=0.9544。"
        "点积也等于 |x1| * |x2| * cos(θ)，即两个向量的模长与夹角余弦值之积；夹角为 0 度时余弦值最大，"
        "方向相同时相似度最高。点积越大，相似度和注意力分数就越高。",
    ),
    "scores_2": (
        "查询 x(2) 的注意力分数",
        "每个输入 Token 的向量与查询 Token x(2) 的向量做点积，即为相应的注意力分数。x(2) 自己与自己的分数 "
        "1.4950 最高：自己与自己最相似。",
    ),
    "sum_norm": (
        "除以总和归一化",
        "不要被归一化(normalize)这个听起来高大上的词吓倒：它就是把数值归到 [0,1] 区间、把总和归为 1。"
        "比如两个人各有 6 和 4 个苹果，转换为权重就是 6/(6+4)=0.6 和 4/(6+4)=0.4。把注意力分数除以它们的"
        "总和也是这样(sum normalization)。简单，但 softmax 更能处理极值，训练时梯度特性也更好。",
    ),
    "softmax": (
        "用 softmax 归一化",
        "softmax(x)_i = exp(x_i) / sum_j exp(x_j)。torch.exp(x) 对每个元素求自然指数，有两个功能："
        "把负数变成正数(e^x 总是为正数)；放大差异(大的值指数级变大，小的值趋近于 0)。这就是 x(2) 的注意力权重。",
    ),
    "softmax_naive": (
        "手写 softmax",
        "在这些较小的分数上，softmax_naive 与 torch.softmax() 的结果一致。",
    ),
    "softmax_overflow": (
        "溢出和下溢：为什么用 PyTorch 的 softmax",
        "分数很大时 exp 上溢为 inf，inf / inf 得到 NaN；分数都很小(很负)时每个 exp 都下溢为 0，0 / 0 也得到 "
        "NaN。先减去最大值，数学上结果不变(公因子约掉)，但最大的一项变成 exp(0) = 1：不会上溢，也不会全为 0。"
        "PyTorch 的 softmax 就是这样做的，经受过了大量的实践检验和性能优化。",
    ),
    "context_2": (
        "上下文向量 z(2)",
        "把所有输入 Token 的嵌入向量与相应的注意力权重相乘并求和，得到与嵌入维度(3)相同的上下文向量 z(2)。"
        "书中 query = inputs[1] 这行可能让人误解：这一步与第二个 Token 的嵌入没有直接关系，"
        "只是用 torch.zeros(query.shape) 构造了与嵌入维度相同的零向量。真正与 x(2) 有关的是循环中的 "
        "attn_weights_2，它是 x(2) 与每个 Token 计算出来的权重。",
    ),
    "scores_loop": (
        "两层循环计算所有注意力分数",
        "对每一对 (i, j) 做点积，得到 6x6 的注意力分数表。",
    ),
    "scores_all": (
        "矩阵乘法计算所有注意力分数：@ 与 .T",
        "@ 是矩阵乘法运算符，规则是内维度相等，即 [m X n] @ [p X q] 要求 n==p。inputs 是 [6 X 3]，"
        "所以 inputs @ inputs 会报错；.T 是矩阵的转置，行列互换，得到 [3 X 6]，匹配维度后 inputs @ inputs.T "
        "就是 [6 X 6]，与两层循环的结果相同。第 2 行就是 x(2) 的分数。",
    ),
    "weights_all": (
        "所有注意力权重",
        "在最后一个维度(dim=-1)上做 softmax 归一化，每行之和为 1。",
    ),
    "context_all": (
        "所有上下文向量",
        "attn_weights @ inputs 逐行加权求和，一次得到所有 z(i)。第 2 行与循环算出的 z(2) 一致。"
        "这种没有可训练权重的简单自注意力几乎没有实用价值，但它表达了注意力机制的核心思想，下一节还会用到。",
    ),
    "weights_init": (
        "可训练权重矩阵 W_q, W_k, W_v",
        "简单自注意力的计算过程：1. 计算 Token 之间的相似度分数(点积)；2. 相似度分数归一化(softmax)；"
        "3. 加权求和得到 context vector(和嵌入维度相同)。原始 Transformer 和 GPT 中的自注意力叫做缩放点积注意力"
        "(scaled dot-product attention)，它引入三个在训练中更新的权重矩阵，训练好的 Wq, Wk, Wv 引导着计算出更好的"
        "上下文向量。torch.manual_seed(123) 固定了随机数种子，按 query、key、value 的顺序由 torch.rand(3, 2) "
        "生成。为便于理解，这里 d_in=3 和 d_out=2 不同；GPT 中输入和输出维度通常相同。",
    ),
    "requires_grad": (
        "requires_grad：训练时更新哪些矩阵",
        "设置 requires_grad=True，即不冻结该权重矩阵：autograd 会记录用到它的每一步运算(query_2 有了 "
        "grad_fn)，于是 backward() 能算出损失对每个元素的梯度，优化器据此更新它。冻结的矩阵"
        "(requires_grad=False)什么也不记录，训练中也不会改变。",
    ),
    "qkv_2": (
        "x(2) 的查询向量、键向量和值向量",
        "x(2) @ W_query 把 x(2) 从 3 维投影到 2 维，变成一个提问向量。训练时通过反向传播，Wq 学会“怎么提问”，"
        "Wk 学会“怎么被匹配”，Wv 学会“提取什么内容”。推理时针对当前 Token：query 表示“我想找什么”，key 表示"
        "“我有什么”(用来和 query 匹配)，value 表示“我能提供什么”。",
    ),
    "keys_values": (
        "所有 Token 的键向量和值向量",
        "要计算 z(2) 仍然需要所有输入 Token 的键向量和值向量：一次矩阵乘法把 6 个 Token 从 3 维映射到 2 维。"
        "注意：权重矩阵 W 中的“权重”是“权重参数”的简称，是训练中优化的神经网络参数；注意力权重则针对每个"
        "输入计算，决定上下文向量对输入的不同部分的依赖程度。两者不同。",
    ),
    "score_22": (
        "注意力分数 omega_22",
        "x(2) 的查询向量与它自己的键向量做点积。",
    ),
    "scores_2_trainable": (
        "查询 2 的注意力分数",
        "query_2 @ keys.T 计算 query_2 与所有键向量的相似度分数；第 2 个值同样是 1.8524。"
        "这就回到了前面简单注意力机制的轨道上：再后面就是 softmax 归一化和加权求和。",
    ),
    "weights_2_scaled": (
        "缩放后的注意力权重",
        "softmax 之前把注意力分数除以键向量嵌入维度的平方根 sqrt(d_k)，防止点积值过大导致 softmax "
        "梯度消失。这就是“缩放”点积注意力。",
    ),
    "context_2_trainable": (
        "带可训练权重的上下文向量 z(2)",
        "由注意力权重对值向量加权求和：z(2) 现在是 d_out=2 维。",
    ),
    "recap_trainable": (
        "小结：四步算出所有上下文向量",
        "1. 通过 Wk 和 Wv 算出所有 token(包括自己)的 k, v 向量，再用 Wq 计算出当前 token 的 q 向量；"
        "2. 由 q 向量计算与每个 token 的 k 向量的注意力分数；3. 归一化注意力分数为注意力权重；"
        "4. 注意力权重与每个 token 的 v 向量加权求和得到上下文向量。训练调整 Wq, Wk, Wv 的权重参数，"
        "从第 1 步起影响 q, k, v，最终影响上下文向量。常被提及的 KV Cache 缓存的就是这些 k, v 向量，"
        "生成文本时不必每次重新计算，从而提高推理效率。",
    ),
    "sa_v1": (
        "SelfAttentionV1：写成 nn.Module",
        "同样的步骤写成 Python 类，直接以 torch.nn.Module 为基类：__init__ 创建 q, k, v 三个权重矩阵；"
        "把输入传给注意力对象时，nn.Module 会自动调用前向传播方法 forward()，计算出上下文向量。种子 123 下，"
        "第 2 个 token 的上下文向量就是前面分步算出的 z(2)。",
    ),
    "sa_v2": (
        "SelfAttentionV2：用 nn.Linear",
        "nn.Linear 自动进行矩阵乘法并添加偏置项(如果有的话)，它的权重初始化方案更好，有助于训练的稳定性和"
        "有效性。初始化的权重不同，所以输出不同，上下文向量中的分量可以是负的。把 V2 的权重转置后交给 V1，"
        "两者输出相同(练习 3.1)。",
    ),
    "causal_simple": (
        "因果注意力：看不到未来",
        "预测下一个词时不能偷看后面的内容，就像看书时只翻看前面。方法一：对 softmax 后的注意力权重，"
        "把对角线以上置 0，再按行重新归一化。",
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
        "批量输入 (2, 6, 3)，掩码注册为 buffer，对注意力权重做 dropout：上下文向量形状为 (2, 6, 2)。"
        "改变后面的 Token 不会改变前面的输出。",
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
        "有了因果掩码，前面 Token 的键向量和值向量不依赖后面的 Token。生成文本时缓存它们(KV Cache)，"
        "只计算新 Token 的 k, v 向量。",
    ),
    "kv_steps": (
        "KV Cache：逐个 Token 生成",
        "同样的多头注意力权重，每次只输入一个 Token：每一步往缓存里添加一个键向量和一个值向量，并得到一行对"
        "缓存内容的注意力权重。把这些行叠起来，正好是整句话的因果注意力权重矩阵。",
    ),
    "kv_lab": (
        "KV Cache 实验室：保存 k, v 向量的四种方式",
        "还是这句话，每次输入一个 Token，分别经过四种缓存。分页 (Paged)：键向量存放在从内存池里取出的块中，每块 "
        "2 个 Token，用一张块表记录每块存了什么 (vLLM 的做法)。注意力汇聚点 (Sink)：保留第 1 个 Token 和最近的 "
        "3 个，丢掉中间的，生成就可以一直进行下去 (StreamingLLM)。int8 量化：键向量按通道用 8 位存储，每 2 个 "
        "Token 一组共用一个缩放系数，最近 2 个保持精确 (KIVI)。H2O：只保留 4 个键向量，即最近的 2 个和得到注意力"
        "最多的 2 个。第一种是精确的；其余三种用精确度换内存。热力图显示 H2O 每一步的选择：黄色 = 保留，青色 = 丢弃，深色 = 尚未读到。",
    ),
    "summary": (
        "小结",
        "注意力机制的目标是计算输入 Token 的上下文向量。简单注意力机制分三步；引入三个可训练权重矩阵"
        "(Wq, Wk, 和 Wv)后分四步。因果注意力隐藏未来；多头注意力让多个头并行；KV Cache 缓存 k, v 向量，"
        "生成时每个只算一次。",
    ),
    "after": (
        "后来的变体：GPT-2 之后的注意力",
        "本章到多头注意力和 KV Cache 为止：KV Cache 为每个 Token 保存每个头的键向量和值向量。到 128k 个 Token 时，"
        "这个缓存比模型本身还大，所以之后的每个模型都改动了注意力本身，大多是为了少存一些，或者看得更远。下面每一步"
        "都用 attnlab 自己的模块在本章的 6 个 Token 上搭出一种改动，并校验它声称的效果；attnlab zoo 把它们放在一起训练比较。",
    ),
    "gqa": (
        "分组查询注意力：多个头共享键和值",
        "4 个查询头，但只有 2 个键值头：头 0 和头 1 读键值头 0，头 2 和头 3 读键值头 1。这就是分组查询注意力 (GQA)。"
        "每个头仍然用自己的 Wq 提出自己的问题，但能找到的答案是共享的，KV Cache 只需存一半。所有头共用一个键值头时，"
        "就是多查询注意力 (MQA)。Llama 3 8B 有 32 个查询头，只有 8 个键值头。",
    ),
    "mla": (
        "潜在注意力：每个 Token 只缓存一个潜在向量",
        "DeepSeek 的潜在注意力 (MLA) 把每个 Token 的键和值压缩成一个小的潜在向量 (latent)，缓存里只存它 (外加一个"
        "携带位置信息的小键向量)。每个头的键和值都可以从它重建；解码时甚至根本不用重建：把 W_UK 并入查询、W_UV 并入"
        "输出，这叫吸收形式 (absorbed form)，算出的数值完全一样。",
    ),
    "sliding": (
        "滑动窗口：每个 Token 只看最近的几个",
        "窗口为 3 的滑动窗口 (sliding window)：每个查询只关注自己和前面 2 个 Token，沿对角线形成一条带。缓存变成 3 个槽位"
        "的环形缓存，新 Token 覆盖最旧的那个。多层叠起来，信息仍能传得比一个窗口更远。Mistral 7B 每层都用滑动窗口；"
        "Gemma 3 是 5 个局部层配 1 个全局层，全局层用的是全注意力 (full attention)；gpt-oss 则是带状层和全注意力层交替。",
    ),
    "sinks": (
        "可学习的注意力汇聚点：给头一个放下多余注意力的地方",
        "softmax 让每行之和为 1，所以一个头即使什么也不想找，也得把权重放在某处；训练好的模型会把它堆在第 1 个 Token 上 "
        "(就是 KV Cache 实验室里的注意力汇聚点)。gpt-oss 给每个头一个可学习的注意力汇聚点 (learned sink)，即一个 logit：它计入 "
        "softmax 的分母，却没有值向量，于是一行可以把一部分注意力交给“空”。这里四个头的汇聚点 logit 设为 0、1、2 和 -1。",
    ),
    "qk_norm": (
        "QK 归一化：让分数不失控",
        "分数是点积，会随查询和键向量的长度增大；分数太大时 softmax 的每一行接近 one-hot，训练变得不稳定。Qwen3 和 "
        "Gemma 3 在点积之前对每个头的查询和键做均方根归一化 (RMSNorm)，这叫 QK 归一化 (QK-norm)：只有方向起作用。"
        "这里把输入放大 100 倍。",
    ),
    "gate": (
        "输出门控：每个头的输出乘以一个门",
        "Qwen3-Next 把每个头的上下文向量乘以 sigmoid(gate(x))，这是由 Token 自己算出的、每个维度一个 0 到 1 之间的数，"
        "叫输出门控 (output gate)。这样一个头可以对某个 Token 什么也不输出，而单靠 softmax 做不到：它的权重之和总是 1。"
        "所有门都关上时，只剩下 out_proj 的偏置项。",
    ),
    "linear": (
        "线性注意力：用固定大小的状态代替缓存",
        "把 exp(q · k) 换成 phi(q) · phi(k)，其中 phi 是一个取正值的特征映射 (feature map)，加权求和就可以重新组合：每来一个 "
        "Token 更新一次 S = outer(phi(k), v) 之和与 z = phi(k) 之和，每个输出只读 S 和 z。这就是线性注意力 (linear attention)，"
        "它的状态 (state) 在 6 个 Token 和 100,000 个 Token 时一样大，没有缓存在增长。它等价的注意力权重仍能逐行写出来，每行之和为 1。",
    ),
    "deltanet": (
        "门控 DeltaNet：delta 规则覆盖一个键原来存的内容",
        "线性注意力只会累加：在同一个键下写入两个值，状态里存的是两者之和 (归一化后读出的是平均)。delta 规则 (delta rule) 先读出这个键现在存的值，"
        "再写入 beta 倍的差值 (误差)，所以 beta = 1 时新值直接替换旧值。衰减 (decay) exp(g) 让状态逐渐遗忘。这就是门控 "
        "DeltaNet (Gated DeltaNet)；Qwen3-Next 把这样的层和少数全注意力层混在一起。即使每个 q · k 都是正的，它等价的权重"
        "也可以是负的：后来在相近的键下写入，收回了之前写入的一部分。",
    ),
    "zoo_run": (
        "注意力动物园：所有变体放在一起训练",
        "attnlab zoo 用同样的文本、同样的参数量 (相差不超过 5%)、同样的批次、学习率计划和随机数种子训练每个变体，并测量"
        "留出损失、缓存、解码速度和它学到的头。这里是随 attnlab 附带的那次运行结果；attnlab zoo --show 打印全部结果，并标出"
        "哪些差异大于不同种子之间的波动。explain --model zoo:NAME 可以在任意文本上查看一个变体的头。",
    ),
}

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
