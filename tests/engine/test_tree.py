"""Token trees: one target pass over a tree gives every node the logits its own path would get, and
keeping one path leaves the cache as if only that path had been fed."""

import dataclasses

import pytest
import torch

from specula.engine.decoding.drafter import Draft, Drafter
from specula.engine.decoding.tree import TokenTree
from tests.support.tiny import loaded, tiny_model

# row 0 continues the cache; rows 1-2 are children of row 0, 3-4 of row 1, 5 of row 3, 6 of row 2
PARENTS = [-1, 0, 0, 1, 1, 3, 2]


def path_to(row: int) -> list[int]:
    rows = [row]
    while PARENTS[rows[-1]] >= 0:
        rows.append(PARENTS[rows[-1]])
    return rows[::-1]


@pytest.fixture(scope="module", params=["blocked", "fused"])
def model(request):
    target = loaded(tiny_model(vocab=64, layers=3, seed=2))
    target.blocked = request.param == "blocked"
    return target


def runner(model):
    r = model.new_runner()
    if not model.blocked:  # the kernel GPUs use, over a cache in the model's dtype
        r.blocked, r.consistent = False, False
        r.cache.shape = dataclasses.replace(r.cache.shape, kv_dtype=r.dtype)
    return r


def test_each_node_gets_the_logits_of_its_own_path(model):
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 64, (37,), generator=gen)
    tree = torch.randint(0, 64, (len(PARENTS),), generator=gen)
    r = runner(model)
    r.forward(prompt)
    logits = r.forward(tree, last=len(PARENTS), tree=TokenTree(tuple(PARENTS)))
    for row in range(len(PARENTS)):
        chain = runner(model)
        chain.forward(prompt)
        expected = chain.forward(tree[path_to(row)], last=1)[0]
        assert torch.allclose(logits[row], expected, atol=1e-5), row


def test_keeping_a_path_equals_feeding_only_that_path(model):
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 64, (20,), generator=gen)
    tree = torch.randint(0, 64, (len(PARENTS),), generator=gen)
    after = torch.randint(0, 64, (3,), generator=gen)
    path = path_to(5)  # rows 0, 1, 3, 5
    r = runner(model)
    r.forward(prompt)
    r.forward(tree, last=len(PARENTS), tree=TokenTree(tuple(PARENTS)))
    r.keep(20, path)
    assert r.length == 20 + len(path)
    got = r.forward(after, last=3)
    fresh = runner(model)
    expected = fresh.forward(torch.cat([prompt, tree[path], after]), last=3)
    assert torch.allclose(got, expected, atol=1e-5)
    # the kept path's features moved with its keys and values
    assert torch.allclose(r.features(0, r.length), fresh.features(0, fresh.length), atol=1e-5)


def test_a_child_before_its_parent_is_refused(model):
    r = runner(model)
    r.forward(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError):
        r.forward(torch.tensor([4, 5, 6]), last=3, tree=TokenTree((-1, 2, 0)))


class TreeOracle(Drafter):
    """A drafter that proposes token trees around the known greedy answer: at every level the right
    token sits among wrong siblings (at a random place), and sometimes the right one is missing."""

    name = "tree-oracle"

    def __init__(self, answer: list[int], prompt_len: int, seed: int) -> None:
        self.answer, self.prompt_len = answer, prompt_len
        self.gen = torch.Generator().manual_seed(seed)

    def propose(self, ctx, k):
        done = ctx.tokens.shape[0] - self.prompt_len
        tokens, parents, parent = [], [], -1
        for level in range(k):
            right = self.answer[done + level] if done + level < len(self.answer) else 0
            options = torch.randint(0, 64, (3,), generator=self.gen).tolist()
            if torch.rand(1, generator=self.gen) < 0.8:
                options[int(torch.randint(0, 3, (1,), generator=self.gen))] = right
            chain = None
            for token in options:
                tokens.append(token)
                parents.append(parent)
                if token == right and chain is None:
                    chain = len(tokens) - 1
            if chain is None:
                break
            parent = chain
        return Draft(torch.tensor(tokens), tree=TokenTree.of_draft(parents))


def test_the_decoder_keeps_the_agreeing_path_of_a_tree(model):
    from specula.engine.api.events import Step
    from specula.engine.api.types import DecodeConfig
    from specula.engine.decoding.loop import generate
    from specula.engine.drafters import build_drafter

    gen = torch.Generator().manual_seed(4)
    accepted = 0
    for trial in range(6):
        prompt = torch.randint(0, 64, (int(torch.randint(3, 30, (1,), generator=gen)),), generator=gen).tolist()
        config = DecodeConfig(k=1 + trial % 5, max_new_tokens=40)
        base = list(generate(runner(model), build_drafter("none", model), prompt, config))[-1]
        drafter = TreeOracle(list(base.token_ids), len(prompt), trial)
        events = list(generate(runner(model), drafter, prompt, config))
        assert events[-1].token_ids == base.token_ids, trial
        streamed = [t.id for e in events if isinstance(e, Step) for t in e.tokens]
        assert tuple(streamed) == base.token_ids
        accepted += events[-1].totals.accepted
    assert accepted > 20


def test_a_tree_knows_its_depths_children_and_what_each_row_sees():
    tree = TokenTree(tuple(PARENTS))
    assert tree.depth == (0, 1, 1, 2, 2, 3, 2) and tree.height == 3 and not tree.is_chain
    assert tree.children == {0: (1, 2), 1: (3, 4), 2: (6,), 3: (5,)}
    seen = tree.ancestors()
    for row in range(len(PARENTS)):
        assert seen[row].nonzero().flatten().tolist() == sorted(path_to(row))
    assert tree.branch([0, 1, 4]) == "tree of 6 nodes, kept path 1·2" and tree.branch([0]).endswith("none (all rejected)")
    assert tree.first_choices_below(0) == [1, 3, 5] and tree.first_choices_below(4) == []


def test_a_chain_is_the_tree_whose_rows_continue_each_other():
    chain = TokenTree.chain(4)
    assert chain.parents == (-1, 0, 1, 2, 3) and chain.is_chain and chain.height == 4
    assert chain.first_choices_below(1) == [2, 3, 4] and TokenTree.chain(0).height == 0


def test_a_drafters_tree_is_cut_at_the_draft_length_with_its_draft_indices():
    # draft tokens 0..5: 0 and 1 under the newest token, 2 under 0, 3 under 2, 4 under 3, 5 under 1
    drafted = TokenTree.of_draft([-1, -1, 0, 2, 3, 1])
    assert drafted.parents == (-1, 0, 0, 1, 3, 4, 2)
    tree, kept = drafted.cut(2)
    assert kept == [0, 1, 2, 5] and tree.parents == (-1, 0, 0, 1, 2)
    whole, every = drafted.cut(9)
    assert every == list(range(6)) and whole.height == 4 and whole == drafted
    with pytest.raises(ValueError):
        TokenTree.of_draft([-1, 2, 0])  # a parent after its child
