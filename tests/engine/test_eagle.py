"""The EAGLE-style head: trained briefly on a tiny model's own greedy text, it loads, drafts, and the
output stays the target's own (greedy and sampled); a head for another model is refused."""

import pytest
import torch
from safetensors.torch import load_file

from specula.engine.api.errors import SpeculaError
from specula.engine.api.events import Finished
from specula.engine.api.types import DecodeConfig, ModelChoice, SamplingParams
from specula.engine.decoding.loop import generate
from specula.engine.drafters import build_drafter
from specula.engine.heads.store import load_head, save_head
from specula.engine.heads.train import chain_acceptance, head_info, train_head
from specula.engine.heads.train.features import features_of
from specula.engine.models.loading import load_model
from tests.support.tiny import loaded, one_torch_thread, tiny_model


def greedy(target, prompt, n):
    events = list(generate(target.new_runner(), build_drafter("none", target), prompt, DecodeConfig(max_new_tokens=n)))
    return list(events[-1].token_ids)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    target = loaded(tiny_model(vocab=64, layers=2, seed=11))
    gen = torch.Generator().manual_seed(0)
    seqs = []
    with one_torch_thread():
        for _ in range(24):
            prompt = torch.randint(0, 64, (int(torch.randint(3, 12, (1,), generator=gen)),), generator=gen).tolist()
            seqs.append(features_of(target, prompt, greedy(target, prompt, 40)))
        head = train_head(target, seqs[:20], epochs=6, lr=3e-3)
        accepted = chain_acceptance(head, target, seqs[20:], k=4)
    folder = tmp_path_factory.mktemp("head")
    save_head(head, head_info(target, "eagle", sum(len(s.tokens) for s in seqs), 6, accepted), folder)
    return target, folder, accepted, seqs


def test_a_trained_head_predicts_the_targets_tokens(trained):
    _, _, accepted, _ = trained
    assert accepted > 1.3  # random guessing over 64 tokens would give about 1.02


@pytest.mark.usefixtures("one_torch_thread")
def test_eagle_is_lossless_greedy_and_really_drafts(trained):
    target, folder, _, _ = trained
    gen = torch.Generator().manual_seed(3)
    accepted = 0
    for trial in range(8):
        prompt = torch.randint(0, 64, (int(torch.randint(2, 20, (1,), generator=gen)),), generator=gen).tolist()
        config = DecodeConfig(k=1 + trial % 6, adaptive_k=trial % 2 == 0, max_new_tokens=50)
        base = list(generate(target.new_runner(), build_drafter("none", target), prompt, config))[-1]
        events = list(generate(target.new_runner(), build_drafter("eagle", target, head=str(folder)), prompt, config))
        spec = events[-1]
        assert isinstance(spec, Finished) and spec.token_ids == base.token_ids, trial
        accepted += spec.totals.accepted
    assert accepted > 0


def test_eagle_sampling_with_a_seed_repeats_and_varies(trained):
    target, folder, _, _ = trained
    params = SamplingParams(temperature=1.0, top_p=0.95)

    def run(seed):
        drafter = build_drafter("eagle", target, head=str(folder))
        return list(generate(target.new_runner(), drafter, [1, 2, 3], DecodeConfig(k=4, max_new_tokens=30, params=params, seed=seed)))[-1].token_ids

    assert run(5) == run(5) and run(5) != run(6)


def test_a_head_for_another_model_is_refused(trained):
    _, folder, _, _ = trained
    other = loaded(tiny_model(vocab=64, layers=2, seed=12))
    with pytest.raises(SpeculaError, match="another model") as refused:
        load_head(folder, other)
    # both are named "tiny": not "(made for tiny), not tiny", but what differs
    assert "another model named tiny: its weights differ" in str(refused.value) and "not tiny" not in str(refused.value)
    with pytest.raises(SpeculaError, match="not found"):
        load_head(folder / "missing", other)
    with pytest.raises(SpeculaError, match="needs a trained draft head"):
        build_drafter("eagle", other)


@pytest.mark.usefixtures("one_torch_thread")
def test_train_head_command_writes_a_head_that_the_eagle_strategy_loads(tiny_folder, tmp_path, capsys):
    import json

    from specula.engine.cli.main import main

    out = tmp_path / "head"
    args = ["train-head", "--model", str(tiny_folder), "--dtype", "fp32", "--tokens", "200", "--epochs", "1",
            "--max-new-tokens", "24", "--batch", "4", "--out", str(out)]
    assert main(args) == 0
    info = json.loads((out / "head.json").read_text())
    assert info["kind"] == "eagle" and info["training"]["answer_tokens"] >= 200
    assert info["training"]["held_out_mean_accepted_length"] >= 1.0
    assert main(args) == 2  # the folder holds a head already
    assert "already holds a head" in capsys.readouterr().err
    # a medusa head from the same answers: nothing new is generated
    answers = (out / "training" / "answers.jsonl").read_text()
    medusa = args[:-2] + ["--kind", "medusa", "--out", str(tmp_path / "m"), "--data", str(out / "training")]
    assert main(medusa) == 0
    assert (out / "training" / "answers.jsonl").read_text() == answers
    assert json.loads((tmp_path / "m" / "head.json").read_text())["kind"] == "medusa"
    # an EAGLE-3 head from them too: stored as an eagle head that reads the target's layers
    eagle3 = args[:-2] + ["--kind", "eagle3", "--out", str(tmp_path / "e3"), "--data", str(out / "training")]
    assert main(eagle3) == 0
    info = json.loads((tmp_path / "e3" / "head.json").read_text())
    assert info["kind"] == "eagle" and info["config"]["aux_layers"] and info["config"]["draft_vocab"] > 0
    assert info["training"]["held_out_mean_accepted_length"] >= 1.0
    # measured on prompts without the cost model: each kind's chain
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [t], "category": c}) + "\n" for t, c in
                               [("Tell me a story.", "writing"), ("Write a poem.", "writing"), ("What is 2+2?", "math")]))
    capsys.readouterr()
    heads = [str(out), str(tmp_path / "m"), str(tmp_path / "e3")]
    assert main(["measure-head", "--model", str(tiny_folder), "--dtype", "fp32", "--prompts", str(prompts),
                 "--max-new-tokens", "16", "--tree-nodes", "6", "--json", *(a for h in heads for a in ("--head", h))]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["heads"]) == set(heads) and report["answers"] == 3
    # EAGLE heads' trees, alone and with prompt lookup's branch; Medusa's chain only
    eagles = {str(out), str(tmp_path / "e3")}
    assert set(report["trees"]) == eagles | {h + ", with prompt lookup's branch" for h in eagles}
    for by in [*report["heads"].values(), *report["trees"].values()]:
        assert set(by) == {"writing", "math", "overall"} and all(1.0 <= v <= 6.0 for v in by.values())
    # and on the first turns of the data folder's held-out tenth, as stored
    from specula.engine.heads.train import held_out_first_turns

    assert main(["measure-head", "--model", str(tiny_folder), "--dtype", "fp32", "--prompts", str(out / "training"),
                 "--max-new-tokens", "8", "--json", "--head", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert 1 <= report["answers"] <= len(held_out_first_turns(out / "training"))
    assert {"overall"} < set(report["heads"][str(out)]) <= {"generated", "written by the model", "overall"}
    for strategy, head in (("medusa", tmp_path / "m"), ("eagle", out), ("eagle", tmp_path / "e3")):
        code = main(["generate", "--model", str(tiny_folder), "--dtype", "fp32", "--strategy", strategy, "--head",
                     str(head), "--prompt", "hello there", "--max-new-tokens", "12", "--json"])
        assert code == 0
        line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert line["strategy"] == strategy and line["new_tokens"] > 0
    with pytest.raises(SpeculaError, match="holds a medusa head, not the eagle head"):
        build_drafter("eagle", load_model(ModelChoice(str(tiny_folder), "cpu", "fp32")), head=str(tmp_path / "m"))
    # an EAGLE-3 head continued on the same answers (--from): its draft vocabulary stays, the record keeps both runs
    more = args[:-2] + ["--kind", "eagle3", "--out", str(tmp_path / "e3+"), "--data", str(out / "training"),
                        "--from", str(tmp_path / "e3"), "--lr", "3e-4"]
    assert main(more) == 0
    before, after = (json.loads((tmp_path / f / "head.json").read_text()) for f in ("e3", "e3+"))
    assert after["config"] == before["config"] and after["training"]["continued_from"] == before["training"]
    vocab = [load_file(str(tmp_path / f / "head.safetensors"))["draft_ids"] for f in ("e3", "e3+")]
    assert torch.equal(*vocab)
    for kind in ("eagle", "medusa"):  # an EAGLE-3 head continues as nothing else
        assert main(args[:-2] + ["--kind", kind, "--out", str(tmp_path / kind), "--data", str(out / "training"),
                                 "--from", str(tmp_path / "e3")]) == 2
        assert "holds an EAGLE-3 head: it cannot continue as --kind " + kind in capsys.readouterr().err


def test_an_interrupted_training_run_resumes_where_it_stopped(trained, tmp_path):
    target, _, _, seqs = trained
    ref = train_head(target, seqs[:8], epochs=2, lr=3e-3, batch=2)

    def stop_in_second_epoch(line):
        if "epoch 2/2" in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_head(target, seqs[:8], epochs=2, lr=3e-3, batch=2, checkpoint=tmp_path / "c.pt", say=stop_in_second_epoch)
    said = []
    resumed = train_head(target, seqs[:8], epochs=2, lr=3e-3, batch=2, checkpoint=tmp_path / "c.pt", say=said.append)
    assert said[0] == "training: resuming at step 4/8"
    for a, b in zip(ref.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)


class _Planted:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path(__import__('os').environ['PLANTED']).write_text('ran')",))


def test_a_pickle_planted_as_a_checkpoint_is_refused_and_runs_no_code(trained, tmp_path, monkeypatch):
    import pickle

    target, _, _, seqs = trained
    marker = tmp_path / "ran"
    monkeypatch.setenv("PLANTED", str(marker))
    (tmp_path / "c.pt").write_bytes(pickle.dumps({"key": None, "x": _Planted()}))
    said = []
    train_head(target, seqs[:4], epochs=1, lr=3e-3, batch=2, checkpoint=tmp_path / "c.pt", say=said.append)
    assert not marker.exists()  # the file's code never ran
    assert said[0].startswith(f"training: the checkpoint {tmp_path / 'c.pt'} was not used")
    assert not any("resuming" in line for line in said)


def test_greedy_eagle_drafts_trees_and_chains_and_stays_lossless(trained):
    target, folder, _, _ = trained
    drafter = build_drafter("eagle", target, head=str(folder), tree=1)
    shapes = []
    original = drafter.propose

    def recording(ctx, k):
        draft = original(ctx, k)
        if draft.parents is not None:
            parents = draft.parents
            shapes.append((len(parents) > len(set(parents)), max(_depth(parents))))
        return draft

    drafter.propose = recording
    for seed in range(4):
        prompt = torch.randint(0, 64, (9,), generator=torch.Generator().manual_seed(seed)).tolist()
        config = DecodeConfig(k=5, max_new_tokens=40)
        base = list(generate(target.new_runner(), build_drafter("none", target), prompt, config))[-1]
        assert list(generate(target.new_runner(), drafter, prompt, config))[-1].token_ids == base.token_ids
    assert any(branched for branched, _ in shapes)  # nodes with several children
    assert any(depth > 1 for _, depth in shapes)  # and paths several tokens deep


def test_on_the_compiled_step_eagle_sends_trees_holding_the_conversations_continuation(ops, trained, monkeypatch):
    """Where tree passes decide as chains do (a CPU's compiled step), the strategy drafts trees by default, with
    prompt lookup's draft as a branch; its answers stay plain decoding's. Eagerly it sends chains."""
    from specula.engine.drafters.eagle import Eagle
    from specula.engine.drafters.prompt_lookup import find_continuation
    from specula.engine.models.loading import LoadedModel

    # the head is asked every step (whether a step drafts lookup's branch alone depends on timings: below)
    monkeypatch.setattr(Eagle, "_lookup_alone", lambda self, ctx, p: False)
    trained_target, folder, _, _ = trained
    for step in ("compiled", "eager"):
        target = LoadedModel(trained_target.model, None, "tiny", torch.device("cpu"), torch.float32)
        target.step = step
        drafter = build_drafter("eagle", target, head=str(folder))
        drafts = []
        original = drafter.propose

        def recording(ctx, k):
            draft = original(ctx, k)
            drafts.append((ctx.tokens.clone(), k, draft, ctx.target.exact_trees))
            return draft

        drafter.propose = recording
        for seed in range(3):
            tail = torch.randint(0, 64, (6,), generator=torch.Generator().manual_seed(seed)).tolist()
            prompt = tail * 3 + [7]  # repeated text: prompt lookup finds matches
            config = DecodeConfig(k=5, max_new_tokens=40)
            base = list(generate(target.new_runner(), build_drafter("none", target), prompt, config))[-1]
            assert list(generate(target.new_runner(), drafter, prompt, config))[-1].token_ids == base.token_ids
        drafted = [d for d in drafts if d[2].tokens.numel()]
        assert drafted and all(exact == (step == "compiled") for _, _, _, exact in drafted)
        trees = [(tokens, k, d) for tokens, k, d, _ in drafted if d.parents is not None]
        if step == "eager":
            assert not trees
            continue
        assert len(trees) == len(drafted)
        holding = 0
        for tokens, k, d in trees:
            path = find_continuation(tokens, k, 1, 16).tolist()
            node, parents, toks = -1, d.parents, d.tokens.tolist()
            for token in path:
                node = next((i for i, (t, p) in enumerate(zip(toks, parents)) if p == node and t == token), None)
                if node is None:
                    break
            holding += bool(path) and node is not None
        assert holding > 0  # whole lookup paths among the trees' nodes


def test_the_lookup_branch_values_its_nodes_by_how_often_the_answer_went_on_so():
    from specula.engine.drafters.eagle import LOOKUP_PRIOR, _Lookup

    lookup = _Lookup()
    context = torch.tensor([1, 2, 3, 4, 1, 2, 3])  # "1 2 3" matched (3 tokens): "4 1 2 3" followed it
    path, probs = lookup.draft(context, 8)
    assert path == [4, 1, 2, 3] and probs == sorted(probs, reverse=True)
    assert probs[0] == pytest.approx(LOOKUP_PRIOR[2])
    lookup.judge(torch.cat([context, torch.tensor([4])]))  # one token known: right so far, still pending
    assert len(lookup.pending) == 1
    lookup.judge(torch.cat([context, torch.tensor([4, 1, 9, 5])]))  # right, right, wrong: judged, done
    assert not lookup.pending
    assert lookup.rate(2, 1) > LOOKUP_PRIOR[2] and lookup.rate(2, 2) > LOOKUP_PRIOR[2]
    assert lookup.rate(2, 3) < LOOKUP_PRIOR[2] and lookup.rate(2, 4) == pytest.approx(LOOKUP_PRIOR[2])  # not reached
    assert lookup.draft(torch.tensor([5, 6, 7]), 8) == ([], [])  # no earlier match: no branch
    # two drafts pending from two steps, judged together against what the answer went on with
    lookup = _Lookup()
    assert lookup.draft(context, 8)[0] == [4, 1, 2, 3]  # drafted after 7 tokens
    assert lookup.draft(torch.cat([context, torch.tensor([4])]), 8)[0] == [1, 2, 3, 4]  # after 8: a 4-token match
    lookup.judge(torch.cat([context, torch.tensor([4, 1, 2, 9])]))
    assert not lookup.pending
    assert lookup.rate(2, 3) > LOOKUP_PRIOR[2] > lookup.rate(2, 4)  # 4 1 2 kept, 3 not
    assert lookup.rate(4, 2) > LOOKUP_PRIOR[4] > lookup.rate(4, 3)  # 1 2 kept, 3 not


def test_a_tree_grows_a_level_only_while_its_likeliest_path_is_worth_the_levels_time(trained):
    from specula.engine.decoding.drafter import DraftContext
    from specula.engine.drafters.eagle import Eagle

    target, folder, _, _ = trained
    head, _ = load_head(folder, target)
    prompt = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(5))
    levels = {}
    for plain_s in (None, 100.0, 1e-6):  # a plain step not measured yet, taking 100 s, a microsecond
        drafter = Eagle(head, target, stop_below=0.0, tree=True)
        drafter.level_s = 1e-3
        calls = []
        grow = head.forward_tree
        head.forward_tree = lambda *a, **kw: calls.append(1) or grow(*a, **kw)
        runner = target.new_runner()
        runner.forward(prompt)
        ctx = DraftContext(prompt, 12, SamplingParams(), None, runner, plain_s=plain_s, timed=True)
        drafter.propose(ctx, 5)
        del head.forward_tree
        levels[plain_s] = len(calls)
    # as deep as the paths stay likely: plain steps unmeasured, or worth far more than levels
    assert levels[None] == levels[100.0] >= 1
    assert levels[1e-6] == 0  # a level would take far longer than the tokens it may win: the head's first guesses


def test_a_step_drafts_lookups_branch_alone_where_the_head_would_add_less_than_reading_costs(trained):
    """Where prompt lookup's first node is likely kept, what the head's guesses could add is worth less than
    reading the step's positions: the step drafts the branch alone, and the next step's reading of those
    positions is booked as its own cost, not as catch-up."""
    from specula.engine.decoding.drafter import DraftContext
    from specula.engine.drafters.eagle import Eagle

    target, folder, _, _ = trained
    head, _ = load_head(folder, target)
    drafter = Eagle(head, target, stop_below=0.0, tree=True, lookup=True)
    ctx = DraftContext(torch.tensor([1, 2, 3]), 3, SamplingParams(), None, None, plain_s=0.004, timed=True)
    assert not drafter._lookup_alone(ctx, 0.9)  # nothing measured yet: the head is asked
    drafter.read_s, drafter.first_p = 0.001, 0.5
    assert drafter._lookup_alone(ctx, 0.9)  # 0.1 x 0.5 x 4 ms = 0.2 ms < 1 ms
    assert not drafter._lookup_alone(ctx, 0.2)  # 0.8 x 0.5 x 4 ms = 1.6 ms > 1 ms
    assert not drafter._lookup_alone(DraftContext(ctx.tokens, 3, SamplingParams(), None, None, 0.004, timed=False), 0.9)
    # through propose: the branch alone, and no earlier catch-up counted against this step
    runner = target.new_runner()
    prompt = torch.tensor([4, 5, 6, 9, 4, 5])
    runner.forward(prompt)
    drafter.catch_up_s = 0.5
    step = DraftContext(prompt, 3, SamplingParams(), None, runner, plain_s=0.004, timed=True)
    drafter.lookup.counts[(2, 1)] = [100.0, 100.0]  # "4 5" matched: its first node has always been kept
    assert drafter.propose(step, 4).tokens.tolist() == [6, 9, 4, 5] and drafter.deferred
    assert drafter.catch_up_s == 0.0 and drafter.synced == 0  # the head read nothing
    drafter.deferred = False
    drafter.nodes = 16
    assert not drafter._lookup_alone(ctx, 0.9)  # trees of a fixed size (measuring the head) always ask it
    drafter.fresh, drafter.deferred = 3, True
    drafter.observe(2, 7)
    assert drafter.fresh == 6 and not drafter.deferred  # 3 positions left unread, then 3 kept
    drafter.observe(1, 7)
    assert drafter.fresh == 2


def test_bench_variants_set_options_on_and_off():
    from specula.engine.cli.bench.run import split_variant, variant_options

    strategy, flags = split_variant("eagle+tree+no-lookup")
    assert strategy == "eagle" and variant_options(flags) == (("tree", 1), ("lookup", 0))


def _depth(parents):
    depth = []
    for p in parents:
        depth.append(1 + (depth[p] if p >= 0 else 0))
    return depth


def test_a_session_finds_heads_made_for_its_model(trained, tmp_path, monkeypatch):
    import shutil

    from specula.engine.api.events import Finished
    from specula.engine.api.prompts import Message
    from specula.engine.api.types import GenerateRequest
    from specula.engine.serving.session import Session

    target, folder, _, _ = trained
    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path))
    session = Session()
    session.use(target)
    assert "eagle" not in session.describe().strategies  # no head in the user's folder yet
    shutil.copytree(folder, tmp_path / "heads" / "mine")
    session.use(target)
    assert session.heads == {"eagle": [tmp_path / "heads" / "mine"]} and "eagle" in session.describe().strategies
    assert "medusa" not in session.describe().strategies  # no medusa head for it
    other = Session()
    other.use(loaded(tiny_model(vocab=64, layers=2, seed=12)))
    assert other.heads == {} and "eagle" not in other.describe().strategies
    request = GenerateRequest((Message("user", "x"),), "eagle", DecodeConfig(k=4, max_new_tokens=20), chat=False)
    finished = [e for e in session.generate(request, prompt_ids=[1, 2, 3]) if isinstance(e, Finished)][0]
    assert finished.totals.drafted > 0


def test_an_unreadable_head_is_skipped_with_a_note_that_names_its_file(trained, tmp_path, monkeypatch):
    import shutil

    from specula.engine.serving.session import Session

    target, folder, _, _ = trained
    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path))
    shutil.copytree(folder, tmp_path / "heads" / "good")
    shutil.copytree(folder, tmp_path / "heads" / "truncated")
    weights = tmp_path / "heads" / "truncated" / "head.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    shutil.copytree(folder, tmp_path / "heads" / "no-info")
    (tmp_path / "heads" / "no-info" / "head.json").write_text("{broken")
    session = Session()
    session.use(target)
    assert session.heads == {"eagle": [tmp_path / "heads" / "good"]}  # eagle and auto still work
    warnings = session.describe().warnings
    assert any(str(weights) in w and "skipped" in w for w in warnings)
    assert any("no-info" in w and "skipped" in w for w in warnings) and len(warnings) == 2
    with pytest.raises(SpeculaError, match=f"the draft head {weights} is unreadable"):
        build_drafter("eagle", target, head=str(tmp_path / "heads" / "truncated"))
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, tmp_path / "other-shape")  # a tensor of another shape: named, with both shapes
    other = tmp_path / "other-shape" / "head.safetensors"
    state = load_file(str(other))
    name = next(k for k, v in state.items() if v.dim() == 2)
    rows, cols = state[name].shape
    save_file({**state, name: torch.zeros(rows, cols + 3)}, str(other))
    with pytest.raises(SpeculaError) as wrong:
        build_drafter("eagle", target, head=str(tmp_path / "other-shape"))
    assert f"{name} is ({rows}, {cols + 3}) in the file but ({rows}, {cols}) for this head" in str(wrong.value)


def test_positions_the_head_catches_up_on_are_timed_apart_and_draft_the_same(trained):
    """After plain steps (or a new answer's prompt), the head first reads the positions it skipped, timed
    apart as catch_up_s, then the ones the last step kept: the draft is the one a single read gives, and a
    proposal right after its own step catches up on nothing."""
    from specula.engine.decoding.drafter import DraftContext

    target, folder, _, seqs = trained
    tokens = seqs[0].tokens
    runner = target.new_runner()
    runner.forward(tokens[:-1])
    at = seqs[0].answer_start + 10
    split, whole = (build_drafter("eagle", target, head=str(folder)) for _ in range(2))
    params = SamplingParams()
    first = split.propose(DraftContext(tokens[:at], 3, params, None, runner), 3)
    assert split.catch_up_s > 0  # the prompt and the first answer tokens
    whole.fresh = at  # as if every position before were kept by its last step: one read
    same = whole.propose(DraftContext(tokens[:at], 3, params, None, runner), 3)
    assert whole.catch_up_s == 0 and first.tokens.tolist() == same.tokens.tolist()
    split.observe(1, int(tokens[at + 1]))  # its draft's first token kept: two new positions
    split.propose(DraftContext(tokens[: at + 2], 3, params, None, runner), 3)
    assert split.catch_up_s == 0
    split.observe(0, int(tokens[at + 2]))
    split.propose(DraftContext(tokens[: at + 8], 3, params, None, runner), 3)  # five plain steps in between
    assert split.catch_up_s > 0


def test_under_auto_the_head_hears_what_the_steps_it_did_not_draft_for_kept(trained):
    """auto tells its eagle member what each step another member (or none) proposed for kept, so the head's
    next proposal counts as catch-up only the positions before that step, as it would after its own step."""
    from specula.engine.decoding.drafter import DraftContext
    from specula.engine.drafters.auto import Auto

    target, folder, _, seqs = trained
    tokens = seqs[0].tokens
    runner = target.new_runner()
    runner.forward(tokens[:-1])
    at = seqs[0].answer_start + 10
    eagle = build_drafter("eagle", target, head=str(folder))
    auto = Auto({"eagle": (eagle, 3)})
    params = SamplingParams()
    auto.member = eagle  # a step the head proposed for: it hears it itself
    eagle.propose(DraftContext(tokens[:at], 3, params, None, runner), 3)
    auto.observe(2, int(tokens[at + 2]))
    assert eagle.fresh == 3
    auto.member = auto.lookup  # then prompt lookup's step kept three drafts and the target's token
    auto.observe(3, int(tokens[at + 6]))
    assert eagle.fresh == 4
    auto.member = None  # then a plain step
    auto.observe(0, int(tokens[at + 7]))
    assert eagle.fresh == 1
    after = DraftContext(tokens[: at + 8], 3, params, None, runner)
    auto.member = eagle
    draft = eagle.propose(after, 3)
    assert eagle.catch_up_s > 0  # the seven positions of the two steps before the last
    again = build_drafter("eagle", target, head=str(folder))
    again.fresh = at + 7  # one read of everything: the same draft
    assert again.propose(after, 3).tokens.tolist() == draft.tokens.tolist() and again.catch_up_s == 0


def test_the_length_policy_books_a_step_without_the_drafters_catching_up(trained, monkeypatch):
    """The decoder books each drafting step's time less the drafter's catch-up, so a draft after a run of
    plain steps is valued as drafting at every step would cost."""
    from specula.engine.decoding import length as length_module

    target, folder, _, _ = trained
    booked = []
    real = length_module.DraftLength.observe

    def spy(self, drafted, accepted, seconds, plain_s):
        booked.append((drafted, seconds))
        return real(self, drafted, accepted, seconds, plain_s)

    monkeypatch.setattr(length_module.DraftLength, "observe", spy)
    drafter = build_drafter("eagle", target, head=str(folder))
    catch_ups = []
    propose = drafter.propose

    def timed(ctx, k):
        draft = propose(ctx, k)
        drafter.catch_up_s += 5.0  # a catch-up far longer than any step here
        catch_ups.append(drafter.catch_up_s)
        return draft

    drafter.propose = timed
    list(generate(target.new_runner(), drafter, [3, 4, 5, 6], DecodeConfig(k=3, max_new_tokens=20)))
    drafting = [s for d, s in booked if d > 0]
    assert catch_ups and drafting and all(s <= 1e-6 for s in drafting)  # each less the 5 s it was told of


def test_rotary_positions_shifted_alike_give_the_head_the_same_outputs(trained):
    """The drafter's window rests on this: the head's cache slot and rotary position of a position may both
    be moved by one offset (rotary attention sees only differences), in a chain and in a tree."""
    target, folder, _, seqs = trained
    head, _ = load_head(folder, target)
    seq = seqs[1]
    feats, embeds = seq.features[None, :-1], target.model.get_input_embeddings()(seq.tokens[None, 1:])
    n = feats.shape[1]
    with torch.no_grad():
        outs = []
        for shift in (0, 37):
            head.truncate(0)
            # slots from 0 whatever the shift: the rotary positions move, the slots do not
            original = head._rope
            head._rope = lambda positions, dtype, s=shift: original(positions + s, dtype)
            try:
                chain = head(feats, embeds, use_cache=True)
                visible = torch.ones(2, n + 2, dtype=torch.bool)
                visible[0, n + 1] = False
                tree = head.forward_tree(chain[0, -2:], embeds[0, -2:], torch.tensor([n, n]), n, visible)
            finally:
                head._rope = original
            outs.append((chain, tree))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-4, atol=1e-4)


def test_a_long_catch_up_reads_only_the_latest_positions_and_answers_stay_the_targets(trained, monkeypatch):
    """A read goes back READ_WINDOW positions at most (a long prompt, or many steps of another drafter): the
    head's cache then holds only those, at slots from 0, its first guesses mostly those of the whole context;
    a tree's first level sits right after them, slot and rotary position alike; chains and trees stay
    lossless however often the window moves."""
    from specula.engine.decoding.drafter import DraftContext
    from specula.engine.drafters import eagle

    target, folder, _, seqs = trained
    windowed, whole = build_drafter("eagle", target, head=str(folder)), build_drafter("eagle", target, head=str(folder))
    tree = eagle.Eagle(load_head(folder, target)[0], target, stop_below=0.0, tree=True, nodes=6)
    levels = []
    grow = tree.head.forward_tree
    tree.head.forward_tree = lambda f, e, positions, slot, visible: (levels.append((positions.tolist(), slot)),
                                                                      grow(f, e, positions, slot, visible))[1]
    same = total = 0
    for seq in seqs:
        runner = target.new_runner()
        runner.forward(seq.tokens[:-1])
        for at in range(seq.answer_start + 12, len(seq.tokens) - 4, 10):  # nine plain steps between proposals
            ctx = DraftContext(seq.tokens[:at], seq.answer_start, SamplingParams(), None, runner)
            monkeypatch.setattr(eagle, "READ_WINDOW", 8)
            first = windowed.propose(ctx, 1).tokens.tolist()
            assert windowed.offset == at - 1 - 8 and windowed.synced == at - 1  # slots 0-7 hold the real context
            levels.clear()
            tree.propose(ctx, 3)
            assert levels and levels[0] == ([8] * len(levels[0][0]), 8)  # the first level: slot 8, position 8
            monkeypatch.setattr(eagle, "READ_WINDOW", 10_000)
            same += first == whole.propose(ctx, 1).tokens.tolist()
            total += 1
        for drafter in (windowed, whole, tree):
            drafter.reset()
        assert windowed.offset == 0
    assert total >= 50 and same >= 0.8 * total
    monkeypatch.setattr(eagle, "READ_WINDOW", 3)
    gen = torch.Generator().manual_seed(9)
    for trial in range(6):
        prompt = torch.randint(0, 64, (int(torch.randint(6, 20, (1,), generator=gen)),), generator=gen).tolist()
        config = DecodeConfig(k=4, max_new_tokens=40)
        base = list(generate(target.new_runner(), build_drafter("none", target), prompt, config))[-1]
        spec = build_drafter("eagle", target, head=str(folder), tree=trial % 2)
        assert list(generate(target.new_runner(), spec, prompt, config))[-1].token_ids == base.token_ids, trial


def _members(protocol) -> set[str]:
    """The attributes and methods a protocol names, its bases' included."""
    names = set()
    for cls in protocol.__mro__:
        if cls.__module__ == protocol.__module__:
            names |= set(cls.__dict__.get("__annotations__", {}))
            names |= {n for n, v in cls.__dict__.items() if callable(v) and (n == "__call__" or not n.startswith("_"))}
    return names


def test_every_head_declares_what_its_protocol_names():
    """The drafters read a head's members without probing for them (heads/protocol.py): every kind of head has
    each one, whether trained here or published."""
    from specula.engine.heads.config import HeadConfig
    from specula.engine.heads.eagle import EagleHead
    from specula.engine.heads.eagle3 import Eagle3Head
    from specula.engine.heads.medusa import MedusaHead
    from specula.engine.heads.protocol import AutoregressiveHead, DraftHead, MultiTokenHead
    from specula.engine.heads.published import PublishedEagle, PublishedMedusa

    from dataclasses import replace

    config = HeadConfig.for_target(tiny_model(layers=4).config)
    heads = {AutoregressiveHead: [EagleHead(config), Eagle3Head(replace(config, aux_layers=(0, 1, 3), draft_vocab=16)),
                                  PublishedEagle(config, fc_bias=True, qkv_bias=False, vocab=None)],
             MultiTokenHead: [MedusaHead(config), PublishedMedusa(config.hidden, 2, 1, True, None)]}
    assert _members(DraftHead) >= {"reads_normed", "aux_layers", "draft_ids"}
    assert _members(AutoregressiveHead) >= _members(DraftHead) | {"truncate", "forward_tree", "own_lm_head"}
    for protocol, kinds in heads.items():
        for head in kinds:
            missing = [name for name in _members(protocol) if not hasattr(head, name)]
            assert not missing, f"{type(head).__name__} lacks {missing}"
            assert isinstance(head.reads_normed, bool) and isinstance(head.aux_layers, tuple)
