"""Fitting a conversation into the model's context window by leaving out its oldest turns.

The tokenizer lives on the engine side, so the app learns that a prompt is too long from the engine:
a `Failed` event of kind `ContextTooLongError` before generation started. It then resends without the
oldest exchange (the system prompt and the newest user message always stay) until the prompt fits, or
until only the newest message is left, when the engine's error is shown.

The request's body must fit too: the engine process takes at most BODY_LIMIT bytes of JSON (its
`--max-body-mb`, which a window's user cannot set). A message larger than that as sent is refused before it
is sent (`too_long`), and a conversation whose messages add up to more is sent without its oldest turns
(`fit_body`), so that one large message never breaks the later ones.
"""

from __future__ import annotations

import json

# the largest request body the engine process takes: `specula serve --max-body-mb`'s default
# (specula.engine.serving.guard.MAX_BODY_BYTES, tested equal)
BODY_LIMIT = 4 << 20
MESSAGE_LIMIT = BODY_LIMIT - (256 << 10)  # one message, leaving room for the request's settings and a system prompt

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


def sent_size(text: str) -> int:
    """The bytes a message's text takes in a request's JSON body (escaped: other than ASCII, 6 or 12 bytes a
    character)."""
    return len(json.dumps(text))


def too_long(text: str) -> str | None:
    """Why a message cannot be sent, in one line; None when it can."""
    size = sent_size(text)
    if size <= MESSAGE_LIMIT:
        return None
    return (f"This message is too long to send ({_mb(size)} as sent; the engine takes up to {_mb(MESSAGE_LIMIT)}): "
            "shorten it or send it in parts.")


def fit_body(messages: tuple, body_size: int) -> tuple:
    """`messages` (engine Messages, sent in a body of `body_size` bytes) without their oldest exchanges until the
    body fits BODY_LIMIT, or only the system prompt and the newest message are left."""
    sizes = {id(m): sent_size(m.content) for m in messages}
    rest = body_size - sum(sizes.values())  # the body but the messages' texts
    while rest + sum(sizes[id(m)] for m in messages) > BODY_LIMIT:
        shorter = drop_oldest(messages)
        if shorter is None:
            break
        messages = shorter
    return messages


def _mb(size: int) -> str:
    return f"{size / (1 << 20):.1f} MB"
