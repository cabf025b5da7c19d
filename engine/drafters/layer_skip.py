"""`layer-skip`: self-speculation with no extra weights. The target's first layers, followed by its own
final norm and LM head, draft for the full model (early exit, as in LayerSkip, Elhoushi et al. 2024).
Its cache is separate from the target's; the weights are shared."""

from __future__ import annotations

from ..api.errors import UnsupportedModelError
from ..api.strategies import STRATEGIES
from ..models.gguf import out_features
from .model_drafter import ModelDrafter


class LayerSkip(ModelDrafter):
    name = "layer-skip"
    description = STRATEGIES[name].description

    @classmethod
    def build(cls, target, draft=None, exit_layer: int | None = None, confident=True, **options) -> "LayerSkip":
        target.require_lean("layer-skip")
        n = target.model.config.num_hidden_layers
        exit_layer = exit_layer or max(1, n // 2)
        if not 1 <= exit_layer < n:
            raise UnsupportedModelError(f"exit layer must be between 1 and {n - 1} for this model, got {exit_layer}")
        runner = target.new_runner().shallow(exit_layer)
        return cls(runner, out_features(target.model.get_output_embeddings()), confident=bool(confident))
