"""Tiny random-weight models built from a config, for fast CPU tests (no downloads)."""

from __future__ import annotations

import contextlib

import torch

from specula.engine.models.loading import LoadedModel


# each family the tests build: its transformers config and model classes, by name
_FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM"),  # every fourth layer without rotary
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),  # soft-capped scores and logits, local and global layers
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),  # one window over every layer
    "ministral": ("MinistralConfig", "MinistralForCausalLM"),  # windowed and full layers in turn
    "granite": ("GraniteConfig", "GraniteForCausalLM"),  # multipliers of embeddings, outputs, attention, logits
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),  # norms of the outputs only, q/k norms over all heads
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM"),  # OLMo 2's norms, per-head q/k norms, global layers without rotary
}


def family_classes(family: str) -> tuple[type, type]:
    """(config class, model class) of a family the tests build."""
    import transformers

    config_name, model_name = _FAMILIES[family]
    return getattr(transformers, config_name), getattr(transformers, model_name)


def longrope(pairs: int, seed: int) -> dict:
    """Phi-4-mini's rotary for a tiny model: over 3/4 of each head (`pairs` frequencies), longrope's random short and
    long factors."""
    gen = torch.Generator().manual_seed(seed)
    return {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "short_factor": (1 + torch.rand(pairs, generator=gen)).tolist(),
            "long_factor": (1 + 4 * torch.rand(pairs, generator=gen)).tolist()}


def tiny_model(vocab: int = 64, layers: int = 4, seed: int = 0, family: str = "llama", max_pos: int = 512,
               head_dim: int = 16, window: int = 8):
    """A tiny random model of a family; "gemma3" (text): local layers of a `window` of positions, one global
    layer in two, each kind with its rotary base, norms of 1 + w with random w. "phi3": fused q/k/v and gate/up
    weights, rotary over 3/4 of each head with longrope's factors (the long ones from position 64), every layer
    attending over a `window` of positions. "mistral": one window over every layer; "ministral": windowed and full
    layers in turn. "granite": its multipliers. "olmo2": its norms after attention and the MLP, q/k norms over all
    heads. "exaone4": OLMo 2's norms of the outputs, per-head q/k norms, local layers and global ones without rotary in
    turn. "gemma2": Gemma's layers with soft-capped attention scores (at 5) and logits (at 30)."""
    config_cls, model_cls = family_classes(family)
    extra = {}
    if family == "smollm3":  # token ids within a tiny vocabulary (SmolLM3's defaults point past it), as Llama's are
        extra = {"pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2}
    elif family == "gemma3":
        extra = {"sliding_window": window, "sliding_window_pattern": 2, "query_pre_attn_scalar": head_dim,
                 "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    elif family == "granite":
        extra = {"embedding_multiplier": 6.0, "residual_multiplier": 0.22, "attention_multiplier": 0.2,
                 "logits_scaling": 4.0}
    elif family == "gemma2":
        extra = {"sliding_window": window, "query_pre_attn_scalar": head_dim, "attn_logit_softcapping": 5.0,
                 "final_logit_softcapping": 30.0, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    elif family == "olmo2":
        extra = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    elif family == "exaone4":  # a local layer and a global one (no rotary) in turn
        extra = {"sliding_window": window, "sliding_window_pattern": 2, "pad_token_id": 0, "bos_token_id": 1,
                 "eos_token_id": 2}
    elif family == "mistral":
        extra = {"sliding_window": window}
    elif family == "ministral":
        extra = {"sliding_window": window, "layer_types": ["sliding_attention", "full_attention"] * (layers // 2)
                 + ["sliding_attention"] * (layers % 2)}
    elif family == "phi3":
        extra = {"sliding_window": window, "original_max_position_embeddings": 64, "pad_token_id": 0,
                 "bos_token_id": 1, "eos_token_id": 2, "rope_parameters": longrope(head_dim * 3 // 8, seed + 1)}
    config = config_cls(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        tie_word_embeddings=False,
        **extra,
    )
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    # sharper distributions than the default init, so greedy text has structure and drafts get accepted
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        gen = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():  # Qwen3's per-head norms: weights other than the ones they start as
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.copy_((0 if family == "gemma3" else 1) + 0.5 * torch.randn(p.shape, generator=gen))
            elif family in ("gemma2", "gemma3") and name.endswith("norm.weight"):  # Gemma's 1 + w, w not the zeros it starts as
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
            elif family in ("olmo2", "exaone4") and name.endswith("norm.weight"):  # norms other than the ones they start as
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
    return model


@contextlib.contextmanager
def one_torch_thread():
    """One intra-op thread inside the block: the tiny models gain nothing from more, and on a small machine busy
    with other work a second spinning thread makes their forwards several times slower. Tests of the bits the
    products give under several threads keep torch's own count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def loaded(model, lean: bool = True, eos: frozenset[int] = frozenset()) -> LoadedModel:
    return LoadedModel(model, None, "tiny", torch.device("cpu"), torch.float32, lean=lean, eos_ids=eos)


def native(model, formats: tuple[str, ...] = ("Q4_1",), head: str | None = None) -> LoadedModel:
    """`model` in bf16 with its projections as a GGUF file's blocks (the formats taken in turn; "Q4_1",
    "Q4_0", "Q8_0"), and with `head` its LM head too: the model's own weights become the blocks'
    dequantized values (as transformers reads a GGUF), and the lean forward runs the blocks as they are
    (torch's int4 kernel in eager answers, the compiled step's own products in compiled ones)."""
    from specula.engine.cpu.products import FileBlocks
    from specula.engine.models.gguf import LM_HEAD, NativeWeights

    weights = NativeWeights()
    linears = [(name, module) for name, module in model.named_modules()
               if name.startswith("model.layers.") and isinstance(module, torch.nn.Linear)]
    if head is not None:
        linears.append((LM_HEAD, model.lm_head))
    with torch.no_grad():
        for i, (name, module) in enumerate(linears):
            type_name = head if name == LM_HEAD else formats[i % len(formats)]
            blocks = FileBlocks.quantize(module.weight, type_name)
            module.weight.copy_(blocks.dequantize())
            weights.tensors[name] = blocks
            weights.file_types[type_name] += 1
    model = model.to(torch.bfloat16)
    return LoadedModel(model, None, "tiny-q4", torch.device("cpu"), torch.bfloat16, lean=True, native=weights)


def perturbed(model, scale: float = 0.02, seed: int = 1):
    """A copy of `model` with noise added: a draft model that agrees with it often, not always."""
    import copy

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.abs().mean())
    return draft


def quick_head(target: LoadedModel, folder, sequences: int = 16, length: int = 40, epochs: int = 5, seed: int = 0,
               kind: str = "eagle"):
    """A draft head of this kind trained for a few seconds on the target's own greedy continuations of random
    prompts; returns the folder it was saved to."""
    from specula.engine.api.types import DecodeConfig
    from specula.engine.decoding.loop import generate
    from specula.engine.drafters import build_drafter
    from specula.engine.heads.store import save_head
    from specula.engine.heads.eagle3 import default_aux_layers
    from specula.engine.heads.train import features_of, head_info, train_head

    gen = torch.Generator().manual_seed(seed)
    vocab = min(target.model.config.vocab_size, 1000)
    seqs = []
    for _ in range(sequences):
        prompt = torch.randint(0, vocab, (int(torch.randint(3, 12, (1,), generator=gen)),), generator=gen).tolist()
        events = list(generate(target.new_runner(), build_drafter("none", target), prompt, DecodeConfig(max_new_tokens=length)))
        layers = default_aux_layers(target.model.config.num_hidden_layers) if kind == "eagle3" else ()
        seqs.append(features_of(target, prompt, list(events[-1].token_ids), layers))
    head = train_head(target, seqs, epochs=epochs, lr=3e-3, seed=seed, kind=kind, batch=1)
    stored = "eagle" if kind == "eagle3" else kind  # the eagle strategy drafts with EAGLE-3 heads too (as train-head saves them)
    config = head.config if kind != "medusa" else None
    save_head(head.to(target.dtype), head_info(target, stored, sequences * length, epochs, None, config), folder)
    return folder


def random_medusa_head(target: LoadedModel, folder):
    """An untrained (randomly initialised) Medusa head for `target`, saved in `folder`."""
    from specula.engine.heads.config import HeadConfig
    from specula.engine.heads.medusa import MedusaHead
    from specula.engine.heads.store import save_head
    from specula.engine.heads.train import head_info

    torch.manual_seed(0)
    head = MedusaHead(HeadConfig.for_target(target.model.config))
    for block in head.blocks:
        torch.nn.init.normal_(block.weight, std=0.02)
    save_head(head.to(target.dtype), head_info(target, "medusa", 0, 0, None), folder)
    return folder


def assert_greedy_identity(target: LoadedModel, draft, strategy: str, options: dict, trials: int,
                           longest_prompt: int, max_new_tokens: int, between=None) -> None:
    """`strategy`'s greedy answers are `none`'s token for token on random prompts, with draft lengths
    1-8, fixed and adaptive, and some drafts were accepted. `between(runner)`: what runs between steps."""
    from specula.engine.api.events import Finished
    from specula.engine.api.types import DecodeConfig
    from specula.engine.decoding.loop import generate
    from specula.engine.drafters import build_drafter

    if strategy in ("draft-model", "layer-skip"):  # every drafting step its whole length: their wait for a long
        options = {"confident": False, **options}  # prompt's read would leave a short answer undrafted
    gen = torch.Generator().manual_seed(1)
    vocab = target.model.config.vocab_size
    accepted = 0
    for trial in range(trials):
        prompt = torch.randint(0, vocab, (int(torch.randint(2, longest_prompt, (1,), generator=gen)),),
                               generator=gen).tolist()
        outs = []
        for name in ("none", strategy):
            drafter = build_drafter(name, target, draft, **(options if name == strategy else {}))
            config = DecodeConfig(k=1 + trial % 8, adaptive_k=trial % 2 == 0, max_new_tokens=max_new_tokens)
            runner = target.new_runner()
            hook = between(runner) if between is not None else None
            finished = list(generate(runner, drafter, prompt, config, between_steps=hook))[-1]
            assert isinstance(finished, Finished)
            outs.append(finished)
        assert outs[1].token_ids == outs[0].token_ids, (strategy, trial)
        accepted += outs[1].totals.accepted
    assert accepted > 0


def head_options(target: LoadedModel, strategy: str, folder) -> dict:
    """The options `strategy` needs on `target`: a quickly trained EAGLE head or a random Medusa head,
    written under `folder`; none for strategies without heads."""
    from specula.engine.drafters import DRAFTERS

    info = DRAFTERS[strategy]
    if info.needs_head == "eagle":
        return {"head": str(quick_head(target, folder / "eagle", sequences=4, length=24, epochs=2))}
    if info.needs_head or info.uses_heads:
        medusa = str(random_medusa_head(target, folder / "medusa"))
        return {"head": medusa} if info.needs_head else {"heads": (medusa,)}
    return {}
