"""The losses a head trains on, each over a group of sequences: (loss, right, seen), the top-1 hits of its
first prediction among the positions counted.

- `eagle_loss`: an EAGLE-1/2 head predicts the next feature (smooth L1) and, through the target's norm and LM
  head, the token after it (cross-entropy);
- `eagle3_loss`: an EAGLE-3 head, unrolled TTT_STEPS times as drafting feeds it its own outputs, against the
  target's own distribution over its draft vocabulary;
- `medusa_loss`: each Medusa head against the token it guesses, over the draft vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..eagle import EagleHead
from ..eagle3 import Eagle3Head
from ..medusa import MedusaHead
from .features import Sequence
from .frozen import Frozen

TTT_STEPS = 4  # steps an EAGLE-3 head is unrolled in training (its drafts' first four positions trained as used)


def _batch(seqs: list[Sequence], device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) tokens, (B, T, D) features and (B, T) validity of a group of sequences, on `device`."""
    width = max(s.tokens.shape[0] for s in seqs)
    dim = seqs[0].features.shape[-1]
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    feats = torch.zeros(len(seqs), width, dim)
    valid = torch.zeros(len(seqs), width, dtype=torch.bool)
    for b, s in enumerate(seqs):
        n = s.tokens.shape[0]
        tokens[b, :n], feats[b, :n], valid[b, :n] = s.tokens, s.features.float(), True
    if device is not None:
        return tokens.to(device), feats.to(device), valid.to(device)
    return tokens, feats, valid


def eagle_loss(head: EagleHead, frozen: Frozen, seqs: list[Sequence]) -> tuple[torch.Tensor, int, int]:
    """Pairs i = 0..T-2: (feature i, token i+1) -> feature i+1, whose logits should give token i+2.
    Padding sits at the end of each row, so causal attention never lets a real position see it."""
    tokens, feats, valid = _batch(seqs, frozen.device)
    pred = head(feats[:, :-1], frozen.embed[tokens[:, 1:]])  # (B, T-1, D) ~ features 1..T-1
    ok = valid[:, 1:]
    reg = F.smooth_l1_loss(pred[ok], feats[:, 1:][ok])
    ok2 = valid[:, 2:]
    logits = frozen.logits(pred[:, :-1][ok2])  # predictions for tokens 2..T-1
    labels = tokens[:, 2:][ok2]
    ce = F.cross_entropy(logits, labels)
    right = int((logits.argmax(-1) == labels).sum())
    return ce + 0.1 * reg, right, labels.shape[0]


def _draft_slots(head, vocab: int) -> torch.Tensor:
    """Each target token's row in the head's draft vocabulary, -1 outside it."""
    ids = head.draft_ids
    slot = torch.full((vocab,), -1, dtype=torch.long, device=ids.device)
    slot[ids] = torch.arange(ids.shape[0], device=ids.device)
    return slot


def eagle3_loss(head: Eagle3Head, frozen: Frozen, seqs: list[Sequence],
                steps: int | None = None) -> tuple[torch.Tensor, int, int]:
    """Row i reads (the target layers' states at i, token i+1) and should give token i+2; unrolled `steps`
    times as drafting feeds the head its own outputs (Eagle3Head.unrolled), step k weighted 0.8^k, on
    answer positions. The label is the target's own distribution over token i+2 (its most likely
    TARGET_TOP tokens inside the draft vocabulary, renormalised), where the target's first choice is a draft
    token: a sampled answer's token teaches less than what the target would have said, and the runners-up
    teach more than a single token does. Sequences without stored distributions learn the answer's token."""
    tokens, feats, valid = _batch(seqs, frozen.device)
    width = tokens.shape[1]
    outs = head.unrolled(feats[:, :-1], frozen.embed[tokens[:, 1:]], steps or TTT_STEPS)  # rows 0..T-2
    slot = _draft_slots(head, frozen.lm.shape[0])
    soft = _soft_labels(seqs, slot, width)
    labels = soft[0][..., 0] if soft is not None else slot[tokens[:, 2:]]  # rows 0..T-3: the first choice
    rows = torch.arange(width - 2, device=tokens.device)
    starts = torch.tensor([s.answer_start for s in seqs], device=tokens.device)
    base = valid[:, 2:] & (labels >= 0) & (rows[None, :] + 2 >= starts[:, None])
    loss, right, seen = 0.0, 0, 0
    for k, out in enumerate(outs):
        ok = base & (rows[None, :] >= k)  # a chain k deep starts at a position the head read
        logits = head.draft_logits(out[:, :-1][ok])
        if soft is not None:
            slots, weights = soft[0][ok], soft[1][ok]
            step_loss = -(weights * logits.log_softmax(-1).gather(1, slots.clamp(min=0))).sum(-1).mean()
        else:
            step_loss = F.cross_entropy(logits, labels[ok])
        loss = loss + step_loss * 0.8**k
        if k == 0:
            right, seen = int((logits.argmax(-1) == labels[ok]).sum()), int(ok.sum())
    return loss, right, seen


def _soft_labels(seqs: list[Sequence], slot: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For rows 0..width-3 (the distribution over token i+2, stored at position i+1): each candidate's row in
    the draft vocabulary (-1 outside it; the first is the target's first choice) and its weight, the stored
    probabilities inside the draft vocabulary renormalised to one; None when a sequence has none stored."""
    if any(s.top_ids is None for s in seqs):
        return None
    k = seqs[0].top_ids.shape[-1]
    ids = torch.zeros(len(seqs), width, k, dtype=torch.long)
    probs = torch.zeros(len(seqs), width, k)
    for b, s in enumerate(seqs):
        n = s.tokens.shape[0]
        ids[b, :n], probs[b, :n] = s.top_ids.long(), s.top_p.float()
    ids, probs = ids[:, 1:-1].to(slot.device), probs[:, 1:-1].to(slot.device)
    slots = slot[ids]
    weights = probs * (slots >= 0)
    weights = weights / weights.sum(-1, keepdim=True).clamp(min=1e-9)
    return slots, weights


def medusa_loss(head: MedusaHead, frozen: Frozen, seqs: list[Sequence]) -> tuple[torch.Tensor, int, int]:
    """Head i reads feature t and should give token t + 2 + i; the softmax runs over the draft vocabulary
    (tokens outside it are not drafted, so they are not trained for)."""
    tokens, feats, valid = _batch(seqs, frozen.device)
    ids = head.draft_ids
    slot = _draft_slots(head, frozen.lm.shape[0])
    preds = head(feats)  # (heads, B, T, D)
    loss, right, seen = 0.0, 0, 0
    for i, pred in enumerate(preds):
        ahead = 2 + i
        labels = slot[tokens[:, ahead:]]
        ok = valid[:, ahead:] & (labels >= 0)
        logits = frozen.logits(pred[:, :-ahead][ok], ids)
        ce = F.cross_entropy(logits, labels[ok])
        loss = loss + ce * 0.8**i  # nearer heads matter more: their guesses sit higher in the tree
        if i == 0:
            right, seen = int((logits.argmax(-1) == labels[ok]).sum()), int(ok.sum())
    return loss, right, seen
