"""Build a randomly initialised model folder (Llama, Qwen2.5, Qwen3, Gemma 3, Phi-4-mini) of a realistic size, for timing.

usage: python scripts/random_model.py PRESET OUT_DIR [--dtype bf16|fp16|fp32] [--device cpu|cuda] [--seed N] [--low-memory]
       python scripts/random_model.py --list

The presets copy the shapes of real models (hidden size, layers, attention heads, grouped KV heads,
MLP width, tied embeddings), with two changes: the tokenizer is the bundled SmolLM2's, 49,152 tokens (its
files are copied into the folder; Qwen2.5's presets keep their 151,936-row embedding and head, the rest
49,152) and the context window is 8,192. The
weights are created directly on `--device` in `--dtype` and saved as safetensors, so the folder loads
with `specula bench --model OUT_DIR` / `specula.engine.models.loading.load_model`.

Random weights produce random text. Acceptance rates, accepted lengths and speedups measured on such
a model mean nothing; only the cost of a forward step (time per step for 1, 2, ... tokens, and the
framework overhead around it) carries over to the real model of the same shape.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

VOCAB = 49152  # the bundled SmolLM2 tokenizer
CONTEXT = 8192

# name: (hidden, intermediate, layers, heads, kv heads, head dim, tied embeddings, rope theta, like)
PRESETS = {
    "smollm-135m": (576, 1536, 30, 9, 3, 64, True, 100000.0, "SmolLM2-135M"),
    "smollm-360m": (960, 2560, 32, 15, 5, 64, True, 100000.0, "SmolLM2-360M"),
    "smollm-1.7b": (2048, 8192, 24, 32, 32, 64, True, 130000.0, "SmolLM2-1.7B"),
    "llama-1b": (2048, 8192, 16, 32, 8, 64, True, 500000.0, "Llama 3.2 1B"),
    "llama-3b": (3072, 8192, 28, 24, 8, 128, True, 500000.0, "Llama 3.2 3B"),
    "llama-8b": (4096, 14336, 32, 32, 8, 128, False, 500000.0, "Llama 3.1 8B"),
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, 128, True, 1000000.0, "Qwen3-1.7B"),
    "gemma3-1b": (1152, 6912, 26, 4, 1, 256, True, 1000000.0, "Gemma 3 1B"),
    "phi4-mini": (3072, 8192, 32, 24, 8, 128, True, 10000.0, "Phi-4-mini"),
    "qwen2.5-3b": (2048, 11008, 36, 16, 2, 128, True, 1000000.0, "Qwen2.5-3B"),
    "qwen2.5-7b": (3584, 18944, 28, 28, 4, 128, False, 1000000.0, "Qwen2.5-7B"),
}
# Qwen2.5's presets keep its 151,936-row embedding and LM head (a tenth of a 3B's weights: the step's cost
# depends on it); the ids past the tokenizer's are never read
VOCABS = {"qwen2.5-3b": 151936, "qwen2.5-7b": 151936}
# the presets of another family than Llama: Qwen3 (per-head q/k norms), Gemma 3 (its norms, GELU-tanh, five local
# layers of a 512-position window with a base of 10,000 to one global layer)
# Phi-4-mini (Phi-3's layers: fused q/k/v and gate/up, rotary over 3/4 of each head, longrope's factors)
FAMILIES = {"qwen3-1.7b": "qwen3", "gemma3-1b": "gemma3", "phi4-mini": "phi3", "qwen2.5-3b": "qwen2", "qwen2.5-7b": "qwen2"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")


def llama_config(preset: str):
    from transformers import Gemma3TextConfig, LlamaConfig, Phi3Config, Qwen2Config, Qwen3Config

    hidden, inter, layers, heads, kv, head_dim, tied, theta, _ = PRESETS[preset]
    vocab = VOCABS.get(preset, VOCAB)
    if FAMILIES.get(preset) == "phi3":
        pairs = head_dim * 3 // 8  # longrope's factors, one per rotated pair (their values do not change a step's cost)
        return Phi3Config(
            vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv, tie_word_embeddings=tied,
            max_position_embeddings=CONTEXT, original_max_position_embeddings=4096, rms_norm_eps=1e-5,
            sliding_window=None, bos_token_id=1, eos_token_id=2, pad_token_id=2,
            rope_parameters={"rope_type": "longrope", "rope_theta": theta, "partial_rotary_factor": 0.75,
                             "short_factor": [1.0] * pairs, "long_factor": [1.0 + i / 4 for i in range(pairs)]},
        )
    if FAMILIES.get(preset) == "gemma3":
        return Gemma3TextConfig(
            vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, tie_word_embeddings=tied,
            max_position_embeddings=CONTEXT, rms_norm_eps=1e-6, sliding_window=512, query_pre_attn_scalar=head_dim,
            bos_token_id=1, eos_token_id=2, pad_token_id=2,
        )
    config_cls = {"qwen3": Qwen3Config, "qwen2": Qwen2Config}.get(FAMILIES.get(preset), LlamaConfig)
    return config_cls(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, tie_word_embeddings=tied,
        max_position_embeddings=CONTEXT, rms_norm_eps=1e-5, hidden_act="silu",
        rope_parameters={"rope_theta": theta, "rope_type": "default"},
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )


def write_tokenizer(out: Path) -> None:
    """The bundled model's tokenizer (built from its GGUF's metadata, chat template included) into `out`, or the
    tokenizer files in the folder SPECULA_TOKENIZER names (a machine without the bundled model)."""
    if os.environ.get("SPECULA_TOKENIZER"):
        source = Path(os.environ["SPECULA_TOKENIZER"])
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copy(source / name, out / name)
        return
    from specula.engine.models.from_gguf import tokenizer_from
    from specula.engine.models.gguf import GGUFFile
    from specula.engine.models.loading import bundled_gguf_path

    tokenizer_from(GGUFFile(bundled_gguf_path())).save_pretrained(out)


SHARD_BYTES = 2 << 30  # --low-memory: the most one safetensors file holds


def write_in_shards(config, out: Path, dtype: torch.dtype) -> int:
    """The model's tensors made one at a time (normal with the config's initializer range; norms ones, biases
    zeros) and written in files of at most SHARD_BYTES with their index, as a sharded checkpoint is: memory for
    one file's worth, not the model's. Returns the parameter count."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {name: p.shape for name, p in model.state_dict().items()}
    config.architectures = [type(model).__name__]  # what a saved model's config names, and converters read
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, shape in shapes.items():
        if "norm" in name:
            t = torch.ones(shape, dtype=dtype)
        elif name.endswith(".bias"):
            t = torch.zeros(shape, dtype=dtype)
        else:
            t = torch.empty(shape, dtype=dtype).normal_(0.0, config.initializer_range)
        if size and size + t.numel() * t.element_size() > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.numel() * t.element_size()
    weight_map, total = {}, 0
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, out / file, metadata={"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = file
            total += t.numel() * t.element_size()
        shard.clear()  # this file's memory goes before the next is made
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}, indent=2))
    config.dtype = dtype
    config.save_pretrained(out)
    return sum(torch.Size(s).numel() for s in shapes.values())


def build(preset: str, out: Path, dtype: torch.dtype, device: str, seed: int, low_memory: bool = False) -> int:
    """Write the model folder; returns the parameter count."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    config = llama_config(preset)
    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    if low_memory:
        n_params = write_in_shards(config, out, dtype)
    else:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # created in place on the device
        model.eval()
        n_params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(out)  # safetensors
    write_tokenizer(out)
    if FAMILIES.get(preset) == "phi3":  # as Phi-4's own folder names it: llama.cpp's converter reads it as GPT-2's BPE
        settings = out / "tokenizer_config.json"
        settings.write_text(json.dumps({**json.loads(settings.read_text()), "tokenizer_class": "GPT2Tokenizer"}, indent=2))
    like = PRESETS[preset][-1]
    (out / "random_model.json").write_text(json.dumps(
        {"preset": preset, "shaped_like": like, "seed": seed, "parameters": n_params,
         "note": "random weights: only step costs are meaningful"}, indent=2))
    return n_params


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build a random-weight Llama-family model folder.")
    parser.add_argument("preset", nargs="?", choices=sorted(PRESETS))
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--device", default="cpu", help="where the weights are created (cpu, cuda, cuda:1, ...)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="print the presets and exit")
    parser.add_argument("--low-memory", action="store_true",
                        help="make and write the tensors one file of 2 GB at a time (CPU), not the whole model at once "
                             "(an 8B in bf16 is 16 GB)")
    args = parser.parse_args(argv)
    if args.list:
        for name, (hidden, inter, layers, heads, kv, head_dim, tied, _, like) in PRESETS.items():
            print(f"{name:12} like {like:13} hidden {hidden}, mlp {inter}, {layers} layers, "
                  f"{heads} heads / {kv} kv heads of {head_dim}{', tied embeddings' if tied else ''}")
        return 0
    if args.preset is None or args.out is None:
        parser.error("PRESET and OUT_DIR are required (or --list)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda: this torch build sees no CUDA GPU")
    t0 = time.perf_counter()
    n = build(args.preset, args.out, DTYPES[args.dtype], args.device, args.seed, args.low_memory)
    print(f"{args.preset}: {n / 1e6:.0f}M parameters, {args.dtype}, written to {args.out} "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
