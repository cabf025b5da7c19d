"""The answers of `specula serve`'s chat and completions endpoints, in OpenAI's shapes.

An answer is sent whole (`response`: chat.completion or text_completion) or as a stream of chunks (`chunk`:
chat.completion.chunk or text_completion). Each carries the `specula` extension the routes give it
(`api.wire`'s): in a streamed chunk, the step's tokens with their origin (draft, correction, bonus, target),
the rejected drafts, and the step's draft and verify times. `Answer` follows one answer as the client
receives it: its text cut at a stop sequence (`TextStream`), the finish reason and the usage.
"""

from __future__ import annotations

from dataclasses import replace

from ..api.events import Finished, Started, Step, Token
from .openai import Parsed


def usage_json(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def finish_reason(finished: Finished, stopped: bool) -> str:
    """OpenAI's finish_reason: "length" where the budget ended the answer, else "stop" (an end token, a stop
    sequence, a cancelled request: the extension's "reason" says which)."""
    return "length" if finished.reason == "length" and not stopped else "stop"


def chunk(parsed: Parsed, text: str | None, finish: str | None = None, *, role: bool = False,
          extension: dict | None = None, usage: dict | None = None, choices: bool = True) -> dict:
    """One streamed chunk: chat.completion.chunk or text_completion."""
    if parsed.kind == "chat":
        delta = {"role": "assistant", "content": text or ""} if role else ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    out = {"id": parsed.response_id, "object": obj, "created": parsed.created, "model": parsed.model,
           "choices": [choice] if choices else []}
    if usage is not None:
        out["usage"] = usage
    if extension is not None:
        out["specula"] = extension
    return out


def response(parsed: Parsed, text: str, finish: str, usage: dict, extension: dict) -> dict:
    """The whole answer at once (stream false)."""
    if parsed.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": parsed.response_id, "object": obj, "created": parsed.created, "model": parsed.model,
            "choices": [choice], "usage": usage, "specula": extension}


class TextStream:
    """The answer's text as it may be sent: cut at the first stop sequence, and holding back the end of
    the text that could still begin one. Tokens are released with the text that ends them (a token cut
    by a stop sequence keeps only its part before it). `generated` counts the tokens the answer took: up to
    the one that completes a stop sequence (its text cut or not), none after it."""

    def __init__(self, stops: tuple[str, ...] = ()) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0
        self.stopped = False
        self.generated = 0
        self._pending: list[tuple[Token, int, int]] = []  # (token, start, end) in self.text

    def push(self, tokens: tuple[Token, ...]) -> tuple[str, list[Token]]:
        if self.stopped:
            return "", []
        searched = max(0, len(self.text) - self.hold)
        for token in tokens:
            start = len(self.text)
            self.text += token.text
            self._pending.append((token, start, len(self.text)))
        hits = [(i, i + len(s)) for s in self.stops if (i := self.text.find(s, searched)) >= 0]
        if not hits:
            self.generated += len(tokens)
            return self._release(len(self.text) - self.hold)
        cut, end = min(hits)
        # the stop sequence ends in this push's tokens (an earlier one would have found it): count them to the one
        # that completes it
        ends = [token_end for _, _, token_end in self._pending[len(self._pending) - len(tokens):]]
        self.generated += next(n for n, token_end in enumerate(ends, 1) if token_end >= end)
        self.stopped = True
        self.text = self.text[:cut]
        return self._release(cut)

    def finish(self, final_text: str) -> tuple[str, list[Token]]:
        """Everything still held; `final_text` (the engine's whole answer) adds what the last tokens'
        text did not yet say (an incomplete character at the end)."""
        if not self.stopped and final_text.startswith(self.text):
            self.text = final_text
        return self._release(len(self.text))

    def _release(self, upto: int) -> tuple[str, list[Token]]:
        upto = max(self.sent, min(upto, len(self.text)))
        piece = self.text[self.sent : upto]
        self.sent = upto
        out, keep = [], []
        for token, start, end in self._pending:
            if end <= upto:
                out.append(token)
            elif self.stopped and start < upto:
                out.append(Token(token.id, token.text[: upto - start], token.origin, token.step, token.draft_pos,
                                 token.p, token.q, token.branch, token.drafter))
            elif not self.stopped:
                keep.append((token, start, end))
        self._pending = keep
        return piece, out


class Answer:
    """One answer as the client receives it, streamed or whole: the text cut at a stop sequence (the
    engine is told to stop, `on_stop`), each step's tokens released with their text, and the usage: where a
    stop sequence cut the answer, the tokens generated up to the one that completes it (those it cut
    included, as OpenAI and vLLM count them), not those the engine made while the stop took effect."""

    def __init__(self, parsed: Parsed, started: Started, on_stop) -> None:
        self.parsed, self.started, self.on_stop = parsed, started, on_stop
        self.text = TextStream(parsed.stops)

    def step(self, event: Step) -> tuple[str, list[Token]] | None:
        """The text and tokens a step releases; None for the steps that ran while a stop took effect."""
        if self.text.stopped:
            return None
        piece, tokens = self.text.push(event.tokens)
        if self.text.stopped:
            self.on_stop()
        return piece, tokens

    def finish(self, event: Finished) -> tuple[str, list[Token], str, dict]:
        """What is still held, the finish reason and the usage."""
        piece, tokens = self.text.finish(event.text)
        count = self.text.generated if self.text.stopped else event.totals.new_tokens
        return piece, tokens, finish_reason(event, self.text.stopped), usage_json(self.started.prompt_tokens, count)

    def ended(self, event: Finished) -> Finished:
        """The answer's end as the extension says it: "stop" where a stop sequence ended it (the engine saw a
        cancel, or ended in the same step), as docs/SERVER.md and /metrics say it."""
        return replace(event, reason="stop") if self.text.stopped else event
