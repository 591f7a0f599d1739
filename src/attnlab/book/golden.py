"""The numbers the chapter prints, transcribed from the reading notes (shared/seed).

These are the book's outputs, typed in by hand, never produced by attnlab:
the tests and ``attnlab tour --check`` compare our computations with them at
the printed precision (4 decimals, so a tolerance of half a unit in the last
place, plus float32 noise).
"""

from __future__ import annotations

PRINTED_DECIMALS = 4
ATOL = 0.5 * 10**-PRINTED_DECIMALS + 1e-6

# Section 3.3.1: the dot product of x(1) and x(2), worked by hand in the notes.
DOT_X1_X2 = 0.9544

# attn_scores_2: the query x(2) against every token.
ATTN_SCORES_2 = [0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865]

# attn_weights_2_tmp = attn_scores_2 / attn_scores_2.sum(), and its sum.
ATTN_WEIGHTS_2_SUM_NORMALIZED = [0.1455, 0.2278, 0.2249, 0.1285, 0.1077, 0.1656]
ATTN_WEIGHTS_2_SUM_NORMALIZED_SUM = 1.0000

# attn_weights_2 = torch.softmax(attn_scores_2, dim=0), and its sum.
ATTN_WEIGHTS_2_SOFTMAX = [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581]
ATTN_WEIGHTS_2_SOFTMAX_SUM = 1.0

# context_vec_2 by the loop over tokens.
CONTEXT_VEC_2 = [0.4419, 0.6515, 0.5683]

# attn_scores = inputs @ inputs.T
ATTN_SCORES = [
    [0.9995, 0.9544, 0.9422, 0.4753, 0.4576, 0.6310],
    [0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865],
    [0.9422, 1.4754, 1.4570, 0.8296, 0.7154, 1.0605],
    [0.4753, 0.8434, 0.8296, 0.4937, 0.3474, 0.6565],
    [0.4576, 0.7070, 0.7154, 0.3474, 0.6654, 0.2935],
    [0.6310, 1.0865, 1.0605, 0.6565, 0.2935, 0.9450],
]

# attn_weights = torch.softmax(attn_scores, dim=-1)
ATTN_WEIGHTS = [
    [0.2098, 0.2006, 0.1981, 0.1242, 0.1220, 0.1452],
    [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581],
    [0.1390, 0.2369, 0.2326, 0.1242, 0.1108, 0.1565],
    [0.1435, 0.2074, 0.2046, 0.1462, 0.1263, 0.1720],
    [0.1526, 0.1958, 0.1975, 0.1367, 0.1879, 0.1295],
    [0.1385, 0.2184, 0.2128, 0.1420, 0.0988, 0.1896],
]

# all_context_vecs = attn_weights @ inputs
ALL_CONTEXT_VECS = [
    [0.4421, 0.5931, 0.5790],
    [0.4419, 0.6515, 0.5683],
    [0.4431, 0.6496, 0.5671],
    [0.4304, 0.6298, 0.5510],
    [0.4671, 0.5910, 0.5266],
    [0.4177, 0.6503, 0.5645],
]

# Section 3.4.1, torch.manual_seed(123), torch.rand(3, 2) three times.
W_QUERY = [[0.2961, 0.5166], [0.2517, 0.6886], [0.0740, 0.8665]]
W_KEY = [[0.1366, 0.1025], [0.1841, 0.7264], [0.3153, 0.6871]]
W_VALUE = [[0.0756, 0.1966], [0.3164, 0.4017], [0.1186, 0.8274]]

QUERY_2 = [0.4306, 1.4551]
KEY_2 = [0.4433, 1.1419]
VALUE_2 = [0.3951, 1.0037]

# keys.shape, values.shape
KEYS_SHAPE = (6, 2)
VALUES_SHAPE = (6, 2)

ATTN_SCORE_22 = 1.8524
ATTN_SCORES_2_TRAINABLE = [1.2705, 1.8524, 1.8111, 1.0795, 0.5577, 1.5440]
ATTN_WEIGHTS_2_SCALED = [0.1500, 0.2264, 0.2199, 0.1311, 0.0906, 0.1820]
CONTEXT_VECTOR_2 = [0.3061, 0.8210]

# torch.manual_seed(123); SelfAttentionV1(3, 2)(inputs)
SA_V1_OUTPUT = [
    [0.2996, 0.8053],
    [0.3061, 0.8210],
    [0.3058, 0.8203],
    [0.2948, 0.7939],
    [0.2927, 0.7891],
    [0.2990, 0.8040],
]

# ---------------------------------------------------------------------------
# Sections 3.4.2 to 3.6. The notes stop before causal attention; these are the
# numbers the book prints for the same code (its chapter 3 listings, run with
# the seeds it states).

# torch.manual_seed(789); SelfAttentionV2(3, 2)(inputs)
SA_V2_OUTPUT = [
    [-0.0739, 0.0713],
    [-0.0748, 0.0703],
    [-0.0749, 0.0702],
    [-0.0760, 0.0685],
    [-0.0763, 0.0679],
    [-0.0754, 0.0693],
]

# sa_v2's scaled softmax weights, before any mask.
CAUSAL_UNMASKED_WEIGHTS = [
    [0.1921, 0.1646, 0.1652, 0.1550, 0.1721, 0.1510],
    [0.2041, 0.1659, 0.1662, 0.1496, 0.1665, 0.1477],
    [0.2036, 0.1659, 0.1662, 0.1498, 0.1664, 0.1480],
    [0.1869, 0.1667, 0.1668, 0.1571, 0.1661, 0.1564],
    [0.1830, 0.1669, 0.1670, 0.1588, 0.1658, 0.1585],
    [0.1935, 0.1663, 0.1666, 0.1542, 0.1666, 0.1529],
]

# attn_scores.masked_fill(mask.bool(), -torch.inf); None stands for -inf.
CAUSAL_MASKED_SCORES: list[list[float | None]] = [
    [0.2899, None, None, None, None, None],
    [0.4656, 0.1723, None, None, None, None],
    [0.4594, 0.1703, 0.1731, None, None, None],
    [0.2642, 0.1024, 0.1036, 0.0186, None, None],
    [0.2183, 0.0874, 0.0882, 0.0177, 0.0786, None],
    [0.3408, 0.1270, 0.1290, 0.0198, 0.1290, 0.0078],
]

# masked_simple_norm, and equally softmax(masked / sqrt(d_k)).
CAUSAL_WEIGHTS = [
    [1.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000],
    [0.5517, 0.4483, 0.0000, 0.0000, 0.0000, 0.0000],
    [0.3800, 0.3097, 0.3103, 0.0000, 0.0000, 0.0000],
    [0.2758, 0.2460, 0.2462, 0.2319, 0.0000, 0.0000],
    [0.2175, 0.1983, 0.1984, 0.1888, 0.1971, 0.0000],
    [0.1935, 0.1663, 0.1666, 0.1542, 0.1666, 0.1529],
]

# torch.manual_seed(123); CausalAttention(3, 2, 6, 0.0)(batch)[0]  (both rows of the batch are equal)
CAUSAL_ATTENTION_OUTPUT = [
    [-0.4519, 0.2216],
    [-0.5874, 0.0058],
    [-0.6300, -0.0632],
    [-0.5675, -0.0843],
    [-0.5526, -0.0981],
    [-0.5299, -0.1081],
]

# torch.manual_seed(123); MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)(batch)[0]
MHA_WRAPPER_OUTPUT = [
    [-0.4519, 0.2216, 0.4772, 0.1063],
    [-0.5874, 0.0058, 0.5891, 0.3257],
    [-0.6300, -0.0632, 0.6202, 0.3860],
    [-0.5675, -0.0843, 0.5478, 0.3589],
    [-0.5526, -0.0981, 0.5321, 0.3428],
    [-0.5299, -0.1081, 0.5077, 0.3493],
]

# torch.manual_seed(123); MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)(batch)[0]
MHA_OUTPUT = [
    [0.3190, 0.4858],
    [0.2943, 0.3897],
    [0.2856, 0.3593],
    [0.2693, 0.3873],
    [0.2639, 0.3928],
    [0.2575, 0.4028],
]

# MultiHeadAttention(768, 768, 1024, 0.0, 12): 3 * 768 * 768 + 768 * 768 + 768
GPT2_MHA_PARAMETERS = 2_360_064

# The notes' example of sum normalization: two people with 6 and 4 apples,
# as weights 6/(6+4) and 4/(6+4).
APPLES_WEIGHTS = [0.6, 0.4]
