"""`draft-model`: a separate small causal LM with the target's tokenizer drafts, with its own KV cache, the
tokens it is confident of (model_drafter.py), from the most frequent ids of the vocabulary (`draft_vocab`)."""

from __future__ import annotations

from ..api.errors import SpeculaError
from ..api.strategies import DRAFT_VOCAB, STRATEGIES
from ..models.gguf import out_features
from .model_drafter import ModelDrafter


def draft_vocab_for(vocab: int, asked: int | None) -> int:
    """The ids a draft model proposes from (0: all): as asked, else DRAFT_VOCAB where the vocabulary is at least
    half as large again."""
    if asked is not None:
        if asked < 0:
            raise SpeculaError(f"draft_vocab must be 0 (every id) or more, got {asked}")
        return 0 if asked >= vocab else asked
    return DRAFT_VOCAB if vocab >= DRAFT_VOCAB * 3 // 2 else 0


class DraftModel(ModelDrafter):
    name = "draft-model"
    description = STRATEGIES[name].description

    @classmethod
    def build(cls, target, draft=None, draft_vocab: int | None = None, confident=True, tree=None,
              **options) -> "DraftModel":
        if draft is None:
            raise SpeculaError("strategy 'draft-model' needs a draft model (--draft-model)")
        runner = draft.new_runner()
        vocab = out_features(target.model.get_output_embeddings())
        cut = draft_vocab_for(vocab, draft_vocab)
        if cut:
            runner.limit_vocab(cut)
        drafter = cls(runner, vocab, confident=bool(confident), tree=tree is None or bool(tree))
        drafter.time_read()
        return drafter
