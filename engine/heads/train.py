"""Self-distillation for a draft head: the target answers prompts from a built-in generator, its final
hidden states over prompt and answer are extracted once, and the head learns to predict the next hidden
state (and through the target's LM head, the next token) from the current one and the next token."""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..prompts import Message, encode
from .eagle import EagleHead, HeadConfig, HeadInfo, target_fingerprint, vocabulary_fingerprint

TOPICS = (
    "the water cycle", "photosynthesis", "a healthy breakfast", "learning a new language", "the history of the bicycle",
    "how vaccines work", "saving money", "remote work", "volcanoes", "the moon landing", "sleep", "recycling",
    "electric cars", "the internet", "coffee", "chess", "gardening", "time management", "the Roman Empire",
    "black holes", "climate change", "public speaking", "dogs as pets", "machine learning", "the human heart",
    "bread baking", "friendship", "a job interview", "the ocean", "renewable energy", "music practice",
    "the printing press", "bees", "running a marathon", "writing a good email", "the solar system",
    "first aid", "a trip to Japan", "budget travel", "smartphones", "the French Revolution", "rainbows",
    "teamwork", "reading habits", "cloud computing", "earthquakes", "a birthday party", "city parks",
)
FORMS = (
    "Explain {t} in simple terms.", "Write a short paragraph about {t}.", "Give three facts about {t}.",
    "What are the main benefits of {t}?", "Write a short poem about {t}.", "List five tips related to {t}.",
    "Describe {t} to a ten-year-old.", "What are common misconceptions about {t}?",
    "Write a short story that involves {t}.", "Summarize the key ideas of {t} in two sentences.",
    "Compare {t} with something similar and explain the differences.", "Why is {t} important?",
    "Write a tweet about {t}.", "What questions do people often ask about {t}? Answer two of them.",
)
FOLLOW_UPS = (
    "Can you make it shorter?", "Give an example.", "Explain that in more detail.", "Now say it more formally.",
    "Summarize your answer in one sentence.", "Translate the first two sentences of your answer into French.",
    "Rewrite your answer as a numbered list.", "What is the most important point? Quote it.",
)
FOLLOW_UP_SHARE = 0.5  # of first answers, how many get a second turn (multi-turn training data)


def prompt_conversations(n: int, seed: int = 0) -> list[tuple[Message, ...]]:
    """n conversations (a user message, sometimes with an earlier exchange): topics x task forms."""
    rng = random.Random(seed)
    pairs = [(t, f) for t in TOPICS for f in FORMS]
    rng.shuffle(pairs)
    out = []
    for i in range(n):
        topic, form = pairs[i % len(pairs)]
        out.append((Message("user", form.format(t=topic)),))
    return out


@dataclass
class Sequence:
    tokens: torch.Tensor  # (T,) prompt and answer
    features: torch.Tensor  # (T, D) the target's final hidden states, before its final norm
    answer_start: int


def self_distill(target, n_tokens: int, max_new: int = 192, batch: int = 8, seed: int = 0,
                 say: Callable[[str], None] = lambda s: None) -> list[Sequence]:
    """The target answers generated prompts greedily until about n_tokens answer tokens exist; then its
    features over every conversation are extracted with the engine's own forward."""
    tok = target.tokenizer
    model = target.model
    pad = tok.pad_token_id if tok.pad_token_id is not None else sorted(target.eos_ids)[0]
    convs = prompt_conversations(max(1, 4 * n_tokens // max_new + 8), seed)
    rng = random.Random(seed + 1)
    seqs: list[Sequence] = []
    made = 0
    t0 = time.perf_counter()
    i = 0
    follow: list[tuple[Message, ...]] = []
    while made < n_tokens and (i < len(convs) or follow):
        n_follow = min(len(follow), batch // 2)  # second turns mixed in as soon as their first answers exist
        group = follow[:n_follow]
        del follow[:n_follow]
        fresh = convs[i : i + batch - n_follow]
        i += len(fresh)
        encoded = []
        for conv in group + fresh:
            e = encode(tok, list(conv), True)
            if len(e) + max_new <= target.context_window:
                encoded.append((conv, e))
        if not encoded:
            continue
        group, encoded = [c for c, _ in encoded], [e for _, e in encoded]
        width = max(len(e) for e in encoded)
        ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded], device=target.device)
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded], device=target.device)
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                                 pad_token_id=pad, eos_token_id=sorted(target.eos_ids))
        for conv, e, row in zip(group, encoded, out[:, width:].tolist()):
            answer = []
            for t in row:
                if t in target.eos_ids:
                    break
                answer.append(t)
            if len(answer) < 4:
                continue
            seqs.append(_with_features(target, e, answer))
            made += len(answer)
            if len(conv) == 1 and rng.random() < FOLLOW_UP_SHARE:  # a second turn on the model's own answer
                reply = Message("assistant", tok.decode(answer, skip_special_tokens=True))
                follow.append((*conv, reply, Message("user", rng.choice(FOLLOW_UPS))))
        rate = made / max(1e-9, time.perf_counter() - t0)
        say(f"answers: {min(made, n_tokens)}/{n_tokens} tokens ({rate:.0f} tokens/s)")
    return seqs


def _with_features(target, prompt: list[int], answer: list[int]) -> Sequence:
    runner = target.new_runner()
    tokens = torch.tensor(prompt + answer, dtype=torch.long)
    runner.forward(tokens[: runner.max_len])
    return Sequence(tokens[: runner.max_len], runner.hidden.detach().clone().cpu(), len(prompt))


class _Frozen:
    """The target's embedding, final norm and LM head in fp32, for training."""

    def __init__(self, target) -> None:
        model = target.model
        self.embed = model.get_input_embeddings().weight.detach().float()
        self.norm_w = model.model.norm.weight.detach().float()
        self.eps = model.model.norm.variance_epsilon
        self.lm = model.get_output_embeddings().weight.detach().float()

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm_w * F.rms_norm(h, (h.shape[-1],), eps=self.eps), self.lm)


def _loss(head: EagleHead, frozen: _Frozen, seq: Sequence) -> tuple[torch.Tensor, int, int]:
    """Pairs i = 0..T-2: (feature i, token i+1) -> feature i+1, whose logits should give token i+2."""
    feats = seq.features.float()
    tokens = seq.tokens
    pred = head(feats[None, :-1], frozen.embed[tokens[1:]][None])[0]  # (T-1, D) ~ features 1..T-1
    reg = F.smooth_l1_loss(pred, feats[1:])
    logits = frozen.logits(pred[:-1])  # predictions for tokens 2..T-1
    labels = tokens[2:]
    ce = F.cross_entropy(logits, labels)
    right = int((logits.argmax(-1) == labels).sum())
    return ce + 0.1 * reg, right, labels.shape[0]


def train_head(target, seqs: list[Sequence], epochs: int = 2, lr: float = 1e-3, seed: int = 0,
               say: Callable[[str], None] = lambda s: None) -> EagleHead:
    torch.manual_seed(seed)
    head = EagleHead(HeadConfig.for_target(target.model.config))
    frozen = _Frozen(target)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    total = epochs * len(seqs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, total) / max(1, total))))
    rng = random.Random(seed)
    step = 0
    t0 = time.perf_counter()
    for epoch in range(epochs):
        order = list(range(len(seqs)))
        rng.shuffle(order)
        right = seen = 0
        for j in order:
            loss, r, n = _loss(head, frozen, seqs[j])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            right, seen = right + r, seen + n
            if step % 10 == 0 or step == total:
                eta = (time.perf_counter() - t0) / step * (total - step)
                say(f"training: epoch {epoch + 1}/{epochs}, step {step}/{total}, top-1 {right / max(1, seen):.0%}, eta {eta:.0f} s")
    return head.eval()


@torch.inference_mode()
def chain_acceptance(head: EagleHead, target, seqs: list[Sequence], k: int = 5, stride: int = 4) -> float:
    """Mean new tokens per target pass a chain of k drafts would give on these (held-out) answers, with
    real features up to each starting point: 1 + the mean common prefix of the drafts and the answer."""
    frozen = _Frozen(target)
    head = head.float()
    kept = []
    for seq in seqs:
        feats, tokens = seq.features.float(), seq.tokens
        for t in range(max(1, seq.answer_start - 1), tokens.shape[0] - 2, stride):
            # the head has read positions 0..t-1 with real features; token t is the newest one
            head.truncate(0)
            out = head(feats[None, :t], frozen.embed[tokens[1 : t + 1]][None], use_cache=True)[0, -1]
            n = 0
            for j in range(k):
                logits = frozen.logits(out[None])[0]
                ids = head.draft_ids
                guess = int(ids[logits[ids].argmax()]) if ids.numel() else int(logits.argmax())
                if t + 1 + j >= tokens.shape[0] or guess != int(tokens[t + 1 + j]):
                    break
                n += 1
                out = head(out[None, None], frozen.embed[torch.tensor([guess])][None], start=t + j, use_cache=True)[0, -1]
            kept.append(n)
    return 1.0 + sum(kept) / max(1, len(kept))


def frequent_tokens(seqs: list[Sequence], size: int) -> torch.Tensor:
    """The `size` token ids that occur most often in the answers (the head's draft vocabulary)."""
    counts = torch.zeros(int(max(int(s.tokens.max()) for s in seqs)) + 1, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(s.tokens[s.answer_start :], minlength=counts.shape[0])
    size = min(size, int((counts > 0).sum()))
    return counts.topk(size).indices.sort().values


def head_info(target, kind: str, tokens: int, epochs: int, acceptance: float | None) -> HeadInfo:
    return HeadInfo(
        kind=kind,
        config=HeadConfig.for_target(target.model.config),
        target=target_fingerprint(target.model),
        vocabulary=vocabulary_fingerprint(target.tokenizer) if target.tokenizer is not None else "",
        target_name=target.name,
        training={"answer_tokens": tokens, "epochs": epochs, "held_out_mean_accepted_length": acceptance},
    )


def progress_line(text: str) -> None:
    sys.stderr.write("\r" + text[:120].ljust(120))
    sys.stderr.flush()
