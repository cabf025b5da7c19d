"""The loaded models and the strategies built for them: requests in, events out, synchronously.

`Session` is what the worker thread (`worker.py`) drives and what the CLI uses directly. It keeps the
loaded model's recent plain-step samples for the live speedup (decoding.speedup.SpeedupMeter); changing strategy
between requests builds (or reuses) a drafter and never reloads the target.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterator

from ..api import prompts
from ..api.errors import SpeculaError
from ..api.events import BaselineCost, Finished, Loaded, Started, Step, Trained
from ..api.memory import give_back_freed
from ..api.prompts import Message
from ..api.types import GenerateRequest, LoadRequest, ModelChoice, TrainRequest
from ..cpu.governor import governor
from ..decoding.loop import generate
from ..decoding.speedup import PlainHistory, measure_baseline
from ..drafters import DRAFTERS, build_drafter
from ..models.loading import LoadedModel, check_same_vocabulary, load_model

WARM_UP_TOKENS = 16  # the short answer a load runs with the strategy it prepares


class Session:
    def __init__(self) -> None:
        self.target: LoadedModel | None = None
        self.draft: LoadedModel | None = None
        self.baseline: BaselineCost | None = None  # measured at load when asked (not the live speedup's)
        self.plain = PlainHistory()  # the loaded model's recent plain-step samples: the live speedup's
        self._runner = None
        self._drafters: dict = {}
        self.heads: dict = {}  # kind -> draft head folders made for the target, found when it loads
        self.head_warnings: list[str] = []  # heads found but unreadable (left out)
        self.dropped: tuple[str, str] | None = None  # (source, why) of a head the load asked for but left out
        self.target_spec: ModelChoice | None = None  # what the last load read the target from

    def load(self, request: LoadRequest, progress: Callable[[str], None] | None = None) -> Loaded:
        """Load the models `request` names; a draft head that does not fit the target never stops it: the model
        loads without the head, and `describe` says so (`Loaded.dropped_head`). Where the head's own file says whom
        it was made for, that is checked before the model is read."""
        from ..heads.made_for import unfit_before_loading

        say = progress or (lambda text: None)
        unfit = unfit_before_loading(request.draft_head, request.target) if request.draft_head else None
        kept = self._kept_target(request)
        target = kept if kept is not None else load_model(request.target, say)
        draft = None
        if request.draft and request.draft.strip() == request.target.source.strip():
            draft = target  # the same weights; the drafter still keeps a cache of its own
        elif request.draft:
            weights = "dequantized" if request.target.weights == "dequantized" else "auto"
            spec = ModelChoice(request.draft, device=str(target.device), dtype=target.dtype_name, weights=weights)
            draft = load_model(spec, say)
            check_same_vocabulary(target.tokenizer, draft.tokenizer)
        baseline, plain = self.baseline, self.plain
        self.use(target, draft)
        self.target_spec = request.target
        if kept is not None:  # the target's own measures stay with it
            self.baseline, self.plain = baseline, plain
        if request.draft_head:
            self.take_head(request.draft_head, say, unfit)
        if request.measure_baseline:
            say("measuring plain decoding speed")
            self.baseline = measure_baseline(self._runner)
        if request.prepare is not None:
            say(f"warming up ({request.prepare.strategy})")
            self.prepare(request.prepare)
        return self.describe()

    def _kept_target(self, request: LoadRequest) -> LoadedModel | None:
        """The target loaded now, where the request keeps it (`keep_target`: only the draft changes) and names the
        same one; None: it is read."""
        if request.keep_target and self.target is not None and self.target_spec == request.target:
            return self.target
        return None

    def prepare(self, request: GenerateRequest) -> None:
        """Make the drafter `request` asks for and run a short answer with it: what the first answer after a
        start would pay on top of the next (the drafter's making, its heads read, the first passes' and the
        sampler's first calls, the detokenizer) is paid before the model is ready. A strategy that cannot
        run here is left for the answer that asks for it to report."""
        if request.strategy not in DRAFTERS:
            return
        target = self._need_target()
        chat = request.chat and bool(getattr(target.tokenizer, "chat_template", None))
        config = replace(request.config, max_new_tokens=WARM_UP_TOKENS, learn=False)  # not an answer of the user's
        try:
            for _ in self.generate(replace(request, messages=(Message("user", "Hello."),), config=config, chat=chat)):
                pass
        except SpeculaError:
            pass
        finally:  # the cache keeps what it read (the chat template's opening, as after any answer)
            self.plain = PlainHistory()  # the first answer measures plain decoding itself
        if self._runner is not None and self._runner.length:
            governor().check_ahead(self._runner)

    def use(self, target: LoadedModel, draft: LoadedModel | None = None) -> None:
        """Adopt already loaded models (tests build tiny ones in memory); the models used before are let go, and
        their memory given back."""
        replaced = self.target is not None
        self.target, self.draft = target, draft
        self.target_spec = None  # (a load sets it once the models are in use)
        self.dropped = None
        self._find_heads(target)
        self._runner = target.new_runner()
        self._drafters = {}
        self.baseline = None
        self.plain = PlainHistory()
        if replaced:
            give_back_freed()

    def unload(self) -> None:
        """Let go of the models (their memory), e.g. when chat moves to a server; `load` brings them back."""
        self.target = self.draft = self.baseline = self._runner = self.target_spec = None
        self._drafters = {}
        self.heads = {}
        give_back_freed()

    def train(self, request: TrainRequest, request_id: int, say: Callable[[str], None],
              should_stop: Callable[[], bool]) -> Trained:
        """Train and save a head in the user's heads folder, then offer it: the strategies change."""
        from ..heads.train import TrainOptions, default_out, run_training

        target = self._need_target()
        out = default_out(target.name, request.kind)
        options = TrainOptions(kind=request.kind, tokens=request.tokens, epochs=request.epochs, batch=request.batch,
                               out=out, overwrite=True)
        result = run_training(target, options, say=say, should_stop=should_stop,
                              drafter=build_drafter("prompt-lookup", target))
        self._find_heads(target)
        self._drafters = {key: d for key, d in self._drafters.items() if key[0] not in (result.kind, "auto")}
        return Trained(request_id, result.kind, str(result.out), result.accepted, result.summary())

    def add_head(self, source: str, say: Callable[[str], None] = lambda text: None) -> str:
        """Offer a head (a folder or a Hub id) first among the heads of its kind, once it has loaded for this
        target (a head for another model is refused here, with the reason); its kind."""
        from ..heads.published import head_folder
        from ..heads.store import load_head

        target = self._need_target()
        folder = head_folder(source, say)
        _, info = load_head(folder, target)
        self.heads[info.kind] = [folder] + [f for f in self.heads.get(info.kind, []) if f != folder]
        self._drafters = {}
        say(f"draft head: {info.kind} from {folder}")
        return info.kind

    def take_head(self, source: str, say: Callable[[str], None] = lambda text: None,
                  unfit: str | None = None) -> None:
        """The head a load asks for, first among its kind where it loads for this target; else (`unfit`: why it
        cannot, known before the model was read) the model stays loaded without it, and `describe` says why."""
        if unfit is None:
            try:
                self.add_head(source, say)
                return
            except SpeculaError as exc:
                unfit = str(exc)
        self.dropped = (source, f"{unfit.rstrip('.')}: the model loaded without it")

    def _find_heads(self, target: LoadedModel) -> None:
        """The heads made for this target, and a warning for each one found but unreadable."""
        from ..heads.store import find_heads

        self.head_warnings = []
        self.heads = find_heads(target, self.head_warnings)

    def describe(self, request_id: int = 0) -> Loaded:
        t = self._need_target()
        return Loaded(
            request_id,
            t.name,
            self.draft.name if self.draft else None,
            str(t.device),
            t.dtype_name,
            t.context_window,
            tuple(name for name, info in DRAFTERS.items()
                  if (self.draft or not info.needs_draft_model) and (not info.needs_head or info.needs_head in self.heads)),
            self.baseline,
            weights=t.weights,
            warnings=tuple(self.head_warnings),
            chat=bool(getattr(t.tokenizer, "chat_template", None)),
            path=t.path,
            step=t.step_status,
            dropped_head=self.dropped[0] if self.dropped else "",
            dropped_why=self.dropped[1] if self.dropped else "",
        )

    def _need_target(self) -> LoadedModel:
        if self.target is None:
            raise SpeculaError("no model is loaded yet")
        return self.target

    def drafter(self, strategy: str, options: dict):
        info = DRAFTERS.get(strategy)
        if info is not None and info.needs_head and not options.get("head") and self.heads.get(info.needs_head):
            options = {**options, "head": str(self.heads[info.needs_head][0])}
        if info is not None and info.uses_heads and "heads" not in options:  # the first head of each kind
            options = {**options, "heads": tuple(str(folders[0]) for folders in self.heads.values())}
        key = (strategy, tuple(sorted(options.items())))
        if key not in self._drafters:
            self._drafters[key] = build_drafter(strategy, self._need_target(), self.draft, **options)
        return self._drafters[key]

    def forget(self) -> None:
        """The next generation reads its whole prompt: nothing of what the cache holds is kept (the bench starts
        each strategy's first turn alike, whatever ran before)."""
        if self._runner is not None:
            self._runner.truncate(0)
        for drafter in self._drafters.values():
            drafter.forget()

    def encode(self, request: GenerateRequest) -> list[int]:
        """The prompt's tokens; one that cannot fit in the window is refused before it is tokenized (a 3.6 MB
        prompt took the engine 3-4 s and 0.66 GB to tokenize, only to be refused)."""
        target = self._need_target()
        if self._runner is not None:
            prompts.check_fits(target.tokenizer, request.messages, self._runner.max_len)
        return prompts.encode(target.tokenizer, request.messages, request.chat)

    def generate(
        self,
        request: GenerateRequest,
        request_id: int = 0,
        should_stop: Callable[[], bool] = lambda: False,
        prompt_ids: list[int] | None = None,
    ) -> Iterator[Started | Step | Finished]:
        target = self._need_target()
        drafter = self.drafter(request.strategy, request.option_dict)
        ids = prompt_ids if prompt_ids is not None else self.encode(request)
        return generate(
            self._runner,
            drafter,
            ids,
            request.config,
            stop_ids=target.eos_ids,
            tokenizer=target.tokenizer,
            request_id=request_id,
            strategy=request.strategy,
            should_stop=should_stop,
            plain=self.plain,
            between_steps=self._between_steps(),
            step=target.step_status,
        )

    def _between_steps(self) -> Callable[[], None] | None:
        """Fewer threads while other programs keep the CPU's cores busy (a count is used only once it is
        checked to change no bits: cpu/governor.py)."""
        runner = self._runner
        if runner is None or runner.device.type != "cpu":
            return None
        threads = governor()
        threads.begin()
        return lambda: threads.tick(runner)
