"""Build a randomly initialised model folder (Llama, Qwen3, Gemma 3, Phi-4-mini) of a realistic size, for timing.

usage: python scripts/random_model.py PRESET OUT_DIR [--dtype bf16|fp16|fp32] [--device cpu|cuda] [--seed N]
       python scripts/random_model.py --list

The presets copy the shapes of real models (hidden size, layers, attention heads, grouped KV heads,
MLP width, tied embeddings), with two changes: the vocabulary is the bundled SmolLM2 tokenizer's
49,152 tokens (its tokenizer files are copied into the folder) and the context window is 8,192. The
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
}
# the presets of another family than Llama: Qwen3 (per-head q/k norms), Gemma 3 (its norms, GELU-tanh, five local
# layers of a 512-position window with a base of 10,000 to one global layer)
# Phi-4-mini (Phi-3's layers: fused q/k/v and gate/up, rotary over 3/4 of each head, longrope's factors)
FAMILIES = {"qwen3-1.7b": "qwen3", "gemma3-1b": "gemma3", "phi4-mini": "phi3"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")


def llama_config(preset: str):
    from transformers import Gemma3TextConfig, LlamaConfig, Phi3Config, Qwen3Config

    hidden, inter, layers, heads, kv, head_dim, tied, theta, _ = PRESETS[preset]
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
    config_cls = Qwen3Config if FAMILIES.get(preset) == "qwen3" else LlamaConfig
    return config_cls(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
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
    from specula.engine.models.gguf import GGUFFile, tokenizer_from
    from specula.engine.models.loading import bundled_gguf_path

    tokenizer_from(GGUFFile(bundled_gguf_path())).save_pretrained(out)


def build(preset: str, out: Path, dtype: torch.dtype, device: str, seed: int) -> int:
    """Write the model folder; returns the parameter count."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    config = llama_config(preset)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # created in place on the device
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    out.mkdir(parents=True, exist_ok=True)
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
    n = build(args.preset, args.out, DTYPES[args.dtype], args.device, args.seed)
    print(f"{args.preset}: {n / 1e6:.0f}M parameters, {args.dtype}, written to {args.out} "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
