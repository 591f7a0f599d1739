"""Every sentence of the exercises, in English and Chinese: the tasks, and the hint for each finding."""

from __future__ import annotations

TASKS: dict[str, dict[str, tuple[str, str]]] = {
    "en": {
        "3.1": (
            "Exercise 3.1: comparing SelfAttention_v1 and SelfAttention_v2",
            "Move SelfAttention_v2's weights (seed 789) into SelfAttention_v1 (seed 123) so that both give the same "
            "context vectors. Write transfer(sa_v1, sa_v2), which changes sa_v1 only.",
        ),
        "3.2": (
            "Exercise 3.2: returning two-dimensional embedding vectors",
            "Change the arguments of MultiHeadAttentionWrapper(..., num_heads=2) so that its context vectors are "
            "2-dimensional instead of 4, keeping two heads. Write build(d_in, context_length), which returns it "
            "(the checker seeds torch with 123 first, as the book does).",
        ),
        "3.3": (
            "Exercise 3.3: initializing GPT-2 size attention modules",
            "Build a MultiHeadAttention the size of the smallest GPT-2: 768 inputs and outputs, 12 heads, a context "
            "of 1024 tokens, dropout 0.0. Write build(), which returns it.",
        ),
        "3.A": (
            "attnlab 3.A (section 3.3): every attention weight, without trainable weights",
            "Write attention_weights(inputs): for the book's six 3-dimensional embeddings, the (6, 6) attention "
            "weights of simplified self-attention, each row a softmax over that token's dot products.",
        ),
        "3.B": (
            "attnlab 3.B (section 3.4): scaled dot-product weights",
            "Write scaled_weights(queries, keys): the (6, 6) attention weights of scaled dot-product attention, "
            "from the queries and keys the book computes with W_query and W_key (seed 123).",
        ),
        "3.C": (
            "attnlab 3.C (section 3.5): causal attention weights",
            "Write causal_weights(attn_scores): hide every later token, then normalize each row as the book does "
            "(scaled by the square root of d_k = 2). The scores are SelfAttention_v2's with seed 789.",
        ),
    },
    "zh": {
        "3.1": (
            "练习 3.1：比较 SelfAttention_v1 和 SelfAttention_v2",
            "把 SelfAttention_v2 (种子 789) 的权重放进 SelfAttention_v1 (种子 123)，让两者算出相同的上下文向量。"
            "写一个 transfer(sa_v1, sa_v2)，只修改 sa_v1。",
        ),
        "3.2": (
            "练习 3.2：返回二维的嵌入向量",
            "修改 MultiHeadAttentionWrapper(..., num_heads=2) 的参数，保持两个头，让上下文向量从 4 维变成 2 维。"
            "写一个 build(d_in, context_length) 返回它(校验前先像书中一样设置种子 123)。",
        ),
        "3.3": (
            "练习 3.3：初始化 GPT-2 规模的注意力模块",
            "构建最小的 GPT-2 规模的 MultiHeadAttention：输入输出 768 维，12 个头，上下文长度 1024，dropout 0.0。"
            "写一个 build() 返回它。",
        ),
        "3.A": (
            "attnlab 3.A (3.3 节)：不带可训练权重的全部注意力权重",
            "写 attention_weights(inputs)：对书中 6 个 3 维嵌入，算出简化自注意力的 (6, 6) 注意力权重，"
            "每一行是该 Token 的点积经过 softmax。",
        ),
        "3.B": (
            "attnlab 3.B (3.4 节)：缩放点积注意力的权重",
            "写 scaled_weights(queries, keys)：由书中用 W_query 和 W_key (种子 123) 算出的查询向量和键向量，"
            "求缩放点积注意力的 (6, 6) 注意力权重。",
        ),
        "3.C": (
            "attnlab 3.C (3.5 节)：因果注意力权重",
            "写 causal_weights(attn_scores)：遮住每个 Token 之后的所有 Token，再像书中一样按行归一化"
            "(除以 d_k = 2 的平方根)。注意力分数来自种子 789 的 SelfAttention_v2。",
        ),
    },
}

HINTS: dict[str, dict[str, str]] = {
    "en": {
        "missing": "the answer has no function {name}(): define it with that name",
        "error": "the answer raised {type}: {message}",
        "shape": "the result has shape {got}; the book's is {want}",
        "values": "the numbers differ from the book's: row 2 is {got}, the book prints {want}",
        "refused.solution": "the answer imports the reference solution ({module}): write the function yourself",
        "refused.book": "the answer uses the book's own {name}, the very function this exercise asks for: "
        "write it yourself",
        "refused.golden": "the answer imports the book's printed numbers ({module}): compute them yourself",
        "refused.borrowed": "{function} is attnlab's own {name}, not a function written in your file: write it "
        "yourself",
        "drawn": "right on the book's input, but on an input the checker drew, row 2 is {got}, not {want}: compute "
        "from the arguments (numbers typed in from the book fit the book's input only)",
        "nan": "row(s) {rows} hold NaN: a row of scores all -inf has no softmax (0 / 0)",
        "forged": "the record the checker reads was not the one its collector wrote (the answer's own process wrote "
        "it: torch.save, an atexit hook, ...): only what your function returns is judged",
        "tampered": "the answer changed the checker's own code ({names}): only what your function returns is judged",
        "3.1.direction": "sa_v2's {names} changed: the exercise moves V2's weights into V1, so assign to sa_v1",
        "3.1.transpose": "sa_v1.{name} has shape {shape}, nn.Linear's (d_out, d_in) layout; V1 multiplies x @ W "
        "and needs (d_in, d_out) = {want}: transpose it with .T",
        "3.1.swapped": "sa_v1.{name} holds V2's {other} weights: match each matrix to its own name",
        "3.1.unchanged": "sa_v1 still holds its own weights (seed 123): assign V2's to its W_query, W_key, W_value",
        "3.1.reshape": "sa_v1.{name} has the right shape and V2's numbers in another order: reshape or view "
        "re-reads the numbers row by row, .T transposes",
        "3.1.values": "sa_v1.{name} (shape {shape}) is not V2's {name} transposed",
        "3.1.runs": "sa_v1(inputs) raised {type}: {message}",
        "3.1.output": "sa_v1's context vectors (shape {got}) differ from the book's sa_v2 output",
        "3.1.same": "sa_v1 now gives the book's sa_v2 context vectors, to 4 decimals",
        "3.1.drawn": "sa_v1 gives the book's output for the book's seeds, but not for a pair the checker built "
        "with seeds {seeds}: copy sa_v2's own weights, not numbers from the book",
        "3.2.class": "build() returned a {got}: the exercise changes the arguments of MultiHeadAttentionWrapper",
        "3.2.heads": "the wrapper has {heads} head(s); the exercise keeps num_heads=2 and changes d_out",
        "3.2.concat": "{heads} heads of d_out={d_out} are concatenated into {width} dimensions: each head adds "
        "its d_out, so set d_out=1",
        "3.2.dropout": "dropout={p}: the book's call uses dropout=0.0, so the context vectors are not random",
        "3.2.output": "the context vectors (shape {shape}) differ from the book's wrapper with d_out=1",
        "3.2.same": "two heads of d_out=1: context vectors of shape {shape}, equal to the book's code",
        "3.2.drawn": "the context vectors are the book's on its batch but not on a batch the checker drew: return "
        "the wrapper itself, whose output follows its input",
        "3.2.seed": "two heads of d_out=1, but the weights are not those torch.manual_seed(123) gives: build() set "
        "another seed, or drew random numbers before creating the wrapper; the checker seeds 123 just before "
        "calling build(), so create the wrapper first and set no other seed",
        "3.3.class": "build() returned a {got}: the exercise builds a MultiHeadAttention",
        "3.3.d_out": "d_out={d_out}: d_out is the whole output, 768, which the heads share (768 / 12 = 64 each)",
        "3.3.heads": "{heads} heads of {head_dim}: GPT-2 small has 12 heads of 64",
        "3.3.context": "the mask is {mask}: its side is context_length, 1024 for GPT-2",
        "3.3.bias": "qkv_bias=True adds {extra} parameters (a bias for each of 3 x 768 outputs); the book's "
        "module has qkv_bias=False",
        "3.3.parameters": "{got} parameters; the book counts 2,360,064",
        "3.3.same": "{parameters:,} parameters, as the book counts: 3 x 768 x 768 + 768 x 768 + 768",
        "3.A.no_softmax": "these are the attention scores (inputs @ inputs.T); normalize each row with softmax",
        "3.A.sum_norm": "each row is divided by its sum; the book uses torch.softmax, which weighs large scores "
        "more and handles extreme values",
        "3.A.dim0": "each column sums to 1: softmax ran over dim=0; a token's weights are a row, dim=-1",
        "3.A.same": "the (6, 6) weights equal the book's, each row summing to 1",
        "3.B.no_scale": "the scores were not scaled: divide them by the square root of d_k = {d_k} before softmax",
        "3.B.scale_d_k": "the scores were divided by d_k = {d_k}; the scale is its square root, {root}",
        "3.B.dim0": "each column sums to 1: softmax ran over dim=0; normalize each query's row, dim=-1",
        "3.B.one_query": "query 2's row is the book's, the other rows are not: compute every query's row, "
        "queries @ keys.T, not one query's",
        "3.B.same": "query 2's weights are the book's [0.1500, 0.2264, 0.2199, 0.1311, 0.0906, 0.1820]",
        "3.C.wrong_side": "the mask is on the wrong side: the past is hidden and the future seen; mask above the "
        "diagonal (torch.triu(..., diagonal=1)) with -inf",
        "3.C.future": "a later token still gets weight (up to {most}): masking with 0 leaves exp(0) = 1 in the "
        "softmax; fill with -inf before it",
        "3.C.renormalize": "the rows sum to {sums}: weights zeroed after softmax must be normalized again, or "
        "mask the scores with -inf before softmax",
        "3.C.no_scale": "the scores were not scaled: divide by the square root of d_k = 2 before softmax",
        "3.C.diagonal": "the diagonal is masked too: each token attends to itself, so hide only what lies above "
        "it, torch.triu(..., diagonal=1) (with the diagonal hidden the first row has nothing left, and a softmax "
        "over all -inf is NaN)",
        "3.C.same": "the causal weights equal the book's, nothing above the diagonal",
        "timeout": "the answer ran past {seconds} s and was stopped (an endless loop?)",
        "crashed": "the answer's process ended without a result: {detail}",
    },
    "zh": {
        "missing": "答案里没有函数 {name}()：请用这个名字定义它",
        "error": "答案抛出了 {type}：{message}",
        "shape": "结果的形状是 {got}，书中是 {want}",
        "values": "数值与书中不同：第 2 行是 {got}，书中打印的是 {want}",
        "refused.solution": "答案导入了参考答案 ({module})：请自己写这个函数",
        "refused.book": "答案用了书中自己的 {name}，这正是本练习要你写的函数：请自己写",
        "refused.golden": "答案导入了书中打印的数值 ({module})：请自己算出来",
        "refused.borrowed": "{function} 是 attnlab 自己的 {name}，不是你在文件里写的函数：请自己写",
        "drawn": "在书中的输入上结果正确，但在检查器随机抽取的输入上，第 2 行是 {got}，应为 {want}："
        "要根据参数计算(照抄书中的数值只对书中的输入成立)",
        "nan": "第 {rows} 行含有 NaN：全是 -inf 的一行分数没有 softmax (0 / 0)",
        "forged": "检查器读到的记录不是它的收集程序写的(是答案自己的进程写的：torch.save、atexit 钩子……)："
        "只评判你的函数返回的结果",
        "tampered": "答案改动了检查器自己的代码 ({names})：只评判你的函数返回的结果",
        "3.1.direction": "sa_v2 的 {names} 被改了：练习是把 V2 的权重放进 V1，应该给 sa_v1 赋值",
        "3.1.transpose": "sa_v1.{name} 的形状是 {shape}，这是 nn.Linear 的 (d_out, d_in) 存法；V1 计算 x @ W，"
        "需要 (d_in, d_out) = {want}：用 .T 转置",
        "3.1.swapped": "sa_v1.{name} 里放的是 V2 的 {other}：每个矩阵要对应自己的名字",
        "3.1.unchanged": "sa_v1 还是它自己的权重 (种子 123)：要把 V2 的权重赋给它的 W_query、W_key、W_value",
        "3.1.reshape": "sa_v1.{name} 形状对了，但 V2 的数值顺序变了：reshape 或 view 按行重新读取数值，.T 才是转置",
        "3.1.values": "sa_v1.{name} (形状 {shape}) 不是 V2 的 {name} 的转置",
        "3.1.runs": "sa_v1(inputs) 抛出了 {type}：{message}",
        "3.1.output": "sa_v1 的上下文向量 (形状 {got}) 与书中 sa_v2 的输出不同",
        "3.1.same": "sa_v1 现在算出书中 sa_v2 的上下文向量，4 位小数一致",
        "3.1.drawn": "用书中的种子时 sa_v1 的输出与书中一致，但在检查器用种子 {seeds} 构建的一对模块上不一致："
        "要复制 sa_v2 自己的权重，而不是书中的数值",
        "3.2.class": "build() 返回的是 {got}：练习要修改的是 MultiHeadAttentionWrapper 的参数",
        "3.2.heads": "有 {heads} 个头；练习保持 num_heads=2，改的是 d_out",
        "3.2.concat": "{heads} 个 d_out={d_out} 的头拼接成 {width} 维：每个头贡献自己的 d_out，所以设 d_out=1",
        "3.2.dropout": "dropout={p}：书中的调用用 dropout=0.0，上下文向量不是随机的",
        "3.2.output": "上下文向量 (形状 {shape}) 与书中代码 d_out=1 时的结果不同",
        "3.2.same": "两个 d_out=1 的头：上下文向量形状 {shape}，与书中代码的结果一致",
        "3.2.drawn": "在书中的批次上上下文向量与书中一致，但在检查器随机抽取的批次上不一致：要返回包装器本身，"
        "它的输出随输入而变",
        "3.2.seed": "两个 d_out=1 的头，但权重不是 torch.manual_seed(123) 给出的：build() 设了别的种子，"
        "或在创建包装器之前抽取了随机数；检查器在调用 build() 之前刚设好种子 123，所以要先创建包装器，不要再设别的种子",
        "3.3.class": "build() 返回的是 {got}：练习构建的是 MultiHeadAttention",
        "3.3.d_out": "d_out={d_out}：d_out 是整个输出的维度 768，由各个头平分(每个 768 / 12 = 64)",
        "3.3.heads": "{heads} 个 {head_dim} 维的头：GPT-2 small 有 12 个 64 维的头",
        "3.3.context": "掩码是 {mask}：它的边长是 context_length，GPT-2 是 1024",
        "3.3.bias": "qkv_bias=True 多出 {extra} 个参数(3 x 768 个输出各一个偏置项)；书中的模块是 qkv_bias=False",
        "3.3.parameters": "{got} 个参数；书中是 2,360,064 个",
        "3.3.same": "{parameters:,} 个参数，与书中一致：3 x 768 x 768 + 768 x 768 + 768",
        "3.A.no_softmax": "这是注意力分数 (inputs @ inputs.T)；还要用 softmax 对每行归一化",
        "3.A.sum_norm": "每行除以了它的总和；书中用 torch.softmax，它更能处理极值",
        "3.A.dim0": "每一列之和为 1：softmax 用在了 dim=0 上；一个 Token 的权重是一行，dim=-1",
        "3.A.same": "(6, 6) 的注意力权重与书中一致，每行之和为 1",
        "3.B.no_scale": "注意力分数没有缩放：softmax 之前要除以 d_k = {d_k} 的平方根",
        "3.B.scale_d_k": "注意力分数除以了 d_k = {d_k}；应该除以它的平方根 {root}",
        "3.B.dim0": "每一列之和为 1：softmax 用在了 dim=0 上；要对每个查询的一行归一化，dim=-1",
        "3.B.one_query": "查询 2 这一行与书中一致，其他行不对：要算每个查询的一行，queries @ keys.T，而不只是一个查询",
        "3.B.same": "查询 2 的注意力权重与书中一致：[0.1500, 0.2264, 0.2199, 0.1311, 0.0906, 0.1820]",
        "3.C.wrong_side": "掩码放反了：遮住了过去、看到了未来；应该用 -inf 遮住对角线以上 "
        "(torch.triu(..., diagonal=1))",
        "3.C.future": "后面的 Token 仍有权重(最大 {most})：用 0 做掩码，softmax 里还有 exp(0) = 1；softmax 之前填 -inf",
        "3.C.renormalize": "每行之和是 {sums}：softmax 之后置 0 的权重要重新归一化，或者在 softmax 之前用 -inf 做掩码",
        "3.C.no_scale": "注意力分数没有缩放：softmax 之前要除以 d_k = 2 的平方根",
        "3.C.diagonal": "对角线也被遮住了：每个 Token 都要关注它自己，只遮住对角线以上的部分，"
        "torch.triu(..., diagonal=1)(对角线也遮住时第一行什么都不剩，全是 -inf 的 softmax 是 NaN)",
        "3.C.same": "因果注意力权重与书中一致，对角线以上全为 0",
        "timeout": "答案运行超过 {seconds} 秒，已被停止(死循环？)",
        "crashed": "答案的进程没有给出结果就结束了：{detail}",
    },
}

WORDS = {
    "en": {"passed": "passed", "failed": "not yet", "function": "write", "solution": "a reference solution"},
    "zh": {"passed": "通过", "failed": "还没通过", "function": "要写的函数", "solution": "参考答案"},
}
