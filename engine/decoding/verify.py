"""One target pass over the draft: how many draft tokens survive, and the target's next token.

The target scored [last committed token, d_1 .. d_k] in one forward, giving k+1 rows of logits: row i
is the target's distribution p_i for the token after d_i (row 0: after the committed token).

Greedy: d_{i+1} survives while it equals argmax p_i; the first mismatch is replaced by argmax p_i (a
correction); when all k survive, argmax p_k is a free bonus token.

Sampling (Leviathan et al. 2023; Chen et al. 2023): accept d_{i+1} with probability
min(1, p_i(d)/q_i(d)); at the first rejection draw the replacement from normalize(max(0, p_i - q_i));
when all survive draw the bonus from p_k. Each emitted token is then distributed exactly as under p.
A drafter with no distribution (n-gram lookup) has q_i = one-hot(d_{i+1}), so the residual is p_i
with d_{i+1} removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..api.types import SamplingParams
from .sampling import process_logits, sample
from .tree import TokenTree


@dataclass(frozen=True)
class Verdict:
    accepted: int  # leading draft tokens kept
    next_token: int  # correction (accepted < k) or bonus (accepted == k)
    p_of_draft: tuple[float, ...] = ()  # target probability of each draft token (sampling, or asked for)
    q_of_draft: tuple[float, ...] = ()  # drafter probability of each draft token (where the drafter gave them)
    best: tuple[int, ...] = ()  # greedy: the target's argmax of every row


def verify_greedy(logits: torch.Tensor, draft: torch.Tensor, q: torch.Tensor | None = None,
                  probs: bool = False) -> Verdict:
    """logits (k+1, V), draft (k,) -> the longest agreeing prefix and the target's next token; with `probs`,
    the model's (and, given q, the drafter's) probability of each draft token too (for the app's hover)."""
    k = draft.shape[0]
    best = logits.argmax(-1).tolist()  # (k+1,): the step's one wait for the device (a GPU's), when greedy
    guesses = draft.tolist()
    accepted = next((i for i in range(k) if guesses[i] != best[i]), k)
    if not probs or not k:
        return Verdict(accepted=accepted, next_token=best[accepted], best=tuple(best))
    rows, d = torch.arange(k, device=logits.device), draft.to(logits.device)
    p = torch.softmax(logits[:k].float(), -1)[rows, d]
    q_of = tuple(q.to(logits.device).float()[rows, d].tolist()) if q is not None else ()
    return Verdict(accepted, best[accepted], tuple(p.tolist()), q_of, tuple(best))


class _Tested(NamedTuple):
    p: torch.Tensor  # (k+1, V) the processed target distributions
    q: torch.Tensor | None  # (k, V) the drafter's, on p's device, or None for point guesses
    draft: torch.Tensor  # (k,) on p's device
    p_d: torch.Tensor  # (k,) p of each draft token
    q_d: torch.Tensor  # (k,) q of each draft token (1 for a point guess)
    keep: torch.Tensor  # (k,) int64: 1 where the draft token's acceptance test passed


def _acceptance_tests(logits: torch.Tensor, draft: torch.Tensor, q: torch.Tensor | None, params: SamplingParams,
                      generator: torch.Generator | None) -> _Tested:
    """Each draft token's test, accept with probability min(1, p/q), drawn on the device."""
    k = draft.shape[0]
    p = process_logits(logits, params)  # (k+1, V)
    q = q.to(p.device) if q is not None else None
    draft = draft.to(p.device)
    rows = torch.arange(k, device=p.device)
    p_d = p[rows, draft]  # (k,)
    q_d = q[rows, draft] if q is not None else torch.ones_like(p_d)
    u = torch.rand(k, generator=generator, device=p.device)
    # u < p/q  <=>  u * q < p, which avoids dividing by q (q(d) > 0 for any token the drafter drew)
    return _Tested(p, q, draft, p_d, q_d, (u * q_d < p_d).long())


def _residuals(tested: _Tested, rows: slice) -> torch.Tensor:
    """max(0, p - q) at the draft positions `rows` (k', V), unnormalised: what a rejection there draws from. A point
    guess (q one-hot) leaves p with the guessed token removed. Where p == q up to rounding (a rejection had
    probability ~0) the row's p stands in."""
    p, draft = tested.p[rows], tested.draft[rows]
    if tested.q is not None:
        residual = (p - tested.q[rows]).clamp_min(0)
    else:
        residual = p.clone()
        residual[torch.arange(draft.shape[0], device=p.device), draft] = 0
    return torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)


def verify_sampling(logits: torch.Tensor, draft: torch.Tensor, q: torch.Tensor | None, params: SamplingParams,
                    generator: torch.Generator | None) -> Verdict:
    """logits (k+1, V), draft (k,), q (k, V) or None for one-hot -> Verdict by the exact rule."""
    k = draft.shape[0]
    tested = _acceptance_tests(logits, draft, q, params, generator)
    p, p_d, q_d = tested.p, tested.p_d, tested.q_d
    accepted = int(tested.keep.cumprod(0).sum()) if k else 0
    if accepted < k:
        residual = _residuals(tested, slice(accepted, accepted + 1))[0]
        next_token = int(sample(residual / residual.sum(), generator))
    else:
        next_token = int(sample(p[k], generator))
    return Verdict(accepted, next_token, tuple(p_d.tolist()), tuple(q_d.tolist()))


def verify_sampling_at_once(logits: torch.Tensor, draft: torch.Tensor, q: torch.Tensor | None, params: SamplingParams,
                            generator: torch.Generator | None) -> Verdict:
    """verify_sampling's rule with one wait for the device (a GPU's) instead of several: every row's
    replacement (a draw from its residual) and the bonus (a draw from p_k) are drawn at once, and the one
    at the first rejection (or the bonus) is kept. The draws are independent of the acceptance tests, so
    every emitted token is distributed as under verify_sampling; the random stream is consumed otherwise,
    so a seed gives another (equally exact) answer than on a CPU."""
    k = draft.shape[0]
    tested = _acceptance_tests(logits, draft, q, params, generator)
    p, p_d, q_d = tested.p, tested.p_d, tested.q_d
    accepted = tested.keep.cumprod(0).sum()  # stays on the device
    residual = _residuals(tested, slice(0, k))
    candidates = torch.cat([residual, p[k:]])  # (k+1, V): row i replaces draft i; row k is the bonus
    draws = torch.multinomial(candidates / candidates.sum(-1, keepdim=True), 1, generator=generator)[:, 0]
    out = torch.cat([accepted[None].double(), draws.double(), p_d.double(), q_d.double()]).tolist()
    n = int(out[0])
    return Verdict(n, int(out[1 + n]), tuple(out[2 + k : 2 + 2 * k]), tuple(out[2 + 2 * k :]))


# devices where a wait for the device costs more than the work it saves: sampling checks a pass with one
ONE_WAIT_DEVICES = frozenset({"cuda", "mps", "xpu"})


def verify(
    logits: torch.Tensor,
    draft: torch.Tensor,
    q: torch.Tensor | None,
    params: SamplingParams,
    generator: torch.Generator | None,
    probs: bool = False,
) -> Verdict:
    if params.greedy:
        return verify_greedy(logits, draft, q, probs)
    if logits.device.type in ONE_WAIT_DEVICES:
        return verify_sampling_at_once(logits, draft, q, params, generator)
    return verify_sampling(logits, draft, q, params, generator)


def walk_tree(best: list[int], tokens: list[int], tree: TokenTree) -> tuple[list[int], int]:
    """Greedy verification of a token tree scored in one pass. best[i]: the target's argmax after row
    i's path. From the root (row 0), follow the child holding the target's argmax while there is one
    -> (the rows of the kept path, root first; the target's next token)."""
    path = [0]
    while True:
        want = best[path[-1]]
        step = next((c for c in tree.children.get(path[-1], ()) if tokens[c] == want), None)
        if step is None:
            return path, want
        path.append(step)


def walk_tree_sampling(
    logits: torch.Tensor,
    tokens: list[int],
    tree: TokenTree,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[list[int], int]:
    """Verification of a token tree under sampling, by recursive rejection over siblings. Each draft
    token counts as a point guess (q = one-hot): at a node with target distribution p, its children are
    tried in order; child c is accepted with probability p(c), and on rejection p loses c and is
    renormalised before the next sibling. A node whose children are all rejected emits a token drawn
    from what is left of p; an accepted leaf emits one drawn from its own row. Every emitted token is
    then distributed exactly as under p, whatever tree the drafter built."""
    path = [0]
    while True:
        node = path[-1]
        p = process_logits(logits[node], params).clone()  # (V,)
        kids = tree.children.get(node, ())
        u = torch.rand(len(kids), generator=generator, device=p.device) if kids else None
        chosen = None
        for j, child in enumerate(kids):
            token = tokens[child]
            total = float(p.sum())
            if total <= 0:
                break
            if float(u[j]) * total < float(p[token]):
                chosen = child
                break
            p[token] = 0  # rejected: the next sibling is judged against what is left
        if chosen is None:
            if not float(p.sum()) > 0:
                p = process_logits(logits[node], params)
            return path, int(sample(p / p.sum(), generator))
        path.append(chosen)
