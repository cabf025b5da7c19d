"""What a draft head knows, measured on prompts without the strategy's cost model: the target answers each
prompt greedily, its features over the conversation are computed as for training, and from every position of
the answer the head's chain of k drafts (an EAGLE or EAGLE-3 head) or its heads' top guesses as a chain
(Medusa) is matched against the answer. The mean accepted length is 1 + the mean run of matches: what a pass
would keep if the strategy drafted that chain at every step. With tree drafters, EAGLE heads are measured as
EAGLE-2 trees too: the eagle drafter itself builds its dynamic tree of a fixed size after every position
of the answer (the target's features of the real context, as when it decodes), and the longest path that
follows the answer is what a pass would keep. `specula bench` measures what a strategy gains on a machine
(where its cost model may keep plain steps); this measures the head itself, the same on any machine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..api.errors import SpeculaError
from ..api.types import SamplingParams
from ..decoding.drafter import Draft, DraftContext
from ..decoding.verify import walk_tree
from .medusa import MedusaHead
from .protocol import DraftHead
from .store import load_head
from .train.evaluate import chain_acceptance, medusa_acceptance, unrolled_acceptance
from .train.features import features_of


@dataclass(frozen=True)
class Answer:
    category: str
    prompt: list[int]  # the conversation's token ids up to the opened assistant turn
    answer: list[int]  # the target's greedy answer, without the end token


def head_chain(head: DraftHead, target, seq, k: int) -> float:
    """Mean accepted length of this head's chain of k (Medusa: its heads' top guesses) over one answer's
    features (`train.features.features_of` with the layers the head reads)."""
    if isinstance(head, MedusaHead):
        return medusa_acceptance(head, target, [seq])
    if head.aux_layers:
        return unrolled_acceptance(head, target, [seq], k=k, stride=1)
    return chain_acceptance(head, target, [seq], k=k, stride=1)


def kept_by(draft: Draft, truth: list[int]) -> int:
    """Draft tokens a greedy pass keeps when the target's answer goes on with `truth`: the chain's agreeing
    prefix, or the depth of the tree's longest path that follows it."""
    tokens = draft.tokens.tolist()
    if draft.tree is None:
        return next((j for j, t in enumerate(tokens) if j >= len(truth) or t != truth[j]), len(tokens))
    # the walk a greedy pass makes where the target's choice after each row is the truth at its depth
    choices = [truth[d] if d < len(truth) else -1 for d in draft.tree.depth]
    path, _ = walk_tree(choices, [-1, *tokens], draft.tree)
    return len(path) - 1


def drafter_tree(drafter, target, answer: Answer, k: int) -> list[int]:
    """What the eagle drafter's tree (its fixed node count, depth k) drafted after each position of one answer
    would keep, its next token included: the target reads the whole conversation once, then the drafter
    proposes from each prefix as it would while decoding, reading the real features up to it."""
    runner = target.new_runner()
    if drafter.aux_layers:
        runner.keep_layers(drafter.aux_layers)
    tokens = torch.tensor(answer.prompt + answer.answer)
    runner.forward(tokens[:-1])  # the features of every position a draft starts from
    drafter.reset()
    params = SamplingParams()  # greedy
    kept = []
    for i in range(len(answer.answer)):
        length = len(answer.prompt) + i
        draft = drafter.propose(DraftContext(tokens[:length], len(answer.prompt), params, None, runner), k)
        kept.append(1 + kept_by(draft, answer.answer[i:]))
    return kept


def passes_when_decoding(kept: list[int]) -> int:
    """The passes that decode the answer when each starts where the last one's tokens end: the mean over every
    position counts the positions inside a long kept run too, which decoding passes over (a run of copied
    text weighs more there than in the passes that decode it)."""
    i = passes = 0
    while i < len(kept):
        i += kept[i]
        passes += 1
    return passes


def _means(by: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, cats in by.items():
        every = [v for values in cats.values() for v in values]
        out[name] = {c: sum(v) / len(v) for c, v in cats.items()} | {"overall": sum(every) / max(1, len(every))}
    return out


def measure_heads(target, folders: list[Path], answers: list[Answer], k: int = 5,
                  say: Callable[[str], None] = lambda s: None,
                  trees: dict[str, object] | None = None) -> tuple[dict[str, dict[str, float]], dict, dict]:
    """({head folder: {category: mean accepted length of chains, ..., "overall": over all answers}}, the same
    for the tree drafters in `trees` ({head folder: an eagle drafter that builds trees of a fixed size, with
    its own copy of the head}; `cli/measure.tree_drafters`), and for those the tokens per pass when decoding
    (answer tokens over `passes_when_decoding`, pooled per category). Each answer's features are computed once
    for all heads that read the same layers."""

    heads = []
    for folder in folders:  # every head loads (or is refused) before the long part
        head, _ = load_head(folder, target)
        if head.reads_normed:
            raise SpeculaError(f"the head in {folder} reads the target's normed states (a published EAGLE-1/2 "
                               "head): measure it with `specula bench --strategies eagle --draft-head` instead")
        heads.append((str(folder), head, tuple(head.aux_layers)))
    trees = trees or {}
    by: dict[str, dict[str, list[float]]] = {name: {} for name, _, _ in heads}
    by_tree: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    walks: dict[str, dict[str, list[int]]] = {name: {} for name in trees}  # category -> [tokens, passes]
    for n, a in enumerate(answers, 1):
        seqs = {aux: features_of(target, a.prompt, a.answer, aux) for aux in dict.fromkeys(h[2] for h in heads)}
        for name, head, aux in heads:
            by[name].setdefault(a.category, []).append(head_chain(head, target, seqs[aux], k))
        for name, drafter in trees.items():
            kept = drafter_tree(drafter, target, a, k)
            by_tree[name].setdefault(a.category, []).append(sum(kept) / len(kept))
            walk = walks[name].setdefault(a.category, [0, 0])
            walk[0] += len(kept)
            walk[1] += passes_when_decoding(kept)
        say(f"heads measured on {n}/{len(answers)} answers")
    decoded = {name: {c: t / p for c, (t, p) in cats.items()}
               | {"overall": sum(t for t, _ in cats.values()) / max(1, sum(p for _, p in cats.values()))}
               for name, cats in walks.items()}
    return _means(by), _means(by_tree), decoded
