"""`specula bench`: every strategy and peer on the same prompts, in one process, interleaved.

For each prompt, every strategy (and transformers peer) runs back to back, so drift in machine speed
hits all alike; `none`, the reference, runs first and last in each prompt's turn (its time: the mean of the
two; their difference: the bench's check that no run slows the one after it); `--repeat` runs the round
several times and keeps each run's median wall time, and each round's too (`Run.tries`: the report gives each
category's speedup in every round, its spread, and counts a category a loss only where every round is). Ratios,
not absolute times, are the result: speedup = `none`'s time a token / the strategy's on the same prompts (total wall
time over total new tokens; greedy, every answer is `none`'s, so it is the ratio of wall times; sampled, each run
draws its own answer and length), per category; overall = mean of the category speedups.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace

import torch

from ...api.errors import SpeculaError
from ...api.events import Finished, Step, Totals
from ...api.metrics import SpeedupSum, summed
from ...api.prompts import Message, conversation
from ...api.types import GenerateRequest
from ...serving.session import Session
from ..common import Asked, PromptItem, read_prompts

PEERS = ("hf", "hf-prompt-lookup", "hf-assisted")
HF_LOOKUP_TOKENS = 10  # transformers' documented example value for prompt_lookup_num_tokens


@dataclass
class Run:
    """One strategy on one prompt (all turns)."""

    token_ids: tuple[int, ...]
    new_tokens: int
    wall_s: float
    counts: Totals = field(default_factory=lambda: summed(()))  # the turns' step counts (none for a peer)
    steps: list[dict] = field(default_factory=list)  # one entry per decoding step, for steps.jsonl
    decoded: int = 0  # tokens after each turn's first (the prefill's)
    decode_s: float = 0.0  # the time they took
    live: SpeedupSum = field(default_factory=SpeedupSum)  # the live speedup the turns measured
    # `none` beside other runs: its runs measured first and last in the prompt's turn, this one their mean
    first_last: tuple[Run, Run] | None = None
    tries: tuple[float, ...] = ()  # with --repeat: each round's time for this run's tokens, in order (their median)

    @property
    def per_token(self) -> float:
        """Seconds per new token: what runs of different lengths (sampled answers) are compared by."""
        return self.wall_s / max(1, self.new_tokens)

    @property
    def per_decoded(self) -> float:
        return self.decode_s / max(1, self.decoded)

    @classmethod
    def mean_of(cls, first: Run, last: Run) -> Run:
        """`none` measured first and last in a prompt's turn: the first's tokens at the mean of the two runs' time a
        token (greedy, the same tokens: the mean of the two times)."""
        return replace(first, wall_s=(first.per_token + last.per_token) / 2 * max(1, first.new_tokens),
                       decode_s=(first.per_decoded + last.per_decoded) / 2 * max(1, first.decoded),
                       first_last=(first, last))


class Bench:
    def __init__(self, session: Session, asked: Asked, remotes: dict | None = None) -> None:
        self.session = session
        self.asked = asked  # the flags: the settings each strategy runs with, its options (e.g. (("head", DIR),))
        self.remotes = remotes or {}  # peer name -> a connected remote.backend.RemoteBackend
        # each strategy's first answer to each prompt's turns: a later round (--repeat) learns nothing and leaves it
        # out of what the drafters learned, so that it does not draft the answer it gave in the round before
        self.answers: dict[tuple[str, int, int], tuple[int, ...]] = {}

    def run_strategy(self, name: str, item: PromptItem) -> Run:
        strategy, flags = split_variant(name)
        options = self.asked.options + variant_options(flags)
        # every strategy reads the first turn's prompt whole (the cache kept by the strategy before would make
        # its reading free); later turns keep what the first left, as in a conversation
        self.session.forget()
        return self._run_turns(self.session, strategy, options, item, name)

    def run_remote(self, name: str, item: PromptItem) -> Run:
        """A server peer: the same prompts through its chat API (its own speculation, its counters). A later round
        asks a Specula server, as this process's strategies, to learn nothing and leave its first answer out: it
        keeps the answers it gave, and a second round read auto at up to 5.6x on a prompt, drafting the first round's
        answer."""
        return self._run_turns(self.remotes[name], "server", (), item, name)

    def _run_turns(self, backend, strategy: str, options: tuple, item: PromptItem, name: str = "") -> Run:
        history: tuple[Message, ...] = ()
        run = Run((), 0, 0.0)
        for turn, text in enumerate(item.turns):
            messages = conversation(text, None, history)
            config = self.asked.config_for(strategy)
            earlier = self.answers.get((name, id(item), turn)) if name else None
            if earlier is not None:  # a later round of this prompt: as the first one found the drafters
                config = replace(config, learn=False, leave_out=(earlier,))
            request = GenerateRequest(messages, strategy, config, self.asked.chat, options)
            events = list(backend.generate(request))
            f = [e for e in events if isinstance(e, Finished)][0]
            if name and earlier is None:
                self.answers[(name, id(item), turn)] = tuple(f.token_ids)
            run.steps += [{"turn": turn, "step": e.step, "context": e.context_len, "k": e.k, "drafted": e.drafted,
                           "accepted": e.accepted, "new_tokens": len(e.tokens),
                           "draft_ms": round(1000 * e.draft_s, 3), "verify_ms": round(1000 * e.verify_s, 3),
                           "drafter": next((t.drafter for t in (*e.tokens, *e.rejected) if t.drafter), None)}
                          for e in events if isinstance(e, Step)]
            t = f.totals
            run.token_ids += f.token_ids
            run.new_tokens += t.new_tokens
            run.wall_s += t.wall_s
            run.decoded += max(0, t.new_tokens - 1)
            run.decode_s += t.decode_s
            run.live.add(f.speedup, f.speedup_err, t.decode_s)
            run.counts = summed((run.counts, t))
            history = messages + (Message("assistant", f.text),)
        return run

    def run_peer(self, peer: str, item: PromptItem) -> Run:
        target = self.session.target
        history: tuple[Message, ...] = ()
        run = Run((), 0, 0.0)
        params = self.asked.config.params
        sampling = ({} if params.greedy else
                    {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k})
        kwargs = dict(do_sample=not params.greedy, max_new_tokens=self.asked.config.max_new_tokens,
                      eos_token_id=sorted(target.eos_ids), **sampling)
        if peer == "hf-prompt-lookup":
            kwargs["prompt_lookup_num_tokens"] = HF_LOOKUP_TOKENS
        elif peer == "hf-assisted":
            if self.session.draft is None:
                raise SpeculaError("peer 'hf-assisted' needs --draft-model")
            kwargs["assistant_model"] = self.session.draft.model
        for text in item.turns:
            messages = conversation(text, None, history)
            ids = torch.tensor([self.session.encode(GenerateRequest(messages, chat=self.asked.chat))],
                               device=target.device)
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = target.model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=kwargs["eos_token_id"][0], **kwargs)
            wall = time.perf_counter() - t0
            new = out[0, ids.shape[1] :].tolist()
            while new and new[-1] in target.eos_ids:  # the stop token is not part of the answer
                new.pop()
            run.token_ids += tuple(new)
            run.new_tokens += len(new)
            run.wall_s += wall
            text_out = target.tokenizer.decode(new, skip_special_tokens=False)
            history = messages + (Message("assistant", text_out),)
        return run

    def run(self, name: str, item: PromptItem) -> Run:
        if name in self.remotes:
            return self.run_remote(name, item)
        return self.run_peer(name, item) if name in PEERS else self.run_strategy(name, item)


def parse_peers(text: str) -> tuple[list[str], dict[str, str]]:
    """'hf,vllm=http://h:8011,vllm-plain=http://h:8012' -> (['hf'], {'vllm': URL, 'vllm-plain': URL}):
    transformers peers by name, servers as NAME=URL."""
    local, remote = [], {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, url = part.partition("=")
        name = name.strip()
        if sep:
            if not name or not url.strip():
                raise SpeculaError(f"peer '{part}': write a server peer as NAME=URL, e.g. vllm=http://127.0.0.1:8011")
            if name in PEERS or name in remote:
                raise SpeculaError(f"peer name '{name}' is taken: choose another name for {url.strip()}")
            remote[name] = url.strip()
        elif name in PEERS:
            local.append(name)
        else:
            raise SpeculaError(f"unknown peer '{name}': choose from {', '.join(PEERS)}, or NAME=URL for a server")
    return local, remote


def split_variant(name: str) -> tuple[str, tuple[str, ...]]:
    """'eagle+tree' -> ('eagle', ('tree',)): a strategy with on/off options set, benched under its own name
    ('eagle+no-lookup': an option set off)."""
    strategy, *flags = name.split("+")
    return strategy, tuple(flags)


def variant_options(flags: tuple[str, ...]) -> tuple[tuple[str, int | str], ...]:
    """A variant's flags as strategy options: ('tree', 'no-lookup', 'draft_vocab=0', 'skip=draft-model') ->
    (('tree', 1), ('lookup', 0), ('draft_vocab', 0), ('skip', 'draft-model')): an option set to a value, a whole
    number where it reads as one (`draft-model+draft_vocab=65536`, `auto+skip=draft-model`)."""
    def option(flag: str) -> tuple[str, int | str]:
        if "=" in flag:
            name, value = flag.split("=", 1)
            return name, int(value) if value.lstrip("-").isdigit() else value
        return (flag[3:], 0) if flag.startswith("no-") else (flag, 1)

    return tuple(option(flag) for flag in flags)


def median_run(runs: list[Run]) -> Run:
    """The runs of one prompt (--repeat) as one: the median run's tokens at the median time a token, and each round's
    time for those tokens (`tries`). Greedy runs keep the same tokens: the median wall time."""
    best = sorted(runs, key=lambda r: r.per_token)[len(runs) // 2]
    tokens, decoded = max(1, best.new_tokens), max(1, best.decoded)
    return replace(best, wall_s=statistics.median(r.per_token for r in runs) * tokens,
                   decode_s=statistics.median(r.per_decoded for r in runs) * decoded,
                   tries=tuple(r.per_token * tokens for r in runs))


def select(items: list[PromptItem], categories: list[str] | None, limit: int | None) -> list[PromptItem]:
    picked: dict[str, list[PromptItem]] = defaultdict(list)
    for item in items:
        cat = item.category or "all"
        if categories and cat not in categories:
            continue
        if limit is None or len(picked[cat]) < limit:
            picked[cat].append(item)
    if not picked:
        raise SpeculaError(f"no prompts in the categories {', '.join(categories or [])}")
    return [i for cat in picked for i in picked[cat]]


def run_bench(session: Session, items: list[PromptItem], names: list[str], asked: Asked, repeat: int,
              remotes: dict | None = None) -> dict[str, list[tuple[PromptItem, Run]]]:
    bench = Bench(session, asked, remotes)
    warm = PromptItem(("Say hello.",), "warm-up", "warm-up")
    for name in names:
        bench.run(name, warm)
    results: dict[str, list[tuple[PromptItem, Run]]] = {n: [] for n in names}
    # interleaved: every strategy on this prompt, back to back; `none`, the reference, first and last, so that
    # whatever a run leaves behind (a peer on the same cores) shows as the two differing (sandwiched)
    order = ["none", *(n for n in names if n != "none"), "none"] if "none" in names and len(names) > 1 else names
    total = len(items) * len(order) * repeat
    done = 0
    for item in items:
        runs: dict[str, list[Run]] = defaultdict(list)
        for _ in range(repeat):
            first = None
            for name in order:
                run = bench.run(name, item)
                done += 1
                _progress(done, total, item, name)
                if name == "none" and len(order) > 1:
                    if first is None:
                        first = run
                        continue
                    run = Run.mean_of(first, run)
                runs[name].append(run)
        for name in names:
            results[name].append((item, median_run(runs[name])))
    print(file=sys.stderr)
    return results


def _progress(done: int, total: int, item: PromptItem, name: str) -> None:
    width = 30
    filled = width * done // total
    bar = "#" * filled + "-" * (width - filled)
    sys.stderr.write(f"\r[{bar}] {done}/{total} {item.category or ''} {name:<18}")
    sys.stderr.flush()


def load_items(path, categories: str | None, limit: int | None) -> list[PromptItem]:
    cats = [c.strip() for c in categories.split(",")] if categories else None
    return select(read_prompts(path), cats, limit)
