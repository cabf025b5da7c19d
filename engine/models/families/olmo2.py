"""OLMo 2: the outputs of attention and the MLP normed, not their inputs; q/k norms over all heads at once; norms
that scale the fp32 rows before rounding."""

from . import LLAMA_KEYS, OUTPUT_NORMS, Family

FAMILY = Family("olmo2", ("olmo2",), gguf_archs=("olmo2",), norms=OUTPUT_NORMS, wide_norms=True, qk_norms="whole",
                gguf_keys=LLAMA_KEYS)
