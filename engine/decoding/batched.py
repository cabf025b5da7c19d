"""Plain decoding of many prompts at once, beside the loop it mirrors.

`BatchedDecoder`: up to `rows` answers advance together, one token each per call of the compiled step over
all their runners (`step_rows`, the lean forward's, given by the caller), and a finished answer's row takes
the next prompt. Greedy answers are the model's own token for token (the compiled step's own products give a
row the bits it gets alone); sampled ones draw from its distribution (`sampling.draw_top_p`), each prompt
with its own seeded generator. Where the compiled step does not run (not built yet, eager, a model it does
not cover) the prompts go one at a time through the loop (`LoopDecoder`).

For a head that reads target layers (EAGLE-3) the decoder also keeps, from the same forwards, the states
entering those layers and labels of the target's logits at the positions its training reads (`Kept`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from ..api.types import DecodeConfig, SamplingParams
from .drafter import Drafter, NoDraft
from .loop import generate, make_generator
from .sampling import choose, draw_top_p
from .target import ModelRunner


class RowRunner(ModelRunner, Protocol):
    """A runner whose answers the compiled step advances together with other runners' (models.runner.LeanRunner)."""

    @property
    def compiled(self) -> bool:
        """Whether the current answer runs through the compiled step."""
        ...

    def aux_features(self, start: int, end: int) -> torch.Tensor:
        """The kept layers' hidden states of cached positions start..end-1, side by side (end-start, layers * D)."""
        ...


class Model(Protocol):
    """What decoding prompts asks of a loaded model: runners over it, and the tokens that end an answer."""

    eos_ids: frozenset[int]

    def new_runner(self) -> RowRunner:
        ...


# one decoding step of several runners at once: token b continues runners[b]; (B,) -> fp32 logits (B, V)
StepRows = Callable[[list[RowRunner], torch.Tensor], torch.Tensor]
Labels = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Kept:
    """What batched decoding keeps of each answer beside its tokens: the hidden states entering the target
    layers `layers`, and `labels` of the target's logits ((n, V) -> two tensors of n rows), at every position
    of the conversation from `first(prompt length)` on."""

    layers: tuple[int, ...]
    first: Callable[[int], int]
    labels: Labels


class LoopDecoder:
    """Answers prompts one at a time through the engine's own decoding loop with the drafter given (none:
    plain steps): greedy answers are the model's own, sampled ones follow its distribution."""

    def __init__(self, model: Model, drafter: Drafter | None = None) -> None:
        self.model = model
        self.runner = model.new_runner()
        self.drafter = drafter if drafter is not None else NoDraft()

    def answer(self, prompts: list[list[int]], max_new: int, params: SamplingParams, seed: int,
               should_stop: Callable[[], bool]) -> list[list[int]]:
        """Each prompt's continuation (prompt j drawn with seed + j), up to max_new tokens and its end token."""
        rows = []
        for j, prompt in enumerate(prompts):
            config = DecodeConfig.for_strategy(self.drafter.name, max_new_tokens=max_new, seed=seed + j,
                                               temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
            events = list(generate(self.runner, self.drafter, prompt, config, stop_ids=frozenset(self.model.eos_ids),
                                   should_stop=should_stop))
            rows.append(list(events[-1].token_ids))
            if should_stop():
                break
        return rows


class BatchedDecoder:
    """Answers many prompts at once by batched plain decoding through the compiled step (module docstring);
    `fallback` answers them where that step does not run. With `kept`, `features` holds what the last call
    kept of each answer: prompt index -> (the layers' states, then the two labels, one row per position)."""

    def __init__(self, model: Model, step_rows: StepRows, rows: int, fallback: LoopDecoder,
                 kept: Kept | None = None) -> None:
        self.model = model
        self.step_rows = step_rows
        self.rows = max(1, rows)
        self.single = fallback
        self.runners: list[RowRunner] = []  # kept from one call to the next
        self.kept = kept
        self.aux_layers = kept.layers if kept is not None else ()
        self.features: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def answer(self, prompts: list[list[int]], max_new: int, params: SamplingParams, seed: int,
               should_stop: Callable[[], bool], keep: bool = True) -> list[list[int]]:
        """Each prompt's continuation (prompt j drawn with seed + j), up to max_new tokens and its end token;
        with `keep`, what `kept` names too (`self.features`)."""
        stop = self.model.eos_ids
        out: list[list[int] | None] = [None] * len(prompts)
        waiting = list(range(len(prompts)))[::-1]
        # (prompt, runner, generator, answer) of each answer being made
        active: list[tuple[int, RowRunner, torch.Generator | None, list[int]]] = []
        idle = list(self.runners)
        keep = keep and bool(self.aux_layers)
        labels: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # prompt -> the labels of its positions so far
        self.features = {}
        while (waiting or active) and not should_stop():
            while waiting and len(active) < self.rows:
                j = waiting.pop()
                if idle:
                    runner = idle.pop()
                else:
                    runner = self.model.new_runner()
                    self.runners.append(runner)
                runner.truncate(0)
                runner.keep_layers(self.aux_layers)
                first = self.kept.first(len(prompts[j])) if keep else 0
                ids = torch.tensor(prompts[j], dtype=torch.long)
                logits = runner.forward(ids, last=len(prompts[j]) - first if keep else 1)
                if not runner.compiled:  # the compiled step is not running: one answer at a time
                    return self.single.answer(prompts, max_new, params, seed, should_stop)
                if keep:
                    labels[j] = [self.kept.labels(logits)]
                gen = make_generator(runner.device, seed + j) if not params.greedy else None
                token = int(choose(logits[-1], params, gen))
                if token in stop or max_new == 1:
                    out[j] = [token]
                    self._keep(j, runner, len(prompts[j]), labels)
                    idle.append(runner)
                else:
                    active.append((j, runner, gen, [token]))
            if not active:
                continue
            logits = self.step_rows([a[1] for a in active], torch.tensor([a[3][-1] for a in active], dtype=torch.long))
            if keep:
                step = self.kept.labels(logits)
                for b, a in enumerate(active):
                    labels[a[0]].append((step[0][b : b + 1], step[1][b : b + 1]))
            if params.greedy:
                tokens = logits.argmax(-1).tolist()
            else:
                tokens = draw_top_p(logits, params, [a[2] for a in active])
            still = []
            for (j, runner, gen, answer), token in zip(active, tokens):
                answer.append(token)
                if token in stop or len(answer) >= max_new:
                    out[j] = answer
                    self._keep(j, runner, len(prompts[j]), labels)
                    idle.append(runner)
                else:
                    still.append((j, runner, gen, answer))
            active = still
        return [a for a in out if a is not None]

    def _keep(self, j: int, runner: RowRunner, prompt_length: int, labels: dict) -> None:
        """A finished answer's kept states from its runner and its labels, at positions first.. of its cache
        (the answer's last token is never read, as it ended the answer)."""
        if j not in labels:  # nothing kept in this call
            return
        seen = labels.pop(j)
        first = self.kept.first(prompt_length)
        self.features[j] = (runner.aux_features(first, runner.length).clone().cpu(),
                            torch.cat([t[0] for t in seen]), torch.cat([t[1] for t in seen]))
