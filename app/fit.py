"""Fitting a conversation into the model's context window by leaving out its oldest turns.

The tokenizer lives on the engine side, so the app learns that a prompt is too long from the engine:
a `Failed` event of kind `ContextTooLongError` before generation started. It then resends without the
oldest exchange (the system prompt and the newest user message always stay) until the prompt fits, or
until only the newest message is left, when the engine's error is shown.
"""

from __future__ import annotations

CONTEXT_ERROR = "ContextTooLongError"  # specula.engine.api.errors.ContextTooLongError, as Failed.kind names it


def is_context_error(failed) -> bool:
    return failed.kind == CONTEXT_ERROR


def drop_oldest(messages: tuple) -> tuple | None:
    """`messages` (engine Messages) without the oldest exchange: the oldest message and any answers
    that followed it, so the conversation still starts with a user turn. None when nothing but the
    system prompt and the newest user message is left."""
    head = tuple(messages[:1]) if messages and messages[0].role == "system" else ()
    body = list(messages[len(head):])
    if len(body) <= 1:
        return None
    body = body[1:]
    while len(body) > 1 and body[0].role != "user":
        body = body[1:]
    return head + tuple(body)


def dropped_note(dropped: int) -> str:
    """What the window says about the messages that were left out (empty when none were)."""
    if dropped <= 0:
        return ""
    what = "1 earlier message was" if dropped == 1 else f"{dropped} earlier messages were"
    return f"Earlier turns were left out to fit the context window ({what} not sent to the model)."
