"""Errors a user can act on. Everything the engine raises on bad input derives from `SpeculaError`."""

from __future__ import annotations

import re

# escape sequences (CSI, OSC, and ESC with its intermediate and final bytes), then any other C0 or C1
# control character but the newline and the tab: what a terminal would act on instead of showing
_CONTROLS = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI
                       r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC, to BEL or ST
                       r"|\x1b[ -/]*[0-~]?"  # other escapes
                       r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line, or its class name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def unsafe_pickle(exc: BaseException) -> str:
    """Why torch.load(weights_only=True) refused a file, in Specula's words; torch's own message advises loading
    it with weights_only=False, which would run code from the file: never passed on."""
    text = first_line(exc)
    if "weights only load failed" in text.lower() or "weights_only" in str(exc):
        return "it holds Python objects besides tensors, which are not read (reading them could run code from the file)"
    return text


def terminal_safe(text: str) -> str:
    """`text` without what a terminal would execute: escape sequences and control characters (a model's or
    a server's text can hold them), keeping newlines and tabs."""
    return _CONTROLS.sub("", text)


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


class ModelFileChanged(SpeculaError):
    """The file a loaded model reads its weights from changed on disk: the model cannot run until it is loaded again."""


class TrainingCancelled(SpeculaError):
    """A draft-head training run stopped by the user; what it made so far is kept for the next run."""
