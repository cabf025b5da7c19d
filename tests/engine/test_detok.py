import random

import pytest

from specula.engine.decoding.detok import Detokenizer

TEXTS = [
    "Hello, world! Plain ASCII first.",
    "naïve café, Ünïcödé — “quotes” and ellipsis…",
    "中文字符和日本語のテキスト, 한국어",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵",
    "math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∑ x² ≤ ∞\n\tindented\n",
]


def stream(tokenizer, ids):
    d = Detokenizer(tokenizer)
    pieces = [d.add(i) for i in ids]
    return pieces, d.flush()


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_concatenate_to_the_full_decode(bundled_fp32, text):
    tok = bundled_fp32.tokenizer
    ids = tok.encode(text)
    pieces, tail = stream(tok, ids)
    assert "".join(pieces) + tail == tok.decode(ids) == text
    assert tail == ""
    assert not any("\ufffd" in p for p in pieces)  # never half a character


def test_multibyte_characters_split_across_tokens_are_held_back(bundled_fp32):
    tok = bundled_fp32.tokenizer
    ids = tok.encode("😀")
    assert len(ids) > 1  # a byte-level tokenizer spreads the emoji over several tokens
    pieces, _ = stream(tok, ids)
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == "😀"


def test_random_token_sequences(bundled_fp32):
    tok = bundled_fp32.tokenizer
    rng = random.Random(0)
    for _ in range(200):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 30))]
        pieces, tail = stream(tok, ids)
        assert "".join(pieces) + tail == tok.decode(ids)


def test_a_rejected_special_token_has_no_text_and_an_ordinary_one_keeps_its_own(bundled_fp32):
    from types import SimpleNamespace

    from specula.engine.decoding.loop import _Loop

    tok = bundled_fp32.tokenizer
    holder = SimpleNamespace(tokenizer=tok)
    assert _Loop._ghost(holder, tok.convert_tokens_to_ids("<|im_end|>")) == ""
    assert _Loop._ghost(holder, tok.encode(" cat")[0]) == " cat"
