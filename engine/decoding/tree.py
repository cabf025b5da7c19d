"""A verify pass's rows as a token tree, built once per step and read by everyone who needs its shape.

Row 0 is the newest context token; every other row is a draft token that continues its parent row
(`parents[row] < row`). A chain is the tree whose every row continues the one before it. The target's
forward reads the tree's positions (a row sits at the depth of its path) and which rows each row sees
(`ancestors`); verify walks it from the root; the loop keeps one root-to-node path and names the branch
it kept. Medusa and EAGLE's buffers hold the same things (Cai et al. 2024; Li et al. 2024).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True)
class TokenTree:
    parents: tuple[int, ...]  # per row; row 0 (the newest context token) has -1

    def __post_init__(self) -> None:
        if not self.parents or self.parents[0] != -1:
            raise ValueError("a token tree's row 0 is the newest context token, with parent -1")
        for row, parent in enumerate(self.parents[1:], 1):
            if not 0 <= parent < row:
                raise ValueError(f"row {row} has parent {parent}: parents come before their children")

    @classmethod
    def chain(cls, drafted: int) -> "TokenTree":
        """The newest token and `drafted` draft tokens, each continuing the one before."""
        return cls(tuple(range(-1, drafted)))

    @classmethod
    def of_draft(cls, parents: list[int]) -> "TokenTree":
        """A drafter's tree from each draft token's parent (-1: the newest context token, else the index of an
        earlier draft token): row 0 is the newest context token, row i + 1 draft token i."""
        return cls((-1, *(parent + 1 for parent in parents)))

    def cut(self, max_depth: int) -> tuple["TokenTree", list[int]]:
        """The tree without its rows deeper than `max_depth` (a pass's draft length) -> that tree, and the
        draft index (row - 1 here) of each of its draft rows."""
        rows, kept = [-1], []
        row_of = {0: 0}
        for row, parent in enumerate(self.parents[1:], 1):
            if self.depth[row] <= max_depth:
                row_of[row] = len(rows)
                rows.append(row_of[parent])
                kept.append(row - 1)
        return TokenTree(tuple(rows)), kept

    def __len__(self) -> int:
        return len(self.parents)

    @cached_property
    def depth(self) -> tuple[int, ...]:
        """Each row's distance from row 0: its position after the cache's end is start + depth."""
        depth = [0] * len(self.parents)
        for row, parent in enumerate(self.parents[1:], 1):
            depth[row] = depth[parent] + 1
        return tuple(depth)

    @property
    def height(self) -> int:
        """The longest path's draft tokens: the most a pass over this tree can keep."""
        return max(self.depth)

    @cached_property
    def is_chain(self) -> bool:
        return all(parent == row - 1 for row, parent in enumerate(self.parents))

    @cached_property
    def children(self) -> dict[int, tuple[int, ...]]:
        """The rows that continue each row, in row order (the drafter's order of preference)."""
        kids: dict[int, list[int]] = {}
        for row, parent in enumerate(self.parents[1:], 1):
            kids.setdefault(parent, []).append(row)
        return {row: tuple(rows) for row, rows in kids.items()}

    @cached_property
    def _ancestors(self) -> torch.Tensor:
        seen = torch.eye(len(self.parents), dtype=torch.bool)  # (T, T)
        for row, parent in enumerate(self.parents[1:], 1):
            seen[row] |= seen[parent]
        return seen

    def ancestors(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """(T, T) bool: [i, j] is true when row j is row i or an ancestor of it (what row i attends to)."""
        return self._ancestors.to(device)

    def depths(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.tensor(self.depth, device=device)

    def branch(self, rows: list[int]) -> str:
        """Which branch a kept root-to-node path took: the rank of each kept node among its siblings (1 =
        the drafter's first choice), e.g. "tree of 14 nodes, kept path 1·2·1"."""
        ranks = [str(self.children[self.parents[row]].index(row) + 1) for row in rows[1:]]
        return f"tree of {len(self.parents) - 1} nodes, kept path {'·'.join(ranks) or 'none (all rejected)'}"

    def first_choices_below(self, row: int) -> list[int]:
        """The rows of the drafter's first-choice continuation below `row` (the ghost text after a step)."""
        below = []
        while self.children.get(row):
            row = self.children[row][0]
            below.append(row)
        return below


def graft(tokens: list[int], parents: list[int], branch: list[int], admit=lambda depth: True) -> list[int]:
    """Add `branch` (tokens continuing the newest context token) to a drafter's tree, given as its draft tokens and
    their parents (-1: the newest context token; TokenTree.of_draft), in place: where a node under the same parent
    already holds the token, the branch runs through it; a new node joins while `admit(its depth index)` says so.
    -> the draft indices of the branch's nodes, root side first."""
    node, path = -1, []
    for depth, token in enumerate(branch):
        child = next((i for i, (t, p) in enumerate(zip(tokens, parents)) if p == node and t == token), None)
        if child is None:
            if not admit(depth):
                break
            child = len(tokens)
            tokens.append(token)
            parents.append(node)
        node = child
        path.append(child)
    return path
