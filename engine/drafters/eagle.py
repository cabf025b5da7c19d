"""`eagle`: a trained head drafts from the target's own features (EAGLE, Li et al. 2024), as a chain or,
where the target's tree passes are exact, as an EAGLE-2 dynamic tree that also holds the conversation's own
continuation (prompt lookup's draft) as a branch.

Before drafting, the head reads the target's final hidden states of the positions kept since it last
drafted (the runner keeps them with its cache), with the embeddings of the tokens that followed them;
that also predicts the hidden state of the next position. The target's final norm and LM head turn each
prediction into a draft token, which is fed back with the predicted state. Rollback: the head's cache is
truncated to the positions it read with the target's real features. A read goes back READ_WINDOW positions
at most: after a long prompt (or many steps of another drafter) the head reads only the latest ones, which
drafted as well as the whole context on Spec-Bench's prompts, and its cache starts again from them.
"""

from __future__ import annotations

import math
import time

import torch

from ..api.strategies import STRATEGIES
from ..decoding.drafter import Draft, DraftContext, Drafter, empty_draft, running
from ..decoding.sampling import process_logits, sample
from ..decoding.tree import TokenTree
from ..heads.protocol import AutoregressiveHead
from ..heads.store import head_for_strategy
from ..models.layers import final_norm
from ..models.gguf import out_features, weight_device, weight_dtype, weight_rows
from .prompt_lookup import matched_continuation

TREE_CHILDREN = 4  # children looked at per expanded node
TREE_EXPAND = 3  # nodes expanded per level
TREE_MAX_NODES = 24
LOG_MIN_PATH = math.log(0.02)  # paths less likely than this are not expanded
DEFAULT_NODE_COST = 0.035  # a tree node's share of a plain pass's time on a CPU, before measuring
COST_DECAY = 0.95
LOOKUP_MAX_N = 16  # the longest match of the conversation's last tokens looked for (as prompt lookup's default)
# before measuring: the share of lookup nodes kept given their parent was, by match length (1, 2-3, 4+);
# measured on Spec-Bench's answers of the bundled model: 0.4-0.8
LOOKUP_PRIOR = {1: 0.4, 2: 0.6, 4: 0.75}
LOOKUP_PRIOR_WEIGHT = 4.0
LOOKUP_DECAY = 0.995
READ_WINDOW = 128  # the most positions a read goes back: a longer catch-up (a long prompt) reads only the latest
RUNNING_WEIGHT = 0.2  # of the newest value in a running figure (a level's or a read's time, the first guess's probability)


class Eagle(Drafter):
    name = "eagle"
    description = STRATEGIES[name].description
    POLICY = ("_lengths", "first_p")

    def __init__(self, head: AutoregressiveHead, target, stop_below: float = 0.3, tree: bool | None = False,
                 nodes: int | None = None, lookup: bool = False) -> None:
        model = target.model
        self.head = head
        # a published head's own copy of the embeddings where its file has one
        self.embed_layer = head.embed if head.embed is not None else model.get_input_embeddings()
        # Specula's heads read and predict final hidden states before the target's final norm; published
        # EAGLE heads after it (the norm goes on the features read, not on the predictions)
        self.normed = head.reads_normed
        # EAGLE-3 heads read the hidden states entering three of the target's layers, and have their own
        # final norm and LM head over their vocabulary
        self.aux_layers = tuple(head.aux_layers)
        self.own_logits = head.draft_logits if head.own_lm_head else None
        self.lm_head = model.get_output_embeddings()
        self.vocab = out_features(self.lm_head)
        # the head runs in the model's dtype: in fp32 its weights and the draft vocabulary's LM-head rows
        # are twice the bytes, and drafting on a CPU took 1.75x as long (docs/PERFORMANCE.md)
        self.dtype = next(head.parameters()).dtype
        norm_w, self.eps = final_norm(model)
        self.norm_w = norm_w.to(self.dtype)
        self.synced = 0  # positions the head has read with the target's real features
        # positions before this one were skipped (a read goes back READ_WINDOW positions at most): the head's
        # cache slot and rotary position of position p are p - offset (rotary attention sees differences only)
        self.offset = 0
        self.fresh = 1  # positions the last step kept: what a proposal after it reads without catching up
        ids = head.draft_ids
        self.ids = ids.to(weight_device(self.lm_head)) if ids.numel() else None
        self.sub_weight = (weight_rows(self.lm_head, self.ids).to(self.dtype).contiguous()
                           if self.ids is not None and self.own_logits is None else None)
        self.id_list = self.ids.tolist() if self.ids is not None else None
        self.stop_below = stop_below  # greedy: no further draft token once the head's top guess is less likely
        # an EAGLE-2 dynamic tree instead of a chain: True, False, or None: where the target's tree passes
        # decide as chain passes would (runner.exact_trees; its size then follows the measured costs)
        self.tree = tree
        self.nodes = nodes  # a tree's nodes; None: as many as the measured costs say pay
        self.costs = _Costs()
        self.lookup = _Lookup() if lookup else None  # trees also hold the conversation's own continuation
        self.level_s: float | None = None  # what one level of a tree's growth takes (the head over its nodes)
        self.read_s: float | None = None  # what reading a step's kept positions takes (no catch-up)
        self.first_p: float | None = None  # the head's recent probability of its first guess
        self.deferred = False  # this step drafted prompt lookup's branch alone, without the head

    @classmethod
    def build(cls, target, draft=None, head=None, tree=None, lookup=None, **options) -> "Eagle":
        module = head_for_strategy(target, head, "eagle", "a trained draft head (--head DIR; make one with `specula train-head`)")
        return cls(module, target, tree=None if tree is None else bool(tree), lookup=lookup is None or bool(lookup))

    def reset(self) -> None:
        self.head.truncate(0)
        self.synced = self.offset = 0
        self.fresh = 1
        self.costs.pending = None  # the time between generations is no pass
        self.deferred = False
        if self.lookup is not None:
            self.lookup.pending.clear()  # what it learned stays; the new answer's tokens judge no old draft

    def sends_tree(self, ctx: DraftContext) -> bool:
        """Forced by the `tree` option, else greedy steps where the target's tree passes decide as chains do.
        Sampled steps draft chains by default: a chain's tokens carry the head's distribution (each kept with
        probability min(1, p/q)), a tree's nodes count as point guesses."""
        if self.tree is not None:
            return self.tree
        return ctx.params.greedy and ctx.target is not None and ctx.target.exact_trees

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, k: int) -> Draft:
        length = ctx.tokens.shape[0]
        self.costs.book()  # the pass over the last tree ended with this call
        tree = k > 0 and self.sends_tree(ctx)  # under sampling its nodes count as point guesses
        branch = self.lookup.draft(ctx.tokens, k) if tree and self.lookup is not None else ([], [])
        if branch[0] and self._lookup_alone(ctx, branch[1][0]):
            self.deferred = True  # the head reads this step's positions with the next step's
            self.catch_up_s = 0.0
            return Draft(torch.tensor(branch[0], dtype=torch.long))
        out = self.read(ctx)
        if k <= 0 or out is None:
            return empty_draft()
        device = out.device
        greedy = ctx.params.greedy
        if tree:
            return self._dynamic_tree(out, ctx, k, branch)
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        for j in range(k):
            if greedy:
                best = torch.softmax(self._draft_logits(out[None])[0], -1).max(-1)  # over the draft vocabulary
                if j > 0 and float(best.values) < self.stop_below:
                    break  # an unlikely guess costs more verify time than it is expected to win
                token = self._token(int(best.indices))
                drafted.append(token)
            else:
                q = process_logits(self._logits(out), ctx.params)  # (V,) fp32, zero outside the draft vocabulary
                token = int(sample(q, ctx.generator))
                qs.append(q)
                drafted.append(token)
            if j + 1 < k:
                emb = self.embed(torch.tensor([token], device=device))
                out = self.head(out[None, None], emb[None], start=length - 1 + j - self.offset, use_cache=True)[0, -1]
        return Draft(torch.tensor(drafted, dtype=torch.long), torch.stack(qs) if qs else None)

    def _dynamic_tree(self, out: torch.Tensor, ctx: DraftContext, k: int, branch: tuple[list[int], list[float]]) -> Draft:
        """EAGLE-2: grow a tree level by level, expanding the nodes whose whole path is most likely under
        the head, while a level's expected tokens are worth its time (`_worth_a_level`); add the conversation's
        own continuation where it has one (`branch`: `_Lookup.draft`'s); then keep the most likely nodes, as
        many as the measured costs say pay."""
        t0 = time.perf_counter()
        device = out.device
        base = self.synced - self.offset  # cache slots below this hold the real context
        top = torch.log_softmax(self._draft_logits(out[None])[0], -1).topk(TREE_CHILDREN)
        tokens = [self._token(i) for i in top.indices.tolist()]
        score = top.values.tolist()  # log-probability of each node's whole path
        self.first_p = running(self.first_p, math.exp(score[0]), RUNNING_WEIGHT)
        parent = [-1] * len(tokens)
        depth = [1] * len(tokens)
        feeds = [out] * len(tokens)  # the feature that goes with a node's token when it is expanded
        slot_of: dict[int, int] = {}  # expanded node -> its cache slot
        frontier = list(range(len(tokens)))
        used = 0
        for level in range(1, k):
            pick = sorted(frontier, key=lambda i: -score[i])[:TREE_EXPAND]
            pick = [i for i in pick if score[i] > LOG_MIN_PATH]
            if not pick or not self._worth_a_level(ctx, pick, score):
                break
            t_level = time.perf_counter()
            slot = base + used
            visible = torch.zeros(len(pick), slot + len(pick), dtype=torch.bool, device=device)
            visible[:, :base] = True
            for row, i in enumerate(pick):
                visible[row, slot + row] = True
                a = parent[i]
                while a >= 0:
                    visible[row, slot_of[a]] = True
                    a = parent[a]
                slot_of[i] = slot + row
            used += len(pick)
            feats = torch.stack([feeds[i] for i in pick])
            embeds = self.embed(torch.tensor([tokens[i] for i in pick], device=device))
            positions = torch.tensor([base + level - 1] * len(pick), device=device)
            outs = self.head.forward_tree(feats, embeds, positions, slot, visible)
            child = torch.log_softmax(self._draft_logits(outs), -1).topk(TREE_CHILDREN)
            self.level_s = running(self.level_s, time.perf_counter() - t_level, RUNNING_WEIGHT)
            frontier = []
            for row, i in enumerate(pick):
                for lp, index in zip(child.values[row].tolist(), child.indices[row].tolist()):
                    frontier.append(len(tokens))
                    tokens.append(self._token(index))
                    score.append(score[i] + lp)
                    parent.append(i)
                    depth.append(level + 1)
                    feeds.append(outs[row])
        if branch[0]:  # a node both propose is one node, as likely as the likelier says
            node = -1
            for d, (token, p) in enumerate(zip(*branch), 1):
                child = next((i for i, (t, a) in enumerate(zip(tokens, parent)) if a == node and t == token), None)
                if child is None:
                    child = len(tokens)
                    tokens.append(token)
                    score.append(-math.inf)
                    parent.append(node)
                    depth.append(d)
                score[child] = max(score[child], math.log(max(p, 1e-9)))
                node = child
        ranked = sorted(range(len(tokens)), key=lambda i: -score[i])
        n = self.nodes or self.costs.budget([math.exp(score[i]) for i in ranked], (time.perf_counter() - t0))
        keep = set(ranked[:n])
        for i in list(keep):  # a kept node's ancestors are kept too (ties can rank a child first)
            a = parent[i]
            while a >= 0 and a not in keep:
                keep.add(a)
                a = parent[a]
        order = sorted(keep, key=lambda i: (depth[i], -score[i]))
        index = {node: j for j, node in enumerate(order)}
        self.costs.proposed(len(order), sum(math.exp(score[i]) for i in order))
        return Draft(torch.tensor([tokens[i] for i in order], dtype=torch.long),
                     tree=TokenTree.of_draft([index[parent[i]] if parent[i] >= 0 else -1 for i in order]))

    def _lookup_alone(self, ctx: DraftContext, lookup_p: float) -> bool:
        """Whether the step drafts prompt lookup's branch alone: when what the head's first guesses may add
        where the branch's first node fails (1 - lookup_p, times the head's recent first-guess probability,
        scaled as its paths are) is worth less of a plain step's time than reading the step's positions takes.
        Timed greedy trees of a measured size only: a fixed-size tree always asks the head."""
        if self.nodes is not None or not ctx.timed or not ctx.plain_s or self.read_s is None or self.first_p is None:
            return False
        return (1 - lookup_p) * self.first_p * self.costs.calibration() * ctx.plain_s < self.read_s

    def _worth_a_level(self, ctx: DraftContext, pick: list[int], score: list[float]) -> bool:
        """Whether the head's next level is worth its time: the likeliest path it extends (its probability
        scaled by how many tokens the head's probabilities have been worth) times a plain step's time, against
        what a level has taken. Trees of a fixed size, untimed steps and a first level grow to their depth."""
        if self.nodes is not None or not ctx.timed or not ctx.plain_s or self.level_s is None:
            return True
        return math.exp(max(score[i] for i in pick)) * self.costs.calibration() * ctx.plain_s > self.level_s

    def read(self, ctx: DraftContext) -> torch.Tensor | None:
        """Read the features of the positions kept since the last call; the head's prediction of the
        newest position's feature (D,), or None when the target keeps no features."""
        runner, length = ctx.target, ctx.tokens.shape[0]
        self.catch_up_s = 0.0
        if runner is None or not runner.keeps_features or length - 1 > runner.length or self.synced >= length - 1:
            return None
        if self.aux_layers and tuple(runner.aux_layers) != self.aux_layers:  # it keeps other layers
            return None
        if length - 1 - self.synced > READ_WINDOW:  # far behind: the latest positions are what the drafts need
            self.synced = self.offset = length - 1 - READ_WINDOW
        self.head.truncate(self.synced - self.offset)
        behind = length - 1 - self.synced
        if behind > self.fresh:  # positions of steps it did not propose for: read first, timed apart
            t0 = time.perf_counter()
            self._read(runner, ctx.tokens, length - 1 - self.fresh)
            self.catch_up_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = self._read(runner, ctx.tokens, length - 1)
        self.read_s = running(self.read_s, time.perf_counter() - t0, RUNNING_WEIGHT)
        return out

    def _read(self, runner, tokens: torch.Tensor, end: int) -> torch.Tensor:
        """The head over positions synced..end-1 with the target's features; its output at the last."""
        feats = (runner.aux_features if self.aux_layers else runner.features)(self.synced, end).to(self.dtype)
        if self.normed:
            feats = self._norm(feats)
        nexts = tokens[self.synced + 1 : end + 1].to(feats.device)
        out = self.head(feats[None], self.embed(nexts)[None], start=self.synced - self.offset, use_cache=True)[0, -1]
        self.synced = end
        return out

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_layer(tokens).to(self.dtype)

    def _norm(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm_w * torch.nn.functional.rms_norm(h, (h.shape[-1],), eps=self.eps)

    def _out(self, outs: torch.Tensor) -> torch.Tensor:
        """Predicted features -> what the LM head reads."""
        return outs if self.normed else self._norm(outs)

    def _logits(self, out: torch.Tensor) -> torch.Tensor:
        """(D,) -> (V,) fp32 logits, -inf outside the draft vocabulary."""
        if self.ids is None:
            if self.own_logits is not None:
                return self.own_logits(out[None])[0][: self.vocab]
            return self.lm_head(self._out(out[None]).to(weight_dtype(self.lm_head)))[0].float()[: self.vocab]
        full = torch.full((self.vocab,), float("-inf"), device=out.device)
        full[self.ids] = self._draft_logits(out[None])[0]
        return full

    def _draft_logits(self, outs: torch.Tensor) -> torch.Tensor:
        """(n, D) predicted features -> (n, V') fp32 logits over the draft vocabulary (all of it if none)."""
        if self.own_logits is not None:
            return self.own_logits(outs)
        h = self._out(outs)
        if self.ids is None:
            return self.lm_head(h.to(weight_dtype(self.lm_head))).float()[:, : self.vocab]
        return torch.nn.functional.linear(h, self.sub_weight).float()

    def _token(self, index: int) -> int:
        """A draft-vocabulary index -> the token id."""
        return int(self.id_list[index]) if self.ids is not None else index

    def observe(self, accepted: int, next_token: int) -> None:
        if not self.deferred:
            self.costs.accepted(accepted)  # the next propose() re-reads the kept positions with real features
        # after a step without the head, the next reads its positions too: no catch-up, its own cost
        self.fresh = accepted + 1 + (self.fresh if self.deferred else 0)
        self.deferred = False

    def passed(self, accepted: int) -> None:
        self.fresh = accepted + 1  # the positions before this step's are caught up on


class _Lookup:
    """The conversation's own continuation as a branch of eagle's trees: what followed the latest longest
    earlier match of its last tokens (prompt lookup's draft, twice the match long at most), each node valued
    at the share of such nodes the target kept given their parent was, by match length (1, 2-3, 4 or more)
    and depth. Each draft is judged against the tokens the answer went on with, once they are there."""

    def __init__(self) -> None:
        self.counts: dict[tuple[int, int], list[float]] = {}  # (match bucket, depth) -> [kept, judged], decayed
        self.pending: list[list] = []  # [length when drafted, bucket, tokens, depths judged]

    def draft(self, context: torch.Tensor, k: int) -> tuple[list[int], list[float]]:
        """(tokens, the probability that each node and its ancestors are kept)."""
        self.judge(context)
        n, found = matched_continuation(context, k, LOOKUP_MAX_N)
        if n == 0 or k <= 0:
            return [], []
        path = found.tolist()
        bucket = 1 if n == 1 else 2 if n <= 3 else 4
        self.pending = self.pending[-15:] + [[context.shape[0], bucket, path, 0]]
        probs, p = [], 1.0
        for d in range(1, len(path) + 1):
            p *= self.rate(bucket, d)
            probs.append(p)
        return path, probs

    def rate(self, bucket: int, depth: int) -> float:
        kept, judged = self.counts.get((bucket, depth), (0.0, 0.0))
        return (kept + LOOKUP_PRIOR[bucket] * LOOKUP_PRIOR_WEIGHT) / (judged + LOOKUP_PRIOR_WEIGHT)

    def judge(self, context: torch.Tensor) -> None:
        """Count each pending draft's nodes whose tokens the answer has reached, up to the first wrong one."""
        length = context.shape[0]
        left = []
        first = min((item[0] for item in self.pending), default=length)
        answer = context[first:length].tolist() if length > first else []  # once for every pending draft
        for item in self.pending:
            at, bucket, path, judged = item
            known = answer[at - first :] if length >= at else []
            done = False
            while judged < min(len(path), len(known)):
                right = path[judged] == known[judged]
                judged += 1
                count = self.counts.setdefault((bucket, judged), [0.0, 0.0])
                count[0] = LOOKUP_DECAY * count[0] + right
                count[1] = LOOKUP_DECAY * count[1] + 1.0
                if not right:
                    done = True
                    break
            item[3] = judged
            if not done and judged < len(path) and length >= at:
                left.append(item)
        self.pending = left


class _Costs:
    """How large a tree pays: the head's path probabilities say how many tokens each extra node is
    expected to add; the measured pass times say what it costs.

    A pass with n tree nodes is timed from the end of drafting to the next proposal and fitted as
    a + b * n (decayed least squares). The head's probabilities are scaled by how many tokens were
    really accepted per expected one. The budget is the n that maximises
    (1 + c * sum of the n largest path probabilities) / (drafting + a + b * n)."""

    def __init__(self) -> None:
        self.sw = self.sn = self.sy = self.snn = self.sny = 0.0
        self.got = self.expected = 1.0
        self.pending: tuple[float, int] | None = None  # (end of drafting, nodes) of the pass under way

    def calibration(self) -> float:
        """Tokens kept per token the head's path probabilities expected, lately (at most 1.5)."""
        return min(1.5, self.got / self.expected)

    def budget(self, probs: list[float], draft_s: float) -> int:
        a, b = self._fit()
        c = self.calibration()
        best, best_rate, total = 1, 0.0, 0.0
        for n, p in enumerate(probs[:TREE_MAX_NODES], 1):
            total += p
            rate = (1 + c * total) / (draft_s + a + b * n)
            if rate > best_rate:
                best, best_rate = n, rate
        return best

    def _fit(self) -> tuple[float, float]:
        if self.sw < 3:
            return 1.0, DEFAULT_NODE_COST  # in units of one plain pass, until there are measurements
        n_mean, y_mean = self.sn / self.sw, self.sy / self.sw
        var = self.snn / self.sw - n_mean**2
        b = (self.sny / self.sw - n_mean * y_mean) / var if var > 1e-6 else DEFAULT_NODE_COST * y_mean
        b = max(b, 1e-3 * y_mean)
        return max(1e-6, y_mean - b * n_mean), b

    def proposed(self, nodes: int, expected: float) -> None:
        self.pending = (time.perf_counter(), nodes)
        self.expected = COST_DECAY * self.expected + expected

    def accepted(self, n: int) -> None:
        self.got = COST_DECAY * self.got + n

    def book(self) -> None:
        if self.pending is None:
            return
        start, n = self.pending
        y = time.perf_counter() - start
        self.pending = None
        for attr, value in (("sw", 1.0), ("sn", n), ("sy", y), ("snn", n * n), ("sny", n * y)):
            setattr(self, attr, COST_DECAY * getattr(self, attr) + value)
