"""`specula train-head`: self-distil a draft head for a model, report its held-out acceptance, save it.
The work itself is `heads.train.run_training`, which the app's training dialog runs too."""

from __future__ import annotations

import sys

from ..api.types import ModelSpec
from ..models.loading import load_model


def run_train_cmd(args) -> int:
    from ..drafters import build_drafter
    from ..heads.train import TrainOptions, check_options, default_out, progress_line, run_training

    options = TrainOptions(kind=args.kind, tokens=args.tokens, epochs=args.epochs, lr=args.lr, seed=args.seed,
                           max_new_tokens=args.max_new_tokens, batch=args.batch, train_batch=args.train_batch,
                           draft_vocab=args.draft_vocab, out=args.out or default_out(args.model, args.kind), data=args.data, overwrite=args.overwrite,
                           start=args.start,
                           **({"written": args.written} if args.written is not None else {}))
    check_options(options)  # bad options fail before the model loads
    target = load_model(ModelSpec(args.model, args.device, args.dtype, args.weights, args.step), progress=lambda s: print(s, file=sys.stderr))
    result = run_training(target, options, say=progress_line, drafter=build_drafter("prompt-lookup", target))
    print(file=sys.stderr)
    print(result.summary())
    return 0
