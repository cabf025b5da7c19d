"""Errors a user can act on. Everything the engine raises on bad input derives from `SpeculaError`."""

from __future__ import annotations


class SpeculaError(ValueError):
    """Bad input or an unusable model; the message is one line a user can act on."""


class ModelNotFoundError(SpeculaError):
    """A model source that is not a file, a folder, the bundled model or a reachable Hub id."""


class IncompatibleDraftError(SpeculaError):
    """A draft model whose tokenizer differs from the target's."""


class ContextTooLongError(SpeculaError):
    """A prompt that does not fit in the model's context window."""


class UnsupportedModelError(SpeculaError):
    """A strategy that needs a model family this model is not part of."""


class TrainingCancelled(SpeculaError):
    """A draft-head training run stopped by the user; what it made so far is kept for the next run."""
