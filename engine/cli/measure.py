"""`specula measure-head`: the draft heads' mean accepted length on a set of prompts, measured without the
strategy's cost model (`heads.measure`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..api.errors import SpeculaError
from ..api.prompts import conversation, encode
from ..models.loading import load_model
from .common import read_flags

LOOKUP_LABEL = ", with prompt lookup's branch"


def tree_drafters(target, folders: list[Path], nodes: int) -> dict[str, object]:
    """{head folder: the eagle drafter building dynamic trees of `nodes` nodes with it, head folder + LOOKUP_LABEL:
    the same with the conversation's own continuation as a branch (as the strategy drafts)} for the EAGLE heads
    among `folders`, each with its own copy of the head as the strategy loads it (the chains' measure runs its
    copy in fp32)."""
    from ..drafters.eagle import Eagle
    from ..heads.medusa import MedusaHead
    from ..heads.store import load_head

    out = {}
    for folder in folders:
        head, _ = load_head(folder, target)
        if nodes > 0 and not isinstance(head, MedusaHead):
            out[str(folder)] = Eagle(head, target, stop_below=0.0, tree=True, nodes=nodes)
            out[str(folder) + LOOKUP_LABEL] = Eagle(load_head(folder, target)[0], target, stop_below=0.0, tree=True,
                                                    nodes=nodes, lookup=True)
    return out


def run_measure_head(args) -> int:
    from ..decoding.loop import generate
    from ..drafters import build_drafter
    from ..heads.measure import Answer, measure_heads
    from ..heads.store import find_heads
    from ..heads.train.run import progress_line
    from .bench.run import load_items, select

    # the answers' settings (plain decoding, --max-new-tokens) and the chains' length (--k, a draft length), read
    # and checked as generate reads them, before any model loads
    asked = read_flags(args, measure_baseline=False, prepare=False)
    config = asked.config
    if args.prompts.is_dir():  # a train-head data folder: the first turns of its held-out tenth, as stored
        from ..heads.train.answers import held_out_first_turns
        from .common import PromptItem

        turns = held_out_first_turns(args.prompts)
        held = [ids for _, ids in turns]
        items = select([PromptItem((), n, kind) for n, (kind, _) in enumerate(turns)], args.categories,
                       args.limit_per_category)
    else:
        held = None
        items = load_items(args.prompts, args.categories, args.limit_per_category)  # a bad file fails before the load
    target = load_model(asked.load.target, progress=lambda s: print(s, file=sys.stderr))
    folders = [Path(h) for h in args.heads or ()]
    if not folders:
        found = find_heads(target)
        folders = [p for kind in ("eagle", "medusa") for p in found.get(kind, [])]
    if not folders:
        raise SpeculaError("no draft heads for this model: name one with --head DIR, or train one with `specula train-head`")
    answers, skipped = [], 0
    for n, item in enumerate(items, 1):  # the first turn of each prompt, answered greedily by the target
        ids = held[item.question_id] if held is not None else encode(target.tokenizer, conversation(item.turns[0]),
                                                                       asked.chat)
        if len(ids) + config.max_new_tokens > target.context_window:
            skipped += 1
            continue
        finished = list(generate(target.new_runner(), build_drafter(asked.strategy, target), ids, config,
                                 stop_ids=frozenset(target.eos_ids)))[-1]
        answer = [t for t in finished.token_ids if t not in target.eos_ids]
        if len(answer) >= 3:
            answers.append(Answer(item.category or "all", ids, answer))
        progress_line(f"answers: {n}/{len(items)}")
    if not answers:
        raise SpeculaError("no prompt gave an answer to measure on (too long for the model's window, or answered in under 3 tokens)")
    results, trees, decoded = measure_heads(target, folders, answers, config.k, say=progress_line,
                                   trees=tree_drafters(target, folders, args.tree_nodes))
    print(file=sys.stderr)
    if args.json:
        print(json.dumps({"model": target.name, "k": config.k, "answers": len(answers), "skipped": skipped,
                          "max_new_tokens": config.max_new_tokens, "heads": results, "tree_nodes": args.tree_nodes,
                          "trees": trees, "trees_when_decoding": decoded}))
        return 0
    categories = list(dict.fromkeys(a.category for a in answers))
    print(f"Mean accepted length per target pass (chain of {config.k}, drafted at every step), {len(answers)} answers "
          f"of up to {config.max_new_tokens} tokens" + (f", {skipped} prompts too long for the window left out" if skipped else ""))
    print()
    print("| head | " + " | ".join(categories) + " | overall |")
    print("|---|" + "---|" * (len(categories) + 1))
    for folder, by in results.items():
        _row(folder, by, categories)
    for name, by in trees.items():
        _row(_tree_label(name, args.tree_nodes), by, categories)
    if decoded:
        print()
        print("Trees, tokens per pass when decoding (each pass starting where the last one's tokens end):")
        print()
        print("| head | " + " | ".join(categories) + " | overall |")
        print("|---|" + "---|" * (len(categories) + 1))
        for name, by in decoded.items():
            _row(_tree_label(name, args.tree_nodes), by, categories)
    return 0


def _tree_label(name: str, nodes: int) -> str:
    """'DIR' -> 'DIR, tree of N'; 'DIR' + LOOKUP_LABEL -> "DIR, tree of N with prompt lookup's branch"."""
    plain = name.removesuffix(LOOKUP_LABEL)
    return f"{plain}, tree of {nodes}" + (LOOKUP_LABEL.removeprefix(",") if plain != name else "")


def _row(label: str, by: dict[str, float], categories: list[str]) -> None:
    print(f"| {label} | " + " | ".join(f"{by[c]:.2f}" for c in categories) + f" | **{by['overall']:.2f}** |")
