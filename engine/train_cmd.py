"""`specula train-head`: self-distil a draft head for a model, report its held-out acceptance, save it.

The generated answers and the training state live in a data folder (OUT/training unless --data says
otherwise), so an interrupted run continues where it stopped, and another kind of head can be trained
on the same answers.
"""

from __future__ import annotations

import json
import sys
import time

from .errors import SpeculaError
from .loading import ModelSpec, load_model


def run_train_cmd(args) -> int:
    from .heads.eagle import save_head, target_fingerprint
    from .heads.train import (chain_acceptance, frequent_tokens, head_info, medusa_acceptance, progress_line,
                              self_distill, train_head, with_features)

    if args.tokens < 100 or args.epochs < 1 or args.batch < 1 or args.train_batch < 1:
        raise SpeculaError("--tokens must be at least 100, --epochs, --batch and --train-batch at least 1")
    if args.out is None:
        from .paths import data_dir

        slug = "".join(c if c.isalnum() else "-" for c in args.model.lower()).strip("-")[:60] or "model"
        args.out = data_dir() / "heads" / f"{slug}-{args.kind}"
    if (args.out / "head.json").exists() and not args.overwrite:
        raise SpeculaError(f"{args.out} already holds a head: choose another --out or pass --overwrite")
    work = args.data or args.out / "training"
    target = load_model(ModelSpec(args.model, args.device, args.dtype), progress=lambda s: print(s, file=sys.stderr))
    if not target.uses_lean_forward:
        raise SpeculaError(f"draft heads need a Llama-family model (Llama, Qwen2/3, Mistral, SmolLM), not '{target.model.config.model_type}'")
    t0 = time.perf_counter()
    about = {"target": target_fingerprint(target.model), "seed": args.seed, "max_new_tokens": args.max_new_tokens}
    try:
        work.mkdir(parents=True, exist_ok=True)
        stored = json.loads((work / "about.json").read_text(encoding="utf-8")) if (work / "about.json").is_file() else None
    except (OSError, ValueError) as exc:
        raise SpeculaError(f"the training data folder {work} is unusable: {exc}") from None
    if stored is not None and stored != about:
        raise SpeculaError(f"{work} holds training data for another model or other settings: choose another --data")
    (work / "about.json").write_text(json.dumps(about), encoding="utf-8")
    answers = self_distill(target, args.tokens, max_new=args.max_new_tokens, batch=args.batch, seed=args.seed,
                           say=progress_line, store=work / "answers.jsonl")
    print(file=sys.stderr)
    seqs = with_features(target, answers, say=progress_line)
    print(file=sys.stderr)
    held = max(1, len(seqs) // 10)
    train, test = seqs[held:], seqs[:held]
    vocab = frequent_tokens(train, args.draft_vocab) if args.draft_vocab else None
    head = train_head(target, train, epochs=args.epochs, lr=args.lr, seed=args.seed, say=progress_line,
                      batch=args.train_batch, checkpoint=work / f"{args.kind}-checkpoint.pt", kind=args.kind,
                      draft_ids=vocab)
    print(file=sys.stderr)
    if args.kind == "medusa":
        accepted, how = medusa_acceptance(head, target, test), "top guesses as a chain"
    else:
        accepted, how = chain_acceptance(head, target, test, k=5), "chain of 5"
    tokens = sum(len(s.tokens) - s.answer_start for s in seqs)
    save_head(head.to(target.dtype), head_info(target, args.kind, tokens, args.epochs, round(accepted, 3)), args.out)
    print(f"head saved to {args.out}: {tokens} answer tokens, {args.epochs} epochs, "
          f"held-out mean accepted length {accepted:.2f} ({how}), {time.perf_counter() - t0:.0f} s; "
          f"the answers and checkpoints stay in {work} (delete it when done)")
    return 0
