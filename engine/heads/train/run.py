"""A training run from options to a saved head: the target answers generated prompts (or an earlier run's
answers are read), its features are extracted, a head is fitted on nine tenths of the conversations and
measured on the rest, and saved with what its training was (`head.json`). The answers, features and
checkpoints stay in a data folder, from which an interrupted or cancelled run continues."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ...api.errors import SpeculaError, TrainingCancelled
from ...api.paths import make_folder
from ...decoding.drafter import Drafter
from ..config import HeadConfig, HeadInfo, target_fingerprint, vocabulary_fingerprint
from ..eagle3 import default_aux_layers
from .distill import self_distill
from .evaluate import chain_acceptance, medusa_acceptance, unrolled_acceptance
from .features import with_features
from .fit import frequent_tokens, start_head, train_head
from .prompts import MODEL_QUERY_SHARE


HEAD_KINDS = ("eagle", "eagle3", "medusa")  # eagle3: an EAGLE-3 head, used by the eagle strategy


@dataclass
class TrainOptions:
    kind: str = "eagle"  # or "eagle3", "medusa"
    tokens: int = 20000  # answer tokens to generate
    epochs: int = 3
    lr: float = 1e-3
    seed: int = 0
    max_new_tokens: int = 192
    batch: int = 32  # conversations answered together
    train_batch: int = 4  # conversations per optimizer step
    draft_vocab: int = 8192  # 0: the whole vocabulary
    out: Path | None = None  # default: the user's heads folder
    data: Path | None = None  # answers and checkpoints; default OUT/training
    overwrite: bool = False
    start: Path | None = None  # a head of this kind to continue training (its weights and draft vocabulary)
    written: float = MODEL_QUERY_SHARE  # of the first turns without a long text, the share the model writes itself


@dataclass
class TrainResult:
    kind: str  # the strategy that drafts with the head (eagle for an EAGLE-3 head)
    out: Path
    data: Path
    answer_tokens: int
    epochs: int
    accepted: float  # held-out mean accepted length
    how: str  # what `accepted` measures
    seconds: float

    def summary(self) -> str:
        return (f"{self.kind} head saved to {self.out}: {self.answer_tokens} answer tokens, {self.epochs} epochs, "
                f"held-out mean accepted length {self.accepted:.2f} ({self.how}), {self.seconds:.0f} s; "
                f"the answers and checkpoints stay in {self.data} (delete it when done)")


def default_out(model_name: str, kind: str) -> Path:
    from ...api.paths import data_dir

    slug = "".join(c if c.isalnum() else "-" for c in model_name.lower()).strip("-")[:60] or "model"
    return data_dir() / "heads" / f"{slug}-{kind}"


def head_info(target, kind: str, tokens: int, epochs: int, acceptance: float | None,
              config: HeadConfig | None = None, before: dict | None = None) -> HeadInfo:
    """`before`: the training of the head this one continued (`--from`), kept beside this run's."""
    training = {"answer_tokens": tokens, "epochs": epochs, "held_out_mean_accepted_length": acceptance}
    if before:
        training["continued_from"] = before
    return HeadInfo(
        kind=kind,
        config=config or HeadConfig.for_target(target.model.config),
        target=target_fingerprint(target.model),
        vocabulary=vocabulary_fingerprint(target.tokenizer) if target.tokenizer is not None else "",
        target_name=target.name,
        training=training,
    )


def check_options(o: TrainOptions) -> None:
    if o.kind not in HEAD_KINDS:
        raise SpeculaError(f"unknown head kind '{o.kind}': choose {', '.join(HEAD_KINDS[:-1])} or {HEAD_KINDS[-1]}")
    low = {"answer tokens": (o.tokens, 100), "epochs": (o.epochs, 1), "batch": (o.batch, 1),
           "train batch": (o.train_batch, 1), "longest answer (max new tokens)": (o.max_new_tokens, 1),
           "draft vocabulary": (o.draft_vocab, 0)}
    for what, (value, least) in low.items():
        if value < least:
            raise SpeculaError(f"{what} must be at least {least}, got {value}")
    if not math.isfinite(o.lr) or o.lr <= 0:
        raise SpeculaError(f"the learning rate must be a finite number above 0, got {o.lr}")
    if not 0 <= o.written <= 1:
        raise SpeculaError(f"the share of questions the model writes must be from 0 to 1, got {o.written}")
    if o.out is not None and (o.out / "head.json").exists() and not o.overwrite:
        raise SpeculaError(f"{o.out} already holds a head: choose another folder or overwrite it")
    if o.data is not None and o.data.exists() and not o.data.is_dir():
        raise SpeculaError(f"the training data folder {o.data} is a file: give a folder (the answers and features "
                           "are kept there)")
    if o.start is not None and not (o.start / "head.json").is_file():
        raise SpeculaError(f"no head to continue from in {o.start}: "
                           "it needs a head.json as `specula train-head` writes")


def run_training(target, o: TrainOptions, say: Callable[[str], None] = lambda s: None,
                 should_stop: Callable[[], bool] = lambda: False, drafter: Drafter | None = None) -> TrainResult:
    """Generate answers (or continue an earlier run's), extract features, train, measure, save.
    `should_stop` is checked often; when it says so, TrainingCancelled is raised and the answers and
    the last checkpoint stay for the next run (a run that kept nothing yet leaves no folder)."""
    out = o.out or default_out(target.name, o.kind)
    # answers at most half the window long, so prompts fit beside them
    o = TrainOptions(**{**o.__dict__, "out": out, "max_new_tokens": min(o.max_new_tokens, target.context_window // 2)})
    check_options(o)
    target.require_lean("training a draft head")

    def report(text: str) -> None:
        if should_stop():
            raise TrainingCancelled("training cancelled: the answers made so far are kept, "
                                    "and the next run continues from them")
        say(text)

    t0 = time.perf_counter()
    work = o.data or out / "training"
    made = [p for p in (work, *work.parents) if not p.exists()]  # the folders this run creates, innermost first
    start = start_head(o.start, target, o.kind) if o.start is not None else None  # refused before anything is written
    try:
        return _run_training(target, o, out, work, report, should_stop, drafter, t0, start)
    except TrainingCancelled:
        _tidy_cancelled(work, made)
        raise


def _tidy_cancelled(work: Path, made: list[Path]) -> None:
    """A run cancelled before it kept anything to continue from leaves no folder behind."""
    answers = work / "answers.jsonl"
    if (answers.is_file() and answers.stat().st_size) or any(work.glob("*-checkpoint.pt")):
        return  # kept for the next run
    (work / "about.json").unlink(missing_ok=True)
    answers.unlink(missing_ok=True)
    for features in work.glob("features-*"):  # made before the first answer was kept: empty
        try:
            features.rmdir()
        except OSError:
            pass
    for folder in made:
        try:
            folder.rmdir()
        except OSError:  # not empty: something else is in it
            return


def _run_training(target, o: TrainOptions, out: Path, work: Path, report: Callable[[str], None],
                  should_stop: Callable[[], bool], drafter: Drafter | None, t0: float,
                  started: tuple[torch.nn.Module, dict] | None) -> TrainResult:
    from ..store import save_head

    about = {"target": target_fingerprint(target.model), "seed": o.seed, "max_new_tokens": o.max_new_tokens}
    if o.written != MODEL_QUERY_SHARE:  # other prompts than the default's (folders of the default stay as they were)
        about["model_questions"] = o.written
    make_folder(work, "the training data folder")
    try:
        about_file = work / "about.json"
        stored = json.loads(about_file.read_text(encoding="utf-8")) if about_file.is_file() else None
    except (OSError, ValueError) as exc:
        raise SpeculaError(f"the training data folder {work} is unusable: {exc}") from None
    if stored is not None and stored != about:
        raise SpeculaError(f"{work} holds training data for another model or other settings: "
                           "choose another data folder")
    (work / "about.json").write_text(json.dumps(about), encoding="utf-8")
    start, before = started if started is not None else (None, None)
    aux = default_aux_layers(target.model.config.num_hidden_layers) if o.kind == "eagle3" else ()
    store = work / ("features-" + ("-".join(map(str, aux)) if aux else "final"))
    answers = self_distill(target, o.tokens, max_new=o.max_new_tokens, batch=o.batch, seed=o.seed, say=report,
                           store=work / "answers.jsonl", should_stop=should_stop, drafter=drafter,
                           aux_layers=aux, features=store if aux else None, written=o.written)
    if len(answers) < 2:
        raise SpeculaError("the model gave too few usable answers to train on "
                           "(each needs at least 4 tokens before its end)")
    seqs = with_features(target, answers, say=report, aux_layers=aux, store=store)
    held = max(1, len(seqs) // 10)
    train, test = seqs[held:], seqs[:held]
    vocab = frequent_tokens(train, o.draft_vocab) if o.draft_vocab and start is None else None
    head = train_head(target, train, epochs=o.epochs, lr=o.lr, seed=o.seed, say=report, batch=o.train_batch,
                      checkpoint=work / f"{o.kind}-checkpoint.pt", kind=o.kind, draft_ids=vocab, start=start)
    report("measuring the head on held-out answers")
    if o.kind == "medusa":
        accepted, how = medusa_acceptance(head, target, test), "top guesses as a chain"
    elif o.kind == "eagle3":
        accepted, how = unrolled_acceptance(head, target, test, k=5), "chain of 5"
    else:
        accepted, how = chain_acceptance(head, target, test, k=5), "chain of 5"
    tokens = sum(len(s.tokens) - s.answer_start for s in seqs)
    stored = "eagle" if o.kind == "eagle3" else o.kind  # the eagle strategy drafts with EAGLE-3 heads too
    info = head_info(target, stored, tokens, o.epochs, round(accepted, 3), head.config if o.kind != "medusa" else None,
                     before)
    save_head(head.to(target.dtype), info, out)
    return TrainResult(stored, out, work, tokens, o.epochs, accepted, how, time.perf_counter() - t0)


def progress_line(text: str) -> None:
    sys.stderr.write("\r" + text[:120].ljust(120))
    sys.stderr.flush()
