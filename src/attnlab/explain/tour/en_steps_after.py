"""The tour in English, part 4: each step's title and explanation for what came after the chapter, in the tour's
order (en_steps.py holds the chapter's, en.py the rest)."""

from __future__ import annotations

STEPS: dict[str, tuple[str, str]] = {
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
    "attention_sink": (
        "Attention sinks: softmax must put its weight somewhere",
        "Every row of softmax sums to 1, so a head whose query matches nothing still gives all of its weight away: "
        "the even head below spreads each row over the tokens it sees, and adds their values up, noise it did "
        "not ask for. Trained models find a way out: the first token, which every query sees, becomes an "
        "attention sink. Its key takes a score every query matches (here 8 added to column 0), its value shrinks "
        "(here set to zero: a value-state drain), and the head, pouring its row onto token 0, adds almost nothing "
        "to the context vectors: it says nothing. The first-token share (the mean weight rows 1..5 put on token 0) "
        "measures it: 1 for a head wired to token 0, the mean of 1/2 .. 1/6 for the even head. In trained models "
        "the first token's residual stream often carries massive activations (a residual-state peak); the share "
        "of heads above a threshold is the sink rate. `attnlab sinks` sets each paper's claim against runs "
        "trained here.",
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
    "ring_back": (
        "Going back on a ring: a refused guess leaves no trace",
        "Speculative decoding makes generation faster without changing one token: something cheap guesses the next "
        "few tokens (`lookup=` copies them from the text so far, `draft=` asks a small model), and the model checks "
        "them all in one pass, keeping each guess it would have chosen itself, up to the first it would not. The "
        'pass wrote every guess into the cache, so a refused one must leave no trace. Here the prompt is "Your '
        'journey starts"; the pass reads "with" and the guesses "one journey starts"; say the model keeps '
        '"one", refuses "journey" (and "starts", which came after it) and gives "step" itself. A sliding '
        'window\'s ring of only 3 slots could not take the pass back: it wrote over "with", which the next window '
        "reads. With 3 spare slots the ring crops to 5 tokens, and each slot a refused guess wrote reads as empty or "
        "as a position older than every window to come (starts@0).",
    ),
    "state_back": (
        "Going back on a recurrent state: a mark, then the kept tokens again",
        "A recurrent layer rewrites its state at every token and keeps no earlier one, so it cannot be cropped "
        "like a cache of keys. Instead the decode loop marks it before a pass: one copy of the state, whatever the "
        'length, made just before "with", the last token held for certain, which the pass reads to check the '
        "first guess. After the pass, crop(5) cannot stop at 5 tokens: it goes back to the mark, 3 tokens, and "
        'puts the copy back bit for bit; the tokens kept since, "with one", run again (in the next pass, beside '
        "its new guesses). The numbers are head 0's state in a Gated DeltaNet layer of seed 123: the refused "
        '"journey starts" moved them, and once gone back and run again they are, bit for bit, those of a run that '
        'never saw the guesses. This is the going_back="mark" way, which shows the idea most plainly; attnlab\'s '
        'default, "each", keeps the state after each token of the pass instead, so crop(5) stops at 5 and nothing '
        'runs again (docs/caches.md, "Going back", says which costs what).',
    ),
    "zoo_run": (
        "The attention zoo: every variant trained side by side",
        "`attnlab zoo` trains each variant on the same text, with the same parameters (within 5%), batches, "
        "schedule and seeds, and measures the held-out loss, the cache, decode speed and the heads it grew. This "
        "is the run that ships with attnlab; `attnlab zoo --show` prints all of it, with which differences are "
        "larger than the spread over seeds. `explain --model zoo:NAME` shows a variant's heads on any text.",
    ),
}
