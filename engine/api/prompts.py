"""Conversations -> prompt token ids, through the model's chat template when asked."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

from .errors import ContextTooLongError, SpeculaError

_LONGEST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> its longest token, in characters


@dataclass(frozen=True)
class Message:
    role: str  # "system", "user" or "assistant"
    content: str


def encode(tokenizer, messages: tuple[Message, ...], chat: bool) -> list[int]:
    """Token ids for a conversation that ends with the user's turn, ready for the assistant's answer.

    With `chat`, the model's chat template lays out the turns and opens the assistant's turn. Without
    it the turns are joined as plain text (a system message first), for base models and raw prompts.
    """
    if not messages:
        raise SpeculaError("nothing to send: the conversation is empty")
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise SpeculaError("this model has no chat template: run without --chat (plain prompt)")
        turns = [{"role": m.role, "content": m.content} for m in messages]
        text = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        return list(tokenizer.encode(text, add_special_tokens=False))
    text = "\n\n".join(m.content for m in messages)
    return list(tokenizer.encode(text))


def conversation(prompt: str, system: str | None = None, history: tuple[Message, ...] = ()) -> tuple[Message, ...]:
    head = (Message("system", system),) if system else ()
    return head + tuple(history) + (Message("user", prompt),)


def fewest_tokens(tokenizer, messages: tuple[Message, ...]) -> int:
    """A floor under the prompt's length in tokens, from its characters alone: no token covers more characters
    than the vocabulary's longest entry has (a byte-level vocabulary spells a byte as a character, so its
    entries cover at most as many characters as they have). Cheap where tokenizing would not be (megabytes)."""
    try:
        longest = _LONGEST.get(tokenizer)
        if longest is None:
            longest = max((len(piece) for piece in tokenizer.get_vocab()), default=0)
            _LONGEST[tokenizer] = longest
    except (AttributeError, TypeError):  # a tokenizer without a vocabulary to read: no floor
        return 0
    return math.ceil(sum(len(m.content) for m in messages) / longest) if longest > 0 else 0


def check_fits(tokenizer, messages: tuple[Message, ...], window: int) -> None:
    """Refuse, before it is tokenized, a prompt that cannot fit in `window` tokens whatever its tokens are."""
    floor = fewest_tokens(tokenizer, messages)
    if floor >= window:
        chars = sum(len(m.content) for m in messages)
        raise ContextTooLongError(f"prompt is at least {floor:,} tokens ({chars:,} characters) but the model's context "
                                  f"window is {window}: shorten it")
