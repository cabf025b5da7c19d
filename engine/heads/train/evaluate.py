"""How well a trained head drafts on held-out answers, measured without a strategy's cost model: the mean new
tokens per target pass its chain of drafts (EAGLE-1/2 from real features up to each start, EAGLE-3 from its
unrolled steps) or its heads' top guesses (Medusa) would give, 1 + the mean run that matches the answer."""

from __future__ import annotations

import torch

from ..eagle import EagleHead
from ..eagle3 import Eagle3Head
from ..medusa import MedusaHead
from .features import Sequence
from .frozen import Frozen


@torch.inference_mode()
def chain_acceptance(head: EagleHead, target, seqs: list[Sequence], k: int = 5, stride: int = 4) -> float:
    """Mean new tokens per target pass a chain of k drafts would give on these (held-out) answers, with
    real features up to each starting point: 1 + the mean common prefix of the drafts and the answer."""
    frozen = Frozen(target)
    head = head.float().to(frozen.device)
    kept = []
    for seq in seqs:
        feats, tokens = seq.features.float().to(frozen.device), seq.tokens.to(frozen.device)
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
                out = head(out[None, None], frozen.embed[[guess]][None], start=t + j, use_cache=True)[0, -1]
            kept.append(n)
    return 1.0 + sum(kept) / max(1, len(kept))


@torch.inference_mode()
def medusa_acceptance(head: MedusaHead, target, seqs: list[Sequence]) -> float:
    """Mean new tokens per target pass the chain of the heads' top guesses would give on these answers:
    1 + the mean common prefix of the guesses and the answer."""
    frozen = Frozen(target)
    head = head.float().to(frozen.device)
    ids = head.draft_ids if head.draft_ids.numel() else None
    kept = []
    for seq in seqs:
        feats, tokens = seq.features.float().to(frozen.device), seq.tokens.to(frozen.device)
        t = torch.arange(max(0, seq.answer_start - 1), tokens.shape[0] - 2, device=frozen.device)
        if t.numel() == 0:
            continue
        guess = frozen.logits(head(feats[t]), ids).argmax(-1)  # (heads, n)
        guess = ids[guess] if ids is not None else guess
        run = torch.ones(t.shape[0], dtype=torch.bool, device=frozen.device)
        n = torch.zeros(t.shape[0], dtype=torch.long, device=frozen.device)
        for i in range(guess.shape[0]):
            where = t + 2 + i
            inside = where < tokens.shape[0]
            run &= inside & (guess[i] == tokens[where.clamp(max=tokens.shape[0] - 1)])
            n += run.long()
        kept += n.tolist()
    return 1.0 + sum(kept) / max(1, len(kept))


@torch.inference_mode()
def unrolled_acceptance(head: Eagle3Head, target, seqs: list[Sequence], k: int = 5, stride: int = 4) -> float:
    """chain_acceptance for an EAGLE-3 head, from its unrolled steps (a chain's j-th draft is step j's
    output, the tokens before it the answer's own: the ones a chain that got that far had drafted)."""
    frozen = Frozen(target)
    head = head.float().to(frozen.device)
    kept = []
    for seq in seqs:
        tokens, n = seq.tokens.to(frozen.device), seq.tokens.shape[0]
        if n < 3:
            continue
        outs = head.unrolled(seq.features.float().to(frozen.device)[None, :-1], frozen.embed[tokens[1:]][None], k)
        guesses = [head.draft_ids[head.draft_logits(out[0]).argmax(-1)].tolist() for out in outs]  # (T-1,) each
        tokens = tokens.tolist()
        for r in range(max(0, seq.answer_start - 2), n - 2, stride):  # the last row the head read for real
            depth = 0
            while depth < k and r + depth + 2 < n and guesses[depth][r + depth] == tokens[r + depth + 2]:
                depth += 1
            kept.append(depth)
    return 1.0 + sum(kept) / max(1, len(kept))
