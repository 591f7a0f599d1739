"""Words of the HTML reports (tour and explain), in English and Chinese."""

from __future__ import annotations

REPORT_TEXT: dict[str, dict[str, str]] = {
    "en": {
        "tour_title": "attnlab: chapter 3, step by step, and what came after",
        "glossary_title": "Glossary",
        "glossary_text": "Every term of the tour with its Chinese as the reading notes write it, the other Chinese "
        "readers meet for it, its names in the book's code and attnlab's, and the step where it first appears. "
        "A term's first use in the tour links here; `attnlab glossary` prints this table.",
        "tour_intro": "Every step of the chapter with its code, the tensor it gives, the check against the number "
        "the book prints, and a heatmap where there is a matrix to see; then what came after it (GQA, MLA, windows, "
        "sinks, QK-norm, gates, linear attention, Gated DeltaNet), each checked against what it claims.",
        "explain_title": "attnlab explains: {sentence}",
        "explain_intro": "The sentence is split into words and punctuation; each word gets a seeded, untrained "
        "vector (seed {seed}, {d_model} dimensions): these are not trained embeddings, so the patterns "
        "below show how attention computes, not what a trained model has learned. Attention: {heads} heads, "
        "causal={causal}, dropout={dropout}.",
        "contents": "Steps",
        "numbers": "show numbers",
        "tokens": "Tokens and their embeddings",
        "tokens_text": "Each token gets a vector drawn from a generator seeded by the word itself (and the seed): the "
        'same word gets the same vector in every sentence, and different words ("The" and "the" too) '
        "get different ones. The vectors are random, not trained.",
        "scores": "Attention scores, per head",
        "scores_text": "Each query is dotted with every key: omega_ij = q_i . k_j, one matrix per head.",
        "scaled": "Scaled scores",
        "scaled_text": "Divided by sqrt(head_dim) = {sqrt:.3f} so the softmax does not saturate.",
        "mask": "The causal mask",
        "mask_text": "A token may attend to itself and the tokens before it (yellow = may attend). Scores above "
        "the diagonal become -inf (grey in the heatmaps).",
        "masked": "Masked scores",
        "masked_text": "The scaled scores with the future hidden.",
        "weights": "Attention weights, per head",
        "weights_text": "Softmax along each row: every row sums to 1. Read row i as how much token i takes from each token.",
        "dropout": "Dropout on the weights",
        "dropout_text": "In training, each weight is zeroed with probability p = {p} and the survivors are scaled by "
        "1/(1-p), so the expected sum of each row is still 1.",
        "context": "Context vectors",
        "context_text": "Each token's context vector is the weighted sum of the value vectors, per head; the heads "
        "are concatenated (columns) and projected by out_proj.",
        "kv": "KV cache, token by token",
        "kv_text": "Generating one token at a time, the cache keeps the keys and values of the tokens so far. Each "
        "step adds one row of weights over the cache; stacked, the rows are exactly the causal weight matrix.",
        "kv_noncausal": "The KV cache serves causal decoding; with causal=False every token attends to the future, "
        "which a token-by-token cache cannot see.",
        "zeroed": "zeroed: {frac:.2f} of the visible weights (p = {p})",
        "check_rows": "rows sum to 1",
        "check_upper": "upper triangle is exactly 0",
        "check_window": "each query sees at most its window's {window} keys",
        "check_rows_sink": "rows sum to at most 1: the learned sinks take {share:.0%} of this layer's attention",
        "layer_full": "full attention",
        "layer_sliding": "sliding window of {window}",
        "layer_shared": "reads layer {source}'s keys and values (KV sharing): it caches nothing of its own",
        "layer_kda": "Kimi Delta Attention: a state of {values} values, whatever the length, each key channel "
        "forgetting at its own rate; the weights shown are the ones it equals (not a softmax)",
        "layer_conv": "gated short convolution: its last {values} inputs, whatever the length; the weights shown "
        "are the ones it equals, averaged over its channels",
        "layer_latent": "latent attention, {values} values a token cached (its heads' keys and values: {heads})",
        "layer_linear": "linear attention: a state of {values} values, whatever the length; the weights shown are "
        "the ones it equals",
        "layer_delta": "Gated DeltaNet: a state of {values} values, whatever the length; the weights shown are the "
        "ones it equals (not a softmax: a row need not sum to 1)",
        "shown_by_size": "; drawn by size, |w|: some weights are negative (a negative q · k, or the delta rule "
        "taking back an earlier write)",
        "check_kv": "stacked rows == full causal weights",
        "keys": "keys",
        "queries": "queries",
        "tokens_axis": "tokens",
        "features": "feature dimensions (head.dimension)",
        "head": "head {h}",
        "enlarge": "click a heatmap to see it full size; click again or press Esc to close",
        "layer_title": "Layer {layer}",
        "view_title": "Every head, interactive",
        "view_text": "Hover a token on the left to see, layer by layer and head by head, which tokens it draws on; "
        "the grid below holds every layer x head as a small pattern with its name and best score: click one to "
        "open it. The rollout follows attention through every layer, with the residual stream counted as half "
        "of each step.",
        "layer_text": "The attention weights of this layer's {heads} heads: row i is how much token i takes from "
        "each earlier token.",
        "names": "Every head, named",
        "names_text": "Each head is scored on a probe of {half} distinct random tokens followed by the same tokens "
        "again (T = 2n): previous-token = mean of A[i, i-1]; duplicate-token = mean of A[i, i-n] (the earlier copy "
        "of the same token); induction = mean of A[i, i-n+1] (the token after the earlier copy); first-token = mean "
        "of A[i, 0] (the attention sink). 1 means all of a head's attention; a head is named after its highest "
        "score when it is at least 0.4. Loss on the first copy {first:.2f}, on the repeat {second:.2f}: "
        "in-context learning score {icl:+.2f} (below zero: the model reads the repeat off the first copy).",
        "heads_axis": "head",
        "layers_axis": "layer",
        "score_previous_token": "previous-token score",
        "score_duplicate_token": "duplicate-token score",
        "score_induction": "induction score",
        "score_first_token": "first-token score",
        "name_previous_token": "previous",
        "name_duplicate_token": "duplicate",
        "name_induction": "induction",
        "name_first_token": "first",
        "name_none": "-",
        "training": "How it learned",
        "training_text": "The loss and each head's scores at every evaluation of the training run (train_log.json "
        "beside the checkpoint). What this run's log shows:",
        "formed": "A head's induction score first reached 0.7 at step {step}.",
        "run_loss": "the held-out loss went from {first:.2f} (step {first_step}) to {last:.2f} (step {last_step}); "
        "its steepest fall between two evaluations was from {before:.2f} to {after:.2f}, by step {cliff}.",
        "run_heads": "A layer-0 head's previous-token score first reached 0.7 at step {prev}, and a later layer's "
        "induction score at step {ind}: {order}.",
        "order_prev_first": "the previous-token head came first",
        "sep": " ",
        "order_ind_first": "the induction head came first",
        "order_same": "both at the same evaluation",
        "run_missing": "In this log, {which} reached 0.7.",
        "run_missing_both": "In this log, neither a layer-0 previous-token score nor an induction score reached 0.7.",
        "which_prev": "no layer-0 previous-token score",
        "which_ind": "no induction score",
        "probe_title": "Layer {layer} on the probe",
        "probe_text": "The {heads} heads on the first sequence of the probe (token ids; the second half repeats "
        "the first). An induction head draws a diagonal one step right of the copy's position; a previous-token "
        "head, the line just below the main diagonal.",
        "model_title": "attnlab: every head of {name} on your text, as typed: {text!r}",
        "hf_intro": "A transformers model ({kind}: {layers} layers, {heads} heads) on {tokens} tokens, labelled as "
        "its tokenizer cuts the text. It ran in transformers with attnlab's flash kernel as its attention "
        "(attnlab.hf): no eager pass. Each layer's weights were formed exactly from its q, k and the kernel's "
        "log-sum-exp, one layer at a time, and went into the view as they came.",
        "hf_view_text": "Hover a token on the left to see, layer by layer and head by head, which tokens it draws on; "
        "the grid below holds every layer x head as a small pattern: click one to open it. The rollout follows "
        "attention through every layer, with the residual stream counted as half of each step.",
        "model_intro": "A real checkpoint ({layers} layers, {heads} heads, {emb} dimensions) on {tokens} tokens, "
        "labelled as its tokenizer cuts the text. One forward pass, recorded layer by layer.",
        "characters_note": "Shown by character: the text's {tokens} tokens are {chars} characters as a reader sees "
        "them (a Chinese character is 3 byte tokens, an emoji 4; a flag, a family of emoji joined by U+200D, or é "
        "written as e and an accent is one character). A character's weight as a key is the sum over its tokens; its "
        "row as a query is the mean of its tokens' rows, so each row still sums to what a token's does.",
        "parts_note": "A token that is a part of a character is labelled by the character and its place in it "
        "(字 1/3: the first of 字's 3 byte tokens); --characters shows one row and column per character.",
        "colon": ": ",
        "cache_title": "The {cache} cache as the model reads and generates",
        "cache_tokens": "tokens",
        "cache_step": "after {n} tokens",
        "cache_layer": "layer {n}",
        "cache_sequence": "sequence {n}",
        "cache_error": "largest key error",
        "cache_kept": "holds tokens",
        "cache_blocks": "blocks {blocks}, {waste} slots unused",
        "cache_held": "{n} tokens held, let go of {gone}",
        "cache_reused": "{seq}: blocks {blocks}, {n} tokens taken from the tree",
        "cache_hit_rate": "hit rate {rate:.0%} of the prompt tokens",
        "cache_plain": "The plain cache keeps every key and value, in place: each row is one step, and every token "
        "seen so far is held (bright).",
        "cache_paged": "Keys and values live in blocks of 16 tokens taken from a shared pool; each cell is the "
        "id of the block that holds that token. A new block is taken only when the last one is full, so at "
        "most one block per sequence is partly empty.",
        "cache_prefix": "The text twice, as two sequences sharing one tree of blocks keyed by token ids: the second "
        "takes the first's full blocks (the same ids) instead of computing them, and computes only the rest.",
        "cache_sink": "StreamingLLM: the first 4 tokens (the attention sinks) and the latest 16 are kept, the "
        "middle is let go (teal; yellow = kept, dark = not read yet); with RoPE the sinks are moved next to the window, so the model can go on past "
        "its context with flat memory.",
        "cache_int8": "Keys stored in 8 bits per channel (groups of 8 tokens), values in 8 bits per token, the "
        "latest 8 exact (KIVI). "
        "Each cell is the largest error of that token's keys in one layer: zero for the latest tokens.",
        "cache_int4": "Keys stored in 4 bits per channel (groups of 8 tokens), values in 4 bits per token, the "
        "latest 8 exact (KIVI). "
        "Each cell is the largest error of that token's keys in one layer: zero for the latest tokens.",
        "cache_h2o": "H2O keeps half the tokens it has seen: the latest, and the heavy hitters that received the "
        "most attention so far; the others are let go (teal; yellow = kept, dark = not read yet). Layer 0 is drawn; each layer chooses its own.",
        "cache_snapkv": "SnapKV compresses the prompt to half: the prompt's last queries vote for the tokens they "
        "attend to, and the others are let go (teal; yellow = kept, dark = not read yet); generated tokens are all kept. Layer 0 is drawn.",
    },
    "zh": {
        "tour_title": "attnlab：第三章逐步讲解，以及后来的变体",
        "glossary_title": "术语表",
        "glossary_text": "导览用到的每个术语：阅读笔记的译法、读者会遇到的另一种译法、英文、书中代码和 attnlab 代码里"
        "的名字，以及它在导览中首次出现的步骤。导览中每个术语第一次出现时都链接到这里；"
        "`attnlab glossary --lang zh` 在终端打印这张表。",
        "tour_intro": "本章每一步的代码、得到的张量、与书中数值的校验，以及可视化的注意力热力图；之后是后来的变体 (GQA、MLA、滑动窗口、汇聚点、QK 归一化、门控、线性注意力、门控 DeltaNet)，每个都校验它声称的效果。",
        "explain_title": "attnlab 解释：{sentence}",
        "explain_intro": "句子按单词和标点分词，每个词得到一个固定随机种子 (seed {seed}, {d_model} 维) 的未训练向量："
        "这些不是训练过的嵌入，下图展示的是注意力如何计算，而不是训练好的模型学到了什么。"
        "注意力：{heads} 个头，causal={causal}，dropout={dropout}。",
        "contents": "步骤",
        "numbers": "显示数值",
        "tokens": "Token 及其嵌入向量",
        "tokens_text": "每个 Token 的向量由以这个词本身(和种子)为种子的随机数生成器生成：同一个词在任何句子里都得到"
        "同一个向量，不同的词(包括 “The” 和 “the”)得到不同的向量。这些向量是随机的，没有经过训练。",
        "scores": "注意力分数 (每个头)",
        "scores_text": "每个查询向量与每个键向量做点积：omega_ij = q_i . k_j，每个头一个矩阵。",
        "scaled": "缩放后的注意力分数",
        "scaled_text": "除以 sqrt(head_dim) = {sqrt:.3f}，防止 softmax 饱和、梯度消失。",
        "mask": "因果注意力掩码",
        "mask_text": "每个 Token 只能关注自己和前面的 Token (黄色 = 可以关注)。对角线以上的分数变为 -inf (热力图中为灰色)。",
        "masked": "掩码后的注意力分数",
        "masked_text": "隐藏了未来 Token 的缩放分数。",
        "weights": "注意力权重 (每个头)",
        "weights_text": "对每一行做 softmax 归一化：每行之和为 1。第 i 行表示 Token i 从每个 Token 获取多少信息。",
        "dropout": "对注意力权重做 dropout",
        "dropout_text": "训练时每个权重以概率 p = {p} 置 0，其余乘以 1/(1-p)，每行的期望之和仍为 1。",
        "context": "上下文向量",
        "context_text": "每个 Token 的上下文向量是值向量按注意力权重的加权和 (每个头)；各头拼接 (列) 后经 out_proj 投影。",
        "kv": "KV Cache：逐个 Token 生成",
        "kv_text": "逐个生成 Token 时，缓存保存已有 Token 的键向量和值向量。每一步新增一行对缓存的注意力权重；"
        "把这些行叠起来，正好是因果注意力权重矩阵。",
        "kv_noncausal": "KV Cache 用于因果解码；causal=False 时每个 Token 都关注未来的 Token，逐个生成时看不到未来。",
        "zeroed": "置 0：可见权重中的 {frac:.2f} (p = {p})",
        "check_rows": "每行之和为 1",
        "check_upper": "对角线以上全为 0",
        "check_window": "每个查询最多看到窗口内的 {window} 个键",
        "check_rows_sink": "每行之和不超过 1：可学习的注意力汇聚点 (sink) 拿走本层 {share:.0%} 的注意力",
        "layer_full": "全注意力",
        "layer_sliding": "{window} 个 Token 的滑动窗口",
        "layer_shared": "读取第 {source} 层的键和值 (KV 共享)：本层自己什么都不缓存",
        "layer_kda": "Kimi Delta Attention：状态固定为 {values} 个值，与长度无关，每个键通道以自己的速度遗忘；图中是它等价的权重（不是 softmax）",
        "layer_conv": "门控短卷积：只保留最近的 {values} 个输入值，与长度无关；图中是它等价的权重（各通道的平均）",
        "layer_latent": "潜在注意力 (MLA)，每个 Token 缓存 {values} 个值 (各头的键和值共 {heads} 个)",
        "layer_linear": "线性注意力：状态固定为 {values} 个值，与长度无关；图中是它等价的权重",
        "layer_delta": "门控 DeltaNet：状态固定为 {values} 个值，与长度无关；图中是它等价的权重（不是 softmax，每行之和不一定为 1）",
        "shown_by_size": "；按大小 |w| 绘制：有些权重是负的 (q · k 为负，或 delta 规则收回了之前的写入)",
        "check_kv": "叠起来的行 == 完整的因果注意力权重",
        "keys": "键 (keys)",
        "queries": "查询 (queries)",
        "tokens_axis": "Token",
        "features": "特征维度 (头.维度)",
        "head": "头 {h}",
        "enlarge": "点击热力图可放大查看；再次点击或按 Esc 关闭",
        "layer_title": "第 {layer} 层",
        "view_title": "所有注意力头（可交互）",
        "view_text": "把鼠标移到左列的某个 Token 上，就能逐层、逐头看到它从哪些 Token 取信息；下面的网格把每一层的每个头"
        "画成一个小图，并标出它的名字和最高分数：点一下就在上方打开。rollout 把注意力沿着所有层连乘起来，"
        "其中每一步的残差连接算作一半。",
        "layer_text": "这一层 {heads} 个头的注意力权重：第 i 行表示 Token i 从前面每个 Token 获取多少信息。",
        "names": "为每个注意力头命名",
        "names_text": "每个头在一个探针序列上打分：{half} 个互不相同的随机 Token，后面再重复一遍 (T = 2n)。"
        "前一个 Token (previous-token) = A[i, i-1] 的平均；重复 Token (duplicate-token) = A[i, i-n] 的平均 (同一个 Token 的前一次出现)；"
        "归纳 (induction) = A[i, i-n+1] 的平均 (前一次出现之后的那个 Token)；首个 Token (first-token) = A[i, 0] 的平均 (注意力汇聚点)。"
        "1 表示这个头的注意力全部落在那里；最高分不低于 0.4 时，用它给这个头命名。"
        "第一遍的损失 {first:.2f}，重复部分的损失 {second:.2f}：上下文学习分数 {icl:+.2f} (小于零：模型从第一遍读出了重复的内容)。",
        "heads_axis": "头",
        "layers_axis": "层",
        "score_previous_token": "前一个 Token 分数",
        "score_duplicate_token": "重复 Token 分数",
        "score_induction": "归纳分数",
        "score_first_token": "首个 Token 分数",
        "name_previous_token": "前一个",
        "name_duplicate_token": "重复",
        "name_induction": "归纳",
        "name_first_token": "首个",
        "name_none": "-",
        "training": "它是怎样学会的",
        "training_text": "训练过程中每次评估时的损失和每个头的分数 (来自检查点旁边的 train_log.json)。这次训练的日志显示：",
        "formed": "某个头的归纳分数在第 {step} 步第一次达到 0.7。",
        "run_loss": "验证损失从 {first:.2f} (第 {first_step} 步) 降到 {last:.2f} (第 {last_step} 步)；"
        "两次评估之间下降最陡的一段是从 {before:.2f} 到 {after:.2f}，到第 {cliff} 步为止。",
        "run_heads": "第 0 层某个头的前一个 Token 分数在第 {prev} 步第一次达到 0.7，某层的归纳分数在第 {ind} 步达到 0.7：{order}。",
        "sep": "",
        "order_prev_first": "前一个 Token 头先出现",
        "order_ind_first": "归纳头先出现",
        "order_same": "两者在同一次评估时出现",
        "run_missing": "在这份日志里，{which}从未达到 0.7。",
        "run_missing_both": "在这份日志里，第 0 层的前一个 Token 分数和归纳分数都从未达到 0.7。",
        "which_prev": "第 0 层的前一个 Token 分数",
        "which_ind": "归纳分数",
        "probe_title": "第 {layer} 层在探针序列上",
        "probe_text": "{heads} 个头在探针的第一条序列上 (标签是 Token 编号；后一半重复前一半)。"
        "归纳头画出一条在副本位置右边一格的对角线；前一个 Token 头画出紧贴主对角线下方的一条线。",
        "model_title": "attnlab：{name} 的每个注意力头，输入 (你输入的原文) {text!r}",
        "hf_intro": "一个 transformers 模型 ({kind}：{layers} 层，{heads} 个头)，输入 {tokens} 个 Token，标签是分词器切出的 "
        "Token。它在 transformers 里运行，注意力换成了 attnlab 的 flash 内核 (attnlab.hf)：没有走 eager 路径。"
        "每一层的权重都由这一层的 q、k 和内核给出的 log-sum-exp 精确算出，一次只算一层，算出就放进下面的视图。",
        "hf_view_text": "把鼠标移到左列的某个 Token 上，就能逐层、逐头看到它从哪些 Token 取信息；下面的网格把每一层的每个头"
        "画成一个小图：点一下就在上方打开。rollout 把注意力沿着所有层连乘起来，其中每一步的残差连接算作一半。",
        "model_intro": "一个真实的模型检查点 ({layers} 层，{heads} 个头，{emb} 维)，输入 {tokens} 个 Token，"
        "标签是分词器切出的 Token。一次前向传播，逐层记录。",
        "characters_note": "按字显示：这段文字的 {tokens} 个 Token 是 {chars} 个字 (一个汉字是 3 个字节 Token，"
        "一个 emoji 是 4 个；按读者看到的算：一面旗帜、用 U+200D 连起来的一组 emoji、写成 e 加重音符的 é，"
        "都算一个字)。一个字作为键的权重是它各个 Token 的权重之和；作为查询的一行是它各个 Token 那几行的平均，"
        "所以每行之和仍与一个 Token 的一行相同。",
        "parts_note": "一个 Token 只是某个字的一部分时，标签写出这个字和它在字里的位置 (字 1/3：“字”的 3 个字节 "
        "Token 中的第 1 个)；加 --characters 则每个字一行一列。",
        "colon": "：",
        "cache_title": "{cache} 缓存：模型读取并生成时缓存里有什么",
        "cache_tokens": "Token",
        "cache_step": "读到第 {n} 个 Token 后",
        "cache_layer": "第 {n} 层",
        "cache_sequence": "序列 {n}",
        "cache_error": "键向量最大误差",
        "cache_kept": "保留 Token",
        "cache_blocks": "块 {blocks}，{waste} 个空位",
        "cache_held": "保留 {n} 个 Token，丢弃 {gone}",
        "cache_reused": "{seq}：块 {blocks}，{n} 个 Token 直接取自前缀树",
        "cache_hit_rate": "命中率：提示词 Token 的 {rate:.0%}",
        "cache_plain": "普通缓存原地保存每个键向量和值向量：每一行是一步，读过的每个 Token 都保留 (亮色)。",
        "cache_paged": "键向量和值向量存放在共享内存池的块中，每块 16 个 Token；每个格子是存放该 Token 的块编号。"
        "只有上一块满了才取新块，所以每个序列最多有一块没有填满。",
        "cache_prefix": "同一段文本作为两个序列，共用一棵以 Token 编号为键的块树：第二个序列直接使用第一个的满块"
        "(块编号相同)，不再重新计算，只计算剩下的部分。",
        "cache_sink": "StreamingLLM：保留开头 4 个 Token (注意力汇聚点) 和最近的 16 个，中间的丢弃 (青色；黄色 = 保留，深色 = 尚未读到)；"
        "使用 RoPE 时汇聚点被移到窗口前面，模型可以在内存不变的情况下生成超过上下文长度的文本。",
        "cache_int8": "键向量按通道用 8 位存储 (每 8 个 Token 一组)，值向量按 Token 用 8 位存储，最近 8 个保持精确 (KIVI)。"
        "每个格子是该 Token 在这一层的键向量最大误差：最近的 Token 误差为零。",
        "cache_int4": "键向量按通道用 4 位存储 (每 8 个 Token 一组)，值向量按 Token 用 4 位存储，最近 8 个保持精确 (KIVI)。"
        "每个格子是该 Token 在这一层的键向量最大误差：最近的 Token 误差为零。",
        "cache_h2o": "H2O 只保留读过的 Token 的一半：最近的，以及到目前为止得到注意力最多的 (heavy hitters)；"
        "其余的丢弃 (青色；黄色 = 保留，深色 = 尚未读到)。图中是第 0 层；每一层各自选择。",
        "cache_snapkv": "SnapKV 把提示词压缩到一半：提示词最后几个查询向量为它们关注的 Token 投票，其余的丢弃 "
        "(青色；黄色 = 保留，深色 = 尚未读到)；生成的 Token 全部保留。图中是第 0 层。",
    },
}
