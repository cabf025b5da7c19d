"""`draft-model`: a separate small causal LM with the target's tokenizer drafts, with its own KV cache."""

from __future__ import annotations

from ..api.errors import SpeculaError
from ..api.strategies import STRATEGIES
from ..models.gguf import out_features
from .model_drafter import ModelDrafter


class DraftModel(ModelDrafter):
    name = "draft-model"
    description = STRATEGIES[name].description

    @classmethod
    def build(cls, target, draft=None, **options) -> "DraftModel":
        if draft is None:
            raise SpeculaError("strategy 'draft-model' needs a draft model (--draft-model)")
        return cls(draft.new_runner(), out_features(target.model.get_output_embeddings()))
