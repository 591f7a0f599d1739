"""The sink experiments' words, in English and Chinese: each claim as its paper states it (quoted only where the
wording was confirmed from the paper's abstract or the authors' code; otherwise its direction alone, said so),
and the phrases a report is built from. Every number in a report comes from the run's file, never from here."""

from __future__ import annotations

# claim key -> (paper, the claim, en), (paper, the claim, zh)
CLAIMS: dict[str, dict[str, str]] = {
    "window_fails": {
        "en": "Xiao et al. 2023 (StreamingLLM): window attention, which keeps only the latest keys, fails once the "
        "text is longer than the cache (the abstract).",
        "zh": "Xiao 等 2023（StreamingLLM）：只保留最近键值的窗口注意力，在文本长于缓存之后失效（摘要）。",
    },
    "sinks_recover": {
        "en": "Xiao et al. 2023: keeping the keys and values of the initial tokens largely recovers window "
        "attention's performance (the abstract). Size: the share of the window's extra loss that 4 sinks win back.",
        "zh": "Xiao 等 2023：保留开头几个 Token 的键值，基本能找回窗口注意力失去的性能（摘要）。大小：4 个汇聚点 Token "
        "挽回的窗口额外损失的比例。",
    },
    "dense_fails": {
        "en": "Xiao et al. 2023: a model does not carry over to texts longer than it was trained on (direction only; "
        "its figures not quoted here).",
        "zh": "Xiao 等 2023：模型无法推广到长于训练长度的文本（只取方向，不引用其数字）。",
    },
    "four_over_one": {
        "en": "StreamingLLM keeps 4 initial tokens by default; whether 4 beat 1 is measured here, direction only "
        "(the paper's own comparison was not confirmed from its text).",
        "zh": "StreamingLLM 默认保留 4 个开头 Token；4 个是否胜过 1 个，这里只测方向（论文自己的对比未从原文核实）。",
    },
    "dormant_sink": {
        "en": "Guo et al. 2024: heads become sinks for some inputs while staying non-sinks for others "
        "(active-dormant; the abstract). Here: softmax with Adam, the weight on BOS from ordinary tokens minus "
        "from triggers.",
        "zh": "Guo 等 2024：注意力头对某些输入成为注意力汇聚点，对另一些输入则不是（活跃-休眠；摘要）。这里：softmax 加 "
        "Adam，普通 Token 与触发 Token各自放在 BOS 上的权重之差。",
    },
    "relu_sink": {
        "en": "Guo et al. 2024: replacing softmax with ReLU mitigates the extreme-token phenomena (the abstract). "
        "Here: the attention sink, softmax minus ReLU.",
        "zh": "Guo 等 2024：用 ReLU 替换 softmax 能缓解极端 Token 现象（摘要）。这里：注意力汇聚点，softmax 减 ReLU。",
    },
    "relu_drain": {
        "en": "The same claim, for the value-state drain: BOS's value norm ratio, ReLU minus softmax.",
        "zh": "同一论断，对值向量消减：BOS 的值范数比，ReLU 减 softmax。",
    },
    "relu_peak": {
        "en": "The same claim, for the residual-state peak: BOS's residual norm ratio, softmax minus ReLU.",
        "zh": "同一论断，对残差峰值：BOS 的残差范数比，softmax 减 ReLU。",
    },
    "sgd_sink": {
        "en": "Guo et al. 2024: replacing Adam with SGD mitigates them too (the abstract). The sink, Adam minus SGD.",
        "zh": "Guo 等 2024：用 SGD 替换 Adam 同样能缓解（摘要）。注意力汇聚点，Adam 减 SGD。",
    },
    "sgd_drain": {
        "en": "The same, for the value drain: BOS's value norm ratio, SGD minus Adam.",
        "zh": "同上，对值向量消减：BOS 的值范数比，SGD 减 Adam。",
    },
    "sgd_peak": {
        "en": "The same, for the residual peak: BOS's residual norm ratio, Adam minus SGD.",
        "zh": "同上，对残差峰值：BOS 的残差范数比，Adam 减 SGD。",
    },
    "sigmoid_sink": {
        "en": "Gu et al. 2024: with sigmoid attention without normalization, attention sinks do not emerge (the "
        "abstract; shown there on text, up to 1B parameters, tried here on Bigram-Backcopy). The sink, softmax minus "
        "sigmoid, each the weight on BOS itself.",
        "zh": "Gu 等 2024：用不做归一化的 sigmoid 注意力，注意力汇聚点不会出现（摘要；原文在文本上、最大 1B 参数，"
        "这里在 Bigram-Backcopy 上试）。注意力汇聚点，softmax 减 sigmoid，各取放在 BOS 上的权重本身。",
    },
    "softmax_text_sink": {
        "en": "Gu et al. 2024: attention sink emerges after effective optimization on sufficient training data (the "
        "abstract). Here, softmax on the zoo's text: the first-token share (the mean over layers and heads) minus an "
        "even head's.",
        "zh": "Gu 等 2024：注意力汇聚点在充足的训练数据上经过有效优化之后出现（摘要）。这里，softmax 在 zoo 的文本上："
        "首 Token 份额（各层各头的均值）减去均匀分布的头的份额。",
    },
    "sigmoid_text_sink": {
        "en": "Gu et al. 2024: with sigmoid attention without normalization, attention sinks do not emerge in LMs up "
        "to 1B parameters (the abstract; the form, the sigmoid of the scaled scores with no bias, read from the "
        "authors' code). Here, on the zoo's text: the first-token share (the mean over layers and heads; a sigmoid "
        "row's weight on token 0 over the row's sum), softmax minus sigmoid.",
        "zh": "Gu 等 2024：用不做归一化的 sigmoid 注意力，在最大 1B 参数的语言模型中注意力汇聚点不会出现（摘要；其形式，"
        "缩放后分数的 sigmoid、不加偏置，取自作者的代码）。这里，在 zoo 的文本上：首 Token 份额（各层各头的均值；"
        "sigmoid 的一行放在第 1 个 Token 上的权重除以该行之和），softmax 减 sigmoid。",
    },
    "zero_breaks": {
        "en": 'Sun et al. 2024: very few activations are far larger than the rest ("e.g., 100,000 times larger"), stay '
        "largely constant whatever the input and act as indispensable bias terms (the abstract); set to their mean "
        "little changes, set to zero the model breaks (the experiment as issue 60 states it, not confirmed from the "
        "paper's text: direction only). Here: the loss with the first token's largest activations zeroed minus with "
        "them set to their mean.",
        "zh": "Sun 等 2024：极少数激活远大于其他激活（“例如大 100,000 倍”），几乎不随输入变化，起着不可缺少的偏置项的"
        "作用（摘要）；设为均值几乎没有变化，设为零模型就坏了（按 issue 60 的表述，未从原文核实：只取方向）。这里："
        "第 1 个 Token 的最大激活置零时的损失减去设为均值时的损失。",
    },
    "zero_vs_control": {
        "en": "The control: zeroing the first token's largest activations against zeroing as many of its smallest.",
        "zh": "对照：把第 1 个 Token 的最大激活置零，对比把同样多个最小激活置零。",
    },
    "gated_sink": {
        "en": "Qiu et al. 2025: a head-specific sigmoid gate after attention mitigates the attention sink (the "
        "abstract). Here: the largest first-token share of any head, mha minus gated.",
        "zh": "Qiu 等 2025：在注意力之后加按头的 sigmoid 门控，能缓解注意力汇聚点（摘要）。这里：各头中最大的首 Token "
        "份额，mha 减 gated。",
    },
    "gated_peak": {
        "en": "Qiu et al. 2025 (the abstract's later version): the gate mitigates massive activations too. Here: the "
        "largest activation of any layer over its median, mha minus gated.",
        "zh": "Qiu 等 2025（摘要的较新版本）：门控也缓解巨量激活。这里：各层输出中最大激活与中位数之比，mha 减 gated。",
    },
    "gated_drain": {
        "en": "The same claim of Qiu et al. 2025, for the value-state drain that comes with a sink (Guo et al. 2024, "
        "the abstract): the smallest value norm ratio, gated minus mha.",
        "zh": "Qiu 等 2025 的同一论断，对随注意力汇聚点而来的值向量消减（Guo 等 2024，摘要）：最小的值范数比，gated 减 mha。",
    },
    "learned_sink": {
        "en": "Gu et al. 2024: the attention sink acts more like a key bias, storing extra attention (the abstract); "
        "a learned sink logit (gpt-oss) is such a bias with no value, so it should take the first token's place. "
        "Here: the largest first-token share, mha minus sinks.",
        "zh": "Gu 等 2024：注意力汇聚点更像键的偏置，存放多余的注意力（摘要）；可学习的注意力汇聚点 logit（gpt-oss）"
        "正是这样一个没有值向量的偏置，应当取代第 1 个 Token 的位置。这里：最大的首 Token 份额，mha 减 sinks。",
    },
}

STATUS = {
    "en": {
        "held": "held here",
        "reversed": "reversed here",
        "within the noise": "not shown here: within the noise",
        "one seed": "not judged: one seed",
    },
    "zh": {
        "held": "在此成立",
        "reversed": "在此相反",
        "within the noise": "在此未显示：在噪声之内",
        "one seed": "未判定：只有一个种子",
    },
}

WORDS = {
    "en": {
        "streaming_title": "StreamingLLM past the context of {model}",
        "streaming_setup": "{texts} held-out sequences of {n} tokens ({contexts} x the {context}-token context; a "
        "token is a byte for the text model), each cache holding {context} tokens; perplexity of the tokens past "
        "the first context, the mean over the sequences ± half the spread.",
        "model_text": "the shipped text model",
        "model_backcopy": "a GPT trained on Bigram-Backcopy (the zoo's mha)",
        "backcopy_title": "Bigram-Backcopy: sinks, value drains and residual peaks",
        "backcopy_setup": "{layers} layers of one head, width {width}, {length} tokens, batch {batch}, {steps} "
        "steps, Adam at {lr_adam:g}, SGD at {lr_sgd:g} with momentum 0.9, {seeds} seeds; each measure at the last "
        "step (at its most extreme layer), the mean over seeds ± half the spread.",
        "verdict": "{claim} Measured: {mean:+.3f} (spread {spread:.3f} over {n}; the zoo's rule): {status}.",
        "size": " Size: {size:.0%}.",
        "arm": "arm",
        "ppl": "perplexity past the context",
        "loss": "held-out loss",
        "sink": "weight on BOS (ordinary rows)",
        "sink_triggers": "weight on BOS (trigger rows)",
        "value_ratio": "BOS value norm ratio",
        "residual_ratio": "BOS residual norm ratio",
        "peak_ratio": "largest activation / median",
        "massive_title": "Massive activations set to their mean or to zero",
        "massive_setup": "The zoo's mha (attnlab's GPT, {layers} layers of {heads} heads, width {width}) trained {steps} "
        "steps on Bigram-Backcopy, {seeds} seeds; at the layer with the largest activation over its median, the "
        "first token's {top} largest channels; held-out loss, the mean over seeds ± half the spread.",
        "way": "the first token's activations",
        "ways": "left|set to their mean|set to zero|control: its {top} smallest set to zero",
        "found": "Seed {seed}: layer {layer}, channels {channels}, values {values}; the layer's largest activation is "
        "{ratio:.1f} times its median, at position {position}.",
        "variants_title": "The zoo's mha, gated and sinks on Bigram-Backcopy",
        "variants_setup": "attnlab's GPT, {layers} layers of {heads} heads, width {width}, rotary positions, {length} "
        "tokens, batch {batch}, {steps} steps of Adam at {lr:g}, {seeds} seeds on the same batches; measured on a "
        "held-out batch, the mean over seeds ± half the spread.",
        "variant": "variant",
        "largest_first": "largest first-token share",
        "learned": "learned sink's largest share",
        "value_min": "smallest value norm ratio",
        "first_token": "The model's own first-token share (the mean over layers and heads) was {share:.3f}, its "
        "largest head's {largest:.3f}; a head spread evenly over every row of one context would give {uniform:.3f}.",
        "sigmoid_title": "Softmax against sigmoid attention on the zoo's text",
        "sigmoid_setup": "The zoo's mha (4 layers of 4 heads, width 64, rotary positions, bytes in) trained {steps} "
        "steps of AdamW at {lr:g}, batch {batch} of {seq_len}-byte windows of the zoo's text, with softmax and with "
        "sigmoid attention without normalisation, {seeds} seeds on the same batches; measured on {probe} held-out "
        "windows, the mean over seeds ± half the spread. A head spread evenly over each row would have a "
        "first-token share of {uniform:.3f}.",
        "attention": "attention",
        "first_mean": "first-token share (mean)",
        "sink_rate": "sink rate (Gu et al., > 0.3)",
        "partial_seeds": "Interrupted: a partial run, the {seeds} seed(s) it finished; the verdicts are judged on "
        "those alone (one seed establishes nothing).",
        "partial_arms": "Interrupted: a partial run, the arms it finished ({arms}), every sequence each; a claim "
        "whose arms are missing is not established.",
        "missing": "{claim} Not established: the run was interrupted before its arms.",
    },
    "zh": {
        "streaming_title": "在{model}的上下文之外运行 StreamingLLM",
        "streaming_setup": "{texts} 段留出序列，每段 {n} 个 Token（{contexts} 倍于 {context} 个 Token 的上下文；文本模型"
        "的一个 Token 是一个字节），每种缓存都保留 {context} 个 Token；第一个上下文之后的 Token 的困惑度，取各序列的"
        "均值 ± 一半极差。",
        "model_text": "自带文本模型",
        "model_backcopy": "一个在 Bigram-Backcopy 上训练的 GPT（zoo 的 mha）",
        "backcopy_title": "Bigram-Backcopy：注意力汇聚点、值向量消减与残差峰值",
        "backcopy_setup": "{layers} 层、每层一个头，宽度 {width}，{length} 个 Token，批量 {batch}，{steps} 步，Adam 学习率 "
        "{lr_adam:g}，SGD 学习率 {lr_sgd:g}、动量 0.9，{seeds} 个种子；各指标取最后一步（取最极端的一层），种子均值 ± 一半极差。",
        "verdict": "{claim} 实测：{mean:+.3f}（{n} 个种子上的极差 {spread:.3f}；与 zoo 相同的噪声规则）：{status}。",
        "size": " 大小：{size:.0%}。",
        "arm": "分组",
        "ppl": "上下文之外的困惑度",
        "loss": "留出损失",
        "sink": "BOS 上的权重（普通行）",
        "sink_triggers": "BOS 上的权重（触发行）",
        "value_ratio": "BOS 值范数比",
        "residual_ratio": "BOS 残差范数比",
        "peak_ratio": "最大激活 / 中位数",
        "massive_title": "把巨量激活设为均值或置零",
        "massive_setup": "zoo 的 mha（attnlab 的 GPT，{layers} 层、每层 {heads} 个头，宽度 {width}）在 Bigram-Backcopy 上"
        "训练 {steps} 步，{seeds} 个种子；在最大激活与中位数之比最大的那一层，取第 1 个 Token 最大的 {top} 个通道；"
        "留出损失，种子均值 ± 一半极差。",
        "way": "第 1 个 Token 的激活",
        "ways": "保持不变|设为均值|置零|对照：最小的 {top} 个置零",
        "found": "种子 {seed}：第 {layer} 层，通道 {channels}，取值 {values}；该层最大激活是中位数的 {ratio:.1f} 倍，位于"
        "位置 {position}。",
        "variants_title": "zoo 的 mha、gated 与 sinks 在 Bigram-Backcopy 上",
        "variants_setup": "attnlab 的 GPT，{layers} 层、每层 {heads} 个头，宽度 {width}，旋转位置编码，{length} 个 Token，"
        "批量 {batch}，Adam 学习率 {lr:g} 训练 {steps} 步，{seeds} 个种子、相同的批次；在留出批次上测量，种子均值 ± 一半极差。",
        "variant": "变体",
        "largest_first": "最大的首 Token 份额",
        "learned": "可学习的注意力汇聚点的最大份额",
        "value_min": "最小的值范数比",
        "first_token": "该模型自身的首 Token 份额（各层各头的均值）为 {share:.3f}，最大的头为 {largest:.3f}；在一个上下文"
        "的每一行上均匀分布的头为 {uniform:.3f}。",
        "sigmoid_title": "在 zoo 的文本上对比 softmax 与 sigmoid 注意力",
        "sigmoid_setup": "zoo 的 mha（4 层、每层 4 个头，宽度 64，旋转位置编码，以字节为输入）在 zoo 的文本上训练 {steps} "
        "步，AdamW 学习率 {lr:g}，批量 {batch}，每个窗口 {seq_len} 个字节，分别用 softmax 和不做归一化的 sigmoid 注意力，"
        "{seeds} 个种子、相同的批次；在 {probe} 个留出窗口上测量，种子均值 ± 一半极差。在每一行上均匀分布的头，"
        "首 Token 份额为 {uniform:.3f}。",
        "attention": "注意力",
        "first_mean": "首 Token 份额（均值）",
        "sink_rate": "汇聚率（Gu 等，> 0.3）",
        "partial_seeds": "已中断：部分运行，只有完成的 {seeds} 个种子；判定只依据这些种子（一个种子确立不了任何结论）。",
        "partial_arms": "已中断：部分运行，只有完成的分组（{arms}），每组含全部序列；缺少分组的论断未能确立。",
        "missing": "{claim} 未能确立：运行在其分组之前被中断。",
    },
}
