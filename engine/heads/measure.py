"""What a draft head knows, measured on prompts without the strategy's cost model: the target answers each
prompt greedily, its features over the conversation are computed as for training, and from every position of
the answer the head's chain of k drafts (an EAGLE or EAGLE-3 head) or its heads' top guesses as a chain
(Medusa) is matched against the answer. The mean accepted length is 1 + the mean run of matches: what a pass
would keep if the strategy drafted that chain at every step. `specula bench` measures what a strategy gains
on a machine (where its cost model may keep plain steps); this measures the head itself, the same on any
machine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..api.errors import SpeculaError
from .medusa import MedusaHead
from .store import load_head
from .train import _with_features, chain_acceptance, medusa_acceptance, unrolled_acceptance


@dataclass(frozen=True)
class Answer:
    category: str
    prompt: list[int]  # the conversation's token ids up to the opened assistant turn
    answer: list[int]  # the target's greedy answer, without the end token


def head_chain(head, target, seq, k: int) -> float:
    """Mean accepted length of this head's chain of k (Medusa: its heads' top guesses) over one answer's
    features (`_with_features` with the layers the head reads)."""
    if isinstance(head, MedusaHead):
        return medusa_acceptance(head, target, [seq])
    if getattr(head, "aux_layers", ()):
        return unrolled_acceptance(head, target, [seq], k=k, stride=1)
    return chain_acceptance(head, target, [seq], k=k, stride=1)


def measure_heads(target, folders: list[Path], answers: list[Answer], k: int = 5,
                  say: Callable[[str], None] = lambda s: None) -> dict[str, dict[str, float]]:
    """{head folder: {category: mean accepted length, ..., "overall": over all answers}}. Each answer's
    features are computed once for all heads that read the same layers."""
    heads = []
    for folder in folders:  # every head loads (or is refused) before the long part
        head, _ = load_head(folder, target)
        if getattr(head, "reads_normed", False):
            raise SpeculaError(f"the head in {folder} reads the target's normed states (a published EAGLE-1/2 "
                               "head): measure it with `specula bench --strategies eagle --draft-head` instead")
        heads.append((str(folder), head, tuple(getattr(head, "aux_layers", ()))))
    by: dict[str, dict[str, list[float]]] = {name: {} for name, _, _ in heads}
    for n, a in enumerate(answers, 1):
        seqs = {aux: _with_features(target, a.prompt, a.answer, aux) for aux in dict.fromkeys(h[2] for h in heads)}
        for name, head, aux in heads:
            by[name].setdefault(a.category, []).append(head_chain(head, target, seqs[aux], k))
        say(f"heads measured on {n}/{len(answers)} answers")
    out: dict[str, dict[str, float]] = {}
    for name, cats in by.items():
        every = [v for values in cats.values() for v in values]
        out[name] = {c: sum(v) / len(v) for c, v in cats.items()} | {"overall": sum(every) / max(1, len(every))}
    return out
