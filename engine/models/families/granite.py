"""Granite: the Llama layer with four multipliers: of the embeddings, of each output before the residual add, of
attention scores (its scale), and the logits' divisor (the config's names, read by every spec)."""

from . import LLAMA_KEYS, Family

FAMILY = Family("granite", ("granite",), gguf_archs=("granite",), scale=lambda config: float(config.attention_multiplier),
                gguf_permuted_qk=True,
                gguf_keys={**LLAMA_KEYS, "embedding_scale": "embedding_multiplier", "residual_scale": "residual_multiplier",
                           "attention.scale": "attention_multiplier", "logit_scale": "logits_scaling"})
