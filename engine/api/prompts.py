"""Conversations -> prompt token ids, through the model's chat template when asked."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SpeculaError


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
