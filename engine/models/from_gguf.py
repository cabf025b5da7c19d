"""A model built from a GGUF file as the file stores it (models/gguf.py reads the file): its config and tokenizer
from the metadata through transformers' own tables and converters (the same ones its GGUF loading uses, without its
step that dequantizes every tensor), and its weights with no full-precision copy of them at any moment.

The transformers module is made on the meta device (its parameters have shapes, no memory), then each of
the file's tensors is placed, one at a time:
- natively (a Llama-family model on the CPU in bf16 with the compiled step's library): the projections
  and the LM head stay the file's blocks (`NativeWeights`, packed once into the products' layout; their
  parameters stay on the meta device and nothing reads them), the token embedding is looked up from its
  own format (`FileEmbedding`: rows dequantized as they are read), norms and biases become small tensors;
- otherwise (other families, other devices or dtypes, `--weights dequantized`, types the products do not
  run): dequantized one tensor at a time into the model's dtype on its device (peak: one tensor in fp32).
transformers' GGUF tables name the tensors (`get_gguf_hf_weights_map`) and its per-architecture processors
undo what llama.cpp's converter did to a dequantized tensor (Llama's q/k row order, Gemma's norms); for
native blocks the q/k row order is undone by an index (`llama_row_order`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from torch import nn

from ..api.errors import SpeculaError, UnsupportedModelError, first_line
from ..api.memory import available_memory, gigabytes, needed_for
from ..cpu import step as cpu_step
from ..cpu.products import BLOCK_FORMATS, Blocks
from .families import GGUF_QK_PROCESSOR, Spec, families, for_gguf, gguf_model_type, projections, spec_of
from .gguf import LM_HEAD, FileEmbedding, FileHead, GGUFFile, NativeWeights
from .layers import build_products, embedding_scale

log = logging.getLogger(__name__)

# A token embedding whose bf16 copy is at most this large is copied (the bundled model's: 57 MB): looking a row up
# in the file's format costs 0.1-0.4 ms a step after a target pass (5% of the bundled model's step), a copy nothing;
# a larger one (a 128k vocabulary: 0.5-1 GB) is read from the file, where a few tenths of a ms are under 1% of a step
EMBED_COPY_BYTES = 64 << 20
_IN_CONFIG = {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}  # rotary, not weights


def memory_needed(file: GGUFFile, config, native: bool, dtype: torch.dtype) -> int:
    """What loading the file takes, before any cache: the file's bytes natively, its parameters in `dtype`
    otherwise, and the runtime."""
    if native:
        weights = sum(e.nbytes for e in file.tensors.values())
    else:
        elements = sum(int(torch.Size(e.shape).numel()) for e in file.tensors.values())
        weights = elements * torch.empty(0, dtype=dtype).element_size()
    return needed_for(weights)


def _native_products(spec: Spec, device: torch.device, dtype: torch.dtype, weights: str, say):
    """The compiled step's library to run the file's blocks with, or None and why not (`spec`: the model's)."""
    if weights == "dequantized":
        return None, "dequantized weights were asked for"
    if device.type != "cpu":
        return None, "the file's blocks run on the CPU only; on a GPU they are dequantized"
    if dtype != torch.bfloat16:
        return None, f"the file's blocks compute in bf16, not {str(dtype).removeprefix('torch.')} (use --dtype bf16)"
    if spec.family is None:
        return None, f"the architecture '{spec.model_type}' has no lean forward"
    if os.environ.get("SPECULA_PRODUCTS", "own").strip().lower() == "torch":
        return None, "SPECULA_PRODUCTS=torch"
    if not cpu_step.built():
        say(cpu_step.building_note())
    cpu_step.prepare(wait=True)
    ops = cpu_step.ops()
    if ops is None:
        say(f"the file's blocks cannot run here ({cpu_step.error() or 'the compiled step is not built'}): "
            "its weights are dequantized, which takes more memory")
        return None, f"the compiled step's library is not available ({cpu_step.error() or 'not built'})"
    if ops.blocks_path(-1) < 2:
        say("this CPU has no vector path for the file's blocks: its weights are dequantized, which takes more memory")
        return None, "this CPU has no vector path for the file's blocks (x86-64 with AVX2 or better)"
    return ops, ""


def load(path: Path, device: torch.device, dtype: torch.dtype, weights: str, say=lambda text: None):
    """(model, tokenizer, NativeWeights or None) from a GGUF file; `weights` "auto", "native" or "dequantized"."""
    file = GGUFFile(path)
    config = config_from(file)
    tokenizer = tokenizer_from(file)
    spec = spec_of(config)
    ops, why = _native_products(spec, device, dtype, weights, say)
    if ops is None and weights == "native":
        raise SpeculaError(f"cannot run {file.path.name} with native weights: {why}")
    if ops is None:
        log.info("dequantized weights for %s: %s", file.path.name, why)
    needed, free = memory_needed(file, config, ops is not None, dtype), available_memory()
    if free is not None and device.type == "cpu" and needed > free:
        raise SpeculaError(f"{file.path.name} needs about {gigabytes(needed)} of memory to load and "
                           f"{gigabytes(free)} is free: close other programs or pick a smaller file")
    say(f"reading {file.path.name} (it needs about {gigabytes(needed)} of memory"
        + (f", {gigabytes(free)} free)" if free is not None else ")"))
    model = _meta_model(config, dtype)
    native = _place(file, model, config, spec, device, dtype, ops)
    model.eval()
    if native is not None:
        # the products hold the blocks once packed (dense bf16 weights as tiles, their copies dropped): the file's
        # pages each layer read are given back after it (the embedding's rows are read again as they are used)
        build_products(model, native, after_layer=file.release)
        log.info("%s: %s", file.path.name, native.summary)
    if any(p.is_meta for p in model.parameters()):
        model.register_forward_pre_hook(_no_dense_forward)
    return model, tokenizer, native


def _names(file: GGUFFile, model: nn.Module, config) -> dict[str, str]:
    """GGUF tensor name -> transformers parameter name, by the gguf package's table for the architecture (what
    transformers' get_gguf_hf_weights_map does, once for the model rather than once per module)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((key for key, name in MODEL_ARCH_NAMES.items() if name == file.architecture), None)
    if arch is None:
        return {}
    table = get_tensor_name_map(arch, config.num_hidden_layers)
    mapping = {}
    for hf in model.state_dict():
        name, _, suffix = hf.rpartition(".")
        found = table.get_name(name) if suffix in ("weight", "bias") else None
        if found is not None:
            mapping[f"{found}.{suffix}"] = hf
    return mapping


def _no_dense_forward(module, args) -> None:
    """transformers' forward over a file's blocks would read parameters that have no memory: say so instead."""
    raise SpeculaError("this GGUF runs as the file stores it, through Specula's own forward: transformers' forward "
                       "needs it loaded with --weights dequantized")


def _meta_model(config, dtype: torch.dtype) -> nn.Module:
    """The transformers module with its parameters on the meta device (buffers such as rotary tables real)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    try:
        with init_empty_weights(include_buffers=False):
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    except (ValueError, KeyError) as exc:
        raise SpeculaError(f"transformers cannot build a '{config.model_type}' model: {first_line(exc)}") from None


def _check_shape(model: nn.Module, name: str, shape: tuple[int, ...], tensor: str = "") -> None:
    """A one-line error where the file's tensor for `name` is not the shape its metadata gives the model."""
    module_name, _, attr = name.rpartition(".")
    expected = tuple(getattr(model.get_submodule(module_name), attr).shape)
    if expected != tuple(shape):
        raise SpeculaError(f"tensor {tensor or name} has the shape {tuple(shape)}, where the file's metadata makes "
                           f"it {expected}: the file is damaged or was made wrongly")


def _set(model: nn.Module, name: str, value: torch.Tensor, tensor: str = "") -> None:
    """Parameter or buffer `name` becomes `value` (shapes checked: a file that disagrees with its metadata)."""
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name)
    _check_shape(model, name, tuple(value.shape), tensor)
    if attr in module._parameters:
        module._parameters[attr] = nn.Parameter(value, requires_grad=False)
    else:
        module._buffers[attr] = value


def _place(file: GGUFFile, model: nn.Module, config, spec: Spec, device: torch.device, dtype: torch.dtype,
           ops) -> NativeWeights | None:
    """Every tensor of the file into `model` (see the module's text); the file's blocks natively where `ops`; `spec`:
    the model's (its heads undo llama.cpp's q/k row order)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    # where llama.cpp's converter permuted q/k rows as Llama's (Granite's, SmolLM3's), Llama's processor undoes it
    family = for_gguf(file.architecture)
    permuted = family is not None and family.gguf_permuted_qk
    offset_norms = family is not None and family.gguf_offset_norms
    kind = GGUF_QK_PROCESSOR if permuted else file.architecture
    processor = TENSOR_PROCESSORS.get(kind, TensorProcessor)(config=config.to_dict())
    mapping = _names(file, model, config)
    if not set(file.tensors) <= set(mapping) | _IN_CONFIG:  # transformers' fuller map (MoE experts, ...)
        try:
            mapping = get_gguf_hf_weights_map(model, processor, model_type=file.architecture)
        except NotImplementedError as exc:
            raise SpeculaError(f"{file.path.name}: {first_line(exc)}") from None
    _check_all_used(file, mapping)
    native = NativeWeights(file=file) if ops is not None else None
    placed = set()
    projected = projections()  # the layers' products, every family's (fused ones included)
    dense = _dense_in_groups(file) if native is not None else set()
    for entry in file.tensors.values():
        if native is not None:
            native.file_types[entry.type_name] += 1
        if entry.name == "rope_freqs.weight":  # llama.cpp's per-dimension rotary factors (Llama 3.1's scaling)
            _scale_rotary(model, file.dequantize(entry.name, torch.float32))
            continue
        if entry.name in _IN_CONFIG:  # Phi-3's longrope factors: read into the config (config_from)
            continue
        hf = mapping[entry.name]
        module, _, attr = hf.rpartition(".")
        blocks_ok = (native is not None and entry.type_name in BLOCK_FORMATS and len(entry.shape) == 2
                     and entry.name not in dense)
        if native is not None and (blocks_ok or hf == "model.embed_tokens.weight"):  # read as the file stores it
            _check_shape(model, hf, entry.shape, entry.name)
        if blocks_ok and attr == "weight" and (module == LM_HEAD or module.endswith(projected)):
            order = None
            if permuted and module.endswith(("q_proj", "k_proj")):
                order = llama_row_order(entry.shape[0], spec.heads if module.endswith("q_proj") else spec.kv_heads)
            native.tensors[module] = file.blocks(entry.name, order)
            placed.add(hf)
            continue
        if native is not None and hf == "model.embed_tokens.weight":
            placed.add(hf)
            if entry.shape[0] * entry.shape[1] * 2 <= EMBED_COPY_BYTES:  # small: a dense copy, looked up faster
                _set(model, hf, file.dequantize(entry.name, dtype), entry.name)
            else:
                model.model.embed_tokens = FileEmbedding(file, entry.name, dtype,
                                                         embedding_scale(model.model.embed_tokens))
            if config.tie_word_embeddings and blocks_ok:
                native.tensors[LM_HEAD] = file.blocks(entry.name)
                placed.add("lm_head.weight")
            continue
        as_is = file.view(entry.name, dtype) if native is not None and device.type == "cpu" else None
        if as_is is not None and not (permuted and module.endswith(("q_proj", "k_proj"))) and not (
                offset_norms and hf.endswith("norm.weight")):
            _set(model, hf, as_is, entry.name)  # the file's own bf16 (or fp32) values where it keeps them: no copy
            placed.add(hf)
            continue
        value = file.dequantize(entry.name, torch.float32)
        result = processor.process(weights=value.numpy(), name=entry.name, tensor_key_mapping=mapping,
                                   parsed_parameters={"tensors": {}})
        target = mapping.get(result.name, hf)
        _set(model, target, torch.from_numpy(result.weights.copy() if not result.weights.flags.writeable
                                              else result.weights).to(dtype=dtype, device=device), entry.name)
        placed.add(target)
    if native is not None and LM_HEAD in native.tensors:
        model.lm_head = FileHead(Blocks(ops, [native.tensors[LM_HEAD]], None, out_float=True), file,
                                 "output.weight" if "output.weight" in file.tensors else "token_embd.weight", dtype)
    elif config.tie_word_embeddings and "lm_head.weight" not in placed:
        embed = model.get_input_embeddings()
        if isinstance(embed, FileEmbedding):  # a tied head in a type the products do not run: dense, from the file
            weight = file.view(embed.name, dtype)
            weight = embed.rows(slice(None)).to(device) if weight is None else weight
            model.lm_head.weight = nn.Parameter(weight, requires_grad=False)
        else:
            model.lm_head.weight = embed.weight
        placed.add("lm_head.weight")
    _check_complete(file, model, placed, mapping)
    for name, buffer in model.named_buffers():
        if buffer.device != device:
            _set(model, name, buffer.to(device))
    return native


def _check_all_used(file: GGUFFile, mapping: dict[str, str]) -> None:
    """A one-line error naming the first tensor of the file the model has no place for, before any is read: another
    architecture's weights (Qwen2's biases in a file relabelled llama) would be left out and the model run wrongly."""
    unused = [name for name in file.tensors if name not in mapping and name not in _IN_CONFIG]
    if unused:
        more = f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""
        raise SpeculaError(f"{file.path.name}: tensor {unused[0]}{more} has no place in a '{file.architecture}' model: "
                           "the file's general.architecture is not the one its tensors were made for, or the file was "
                           "made wrongly")


def _check_complete(file: GGUFFile, model: nn.Module, placed: set[str], mapping: dict[str, str]) -> None:
    """A one-line error naming the first parameter the model needs that no tensor of the file became, by the
    tensor's GGUF name where the architecture's table gives one."""
    missing = [name for name, p in model.named_parameters() if p.is_meta and name not in placed]
    if not missing:
        return
    tensor = next((gguf for gguf, hf in mapping.items() if hf == missing[0]), None)
    raise SpeculaError(f"{file.path.name} holds no tensor {f'{tensor} ' if tensor else ''}for {missing[0]}"
                       f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}: it is incomplete")


_FUSED = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"))  # the products the lean forward runs as one


def _dense_in_groups(file: GGUFFile) -> set[str]:
    """The projections that are made dense although the products run their type: q/k/v and gate/up run as one
    product each, so where one of a group is in a type the products do not run, the group is dense."""
    dense = set()
    layers = {name.split(".")[1] for name in file.tensors if name.startswith("blk.")}
    for i in layers:
        for group in _FUSED:
            names = [f"blk.{i}.{part}.weight" for part in group]
            if any(n in file.tensors and file.tensors[n].type_name not in BLOCK_FORMATS for n in names):
                dense.update(names)
    return dense


def _scale_rotary(model: nn.Module, factors: torch.Tensor) -> None:
    """Divide the rotary frequencies by llama.cpp's per-dimension factors, as its graph does."""
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    inv = getattr(rotary, "inv_freq", None)
    if inv is None or inv.shape != factors.shape:
        log.warning("rope_freqs of %s values does not fit this model's rotary: left out", factors.numel())
        return
    rotary.inv_freq = inv / factors.to(inv)
    if hasattr(rotary, "original_inv_freq"):
        rotary.original_inv_freq = rotary.inv_freq


# GGUF architectures (llama.cpp's names) that run through transformers' forward from a file read here, each checked
# with a file llama.cpp's converter wrote of a small random model (the same greedy tokens as transformers' own
# model of it). transformers' GGUF table knows more, which do not load: Mamba (no attention, no KV cache), T5 (not
# a causal LM), mixtures of experts (their experts are stored otherwise than transformers' modules hold them).
# The families' architectures (families/) run Specula's own forward.
TRANSFORMERS_ARCHS = ("bloom", "falcon", "gpt2", "lfm2", "nemotron", "stablelm", "starcoder2")


def llama_row_order(rows: int, n_head: int) -> torch.Tensor:
    """llama.cpp stores each head's q/k rows interleaved for its rotary; this index restores
    transformers' order: hf_rows = gguf_rows[order]."""
    half = rows // n_head // 2
    return torch.arange(rows).reshape(n_head, half, 2).transpose(1, 2).reshape(-1)


def transformers_type(file: GGUFFile) -> str:
    """transformers' name for the file's architecture (a family's where one claims the file: families/)."""
    return gguf_model_type(file.architecture, str(file.metadata.get("general.name", "")))


def runnable_archs() -> tuple[str, ...]:
    """The GGUF architectures a file can have for Specula to load it: its families' and TRANSFORMERS_ARCHS."""
    return tuple(sorted({arch for family in families().values() for arch in family.gguf_archs} | set(TRANSFORMERS_ARCHS)))


def config_from(file: GGUFFile):
    """The transformers config the file's metadata describes (transformers' own table of GGUF keys)."""
    from transformers import AutoConfig
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    arch, model_type = file.architecture, transformers_type(file)
    family = for_gguf(arch)
    table = GGUF_CONFIG_MAPPING.get(model_type) or GGUF_CONFIG_MAPPING.get(arch) or (family and family.gguf_keys)
    if arch not in runnable_archs() or table is None:
        raise UnsupportedModelError(f"{file.path.name}: architecture '{arch or 'none given'}' is not one Specula "
                                    f"can run (it runs {', '.join(runnable_archs())})")
    if not file.tensors:
        raise UnsupportedModelError(f"{file.path.name} holds no tensors: a header without a model's weights")
    missing = [key for key in ("block_count", "embedding_length") if f"{arch}.{key}" not in file.metadata]
    if missing:
        raise UnsupportedModelError(f"{file.path.name}: its metadata gives no {arch}.{missing[0]}, which every "
                                    f"'{arch}' model has: the file was made wrongly")
    values = dict(GGUF_CONFIG_DEFAULTS_MAPPING.get(model_type, {}))
    for key, value in file.metadata.items():
        prefix, _, rest = key.partition(".")
        shared = GGUF_CONFIG_MAPPING.get(prefix) if prefix in ("general", "tokenizer") else None
        renames = table if prefix == arch else shared
        if renames is None or renames.get(rest) in (None, -1):
            continue
        values[renames[rest]] = value
    values["model_type"] = model_type
    values.pop("_model_name_or_path", None)
    values["tie_word_embeddings"] = "output.weight" not in file.tensors
    if "vocab_size" not in values:
        embedding = file.tensors.get("token_embd.weight")
        values["vocab_size"] = len(file.metadata.get("tokenizer.ggml.tokens") or []) or (
            int(embedding.shape[0]) if embedding is not None else 0)
    for key in ("num_key_value_heads",):  # some files give one per layer
        if isinstance(values.get(key), list):
            values[key] = max(values[key])
    # the heads' width where the file gives it (transformers' table leaves it out for some families, e.g. Qwen3,
    # whose config then assumes 128)
    if isinstance(file.metadata.get(f"{arch}.attention.key_length"), int) and "head_dim" not in values:
        values["head_dim"] = int(file.metadata[f"{arch}.attention.key_length"])
    scaling = file.metadata.get(f"{arch}.rope.scaling.type")
    factor = file.metadata.get(f"{arch}.rope.scaling.factor")
    if scaling in ("linear", "yarn") and isinstance(factor, (int, float)) and factor > 1:
        # rotary scaling as llama.cpp's converter writes it (Gemma 3 4B and larger: linear, 8, on its global layers)
        values["rope_scaling"] = {"rope_type": scaling, "factor": float(factor)}
        original = file.metadata.get(f"{arch}.rope.scaling.original_context_length")
        if scaling == "yarn" and isinstance(original, int):
            values["rope_scaling"]["original_max_position_embeddings"] = original
    if family is not None and family.gguf_config is not None:  # what else the family's files say (Phi-3's rotary, ...)
        family.gguf_config(file, values)
    try:
        return AutoConfig.for_model(**values)
    except (ValueError, TypeError, KeyError) as exc:
        raise UnsupportedModelError(f"{file.path.name}: its metadata does not make a '{model_type}' config "
                                    f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None


def tokenizer_from(file: GGUFFile):
    """The tokenizer the file's metadata describes, with its chat template (transformers' GGUF converter)."""
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    if not file.metadata.get("tokenizer.ggml.tokens"):
        raise UnsupportedModelError(f"{file.path.name} holds no tokenizer (tokenizer.ggml.tokens)")
    try:
        arch, tokens, config = get_gguf_tokenizer(str(file.path))
        backend, extra = convert_gguf_tokenizer(arch, tokens)
    except (ValueError, KeyError, TypeError, NotImplementedError) as exc:
        kind = file.metadata.get("tokenizer.ggml.model", "?")
        raise UnsupportedModelError(f"{file.path.name}: its '{kind}' tokenizer cannot be built "
                                    f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    return TokenizersBackend(tokenizer_object=backend, **config, **extra)
