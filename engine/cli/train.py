"""`specula train-head`: self-distil a draft head for a model, report its held-out acceptance, save it.
The work itself is `heads.train.run.run_training`, which the app's training dialog runs too."""

from __future__ import annotations

import sys

from ..models.loading import load_model
from .common import model_choice


def run_train_cmd(args) -> int:
    if args.kind == "phrases":
        return _count_phrases(args)
    from ..drafters import build_drafter
    from ..heads.train.run import TrainOptions, check_options, default_out, progress_line, run_training

    options = TrainOptions(kind=args.kind, tokens=args.tokens, epochs=args.epochs, lr=args.lr, seed=args.seed,
                           max_new_tokens=args.max_new_tokens, batch=args.batch, train_batch=args.train_batch,
                           draft_vocab=args.draft_vocab, out=args.out or default_out(args.model, args.kind), data=args.data, overwrite=args.overwrite,
                           start=args.start,
                           **({"written": args.written} if args.written is not None else {}))
    check_options(options)  # bad options fail before the model loads
    target = load_model(model_choice(args), progress=lambda s: print(s, file=sys.stderr))
    result = run_training(target, options, say=progress_line, drafter=build_drafter("prompt-lookup", target))
    print(file=sys.stderr)
    print(result.summary())
    return 0


def _count_phrases(args) -> int:
    """`--kind phrases`: the model's own phrases counted from a data folder's answers (no training)."""
    import time

    from ..api.errors import SpeculaError
    from ..drafters.phrases import build_table, read_answers
    from ..heads.train.run import default_out

    if args.data is None or (args.data.exists() and not args.data.is_dir()):
        given = f" ({args.data} is a file)" if args.data is not None else ""
        raise SpeculaError(f"--kind phrases counts the answers of a data folder: give --data DIR{given}")
    out = args.out or default_out(args.model, "phrases")
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise SpeculaError(f"{out} is not empty: choose another --out or pass --overwrite")
    answers = read_answers(args.data)  # before the model loads
    target = load_model(model_choice(args), progress=lambda s: print(s, file=sys.stderr))
    began = time.perf_counter()
    table = build_table(target, answers)
    table.save(out)
    info = table.info
    print(f"phrase table saved to {out}: {table.runs} runs from {info['answers']} answers "
          f"({info['answer_tokens']} answer tokens), {time.perf_counter() - began:.0f} s")
    return 0
