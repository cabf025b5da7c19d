"""`medusa`: trained heads guess the next few tokens at once from the target's last feature, and a static
token tree of their top guesses goes to the target in one pass (Medusa, Cai et al. 2024).

The decoder feeds the newest token at the start of each pass, so the target's cache ends one position
before it: from that position's feature, head i guesses the token i + 1 places after the newest one.
The tree below (ranks of each head's guesses along a path) is verified greedily, or under sampling by
recursive rejection over siblings (verify.walk_tree_sampling), which keeps the target's distribution.
Where the target's tree passes are not bit-exact (bf16 on a CPU), the top guesses go as a chain unless
the `tree` option asks for the tree."""

from __future__ import annotations

import torch

from ..api.strategies import STRATEGIES
from ..decoding.drafter import Draft, DraftContext, empty_draft, sends_tree
from ..heads.store import head_for_strategy

# paths of guess ranks, e.g. (0, 1): head 0's best guess, then head 1's second best below it; parents
# come before children. Ten nodes: on a CPU each extra node adds about 1 ms to a pass.
TREE = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 0, 0, 0), (2,))


class Medusa:
    name = "medusa"
    learns_from_tree = False
    chooses_length = False
    description = STRATEGIES[name].description

    def __init__(self, head, target, tree=TREE, force_tree: bool | None = None) -> None:
        model = target.model
        self.head = head
        self.norm = model.model.norm
        self.lm_head = model.get_output_embeddings()
        self.vocab = self.lm_head.weight.shape[0]
        ids = head.draft_ids
        self.ids = ids.to(self.lm_head.weight.device) if ids.numel() else None
        self.weight = self.lm_head.weight[self.ids].contiguous() if self.ids is not None else self.lm_head.weight
        self.tree = tuple(path for path in tree if len(path) <= len(head.blocks))
        self.width = 1 + max(rank for path in self.tree for rank in path)
        self.force_tree = force_tree  # None: a tree where the target decides trees exactly, else the top chain

    @classmethod
    def build(cls, target, draft=None, head=None, tree=None, **options) -> "Medusa":
        module = head_for_strategy(target, head, "medusa",
                                   "trained heads (--head DIR; make them with `specula train-head --kind medusa`)")
        return cls(module, target, force_tree=None if tree is None else bool(tree))

    def reset(self) -> None:
        pass

    def logits(self, feature: torch.Tensor) -> torch.Tensor:
        """feature (D,) -> each head's logits over the draft vocabulary (heads, V'), fp32."""
        h = self.norm(self.head(feature[None]))[:, 0]  # (heads, D)
        return torch.nn.functional.linear(h, self.weight).float()

    def _full(self, index: torch.Tensor) -> torch.Tensor:
        return self.ids[index] if self.ids is not None else index

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, k: int) -> Draft:
        runner, length = ctx.target, ctx.tokens.shape[0]
        if k <= 0 or length < 2 or runner is None or not runner.keeps_features or runner.length < length - 1:
            return empty_draft()
        logits = self.logits(runner.features(length - 2, length - 1)[0])  # (heads, V')
        depth = min(k, logits.shape[0])
        if not sends_tree(self.force_tree, runner):
            return Draft(self._full(logits[:depth].argmax(-1)).cpu())  # the top guesses as a chain
        top = self._full(logits[:depth].topk(self.width, dim=-1).indices).tolist()  # (depth, width)
        index: dict[tuple[int, ...], int] = {}
        drafted, parents = [], []
        for path in self.tree:
            if len(path) > depth or path[:-1] not in index and len(path) > 1:
                continue
            index[path] = len(drafted)
            drafted.append(top[len(path) - 1][path[-1]])
            parents.append(index[path[:-1]] if len(path) > 1 else -1)
        return Draft(torch.tensor(drafted, dtype=torch.long), None, torch.tensor(parents))

    def observe(self, accepted: int, next_token: int) -> None:
        pass
