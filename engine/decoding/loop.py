"""The speculative loop: token ids in, events out.

    prefill(prompt)                      -> the target's first token (step 0)
    repeat until eos, length or cancel:
        draft   = drafter.propose(context, k)              up to k guesses
        logits  = target.forward([last, *draft])           one pass scores them all
        verdict = verify(logits, draft)                    how many survive + the target's next token
        rollback: target cache keeps [last, accepted drafts]; the next token is fed next step
        emit accepted drafts, then the correction / bonus

With no draft (strategy `none`) each step is exactly one plain decoding step, so the baseline runs
through the same code. Rollback is a truncation of the cache; nothing is recomputed.
"""

from __future__ import annotations

import random
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from ..api.errors import ContextTooLongError, SpeculaError
from ..api.events import Finished, Origin, PromptProgress, Started, Step, Token
from ..api.metrics import StepTotals
from ..api.types import K_MAX, DecodeConfig
from .detok import Detokenizer
from .drafter import DraftContext, Drafter
from .length import next_k
from .sampling import choose
from .speedup import PlainHistory, SpeedupMeter
from .target import ModelRunner
from .tree import TokenTree
from .verify import Verdict, verify, walk_tree, walk_tree_sampling

PROMPT_CHUNK = 512  # a longer prompt is read in chunks of this many tokens, with progress between them
PROGRESS_AFTER_S = 1.0  # ... said once reading has taken this long


def make_generator(device: torch.device, seed: int | None) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else random.SystemRandom().randrange(2**63))
    return gen


class _Budget:
    """Cuts the emitted tokens at the first stop token or when the token budget runs out."""

    def __init__(self, limit: int, stop_ids: frozenset[int]) -> None:
        self.limit = limit
        self.stop_ids = stop_ids
        self.used = 0
        self.reason: str | None = None

    def take(self, ids: list[int]) -> int:
        """How many of `ids` are emitted; sets `reason` when the generation ends here."""
        n = 0
        for token in ids:
            if token in self.stop_ids:
                self.reason = "eos"
                break
            if self.used + n >= self.limit:
                break
            n += 1
        self.used += n
        if self.reason is None and self.used >= self.limit:
            self.reason = "length"
        return n


def _origin_of_target_token(drafted: int, accepted: int) -> Origin:
    if drafted == 0:
        return Origin.TARGET
    return Origin.BONUS if accepted == drafted else Origin.CORRECTION


def generate(
    target: ModelRunner,
    drafter: Drafter,
    prompt_ids: list[int],
    config: DecodeConfig,
    *,
    stop_ids: frozenset[int] = frozenset(),
    tokenizer=None,
    request_id: int = 0,
    strategy: str = "",
    should_stop: Callable[[], bool] = lambda: False,
    plain: PlainHistory | None = None,
    between_steps: Callable[[], None] | None = None,
    step: str = "",
) -> Iterator[Started | Step | Finished]:
    """Generate from `prompt_ids`; the events carry text when a tokenizer is given. `plain` holds the
    model's recent plain-step samples (the live speedup's, across answers); `between_steps` runs before
    every decode step (the machine's policy, e.g. the CPU's thread count: it must change no bits)."""
    loop = _Loop(target, drafter, prompt_ids, config, stop_ids, tokenizer, request_id, plain or PlainHistory())
    with drafter.leaving_out(_left_out(config.leave_out, tokenizer)), \
            (nullcontext() if config.learn else drafter.unchanged()):
        yield from _run(loop, strategy, should_stop, between_steps, step_kind=step)


def _left_out(answers: tuple, tokenizer) -> list[list[int]]:
    """DecodeConfig.leave_out as token ids: texts tokenized (left out without a tokenizer), ids as they are."""
    out = []
    for answer in answers:
        if not isinstance(answer, str):
            out.append([int(t) for t in answer])
        elif tokenizer is not None:
            out.append(list(tokenizer.encode(answer, add_special_tokens=False)))
    return out


def _run(loop: "_Loop", strategy: str, should_stop: Callable[[], bool],
         between_steps: Callable[[], None] | None, step_kind: str) -> Iterator[Started | Step | Finished]:
    """The generation's events: its start, the prompt read, each step, its end."""
    drafter, config = loop.drafter, loop.config
    yield Started(loop.request_id, strategy, loop.n_prompt, config.k, step_kind)
    for event in loop.prefill():
        yield event
        if should_stop() and isinstance(event, PromptProgress):  # cancelled while a long prompt is read
            loop.budget.reason = "cancelled"
            yield loop.finish()
            return
    k = config.k
    # the draft length of each step, from measured costs and acceptance (a drafter that chooses its own
    # lengths, auto, gets the step times instead; --adaptive-k keeps the older grow/shrink rule). Sampling
    # with a seed, every choice that shapes the steps depends on step counts only, never on timings: the
    # same seed gives the same answer
    seeded = not loop.timed
    own = drafter.chooses_length
    lengths = drafter.lengths(k) if k > 0 and not seeded and not config.adaptive_k and not own else None
    while loop.budget.reason is None:
        if should_stop():
            loop.budget.reason = "cancelled"
            break
        if between_steps is not None:
            between_steps()
        meter = loop.meter
        probe = k > 0 and meter.probe_due(own_only=seeded)
        plain_s = meter.plain_step_s
        n = 0 if probe else lengths.choose(plain_s) if lengths is not None else k
        if n and lengths is not None and drafter.sizes_itself:
            n = k  # it drafts as far as it is confident: the policy says only whether to draft (plain steps or not)
        step = loop.step(n)
        drafter.observe_pass(loop.pass_rows, step.verify_s)
        yield step
        seconds = max(1e-6, loop.step_seconds - (drafter.catch_up_s if step.k else 0.0))  # within the step's time
        if lengths is not None:
            lengths.observe(step.drafted, step.accepted, seconds, plain_s)
        elif own and step.k:  # it proposed for this step
            drafter.observe_step(step.drafted, step.accepted, seconds)
        if config.adaptive_k and not probe:
            k = next_k(k, step.drafted, step.accepted, config.k_max)
    yield loop.finish()


def reading_left(chunks: list[tuple[int, int, float]], total: int) -> float | None:
    """About how long reading the rest of a prompt takes, from its chunks read so far ((first position, tokens,
    seconds) each): a token's cost grows with its position (attention reads everything before it), so the cost per
    token is fitted as a line over the chunks' middle positions and summed over the rest. At the rate so far the
    estimate was a fifth of the truth early in a long read (7 s left said at 21% of a 40 s read)."""
    if not chunks:
        return None
    mids = [first + size / 2 for first, size, _ in chunks]
    rates = [seconds / size for _, size, seconds in chunks]
    done = chunks[-1][0] + chunks[-1][1]
    slope = 0.0
    if len(chunks) >= 2:
        mean_x, mean_y = sum(mids) / len(mids), sum(rates) / len(rates)
        spread = sum((x - mean_x) ** 2 for x in mids)
        slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(mids, rates)) / spread) if spread else 0.0
    # from the latest chunks' rate (the last two, against one's noise), along the fitted slope (never falling), to
    # the rate at the middle of the rest: its mean rate, where the cost grows in a line
    recent = rates[-2:]
    rate, at = sum(recent) / len(recent), sum(mids[-2:]) / len(recent)
    return max(0.0, total - done) * (rate + slope * ((done + total) / 2 - at))


class _Loop:
    """The state of one generation: the context buffer, the caches' length, the counters."""

    def __init__(self, target, drafter, prompt_ids, config, stop_ids, tokenizer, request_id, plain) -> None:
        n_prompt = len(prompt_ids)
        if n_prompt == 0:
            raise SpeculaError("the prompt is empty")
        if n_prompt >= target.max_len:
            raise ContextTooLongError(
                f"prompt is {n_prompt} tokens but the model's context window is {target.max_len}: shorten it"
            )
        if config.fit_window and n_prompt + config.max_new_tokens > target.max_len:
            asked = n_prompt + config.max_new_tokens
            raise ContextTooLongError(
                f"prompt is {n_prompt} tokens and max_tokens asks for {config.max_new_tokens} more, {asked} in all, "
                f"but the model's context window is {target.max_len}: lower max_tokens or shorten the prompt")
        self.target, self.drafter, self.config = target, drafter, config
        self.params = config.params
        self.request_id = request_id
        self.tokenizer = tokenizer
        self.detok = Detokenizer(tokenizer) if tokenizer is not None else None
        self.budget = _Budget(min(config.max_new_tokens, target.max_len - n_prompt), stop_ids)
        self.gen = make_generator(target.device, config.seed)
        self.n_prompt = n_prompt
        self.ctx = torch.empty(n_prompt + self.budget.limit + K_MAX + 2, dtype=torch.long)  # (L_max,)
        self.ctx[:n_prompt] = torch.tensor(prompt_ids, dtype=torch.long)
        self.length = n_prompt  # tokens in the conversation; the target's cache holds length - 1
        self.out_ids: list[int] = []
        self.stats = StepTotals()
        self.plain = plain
        self.meter = SpeedupMeter()  # from the prefill on, with earlier samples of the step this answer runs
        self.step_kind = ""
        self.last_elapsed = 0.0  # when the previous step ended (since t_start)
        self.step_seconds = 0.0  # the last decode step's wall time (DraftLength learns from it)
        self.pass_rows = 1  # the last verify pass's rows (the newest token and the draft)
        # whether timings may shape the steps: not when sampling with a seed (a greedy answer is the target's
        # own whatever the steps)
        self.timed = config.seed is None or config.params.greedy
        self.t_start = time.perf_counter()

    def _append(self, ids: list[int]) -> int:
        """Add the step's tokens to the context; return how many are emitted (eos / budget cut)."""
        self.ctx[self.length : self.length + len(ids)] = torch.tensor(ids, dtype=torch.long)
        self.length += len(ids)
        kept = self.budget.take(ids)
        self.out_ids += ids[:kept]
        return kept

    def _text(self, token: int) -> str:
        return self.detok.add(token) if self.detok else ""

    def prefill(self) -> Iterator[PromptProgress | Step]:
        """The target reads the prompt and chooses the first token (the last event). A prompt longer than
        PROMPT_CHUNK is read in chunks of it, with a PromptProgress after each once reading has taken
        PROGRESS_AFTER_S (every strategy reads a prompt the same way, so their answers stay the same)."""
        layers = self.drafter.aux_layers
        if layers or self.target.aux_layers:  # the layers an EAGLE-3 head reads, or none again
            self.target.keep_layers(layers)
        # what the cache holds of this prompt already (a conversation continued, an answer asked again) stays,
        # where it holds the bits reading the prompt would give (`reusable`); the rest is read
        self.target.truncate(self.target.reusable(self.ctx[: self.length]))
        self.drafter.reset()
        start = self.target.length
        chunks = []  # (first position, tokens, seconds) of each chunk read
        while self.length - start > PROMPT_CHUNK:
            began = time.perf_counter()
            self.target.forward(self.ctx[start : start + PROMPT_CHUNK])
            chunks.append((start, PROMPT_CHUNK, time.perf_counter() - began))
            start += PROMPT_CHUNK
            elapsed = time.perf_counter() - self.t_start
            if elapsed >= PROGRESS_AFTER_S:  # the caller may stop here
                yield PromptProgress(self.request_id, start, self.length, elapsed, reading_left(chunks, self.length))
        logits = self.target.forward(self.ctx[start : self.length])  # (1, V)
        # the kind of step the answer runs is chosen as it starts: earlier plain samples count if of that kind
        self.step_kind = self.target.step_kind
        seeds = () if self.config.own_baseline else self.plain.seeds(self.step_kind)
        self.meter = SpeedupMeter(seeds, self.plain.latest(self.step_kind))
        first = int(choose(logits[-1], self.params, self.gen))
        self.stats.prefill_s = time.perf_counter() - self.t_start
        kept = self._append([first])
        tokens = tuple(Token(first, self._text(first), Origin.TARGET, 0) for _ in range(kept))
        s = self.last_elapsed = self.stats.prefill_s
        yield Step(self.request_id, 0, 0, 0, tokens, (), 0.0, s, self.n_prompt, 0, s)

    def _measured(self, drafted: int, emitted: int, draft_s: float, proposed: bool,
                  pass_s: float | None = None) -> tuple[float, dict]:
        """The step's end (since t_start) and the live speedup's fields for its event. A step that drafted
        nothing is a plain decoding step: its time, its drafting excluded, is a sample of plain cost where
        no drafter ran before it (`proposed` false: a probe; the work of one that looked and found nothing
        still slows the pass after it, which `none` never pays)."""
        elapsed = time.perf_counter() - self.t_start
        seconds, self.last_elapsed = elapsed - self.last_elapsed, elapsed
        self.step_seconds = seconds
        plain_s = max(1e-9, seconds - draft_s) if drafted == 0 else None
        # the first step after the prompt runs cold (about 1.5 plain steps here): if plain, it counts for
        # itself only, not as a sample of the others; the meter keeps the samples that stand for `none`
        if self.meter.add(emitted, seconds, plain_s, sample=self.stats.steps > 1, clean=not proposed,
                          rows=self.pass_rows, pass_s=pass_s):
            self.plain.add(plain_s, self.step_kind)
        m = self.meter
        return elapsed, {"speedup": m.value, "speedup_err": m.error, "plain_step_s": m.plain_step_s}

    def step(self, k: int) -> Step:
        """Draft, verify in one target pass, roll back to the kept path, emit."""
        length, target = self.length, self.target
        room = min(self.budget.limit - self.budget.used - 1, target.max_len - length)
        k = max(0, min(k, room))
        # the context is bookkeeping a plain step pays too: only the proposal counts as drafting time
        ctx = DraftContext(self.ctx[:length], self.n_prompt, self.params, self.gen, target, self.meter.plain_step_s,
                           self.timed) if k else None
        t0 = time.perf_counter()
        draft = self.drafter.propose(ctx, k) if k else None
        t1 = time.perf_counter()
        if draft is not None and draft.tree is not None and draft.tokens.shape[0]:
            tree, kept = draft.tree.cut(k)
            checked = self._verify_tree(tree, draft.tokens[kept], kept)
        else:
            d = draft.tokens[:k] if draft is not None else self.ctx[:0]  # (n,)
            q = draft.q[: d.shape[0]] if draft is not None and draft.q is not None else None  # (n, V)
            checked = self._verify_chain(d, q)
        t2 = time.perf_counter()
        self.pass_rows = len(checked.tokens)
        return self._commit(checked, k, t0, t1, t2)

    def _verify_chain(self, d: torch.Tensor, q: torch.Tensor | None) -> _Checked:
        """One pass over [newest token, *draft]: the surviving prefix and the target's next token."""
        n = d.shape[0]
        feed = torch.cat([self.ctx[self.length - 1 : self.length], d])  # the newest token, then the draft
        logits = self.target.forward(feed, last=n + 1)  # (n+1, V)
        verdict = verify(logits, d, q, self.params, self.gen, self.config.token_probs)
        if n and self.drafter.learns_from_tree:  # the target's argmax after each draft token
            best = verdict.best[1:] or logits[1:].argmax(-1).tolist()
            self.drafter.observe_tree(dict(enumerate(best)))
        rows = list(range(verdict.accepted + 1))
        probs = _DraftProbs(verdict, q is not None)
        return _Checked(TokenTree.chain(n), feed.tolist(), rows, verdict.next_token, probs)

    def _verify_tree(self, tree: TokenTree, d: torch.Tensor, kept: list[int]) -> _Checked:
        """One pass over a token tree: the longest path the target agrees with and its next token."""
        feed = torch.cat([self.ctx[self.length - 1 : self.length], d])
        tokens = feed.tolist()
        logits = self.target.forward(feed, last=len(tree), tree=tree)  # (T, V)
        learns = self.drafter.learns_from_tree
        best = logits.argmax(-1).tolist() if self.params.greedy or learns else None
        if self.params.greedy:
            rows, next_token = walk_tree(best, tokens, tree)
        else:
            rows, next_token = walk_tree_sampling(logits, tokens, tree, self.params, self.gen)
        if learns:  # drafters that learn from every node's output (lookahead)
            self.drafter.observe_tree({i: best[row] for row, i in enumerate(kept, 1)})
        self.drafter.observe_path([kept[row - 1] for row in rows[1:]])
        # a tree's nodes count as point guesses: no probabilities to show
        return _Checked(tree, tokens, rows, next_token, _DraftProbs(Verdict(len(rows) - 1, next_token), False))

    def _commit(self, checked: _Checked, k: int, t0: float, t1: float, t2: float) -> Step:
        """Keep the checked path in the caches, tell the drafter, count the step and make its event."""
        tree, tokens, rows = checked.tree, checked.tokens, checked.rows
        length = self.length
        self.target.keep(length - 1, rows)  # the fed token and the kept drafts
        acc, drafted = len(rows) - 1, tree.height  # a tree's height: the longest chain it could have kept
        chose = self.drafter.chose if drafted else None  # auto's member, named on the step's tokens
        self.drafter.observe(acc, checked.next_token)
        new = [tokens[r] for r in rows[1:]] + [checked.next_token]
        kept = self._append(new)
        self.stats.add_step(drafted, acc, t1 - t0, t2 - t1)
        step = self.stats.steps
        branch = None if tree.is_chain else tree.branch(rows)
        probs = checked.probs
        emitted = tuple(
            Token(t, self._text(t), Origin.DRAFT, step, i, *probs.at(i), branch=branch, drafter=chose) if i < acc
            else Token(t, self._text(t), _origin_of_target_token(drafted, acc), step, branch=branch, drafter=chose)
            for i, t in enumerate(new[:kept])
        )
        # the ghost text: the drafter's first-choice continuation below the last kept node
        rejected = tuple(Token(tokens[r], self._ghost(tokens[r]), Origin.REJECTED, step, acc + j, *probs.at(acc + j),
                               drafter=chose)
                         for j, r in enumerate(tree.first_choices_below(rows[-1])))
        elapsed, live = self._measured(drafted, len(emitted), t1 - t0, proposed=k > 0, pass_s=t2 - t1)
        return Step(self.request_id, step, drafted, acc, emitted, rejected, t1 - t0, t2 - t1, length, k, elapsed,
                    **live)

    def _ghost(self, token: int) -> str:
        """A rejected draft token's text; a special token (e.g. <|im_end|>) is not text and shows as nothing."""
        return self.tokenizer.decode([token], skip_special_tokens=True) if self.tokenizer is not None else ""

    def finish(self) -> Finished:
        wall = time.perf_counter() - self.t_start
        if self.config.learn:
            self.drafter.finished(self.ctx[: self.n_prompt + len(self.out_ids)], self.n_prompt)
        if self.detok:
            self.detok.flush()
        totals = self.stats.totals(len(self.out_ids), wall)
        text = self.detok.text if self.detok else ""
        return Finished(self.request_id, self.budget.reason or "length", text, tuple(self.out_ids), totals,
                        self.meter.value, self.meter.error, self.meter.own_plain_s, self.meter.own_plain_err)


@dataclass(frozen=True)
class _DraftProbs:
    verdict: Verdict
    has_q: bool

    def at(self, i: int) -> tuple[float | None, float | None]:
        """(p, q) of draft position i, where the verification computed them."""
        v = self.verdict
        p = v.p_of_draft[i] if i < len(v.p_of_draft) else None
        q = v.q_of_draft[i] if self.has_q and i < len(v.q_of_draft) else None
        return p, q


@dataclass(frozen=True)
class _Checked:
    """What one verify pass decided: the pass's tree and tokens (row 0: the newest context token), the rows
    of the path the target kept, its next token, and the draft tokens' probabilities where computed."""

    tree: TokenTree
    tokens: list[int]
    rows: list[int]
    next_token: int
    probs: _DraftProbs
