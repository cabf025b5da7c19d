"""Streamed chat-completion chunks -> tokens, and the colours inferred for them.

vLLM streams one chunk per engine step when the client keeps up: the draft tokens the target accepted
in that step, then the target's own token (its correction of the first rejected draft, or the bonus
token after a fully accepted draft). So the last token of a chunk is the target's and the ones before
it are accepted drafts; the prefill's chunk is the target's single first token. That is an inference
(when the server's API process falls behind its engine, several steps arrive merged in one chunk), so
such steps are marked `inferred`; a chunk longer than the server's longest draft + 1 is certainly
merged and is not coloured. Rejected drafts are never shown: the stream does not carry them.

With `logprobs` on, vLLM sends each token's bytes; they are decoded incrementally so a character split
across tokens is never broken, and reconciled with the chunk's text (which leaves out the stop token).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from ..api.events import Origin, Token
from .http import RemoteError


@dataclass(frozen=True)
class Chunk:
    content: str  # the text the chunk adds to the answer
    ids: tuple[int, ...]  # the token ids, when the server sends them (vLLM: return_token_ids)
    texts: tuple[str, ...]  # one text per token when known; else a single text for the whole chunk
    finish_reason: str | None = None
    usage: dict | None = None


class ChunkReader:
    """Reads the chunks of one answer (it keeps the UTF-8 decoder's state between chunks)."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read(self, event: dict) -> Chunk | None:
        """The chunk's tokens; None for a chunk that carries no choice (e.g. the final usage chunk)."""
        usage = event.get("usage") if isinstance(event.get("usage"), dict) else None
        choices = event.get("choices")
        if "choices" not in event:
            raise RemoteError(f"the server sent a chunk without 'choices': {str(event)[:120]}")
        if not isinstance(choices, list):
            raise malformed(f"'choices' is {_kind(choices)}, not a list")
        if not choices:
            return Chunk("", (), (), None, usage) if usage else None
        choice = choices[0]
        if not isinstance(choice, dict):
            raise malformed(f"a choice is {_kind(choice)}, not an object")
        delta = choice.get("delta") or {}
        content = (delta.get("content") or "") if isinstance(delta, dict) else ""
        if not isinstance(content, str):
            raise malformed(f"'content' is {_kind(content)}, not text")
        ids = choice.get("token_ids")
        if ids is None:
            ids = ()
        elif isinstance(ids, list) and all(_is_id(i) for i in ids):
            ids = tuple(ids)
        else:
            raise malformed("'token_ids' is not a list of token ids (whole numbers from 0)")
        finish = choice.get("finish_reason")
        if finish is not None and not isinstance(finish, str):
            raise malformed(f"'finish_reason' is {_kind(finish)}, not text")
        texts = self._texts(choice, content, len(ids))
        return Chunk(content, ids, texts, finish, usage)

    def _texts(self, choice: dict, content: str, n_ids: int) -> tuple[str, ...]:
        logprobs = choice.get("logprobs")
        entries = logprobs.get("content") if isinstance(logprobs, dict) else None
        if not isinstance(entries, list) or not entries or (n_ids and len(entries) != n_ids):
            return (content,) if content else ()
        pieces = []
        for entry in entries:
            raw = entry.get("bytes") if isinstance(entry, dict) else None
            if isinstance(raw, list):
                if not all(_is_id(b) and b < 256 for b in raw):
                    raise malformed("'bytes' of a token's logprobs are not bytes (whole numbers from 0 to 255)")
                pieces.append(self._utf8.decode(bytes(raw)))
            else:
                token = entry.get("token", "") if isinstance(entry, dict) else ""
                pieces.append(token if isinstance(token, str) else "")
        return reconcile(pieces, content)


def malformed(what: str) -> RemoteError:
    return RemoteError(f"the server sent a malformed stream chunk: {what}")


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _kind(value) -> str:
    """A JSON value's kind in words (never the value: it came from the server)."""
    return {dict: "an object", list: "a list", str: "text", bool: "true or false", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), "something else")


def reconcile(pieces: list[str], content: str) -> tuple[str, ...]:
    """Per-token texts whose concatenation is exactly `content`: a piece the content does not carry at
    that point (a stop token, special tokens the server hides) becomes empty, and text left over goes to
    the last token."""
    out, at = [], 0
    for piece in pieces:
        if piece and content.startswith(piece, at):
            out.append(piece)
            at += len(piece)
        else:
            out.append("")
    if at < len(content):
        if not out:
            return (content,)
        out[-1] += content[at:]
    return tuple(out)


def chunk_tokens(chunk: Chunk, step: int, inferred: bool) -> tuple[Token, ...]:
    """The chunk's tokens coloured: with `inferred`, the last is the target's and the ones before it
    accepted drafts; otherwise all are the target's. Without ids, one token of id -1 stands for the chunk."""
    if chunk.ids and len(chunk.texts) == len(chunk.ids):
        pairs = list(zip(chunk.ids, chunk.texts))
    elif chunk.ids:  # ids but no per-token text: the chunk's text rides on its first token
        pairs = [(i, chunk.content if n == 0 else "") for n, i in enumerate(chunk.ids)]
    else:
        pairs = [(-1, text) for text in chunk.texts]
    tokens = []
    for n, (token_id, text) in enumerate(pairs):
        if inferred and n < len(pairs) - 1:
            tokens.append(Token(token_id, text, Origin.DRAFT, step, draft_pos=n))
        else:
            tokens.append(Token(token_id, text, Origin.TARGET, step))
    return tuple(tokens)


def drop_stop_token(tokens: tuple[Token, ...], finish_reason: str | None) -> tuple[Token, ...]:
    """Without the answer's stop token: its last token when it ended on a stop and adds no text. Dropped
    after colouring, so the drafts before it keep their colour (the stop was the step's own token)."""
    if finish_reason == "stop" and tokens and tokens[-1].text == "" and tokens[-1].id >= 0:
        return tokens[:-1]
    return tokens
