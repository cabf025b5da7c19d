"""Tiny random-weight models built from a config, for fast CPU tests (no downloads)."""

from __future__ import annotations

import torch

from engine.loading import LoadedModel


def tiny_model(vocab: int = 64, layers: int = 4, seed: int = 0, family: str = "llama", max_pos: int = 512):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[family]
    config = config_cls(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=max_pos,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    # sharper distributions than the default init, so greedy text has structure and drafts get accepted
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def loaded(model, lean: bool = True, eos: frozenset[int] = frozenset()) -> LoadedModel:
    return LoadedModel(model, None, "tiny", torch.device("cpu"), torch.float32, lean=lean, eos_ids=eos)


def perturbed(model, scale: float = 0.02, seed: int = 1):
    """A copy of `model` with noise added: a draft model that agrees with it often, not always."""
    import copy

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.abs().mean())
    return draft
