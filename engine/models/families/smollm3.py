"""SmolLM3: the Llama layer, every fourth layer without rotary (`no_rope_layers`: 1 where a layer rotates)."""

from . import LLAMA_KEYS, Family


def _rotary(config) -> tuple[bool, ...]:
    uses = getattr(config, "no_rope_layers", None) or [1] * config.num_hidden_layers
    return tuple(bool(u) for u in uses)


FAMILY = Family("smollm3", ("smollm3",), gguf_archs=("smollm3",), rotary=_rotary, gguf_permuted_qk=True,
                gguf_keys=LLAMA_KEYS)
