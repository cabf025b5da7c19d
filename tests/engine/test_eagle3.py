"""Specula's own EAGLE-3 heads: training unrolls the head exactly as drafting feeds it its own outputs
(training-time test), a head trained briefly on a tiny model's answers predicts its tokens, loads as an
eagle head, drafts, and every answer stays the target's own."""

import copy
import json

import pytest
import torch

from specula.engine.api.errors import SpeculaError
from specula.engine.api.events import Finished
from specula.engine.api.types import DecodeConfig
from specula.engine.decoding.loop import generate
from specula.engine.drafters import build_drafter
from specula.engine.heads.config import HeadConfig
from specula.engine.heads.eagle3 import Eagle3Head, default_aux_layers
from specula.engine.heads.store import load_head, save_head
from specula.engine.heads.train import TARGET_TOP, frequent_tokens, head_info, train_head, unrolled_acceptance
from specula.engine.heads.train.features import features_of
from specula.engine.heads.train.frozen import Frozen
from specula.engine.heads.train.losses import eagle3_loss
from specula.engine.models.loading import LoadedModel
from tests.engine.test_eagle import greedy
from tests.support.tiny import loaded, one_torch_thread, tiny_model


def test_default_layers_are_a_low_a_middle_and_a_high_one():
    assert default_aux_layers(30) == (2, 15, 27)
    assert default_aux_layers(32) == (2, 16, 29)
    assert default_aux_layers(2) == (0, 1)  # tiny models: as many distinct layers as there are


@pytest.mark.parametrize("start", [1, 3, 8])
def test_the_unrolled_steps_are_what_drafting_computes(start):
    """Step k's output at row start-1+k of `unrolled` is the k-th draft of a chain that read the target's
    states up to position start-1 and then fed the head its own outputs (the tokens the answer's own)."""
    torch.manual_seed(0)
    config = HeadConfig(hidden=32, heads=4, kv_heads=2, head_dim=8, intermediate=48, aux_layers=(0, 2, 3), draft_vocab=20)
    head = Eagle3Head(config).eval()
    aux = torch.randn(1, 14, 96)
    embeds = torch.randn(1, 14, 32)
    with torch.no_grad():
        for module in head.modules():  # non-trivial norms
            if isinstance(module, torch.nn.RMSNorm):
                module.weight.uniform_(0.5, 1.5)
        steps = head.unrolled(aux, embeds, 4)
        head.truncate(0)
        out = head(aux[:, :start], embeds[:, :start], use_cache=True)[0, -1]
        assert torch.allclose(out, steps[0][0, start - 1], atol=1e-5)
        for k in range(1, 4):
            row = start - 1 + k
            out = head(out[None, None], embeds[:, row : row + 1], start=row, use_cache=True)[0, -1]
            assert torch.allclose(out, steps[k][0, row], atol=1e-5), k


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    target = loaded(tiny_model(vocab=64, layers=2, seed=11))
    layers = default_aux_layers(2)
    gen = torch.Generator().manual_seed(0)
    seqs = []
    with one_torch_thread():
        for _ in range(24):
            prompt = torch.randint(0, 64, (int(torch.randint(3, 12, (1,), generator=gen)),), generator=gen).tolist()
            seqs.append(features_of(target, prompt, greedy(target, prompt, 40), layers))
        head = train_head(target, seqs[:20], epochs=6, lr=3e-3, kind="eagle3", draft_ids=frequent_tokens(seqs[:20], 48))
        accepted = unrolled_acceptance(head, target, seqs[20:], k=4)
    folder = tmp_path_factory.mktemp("eagle3")
    save_head(head, head_info(target, "eagle", sum(len(s.tokens) for s in seqs), 6, accepted, head.config), folder)
    return target, folder, accepted, seqs


def test_a_trained_eagle3_head_predicts_the_targets_tokens(trained):
    target, folder, accepted, seqs = trained
    layers = default_aux_layers(2)
    assert seqs[0].features.shape[-1] == len(layers) * target.model.config.hidden_size  # the layers' states side by side
    assert accepted > 1.3  # random guessing over 48 tokens would give about 1.02
    info = json.loads((folder / "head.json").read_text())
    assert info["kind"] == "eagle" and info["config"]["aux_layers"] == list(default_aux_layers(2))


@pytest.mark.usefixtures("one_torch_thread")
def test_an_eagle3_head_loads_as_an_eagle_head_drafts_and_stays_lossless(trained):
    target, folder, _, _ = trained
    head, info = load_head(folder, target, kind="eagle")
    assert isinstance(head, Eagle3Head) and head.aux_layers == default_aux_layers(2) and head.draft_ids.numel() == info.config.draft_vocab < 64
    gen = torch.Generator().manual_seed(3)
    accepted = 0
    for trial in range(8):
        prompt = torch.randint(0, 64, (int(torch.randint(2, 20, (1,), generator=gen)),), generator=gen).tolist()
        config = DecodeConfig(k=1 + trial % 6, adaptive_k=trial % 2 == 0, max_new_tokens=50)
        base = list(generate(target.new_runner(), build_drafter("none", target), prompt, config))[-1]
        tree = trial % 3 == 0
        spec = list(generate(target.new_runner(), build_drafter("eagle", target, head=str(folder), tree=tree), prompt, config))[-1]
        assert isinstance(spec, Finished) and spec.token_ids == base.token_ids, trial
        accepted += spec.totals.accepted
    assert accepted > 0


def test_features_are_stored_once_and_read_back_memory_mapped(tmp_path, monkeypatch):
    from specula.engine.heads.train import Answer, features, with_features

    target = loaded(tiny_model(vocab=64, layers=4, seed=3))
    answers = [Answer([j % 60 + 1 for j in range(300 + 7 * i)], [5, 6, 7, 8, 9, 10]) for i in range(3)]  # past EAGLE3_CONTEXT
    layers = default_aux_layers(4)
    store = tmp_path / "features"
    first = with_features(target, answers, aux_layers=layers, store=store)
    assert len(list(store.glob("*.pt"))) == 3 and first[0].tokens.shape[0] == features.EAGLE3_CONTEXT + 6
    monkeypatch.setattr(features, "features_of", lambda *a, **k: pytest.fail("computed again"))
    again = with_features(target, answers, aux_layers=layers, store=store)
    for a, b in zip(first, again):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.features, b.features) and a.answer_start == b.answer_start
        assert torch.equal(a.top_ids, b.top_ids) and torch.equal(a.top_p, b.top_p)
    monkeypatch.undo()
    damaged = tmp_path / "damaged"
    damaged.write_bytes(b"cut short")  # a damaged file: computed again (a new file: the old one stays mapped)
    damaged.replace(store / "000001.pt")
    other = [answers[0], answers[1], Answer(answers[2].prompt, [9, 9, 9, 9])]  # another answer: computed again
    said = []
    third = with_features(target, other, aux_layers=layers, store=store, say=said.append)
    assert said == ["features: 3/3 conversations, 1 read from the data folder, eta 0 s"]  # time left: computed ones
    assert third[2].tokens[-4:].tolist() == [9, 9, 9, 9] and torch.equal(third[1].features, first[1].features)
    final = with_features(target, answers, store=tmp_path / "final")  # an EAGLE-1 head's: the whole conversation
    assert final[0].tokens.shape[0] == len(answers[0].prompt) + 6 and final[0].features.shape[1] == 64


def test_an_eagle3_head_learns_the_targets_own_distribution():
    """The features of a conversation carry the target's most likely next tokens at each position with their
    probabilities (a greedy answer's tokens are its first choices); the loss is the cross-entropy against
    them, which for a target sure of one token is the cross-entropy against that token."""
    target = loaded(tiny_model(vocab=64, layers=2, seed=11))
    prompt = [3, 9, 4, 17, 22]
    answer = greedy(target, prompt, 12)
    seq = features_of(target, prompt, answer, default_aux_layers(2))
    probs = torch.softmax(target.new_runner().forward(torch.tensor(prompt + answer), last=len(prompt) + 12), -1)
    top = probs.topk(TARGET_TOP)
    assert torch.equal(seq.top_ids.long(), top.indices) and torch.allclose(seq.top_p.float(), top.values, atol=1e-3)
    assert seq.top_ids[seq.answer_start - 1 : -1, 0].tolist() == answer

    torch.manual_seed(0)
    config = HeadConfig.for_target(target.model.config)
    from dataclasses import replace

    head = Eagle3Head(replace(config, aux_layers=default_aux_layers(2), draft_vocab=48))
    head.draft_ids = torch.arange(48)
    frozen = Frozen(target)
    sure = replace(seq, top_p=torch.zeros_like(seq.top_p))
    sure.top_p[:, 0] = 1.0  # all the target's mass on its first choice
    hard = replace(seq, top_ids=None, top_p=None)  # no stored distribution: the answer's own tokens
    with torch.no_grad():
        soft_loss, right, seen = eagle3_loss(head, frozen, [sure], steps=2)
        hard_loss, right2, seen2 = eagle3_loss(head, frozen, [hard], steps=2)
        real_loss, _, _ = eagle3_loss(head, frozen, [seq], steps=2)
    assert seen > 0 and (right, seen) == (right2, seen2)
    assert torch.allclose(soft_loss, hard_loss, atol=1e-5)
    assert not torch.allclose(real_loss, hard_loss, atol=1e-3)  # the runners-up count


def test_a_head_that_drafts_ids_past_the_vocabulary_or_whose_head_json_nests_too_deeply_is_one_line(trained,
                                                                                                    tmp_path):
    """A draft vocabulary naming token 64 of a 64-token model (drafting it would read past the embedding), and a
    head.json nested 100,000 deep, are refused in one line each, not with an IndexError or a RecursionError."""
    import shutil

    from safetensors.torch import load_file, save_file

    target, folder, _, _ = trained
    for bad_id in (64, -1):
        shutil.copytree(folder, bad := tmp_path / f"ids{bad_id}")
        state = load_file(str(bad / "head.safetensors"))
        state["draft_ids"][3] = bad_id
        save_file(state, str(bad / "head.safetensors"))
        with pytest.raises(SpeculaError, match=f"drafts token id {bad_id}, which .* vocabulary of 64 tokens has not"):
            load_head(bad, target)
    shutil.copytree(folder, deep := tmp_path / "deep")
    text = (deep / "head.json").read_text().rstrip()
    (deep / "head.json").write_text(text[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(SpeculaError, match="head.json is unreadable: it nests lists or objects too deeply"):
        load_head(deep, target)


def test_measuring_a_head_counts_what_it_knows(trained, tmp_path):
    """`measure-head`'s chains: the trained head keeps what its held-out figure says, and far more than an
    untrained one of the same shape (which still keeps some: a tiny random model's answers repeat tokens)."""
    from specula.engine.cli.measure import tree_drafters
    from specula.engine.heads.measure import Answer, measure_heads

    target, folder, accepted, seqs = trained
    answers = [Answer("x", s.tokens[: s.answer_start].tolist(), s.tokens[s.answer_start :].tolist()) for s in seqs[20:]]
    trained_head, info = load_head(folder, target)
    torch.manual_seed(1)
    untrained = Eagle3Head(trained_head.config)
    untrained.draft_ids = trained_head.draft_ids
    save_head(untrained, info, tmp_path / "untrained")
    folders = [folder, tmp_path / "untrained"]
    got, trees, decoded = measure_heads(target, folders, answers, k=4, trees=tree_drafters(target, folders, 24))
    assert got[str(folder)]["overall"] > got[str(tmp_path / "untrained")]["overall"] + 0.5
    assert got[str(tmp_path / "untrained")]["overall"] >= 1.0
    assert got[str(folder)]["overall"] == pytest.approx(accepted, abs=0.25)  # its held-out figure, every 4th position
    # the eagle drafter's own trees of 24 nodes and depth 4: about what the chain keeps (the path of top guesses
    # is nearly always among its nodes; a tiny target leaves runners-up little to win), far more than untrained
    assert trees[str(folder)]["overall"] == pytest.approx(got[str(folder)]["overall"], abs=0.15)
    assert trees[str(folder)]["overall"] > trees[str(tmp_path / "untrained")]["overall"] + 0.5
    for name in trees:  # tokens per pass when decoding: at most the depth and the next token
        assert 1.0 <= decoded[name]["overall"] <= 5.0 and set(decoded[name]) == {"x", "overall"}
    assert decoded[str(folder)]["overall"] > decoded[str(tmp_path / "untrained")]["overall"] + 0.3


def test_decoding_walks_an_answer_pass_by_pass():
    from specula.engine.heads.measure import passes_when_decoding

    # a pass from position 0 keeps 3 (to position 3), then 1, then 2 (to 6, the end)
    assert passes_when_decoding([3, 5, 5, 1, 2, 9]) == 3
    assert passes_when_decoding([1] * 7) == 7 and passes_when_decoding([]) == 0


def test_a_drafts_kept_tokens_follow_the_answer():
    from specula.engine.decoding.drafter import Draft
    from specula.engine.decoding.tree import TokenTree
    from specula.engine.heads.measure import kept_by

    chain = Draft(torch.tensor([5, 6, 7]))
    assert [kept_by(chain, truth) for truth in ([5, 6, 7, 8], [5, 6, 9], [4], [5])] == [3, 2, 0, 1]
    # root children 5 and 9; 5's children 6 and 7; 7's child 8
    tree = Draft(torch.tensor([5, 9, 6, 7, 8]), tree=TokenTree.of_draft([-1, -1, 0, 0, 3]))
    assert [kept_by(tree, truth) for truth in ([5, 7, 8, 1], [5, 6, 1], [9, 9], [1], [5, 7])] == [3, 2, 1, 0, 2]


def test_measuring_trees_on_a_bf16_target_uses_the_heads_as_the_strategy_loads_them(trained):
    """The chains' measure runs its heads in fp32; the trees' drafter keeps its own copy in the target's dtype."""
    from specula.engine.cli.measure import tree_drafters
    from specula.engine.heads.measure import Answer, measure_heads

    target, folder, _, seqs = trained
    low = LoadedModel(copy.deepcopy(target.model).to(torch.bfloat16), None, "tiny", torch.device("cpu"), torch.bfloat16)
    answers = [Answer("x", s.tokens[: s.answer_start].tolist(), s.tokens[s.answer_start :].tolist())
               for s in seqs[20:22]]
    chains, trees, _ = measure_heads(low, [folder], answers, k=4, trees=tree_drafters(low, [folder], 12))
    assert 1.0 <= chains[str(folder)]["overall"] <= 5.0 and 1.0 <= trees[str(folder)]["overall"] <= 5.0


def test_a_head_loaded_for_a_strategy_runs_prepacked_products_with_the_same_predictions(trained):
    from specula.engine.cpu.products import can_prepack
    from specula.engine.heads.store import _Product, head_for_strategy

    target, folder, _, seqs = trained
    plain, _ = load_head(folder, target)
    packed = head_for_strategy(target, str(folder), "eagle", "a head")
    assert can_prepack(plain.lm.weight)  # fp32 on a CPU
    assert not any(isinstance(m, torch.nn.Linear) for m in packed.modules())
    products = [m.product for m in packed.modules() if isinstance(m, _Product)]
    assert len(products) == 9 and {p.kind for p in products} == {"prepacked"}  # fc, q, k, v, o, gate, up, down, lm
    seq = seqs[0]
    feats, embeds = seq.features[None, :-1].float(), target.model.get_input_embeddings()(seq.tokens[None, 1:])
    with torch.no_grad():
        torch.testing.assert_close(packed(feats, embeds), plain(feats, embeds), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(packed.draft_logits(packed(feats, embeds)[0]),
                                   plain.draft_logits(plain(feats, embeds)[0]), rtol=1e-4, atol=1e-4)


def test_a_bf16_head_drafts_through_its_layer_in_one_call_and_the_answers_stay_the_targets(trained, ops):
    """In bf16 with the compiled step's library loaded, a head loaded for a strategy runs its decoder layer in
    one call of the compiled step (its products as 4-bit blocks, its drafting cache beside them) and its fc and
    LM head as 4-bit blocks: read together or one position at a time (the same bits), or as a tree, its
    predictions stay the head's own (they round otherwise), and every answer stays the target's greedy one."""
    from specula.engine.heads.store import _Product, head_for_strategy

    target, folder, _, seqs = trained
    low = LoadedModel(copy.deepcopy(target.model).to(torch.bfloat16), None, "tiny", torch.device("cpu"), torch.bfloat16)
    plain, _ = load_head(folder, low)
    fast = head_for_strategy(low, str(folder), "eagle", "a head")
    assert fast.native is not None and plain.native is None
    products = [m.product for m in fast.modules() if isinstance(m, _Product)]
    assert len(products) == 2 and {p.kind for p in products} == {"blocks"}  # fc and the LM head
    seq = seqs[0]
    feats = seq.features[None, :-1].to(torch.bfloat16)
    embeds = low.model.get_input_embeddings()(seq.tokens[None, 1:])
    n = feats.shape[1]

    def near(got, want):  # 4-bit weights: within a fifth of the largest value (a wrong product is all of it)
        assert (got.float() - want.float()).abs().max() < 0.2 * want.float().abs().max()

    with torch.no_grad():
        want, got = plain(feats, embeds, use_cache=True), fast(feats, embeds, use_cache=True)
        near(got, want)
        # 4-bit blocks: the logits keep their shape (every row), the top guess mostly (this tiny head's logits
        # are nearly flat; the bundled head keeps 1% fewer tokens in 4-bit than in 8-bit blocks)
        lw, lg = plain.draft_logits(want[0]), fast.draft_logits(got[0])
        centred = [x - x.mean(-1, keepdim=True) for x in (lw, lg)]
        assert torch.nn.functional.cosine_similarity(*centred, dim=-1).min() > 0.95
        assert (lw.argmax(-1) == lg.argmax(-1)).float().mean() > 0.5
        # one position at a time over the same slots: each row's bits do not depend on the call's other rows
        alone = torch.cat([fast(feats[:, i : i + 1], embeds[:, i : i + 1], start=i, use_cache=True) for i in range(n)], 1)
        assert torch.equal(alone, got)
        # a tree after n - 1 read positions, each row at its own slot: rows 0 and 1 a chain (the context, then
        # row 0), row 2 sees slot 0 and itself only (a mask no chain makes)
        for head in (plain, fast):
            head.truncate(0)
            head(feats[:, : n - 1], embeds[:, : n - 1], use_cache=True)
        visible = torch.zeros(3, n + 2, dtype=torch.bool)
        visible[:2, : n - 1] = True
        visible[1, n - 1] = True
        visible[2, 0] = True
        for row in range(3):
            visible[row, n - 1 + row] = True
        h, e, positions = feats[0, -1].expand(3, -1).clone(), embeds[0, -3:], torch.tensor([n - 1, n, n])
        want_tree = plain.forward_tree(h, e, positions, n - 1, visible)
        got_tree = fast.forward_tree(h, e, positions, n - 1, visible)
        near(got_tree, want_tree)
        everything = visible.clone()
        everything[2, : n - 1] = True
        want_all = plain.forward_tree(h, e, positions, n - 1, everything)
        assert (got_tree[2] - want_tree[2]).abs().max() < 0.25 * (want_all[2] - want_tree[2]).abs().max()
        # rows 0 and 1 are the chain's rows, bit for bit
        assert torch.equal(got_tree[0], fast(h[None, :1], e[None, :1], start=n - 1, use_cache=True)[0, 0])
        assert torch.equal(got_tree[1], fast(h[None, 1:2], e[None, 1:2], start=n, use_cache=True)[0, 0])
    gen = torch.Generator().manual_seed(5)
    for trial in range(4):
        prompt = torch.randint(0, 64, (int(torch.randint(2, 20, (1,), generator=gen)),), generator=gen).tolist()
        config = DecodeConfig(k=2 + trial, max_new_tokens=40)
        base = list(generate(low.new_runner(), build_drafter("none", low), prompt, config))[-1]
        for tree in (False, True):
            spec = build_drafter("eagle", low, head=str(folder), tree=tree)
            assert spec.head.native is not None
            assert list(generate(low.new_runner(), spec, prompt, config))[-1].token_ids == base.token_ids, (trial, tree)


def test_training_continues_from_a_heads_weights(trained):
    """--from: the head's weights are the start (a step of a tiny learning rate leaves them where they were,
    a new head's would be random), its draft vocabulary stays, and its predictions improve from there."""
    from specula.engine.heads.train import start_head

    target, folder, accepted, seqs = trained
    head, before = start_head(folder, target, "eagle3")
    assert before["held_out_mean_accepted_length"] == accepted
    saved, _ = load_head(folder, target, dtype=torch.float32)
    same = train_head(target, seqs[:4], epochs=1, lr=1e-9, kind="eagle3", batch=4, start=head)
    for name, t in saved.state_dict().items():
        assert torch.allclose(same.state_dict()[name].float(), t.float(), atol=1e-5), name
    assert torch.equal(same.draft_ids, saved.draft_ids)
    with pytest.raises(SpeculaError, match="cannot continue as --kind medusa"):
        start_head(folder, target, "medusa")


def test_continuing_another_models_head_is_refused_as_such_before_anything_is_written(trained, tmp_path):
    """--from a head made for another model (here of 4 layers, so the layers it reads differ too): it says so,
    not "reads target layers [...]", and leaves no folder (an about.json was left behind)."""
    from specula.engine.heads.train import TrainOptions, run_training, start_head

    _, folder, _, _ = trained
    other = loaded(tiny_model(vocab=64, layers=4, seed=12))
    with pytest.raises(SpeculaError, match="trained for another model") as refused:
        start_head(folder, other, "eagle3")
    assert "reads target layers" not in str(refused.value)
    out = tmp_path / "continued"
    with pytest.raises(SpeculaError, match="trained for another model"):
        run_training(other, TrainOptions(kind="eagle3", tokens=200, out=out, start=folder))
    assert not out.exists()
