"""The tour in English: every step's title and explanation, every check's label, every other phrase."""

from __future__ import annotations

from attnlab.explain.tour.en_steps import STEPS as CHAPTER_STEPS
from attnlab.explain.tour.en_steps_after import STEPS as AFTER_STEPS

STEPS: dict[str, tuple[str, str]] = {**CHAPTER_STEPS, **AFTER_STEPS}  # each step's title and explanation, in order

VALUES: dict[str, str] = {
    "after": "gqa, mqa       share keys and values between heads          Llama 3, Qwen3\n"
    "mla            cache one latent a token                     DeepSeek-V2/V3\n"
    "sliding        see only the latest tokens; local/global     Mistral, Gemma 3, gpt-oss\n"
    "sinks          a row may attend to nothing                  gpt-oss\n"
    "qk-norm        RMSNorm on queries and keys                  Qwen3, Gemma 3\n"
    "gated          an output gate on each head                  Qwen3-Next\n"
    "linear         a state of fixed size, no softmax            Katharopoulos et al.\n"
    "deltanet       the delta rule, with a decay                 Qwen3-Next",
    "overview": "1. simplified self-attention     the idea, no trainable weights\n"
    "2. self-attention                 trainable weights W_q, W_k, W_v (scaled dot-product)\n"
    "3. causal attention               only earlier and current tokens: text stays in order\n"
    "4. multi-head attention           many causal heads, each its own representation subspace",
    "summary": "without trainable weights:\n"
    "  1. similarity scores between tokens (dot products)\n"
    "  2. normalize the scores (softmax)\n"
    "  3. weighted sum: the context vector (the embedding's size)\n"
    "with W_q, W_k, W_v:\n"
    "  1. k, v of every token with W_k, W_v; q of the current token with W_q\n"
    "  2. attention scores of q against every k\n"
    "  3. normalize the scores into attention weights\n"
    "  4. weighted sum of the v vectors: the context vector",
}

CHECKS: dict[str, str] = {
    "book": "{name} matches the book",
    "book_shape": "shape {got} != book {book}",
    "inf": "-inf entries differ from the book",
    "diff": "max |diff| = {err:.1e}",
    "length_cosine": "dot product == |x1| * |x2| * cos(theta), the angle from the side lengths",
    "max_self": "max at x(2) itself",
    "overflow_nan": "naive softmax overflows to NaN",
    "underflow_nan": "naive softmax underflows to 0 / 0 = NaN",
    "stable_finite": "stable softmax stays finite and sums to 1",
    "same_size": "z(2) has the embedding's size",
    "transpose": ".T swaps rows and columns: inputs.T[2, 4] == inputs[4, 2], shape (3, 6)",
    "inner_dims": "inputs @ inputs is refused: inner dimensions 3 and 6 differ",
    "rows_sum_1": "rows sum to 1",
    "row_2_loop": "row 2 == z(2) from the loop",
    "grad_fn": "query_2 has a grad_fn",
    "grad_value": "W_query.grad == x(2) in every column (worked by hand)",
    "frozen": "a frozen matrix records nothing",
    "keys_shape": "keys.shape == (6, 2)",
    "values_shape": "values.shape == (6, 2)",
    "call_forward": "sa_v1(inputs) is sa_v1.forward(inputs)",
    "negative": "some components are negative",
    "v1_with_v2": "V1 with V2's transposed weights gives V2's output",
    "upper_zero": "upper triangle is exactly 0",
    "same_as_renormalized": "same weights as the renormalized method",
    "dropout_scale": "survivors scaled by 1/(1-p) = 2",
    "dropout_half": "about half dropped",
    "dropout_eval": "identity in eval()",
    "future_ignored": "positions 0..3 ignore changes at 4..5",
    "shape": "shape {shape}",
    "gpt2_params": "GPT-2 size: 2,360,064 parameters",
    "keys_fixed": "keys of tokens 0..3 do not change when tokens 4, 5 arrive",
    "kv_rows": "stacked rows == the full causal weights",
    "lab_paged": "paged blocks: stacked rows == the full causal weights",
    "lab_sink": "sink cache: the last output == attention over the tokens it kept",
    "lab_int8": "int8: every quantized key within half a code of the exact one",
    "lab_h2o": "H2O: holds its budget of 4 keys",
    "gqa_by_hand": "== softmax(q @ k.T / sqrt(2)) with each key head repeated for its 2 query heads",
    "gqa_half": "the cache holds half of MHA's bytes",
    "mla_forms": "cached decode (absorbed) == the whole sentence (expanded)",
    "mla_cache": "the cache holds {values} values a token: the latent and its RoPE key",
    "window_rows": "each query sees at most 3 keys",
    "window_last": "the last token's output == attention over only the last 3 tokens",
    "window_cached": "token by token through a ring of 3 slots == the whole sentence; the ring holds tokens 3, 4, 5",
    "sinks_by_hand": "== exp(scores) / (sum of exp(scores) + exp(sink))",
    "sinks_less": "every row gives its sink a share between 0 and 1",
    "qk_norm_same": "with QK-norm, 100 times larger inputs give the same weights",
    "plain_peaks": "without it, the rows become almost one-hot (mean largest weight > 0.95)",
    "gate_by_hand": "== out_proj(sigmoid(gate(x)) * context_vec)",
    "gate_silent": "every gate shut: the output is out_proj's bias alone",
    "linear_forms": "recurrent == parallel == chunked (float64), and the module gives their output",
    "linear_weights": "the implicit weights: the module records them, they give its output, each row sums to 1",
    "state_fixed": "the state is as large for 100,000 tokens as for 6",
    "delta_replaces": "the delta rule reads back the second value; linear attention's state the sum of both",
    "delta_forms": "recurrent == chunked (float64)",
    "delta_negative": "with every q . k >= 0, the delta rule still gives v0 a negative weight: 0.28 - 0.6 x 0.936",
    "kda_channels": "after 5 tokens, channel 0 holds 0.6 x [1, 2] x e^-5 and channel 1 still 0.8 x [1, 2]",
    "kda_scalar": "with one decay for every channel it is Gated DeltaNet's delta rule exactly",
    "kda_forms": "recurrent == chunked (float64)",
    "share_by_hand": "== softmax(q_later @ k_first.T / sqrt(2)) @ v_first: the later layer reads the first one's keys",
    "share_cache": "the later layer's cache holds 0 bytes: the two layers keep what the first alone keeps",
    "share_rows_fewer": "the later layer projects queries only: 8 rows, against 8 + 2 x 4",
    "conv_by_hand": "== out_proj(C * the convolution written tap by tap), and the module gives it",
    "conv_reach": "each token reads itself and its 2 predecessors, no further",
    "conv_state_held": "token by token == the whole sentence; the cache then holds the last 2 inputs (B * x)",
    "zoo_all": "every variant, the same steps and seeds",
    "zoo_mla": "MLA's cache, measured after {tokens} tokens: {n} bytes a token, {layers} layers x ({rank} + {rope}) x 4 bytes",
    "zoo_hybrid": "the hybrid's, measured: {n} bytes a token ({full} full layer x 2 x {kv} x 4 bytes), and a state of {state} bytes",
    "zoo_budget": "every variant within 5% of mha's parameters",
}

WORDS: dict[str, str] = {
    "heading": "Chapter 3: coding attention mechanisms",
    "cache_bytes": "{what} cache for 6 tokens: {n} bytes",
    "llama_gqa": "Llama 3 8B, values a token and layer: {mha:,} as MHA, {gqa:,} with 8 key/value heads",
    "cm_latent": "one latent a token",
    "mla_values": "values a token: {latent} in the latent cache, {heads} as every head's keys and values",
    "deepseek_values": "DeepSeek-V3: {latent} values a token, {heads} as its 128 heads' keys and values ({ratio:.0f}x)",
    "cm_ring": "a ring of 3 slots",
    "ring_holds": "after 6 tokens the ring holds tokens {held}",
    "gemma_local": "Gemma 3 27B at 32k tokens (52 local layers of 1024, 10 global): {share:.0%} of an all-global cache",
    "cm_sink_weight": "each row gives its keys what its sink did not take",
    "cm_sinks": "one logit per head",
    "sink_share": "what the first row of each head gives the sink: {shares}",
    "cm_loud": "100 times larger inputs",
    "peak": "{name:<8} mean largest weight of a row: {quiet:.4f}, with 100x inputs {loud:.4f}",
    "cm_gate": "a number in (0, 1) per dimension",
    "gate_shut": "out_proj.bias: {bias}\nevery gate shut, the last token's output: {out}",
    "cm_phi": "positive",
    "state_shape": "S: {s}, z: {z}: {n} values, whatever the length",
    "cm_decay": "forget a little",
    "cm_delta": "write the error",
    "delta_read": "the key written twice reads back: delta rule {delta}, linear attention's state {linear}",
    "delta_taken": "k0 = [1, 0], then k1 = [0.6, 0.8], read by q = [0.28, 0.96]: every q . k >= 0, v0's weight {w:.4f}",
    "cm_channel_decay": "each key channel forgets at its own rate",
    "kda_kept": "what each key channel still holds of [1, 2] after 5 tokens: decaying {fast}, kept {kept}",
    "cm_share": "no keys or values of its own",
    "share_rows": "rows of W_qkv: first {first}, later {later}; cached for 6 tokens: first {bytes} bytes, later {none}",
    "cm_gates": "two gates and the input",
    "conv_state": "what it keeps: its last 2 inputs per channel, {shape}: {n} values, whatever the length",
    "cm_show": "the shipped run, whole",
    "zoo_header": "the shipped run: {steps} steps, {seeds} seeds, {minutes:.0f} minutes on {threads} CPU threads",
    "zoo_columns": "variant       loss    KV bytes a token   cache at 32k tokens",
    "check": "check",
    "terms": "term",
    "passed": "{n} checks: the chapter matches the book, each variant does what it claims",
    "mismatch": "{n} mismatches",
    "kv_step": "step {t}: the cache holds {t} keys; new row (head 0): [{row}]",
    "lab_paged": "paged, blocks of 2: block table {blocks}, {waste} slots unused",
    "lab_sink": "sinks, 1 + 3 recent: holds tokens {held}",
    "lab_int8": "int8, groups of 2: largest key error {err:.4f} (a code is at most {bound:.4f} wide)",
    "lab_h2o": "H2O, budget 4: keeps tokens {kept}, let go of {evicted}",
    "cm_overflow": "exp overflows to inf",
    "cm_underflow": "exp underflows to 0",
    "cm_stable": "the largest term is exp(0) = 1",
    "overflow_naive": "overflow, naive",
    "underflow_naive": "underflow, naive",
    "overflow_stable": "overflow, stable",
    "underflow_stable": "underflow, stable",
    "apples": "apples",
    "cm_shape_only": "only the shape (3,) is used",
    "cm_records": "autograd records how query_2 was made",
    "cm_backward": "d(sum)/d(W_query) lands in W_query.grad",
    "cm_frozen": "frozen: nothing recorded",
    "frozen_value": "frozen",
    "cm_forward": "nn.Module calls forward()",
    "cm_linear": "nn.Linear(d_in, d_out, bias=qkv_bias) for W_query, W_key, W_value",
    "cm_one_token": "one token in, one row of weights out",
    "gpt2_size": "parameters at GPT-2 size",
    "keys": "keys",
    "queries": "queries",
    "tokens": "tokens",
    "features": "feature dimensions",
    "head": "head {h}",
}
