"""CPU linear-weight kernels: how a model's weights are laid out and multiplied when it decodes on a CPU.

``layout`` (a weight's layout chosen by measurement: plain, gemv, packed, prefetch), ``gemv`` (the compiled
row-at-a-time loop), ``packed`` (oneDNN's reordered weights), ``prefetch`` (a C++ loop that asks memory ahead)
and ``quantized`` (int8 weights and their kernels). A floor below the attention modules (``attnlab.nn``), which
know nothing of them: ``GPT.set_layout`` and ``GPT.quantize`` swap a model's ``nn.Linear`` layers for these.
"""
