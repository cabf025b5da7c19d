"""`specula train-head`: self-distil a draft head for a model, report its held-out acceptance, save it."""

from __future__ import annotations

import sys
import time

from .errors import SpeculaError
from .loading import ModelSpec, load_model


def run_train_cmd(args) -> int:
    from .heads.eagle import save_head
    from .heads.train import chain_acceptance, frequent_tokens, head_info, progress_line, self_distill, train_head

    if args.kind != "eagle":
        raise SpeculaError(f"only eagle heads can be trained in this version, not '{args.kind}'")
    if args.tokens < 100 or args.epochs < 1 or args.batch < 1:
        raise SpeculaError("--tokens must be at least 100, --epochs and --batch at least 1")
    if args.out is None:
        from .paths import data_dir

        slug = "".join(c if c.isalnum() else "-" for c in args.model.lower()).strip("-")[:60] or "model"
        args.out = data_dir() / "heads" / f"{slug}-{args.kind}"
    if (args.out / "head.json").exists() and not args.overwrite:
        raise SpeculaError(f"{args.out} already holds a head: choose another --out or pass --overwrite")
    target = load_model(ModelSpec(args.model, args.device, args.dtype), progress=lambda s: print(s, file=sys.stderr))
    if not target.uses_lean_forward:
        raise SpeculaError(f"draft heads need a Llama-family model (Llama, Qwen2/3, Mistral, SmolLM), not '{target.model.config.model_type}'")
    t0 = time.perf_counter()
    seqs = self_distill(target, args.tokens, max_new=args.max_new_tokens, batch=args.batch, seed=args.seed,
                        say=progress_line)
    print(file=sys.stderr)
    held = max(1, len(seqs) // 10)
    train, test = seqs[held:], seqs[:held]
    head = train_head(target, train, epochs=args.epochs, lr=args.lr, seed=args.seed, say=progress_line)
    print(file=sys.stderr)
    if args.draft_vocab:
        head.draft_ids = frequent_tokens(train, args.draft_vocab)
    accepted = chain_acceptance(head, target, test, k=5)
    tokens = sum(len(s.tokens) - s.answer_start for s in seqs)
    save_head(head.to(target.dtype), head_info(target, "eagle", tokens, args.epochs, round(accepted, 3)), args.out)
    print(f"head saved to {args.out}: {tokens} answer tokens, {args.epochs} epochs, "
          f"held-out mean accepted length {accepted:.2f} (chain of 5), {time.perf_counter() - t0:.0f} s")
    return 0
