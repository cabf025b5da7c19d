"""Any transformers causal LM as a `decoding.target.ModelRunner`, through its own cache: the fallback
for architectures without the lean forward (`models.llama.LlamaRunner`)."""

from __future__ import annotations

import inspect

import torch

from ..api.errors import UnsupportedModelError


class HFRunner:
    """Fallback for architectures without a lean forward: transformers' model and DynamicCache."""

    keeps_features = False
    exact_trees = False  # it takes no trees at all

    def __init__(self, model: torch.nn.Module, max_len: int) -> None:
        from transformers import DynamicCache

        self.model = model
        self.max_len = max_len
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.device = next(model.parameters()).device
        self._new_cache = lambda: DynamicCache(config=model.config)
        self._cache = self._new_cache()
        self._length = 0
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @property
    def length(self) -> int:
        return self._length

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, last: int = 1, tree=None) -> torch.Tensor:
        if tree is not None and not tree.is_chain:
            raise UnsupportedModelError("token trees need the lean forward (the Llama family); this model takes chains")
        t = tokens.shape[0]
        positions = torch.arange(self._length, self._length + t, device=self.device)
        out = self.model(
            input_ids=tokens.to(self.device)[None],
            position_ids=positions[None],
            use_cache=True,
            logits_to_keep=last,
            **{self._cache_kw: self._cache},
        )
        self._length += t
        return out.logits[0, -last:].float()  # (last, V)

    def reusable(self, ids: torch.Tensor) -> int:
        """0: transformers' forward reads a prompt with other kernels than its steps, so a prompt is read whole."""
        return 0

    def truncate(self, length: int) -> None:
        if length >= self._length:
            return
        if length == 0:
            self._cache = self._new_cache()
        else:
            self._cache.crop(length - self._length)  # negative: tokens to drop
        self._length = length

    def keep(self, start: int, rows: list[int]) -> None:
        """A chain's kept rows (it takes no trees): the first len(rows) tokens from `start`."""
        if rows != list(range(len(rows))):
            raise UnsupportedModelError("token trees need the lean forward (the Llama family); this model takes chains")
        self.truncate(start + len(rows))
