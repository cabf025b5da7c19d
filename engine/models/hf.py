"""Any transformers causal LM as a `decoding.target.ModelRunner`, through its own cache: the fallback
for architectures without the lean forward (`models.runner.LeanRunner`).

Exactness. transformers' forward does not give a row the same bits in every call: its matrix products take
other kernels for one row than for several and change again at some numbers of rows, and its attention
kernels group a row's keys by the call's whole length (measured here: a pass's rows part from single steps'
once the pass crosses some lengths of the cache, in bf16 and fp32, Gemma 3 and GPT-NeoX alike). No padding or
size of call is exact at every length, so a verify pass runs one row at a time, each row the call plain
decoding makes: speculation on this path keeps the answer exactly and gains nothing (the load says so); the
prompt is read in one pass, as plain decoding reads it.
"""

from __future__ import annotations

import inspect

import torch

from ..api.errors import UnsupportedModelError


class HFRunner:
    """Fallback for architectures without a lean forward: transformers' model and a DynamicCache whose layers
    all keep every position (a sliding-window layer's cache cannot be cut back once its window is full; the
    attention masks still see only the window)."""

    keeps_features = False
    exact_trees = False  # it takes no trees at all
    aux_layers: tuple[int, ...] = ()  # it keeps no layers' hidden states (keep_layers)
    step_kind = "eager"  # transformers' own forward

    def __init__(self, model: torch.nn.Module, max_len: int) -> None:
        from transformers import DynamicCache

        self.model = model
        self.max_len = max_len
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.device = next(model.parameters()).device
        self._new_cache = lambda: DynamicCache()
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
        if 1 < t == last:  # a verify pass: each row as the single step plain decoding would take
            return torch.cat([self.forward(tokens[i : i + 1]) for i in range(t)])
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

    def keep_layers(self, layers: tuple[int, ...]) -> None:
        """Keeps no layers' hidden states: () is all it takes (heads that read layers need the lean forward)."""
        if layers:
            raise UnsupportedModelError("reading the target's layers (EAGLE-3 heads) needs the lean forward "
                                        "(the Llama family)")

    def limit_vocab(self, n: int) -> None:
        """Keeps every id: transformers' forward computes them all, so a cut would save nothing."""

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
