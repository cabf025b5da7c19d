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
from ..decoding.drafter import Draft, DraftContext, Drafter, empty_draft, sends_tree
from ..decoding.tree import TokenTree
from ..heads.protocol import MultiTokenHead
from ..heads.store import head_for_strategy
from ..models.gguf import out_features, weight_device, weight_rows

# paths of guess ranks, e.g. (0, 1): head 0's best guess, then head 1's second best below it; parents
# come before children. Ten nodes: on a CPU each extra node adds about 1 ms to a pass.
TREE = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 0, 0, 0), (2,))


class Medusa(Drafter):
    name = "medusa"
    description = STRATEGIES[name].description

    def __init__(self, head: MultiTokenHead, target, tree=TREE, force_tree: bool | None = None) -> None:
        model = target.model
        self.head = head
        self.norm = model.model.norm
        self.lm_head = model.get_output_embeddings()
        self.vocab = out_features(self.lm_head)
        ids = head.draft_ids
        self.ids = ids.to(weight_device(self.lm_head)) if ids.numel() else None
        self.weight = weight_rows(self.lm_head, self.ids if self.ids is not None else slice(None)).contiguous()
        self.tree = tuple(path for path in tree if len(path) <= len(head.blocks))
        self.width = 1 + max(rank for path in self.tree for rank in path)
        self.force_tree = force_tree  # None: a tree where the target decides trees exactly, else the top chain
        self._shapes: dict[int, tuple[list[tuple[int, ...]], torch.Tensor]] = {}

    @classmethod
    def build(cls, target, draft=None, head=None, tree=None, **options) -> "Medusa":
        module = head_for_strategy(target, head, "medusa",
                                   "trained heads (--head DIR; make them with `specula train-head --kind medusa`)")
        return cls(module, target, force_tree=None if tree is None else bool(tree))

    def logits(self, feature: torch.Tensor) -> torch.Tensor:
        """feature (D,) -> each head's logits over the draft vocabulary (heads, V'), fp32."""
        if self.head.reads_normed:  # published heads: the normed feature, their own LM heads
            return self.head.head_logits(self.norm(feature[None]), self.lm_head)
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
        paths, tree = self._shape(depth)
        return Draft(torch.tensor([top[len(path) - 1][path[-1]] for path in paths], dtype=torch.long), tree=tree)

    def _shape(self, depth: int) -> tuple[list[tuple[int, ...]], TokenTree]:
        """The tree's paths no deeper than `depth`, and the tree they make (each path's parent the path one
        shorter): the same every step, so built once per depth."""
        if depth not in self._shapes:
            index: dict[tuple[int, ...], int] = {}
            paths, parents = [], []
            for path in self.tree:
                if len(path) > depth or len(path) > 1 and path[:-1] not in index:
                    continue
                index[path] = len(paths)
                paths.append(path)
                parents.append(index[path[:-1]] if len(path) > 1 else -1)
            self._shapes[depth] = (paths, TokenTree.of_draft(parents))
        return self._shapes[depth]
