"""Self-distillation for a draft head: the target answers prompts from a built-in generator, its final
hidden states over prompt and answer are extracted once, and the head learns to predict the next hidden
state (and through the target's LM head, the next token) from the current one and the next token."""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ..api.errors import SpeculaError, TrainingCancelled, unsafe_pickle
from ..api.prompts import Message, encode
from ..decoding.drafter import Drafter, empty_draft
from ..models.arch import embedding_scale, final_norm
from ..models.gguf import weight_rows
from .config import HeadConfig, HeadInfo, target_fingerprint, vocabulary_fingerprint
from .eagle import EagleHead
from .eagle3 import Eagle3Head, default_aux_layers
from .medusa import MedusaHead

TOPICS = (
    "the water cycle", "photosynthesis", "a healthy breakfast", "learning a new language", "the history of the bicycle",
    "how vaccines work", "saving money", "remote work", "volcanoes", "the moon landing", "sleep", "recycling",
    "electric cars", "the internet", "coffee", "chess", "gardening", "time management", "the Roman Empire",
    "black holes", "climate change", "public speaking", "dogs as pets", "machine learning", "the human heart",
    "bread baking", "friendship", "a job interview", "the ocean", "renewable energy", "music practice",
    "the printing press", "bees", "running a marathon", "writing a good email", "the solar system",
    "first aid", "a trip to Japan", "budget travel", "smartphones", "the French Revolution", "rainbows",
    "teamwork", "reading habits", "cloud computing", "earthquakes", "a birthday party", "city parks",
    "inflation", "the stock market", "democracy", "the immune system", "DNA", "gravity", "electricity",
    "the Renaissance", "ancient Egypt", "the Industrial Revolution", "social media", "video games", "yoga",
    "meditation", "a small business", "customer service", "online privacy", "passwords", "databases",
    "the Python programming language", "open source software", "artificial intelligence", "robots",
    "space exploration", "Mars", "dinosaurs", "rain forests", "deserts", "coral reefs", "honey", "tea",
    "chocolate", "pizza", "a wedding speech", "moving to a new city", "learning to drive", "cooking pasta",
    "a museum visit", "the Olympic Games", "football", "tennis", "photography", "painting", "poetry",
    "jazz", "classical music", "the piano", "volunteering", "stress at work", "a home office", "cats",
    "migrating birds", "the periodic table", "nuclear power", "solar panels", "water pollution", "plastic waste",
)
FORMS = (
    "Explain {t} in simple terms.", "Write a short paragraph about {t}.", "Give three facts about {t}.",
    "What are the main benefits of {t}?", "Write a short poem about {t}.", "List five tips related to {t}.",
    "Describe {t} to a ten-year-old.", "What are common misconceptions about {t}?",
    "Write a short story that involves {t}.", "Summarize the key ideas of {t} in two sentences.",
    "Compare {t} with something similar and explain the differences.", "Why is {t} important?",
    "Write a tweet about {t}.", "What questions do people often ask about {t}? Answer two of them.",
    "Write a blog post introduction about {t}.", "What are the pros and cons of {t}?",
    "Write a persuasive essay outline about {t}.", "How has {t} changed over the last hundred years?",
    "Write a dialogue between two friends talking about {t}.", "Give a step-by-step guide related to {t}.",
    "What would a beginner need to know about {t}?", "Write a product description inspired by {t}.",
    "Create a quiz with three questions about {t}, with answers.", "What is the history of {t}?",
    "Write a formal letter to a newspaper about {t}.", "Explain {t} as an expert would.",
    "Imagine you are a teacher. Plan a short lesson about {t}.", "What careers are related to {t}?",
)
ROLES = ("a pirate captain", "a medieval knight", "a travel guide", "a detective", "a chef", "a doctor",
         "a famous scientist", "a sports coach", "a friendly robot", "a history professor", "a tour guide in Paris")
ROLE_ASKS = ("Introduce yourself and describe a typical day.", "Give me advice about {t}.",
             "Tell me what you think about {t}.", "Answer my question: what should I know about {t}?")
LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese", "Chinese")
SENTENCES = (
    "The weather is beautiful today, so we are going to the beach.", "Could you tell me where the train station is?",
    "I have been learning to cook for three months.", "Our meeting has been moved to Thursday afternoon.",
    "The library closes at eight o'clock in the evening.", "She bought a new bicycle because her old one broke.",
    "Please remember to turn off the lights when you leave.", "The museum has a new exhibition about ancient Rome.",
    "We need more time to finish the project properly.", "My brother works as a nurse in a large hospital.",
    "The children played in the garden until it got dark.", "This restaurant serves the best soup in town.",
)
CODE_TASKS = (
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the vowels in a sentence", "finds the largest number in a list", "removes duplicates from a list",
    "checks whether a word is a palindrome", "sorts a list of names alphabetically", "converts Celsius to Fahrenheit",
    "computes the factorial of a number", "merges two sorted lists", "counts how often each word occurs in a text",
    "checks whether two strings are anagrams", "returns the sum of the digits of a number", "flattens a nested list",
    "reads a CSV file and prints each row", "finds the second smallest element of a list", "computes the average of a list",
)
CODE_LANGUAGES = ("Python", "Python", "Python", "JavaScript", "C", "Java")
NAMES = ("Anna", "Ben", "Carlos", "Diana", "Ethan", "Fatima", "George", "Hana", "Ivan", "Julia", "Kofi", "Lena")
ITEMS = ("apples", "pencils", "books", "tickets", "cupcakes", "notebooks", "oranges", "stickers")


def _math(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 40), rng.randint(2, 25), rng.randint(2, 9)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    return rng.choice((
        f"{name} has {a} {item} and buys {b} more, then gives away {c}. How many {item} does {name} have now? Explain step by step.",
        f"A box holds {b} {item}. How many {item} are in {c} boxes and {a} loose ones? Show your reasoning.",
        f"{name} reads {b} pages a day. How many days does it take to read a book of {a * b + c} pages?",
        f"What is {a} times {b} plus {c}? Explain your calculation.",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        f"If {c} workers build a wall in {b} days, how long would {c * 2} workers take? Explain.",
        f"A shirt costs ${a + 10} and is on sale for {c * 5}% off. What is the sale price?",
    ))


def _passage(rng: random.Random) -> str:
    """A short made-up text with names, dates and numbers, for extraction and questions about a text."""
    name, other = rng.sample(NAMES, 2)
    day = rng.choice(("Monday", "Tuesday", "Wednesday", "Thursday", "Friday"))
    n, price, room = rng.randint(5, 60), rng.randint(10, 300), rng.randint(100, 450)
    topic = rng.choice(TOPICS)
    return (f"Meeting notes: On {day}, {name} and {other} met in room {room} to plan a workshop about {topic}. "
            f"They expect {n} participants and a budget of ${price * 10}. {name} will prepare the slides; "
            f"{other} will book the catering, which costs ${price} per day. The next meeting is in two weeks.")


def _conversation(rng: random.Random, pairs: list, i: int, sentences: list | tuple = (),
                  subjects: dict | None = None, written: float | None = None) -> str:
    """One first turn: a question the model writes itself (MODEL_QUERY, filled in while answering), topics x
    task forms, arithmetic, code, translation both ways (into English from the message catalogs'
    `sentences`), a short factual question about one of `subjects`, role play, or a question about a short
    made-up text (a kind without its source falls back to topics x forms). `written`: the share the model
    writes (MODEL_QUERY_SHARE by default); the other kinds keep their proportions among the rest."""
    from .documents import question_prompt, translation_prompt

    kind = rng.random()
    share = MODEL_QUERY_SHARE if written is None else written
    if kind < share:
        return MODEL_QUERY  # the model writes this one itself while answering (self_distill)
    if share != MODEL_QUERY_SHARE:  # the rest onto the default's range of kinds, their thresholds below
        kind = MODEL_QUERY_SHARE + (kind - share) / (1 - share) * (1 - MODEL_QUERY_SHARE)
    if kind < 0.45:
        topic, form = pairs[i % len(pairs)]
        return form.format(t=topic)
    if kind < 0.53:
        return _math(rng)
    if kind < 0.61:
        return f"Write a {rng.choice(CODE_LANGUAGES)} function that {rng.choice(CODE_TASKS)}. Explain how it works."
    if kind < 0.65:
        return f"Translate into {rng.choice(LANGUAGES)}: \"{rng.choice(SENTENCES)}\""
    if kind < 0.82:
        if kind < 0.73:
            made = translation_prompt(*sentences[i % len(sentences)], rng) if sentences else None
        else:
            made = question_prompt(subjects or {}, rng)
        if made is not None:
            return made
        topic, form = pairs[i % len(pairs)]  # a kind whose source this machine lacks
        return form.format(t=topic)
    if kind < 0.9:
        return f"Imagine you are {rng.choice(ROLES)}. {rng.choice(ROLE_ASKS).format(t=rng.choice(TOPICS))}"
    ask = rng.choice(("Who attends the meeting and what does each person do?", "Summarize this text in one sentence.",
                      "Extract every number in this text and say what it means.", "What is the total cost of catering for three days?",
                      "Write a short email to the participants based on these notes."))
    return f"{_passage(rng)}\n\n{ask}"


FOLLOW_UPS = (
    "Can you make it shorter?", "Give an example.", "Explain that in more detail.", "Now say it more formally.",
    "Summarize your answer in one sentence.", "Translate the first two sentences of your answer into French.",
    "Rewrite your answer as a numbered list.", "What is the most important point? Quote it.",
    "Why is that?", "Can you give me another one?", "Rewrite it for a child.", "What are the next steps?",
)
FOLLOW_UP_SHARE = 0.5  # of first answers, how many get a second turn (multi-turn training data)


DOCUMENT_SHARE = 0.3  # of first turns, how many paste a long text (documents.py) to summarise, answer from or extract from

# Of the other first turns, how many the model writes itself: its chat template opened at a user's turn, it
# goes on as the user (as Magpie makes instructions), so the questions are as varied as what the model has
# seen people ask, not the generator's templates. MODEL_QUERY stands in for one until it is written.
MODEL_QUERY_SHARE = 0.25
MODEL_QUERY = "\x00a question the model writes\x00"
QUERY_TOKENS = 96  # longest question; one cut there is dropped
QUERY_SAMPLING = {"temperature": 1.0, "top_p": 0.95}
QUERY_SEEDS = 1 << 40  # the questions' seeds, apart from the answers'


def prompt_conversations(n: int, seed: int = 0, documents: tuple | list | None = None,
                         sentences: list | tuple | None = None,
                         subjects: dict | None = None, written: float | None = None) -> list[tuple[Message, ...]]:
    """n conversations of one user message: questions the model writes itself (MODEL_QUERY until they are
    written while answering), topics x task forms, arithmetic word problems, code, translation both ways,
    short factual questions, role play, questions about a short made-up text, and (DOCUMENT_SHARE of them) a
    long text that ships on this machine with a task about it (second turns are added while generating).
    `documents`, `sentences`, `subjects`: the texts to paste, the sentences to translate into English and the
    names to ask about (default: what documents.py finds on this machine). `written`: the share of the
    first turns without a long text that the model writes itself (default MODEL_QUERY_SHARE)."""
    from .documents import catalog_sentences, document_prompt, question_subjects, shipped_documents

    rng = random.Random(seed)
    pairs = [(t, f) for t in TOPICS for f in FORMS]
    rng.shuffle(pairs)
    docs = shipped_documents(seed) if documents is None else documents
    sentences = catalog_sentences(seed=seed) if sentences is None else sentences
    subjects = question_subjects() if subjects is None else subjects
    out = []
    for i in range(n):
        if docs and rng.random() < DOCUMENT_SHARE:
            out.append((Message("user", document_prompt(docs[i % len(docs)], rng)),))
        else:
            out.append((Message("user", _conversation(rng, pairs, i, sentences, subjects, written)),))
    return out


@dataclass
class Sequence:
    tokens: torch.Tensor  # (T,) prompt and answer
    # (T, D) the target's final hidden states, before its final norm; for an EAGLE-3 head (T, 3D) the states
    # entering the layers it reads
    features: torch.Tensor
    answer_start: int
    # for an EAGLE-3 head: the target's TARGET_TOP most likely next tokens at each position and their
    # probabilities (T, TARGET_TOP), its soft labels
    top_ids: torch.Tensor | None = None
    top_p: torch.Tensor | None = None


@dataclass
class Answer:
    prompt: list[int]  # the conversation's token ids, up to the opened assistant turn
    answer: list[int]  # the target's answer (greedy or sampled), without the end token
    index: int = -1  # which generated conversation it answers (-1: a second turn)
    written: bool = False  # its first turn was written by the model itself (MODEL_QUERY)


def _read_answers(path: Path | None) -> list[Answer]:
    """The answers an earlier (interrupted) run stored; a torn last line is dropped."""
    if path is None or not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            d = json.loads(line)
            out.append(Answer(list(d["prompt"]), list(d["answer"]), int(d.get("index", -1)), bool(d.get("written", False))))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def _drop_torn_tail(path: Path) -> None:
    """A last line cut short (a run killed while writing it: no newline at its end) is dropped before more
    answers are appended, so that the next answer starts on a line of its own instead of joining it."""
    if not path.is_file():
        return
    with path.open("r+b") as f:
        size = f.seek(0, 2)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":  # whole lines: the file is not read further
            return
        f.seek(0)
        f.truncate(f.read().rfind(b"\n") + 1)


SAMPLED_SHARE = 0.3  # of batches, how many are answered by sampling (temperature 0.8, top-p 0.95) instead of greedily
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_p": 0.95, "top_k": 0}


class _Plain(Drafter):
    """Drafts nothing: plain decoding, where the caller gives no drafter."""

    name = "none"

    def propose(self, ctx, k: int):
        return empty_draft()


class _EngineAnswers:
    """Answers through the engine's own decoding loop (the compiled step where it is built, and the drafter
    the caller gives, prompt lookup from the command line and the app: greedy answers are the model's own,
    sampled ones follow its distribution), one conversation at a time."""

    def __init__(self, target, drafter: Drafter | None) -> None:
        self.target = target
        self.runner = target.new_runner()
        self.drafter = drafter or _Plain()

    def answer(self, prompts: list[list[int]], max_new: int, sampling: bool, seed: int,
               should_stop: Callable[[], bool], how: dict = SAMPLING, keep: bool = True) -> list[list[int]]:
        """Each prompt's continuation, greedy or (`sampling`) drawn with `how`'s temperature and top-p."""
        from ..api.types import DecodeConfig
        from ..decoding.loop import generate

        rows = []
        for j, prompt in enumerate(prompts):
            config = DecodeConfig.for_strategy(self.drafter.name, max_new_tokens=max_new, seed=seed + j,
                                               temperature=how["temperature"] if sampling else 0.0,
                                               top_p=how["top_p"] if sampling else 1.0)
            events = list(generate(self.runner, self.drafter, prompt, config, stop_ids=frozenset(self.target.eos_ids),
                                   should_stop=should_stop))
            rows.append(list(events[-1].token_ids))
            if should_stop():
                break
        return rows


class _BatchAnswers:
    """Answers many conversations at once by batched plain decoding through the compiled step
    (`models.llama.step_rows`): up to `rows` answers advance together, and a finished answer's row takes the
    next prompt. Greedy answers are the model's own token for token (the own products give a row the bits
    it gets alone); sampled ones draw from its distribution, each with its own seeded generator. Where the
    compiled step does not run (not built yet, eager, a model it does not cover) one answer at a time
    (`_EngineAnswers`)."""

    def __init__(self, target, drafter: Drafter | None, rows: int, aux_layers: tuple[int, ...] = ()) -> None:
        self.target = target
        self.rows = max(1, rows)
        self.single = _EngineAnswers(target, drafter)
        self.runners: list = []
        # an EAGLE-3 head's features, kept while answering (the layers' states and the target's most likely
        # tokens, as `_with_features` computes them, from the same forwards): the separate pass over every
        # conversation, long prompts included, is not needed for these answers
        self.aux_layers = tuple(aux_layers)
        self.features: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # prompt -> the last call's

    def answer(self, prompts: list[list[int]], max_new: int, sampling: bool, seed: int,
               should_stop: Callable[[], bool], how: dict = SAMPLING, keep: bool = True) -> list[list[int]]:
        """Each prompt's continuation, greedy or (`sampling`) drawn with `how`'s temperature and top-p; with
        `keep`, their features too (`self.features`, where the head reads layers)."""
        from ..api.types import SamplingParams
        from ..decoding.loop import make_generator
        from ..decoding.sampling import choose
        from ..models.llama import step_rows

        params = SamplingParams(how["temperature"], 0, how["top_p"]) if sampling else SamplingParams()
        stop = self.target.eos_ids
        out: list[list[int] | None] = [None] * len(prompts)
        waiting = list(range(len(prompts)))[::-1]
        active: list[tuple[int, object, torch.Generator | None, list[int]]] = []  # (prompt, runner, generator, answer)
        idle = list(self.runners)
        keep = keep and bool(self.aux_layers)
        tops: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # prompt -> the target's top tokens so far
        self.features = {}
        while (waiting or active) and not should_stop():
            while waiting and len(active) < self.rows:
                j = waiting.pop()
                if idle:
                    runner = idle.pop()
                else:
                    runner = self.target.new_runner()
                    self.runners.append(runner)
                runner.truncate(0)
                runner.keep_layers(self.aux_layers)
                first = _first_kept(len(prompts[j]))
                logits = runner.forward(torch.tensor(prompts[j], dtype=torch.long), last=len(prompts[j]) - first if keep else 1)
                if not runner.compiled:  # the compiled step is not running: one answer at a time
                    return self.single.answer(prompts, max_new, sampling, seed, should_stop, how)
                if keep:
                    tops[j] = [_top(logits)]
                gen = make_generator(runner.device, seed + j) if sampling else None
                token = int(choose(logits[-1], params, gen))
                if token in stop or max_new == 1:
                    out[j] = [token]
                    self._keep(j, runner, first, tops)
                    idle.append(runner)
                else:
                    active.append((j, runner, gen, [token]))
            if not active:
                continue
            logits = step_rows([a[1] for a in active], torch.tensor([a[3][-1] for a in active], dtype=torch.long))
            if keep:
                top = _top(logits)
                for b, a in enumerate(active):
                    tops[a[0]].append((top[0][b : b + 1], top[1][b : b + 1]))
            if params.greedy:
                tokens = logits.argmax(-1).tolist()
            else:
                tokens = _draw_top_p(logits, params, [a[2] for a in active])
            still = []
            for (j, runner, gen, answer), token in zip(active, tokens):
                answer.append(token)
                if token in stop or len(answer) >= max_new:
                    out[j] = answer
                    self._keep(j, runner, _first_kept(len(prompts[j])), tops)
                    idle.append(runner)
                else:
                    still.append((j, runner, gen, answer))
            active = still
        return [a for a in out if a is not None]

    def _keep(self, j: int, runner, first: int, tops: dict) -> None:
        """A finished answer's features from its runner: the kept layers' states and the target's most likely
        tokens at positions first.. of its cache (the answer's last token is never read, as it ended the answer)."""
        if j not in tops:  # no features kept in this call
            return
        seen = tops.pop(j)
        self.features[j] = (runner.aux_features(first, runner.length).clone().cpu(),
                            torch.cat([t[0] for t in seen]), torch.cat([t[1] for t in seen]))


def _top(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, V) fp32 logits -> the target's TARGET_TOP most likely tokens (n, TARGET_TOP) int32 and their
    probabilities, fp16: an EAGLE-3 head's soft labels."""
    top = torch.softmax(logits, -1).topk(min(TARGET_TOP, logits.shape[-1]), dim=-1)
    return top.indices.int().cpu(), top.values.half().cpu()


def top_p_prefix(logits: torch.Tensor, params, prefix: int = 512) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, V) logits -> the temperature and top-p distribution over each row's `prefix` most likely tokens:
    their ids (B, K), their probabilities (B, K) (zero for the ones top-p drops) and whether the prefix
    holds all that top-p keeps (B,). About a tenth of the time of sorting the whole vocabulary."""
    scaled = logits.float() / params.temperature
    top, ids = scaled.topk(min(prefix, scaled.shape[-1]), dim=-1)  # most likely first
    probs = (top - torch.logsumexp(scaled, -1, keepdim=True)).exp()
    before = probs.cumsum(-1) - probs  # each token's mass of the tokens ranked above it
    kept = probs.masked_fill(before >= params.top_p, 0.0)
    return ids, kept / kept.sum(-1, keepdim=True), before[:, -1] + probs[:, -1] >= params.top_p


def _draw_top_p(logits: torch.Tensor, params, generators: list) -> list[int]:
    """One draw per row of (B, V) logits from the temperature and top-p distribution, each row with its own
    generator; a row whose prefix does not reach top-p is drawn from the full sort (`process_logits`)."""
    from ..decoding.sampling import process_logits, sample

    ids, kept, covered = top_p_prefix(logits, params)
    return [int(ids[b, torch.multinomial(kept[b], 1, generator=gen)]) if covered[b]
            else int(sample(process_logits(logits[b], params), gen)) for b, gen in enumerate(generators)]


ANSWER_ROWS = 16  # answers decoded together by batched plain decoding on a CPU (measured in docs/HEADS.md)


def self_distill(target, n_tokens: int, max_new: int = 192, batch: int = 8, seed: int = 0,
                 say: Callable[[str], None] = lambda s: None, store: Path | None = None,
                 should_stop: Callable[[], bool] = lambda: False, sampled: float = SAMPLED_SHARE,
                 drafter: Drafter | None = None, aux_layers: tuple[int, ...] = (),
                 features: Path | None = None, written: float | None = None) -> list[Answer]:
    """The target answers generated prompts, batched, until about n_tokens answer tokens exist: greedily, and
    a `sampled` share of the batches by sampling (a seed per batch). With `store` (a .jsonl file) every
    answer is appended as it is made, and a later run with the same file continues where this one stopped.
    `drafter`: the strategy the engine's own decoding uses on a CPU (none: plain steps). With `aux_layers` and
    a `features` folder, an EAGLE-3 head's features of each answer made by batched decoding are written there
    as it is made (as `with_features` stores them, which then reads them instead of computing them).
    `written`: the share of first turns without a long text that the model writes itself (prompt_conversations)."""
    tok = target.tokenizer
    # on a CPU the engine's own decoding answers: batched plain decoding through the compiled step (one
    # conversation at a time with the caller's drafter until that step runs); GPUs batch through generate()
    engine = None
    if target.device.type == "cpu" and target.uses_lean_forward:
        engine = _BatchAnswers(target, drafter, rows=min(batch, ANSWER_ROWS), aux_layers=aux_layers if features else ())
        if features is not None:
            features.mkdir(parents=True, exist_ok=True)
    answers = _read_answers(store)
    made = sum(len(a.answer) for a in answers)
    convs = prompt_conversations(max(1, 4 * n_tokens // max_new + 8), seed, written=written)
    rng = random.Random(seed + 1 + len(answers))
    i = max((a.index for a in answers), default=-1) + 1
    if made:
        say(f"answers: {min(made, n_tokens)}/{n_tokens} tokens from {store}")
    if made < n_tokens:
        say(f"answers: {min(made, n_tokens)}/{n_tokens} tokens, the model is answering a first batch of {batch} prompts")
    if store is not None:
        _drop_torn_tail(store)
    sink = store.open("a", encoding="utf-8") if store is not None else None
    t0, made_here = time.perf_counter(), 0
    follow: list[tuple[tuple[Message, ...], int]] = []
    asked: set[str] = set()  # the questions the model wrote in this run (one written twice is dropped)
    written: set[int] = set()  # the conversations whose first turn the model wrote
    try:
        while made < n_tokens and (i < len(convs) or follow):
            n_follow = min(len(follow), batch // 2)  # second turns mixed in as soon as their first answers exist
            group = follow[:n_follow]
            del follow[:n_follow]
            fresh = [(c, i + j) for j, c in enumerate(convs[i : i + batch - n_follow])]
            i += len(fresh)
            if any(c[0].content == MODEL_QUERY for c, _ in fresh):
                fresh = _write_queries(target, engine, fresh, QUERY_SEEDS + seed * 1_000_003 + i, asked, written,
                                       should_stop)
            encoded = []
            for conv, index in group + fresh:
                e = encode(tok, list(conv), True)
                if len(e) + max_new <= target.context_window:
                    encoded.append((conv, index, e))
            if not encoded:
                continue
            batch_seed = seed * 1_000_003 + i
            sampling = random.Random(batch_seed).random() < sampled
            rows = _continuations(target, engine, [e for _, _, e in encoded], max_new, sampling, batch_seed, should_stop)
            if should_stop():
                say("")  # a cut batch is dropped; the caller's say raises
                break
            for j, ((conv, index, e), row) in enumerate(zip(encoded, rows)):
                answer = []
                for t in row:
                    if t in target.eos_ids:
                        break
                    answer.append(t)
                if len(answer) < 4:
                    continue
                a = Answer(e, answer, index if len(conv) == 1 else -1, len(conv) == 1 and index in written)
                answers.append(a)
                if engine is not None and j in engine.features:
                    _store(features / f"{len(answers) - 1:06d}.pt", _kept_sequence(target, a, aux_layers, engine.features[j]))
                if sink is not None:
                    sink.write(json.dumps({"prompt": a.prompt, "answer": a.answer, "index": a.index,
                                           **({"written": True} if a.written else {})}) + "\n")
                made += len(answer)
                made_here += len(answer)
                if len(conv) == 1 and rng.random() < FOLLOW_UP_SHARE:  # a second turn on the model's own answer
                    reply = Message("assistant", tok.decode(answer, skip_special_tokens=True))
                    follow.append(((*conv, reply, Message("user", rng.choice(FOLLOW_UPS))), -1))
            if sink is not None:
                sink.flush()
            rate = made_here / max(1e-9, time.perf_counter() - t0)
            eta = (n_tokens - made) / max(1e-9, rate)
            say(f"answers: {min(made, n_tokens)}/{n_tokens} tokens ({rate:.0f} tokens/s, eta {max(0, eta):.0f} s)")
    finally:
        if sink is not None:
            sink.close()
    return answers


def _continuations(target, engine, prompts: list[list[int]], max_new: int, sampling: bool, seed: int,
                   should_stop: Callable[[], bool], how: dict = SAMPLING, keep: bool = True) -> list[list[int]]:
    """Each prompt's continuation (greedy, or drawn with `how`'s temperature and top-p), up to max_new tokens
    and its end token: through `engine` (the CPU's batched decoding; with `keep`, features kept) or, without
    one, transformers' generate() in one padded batch."""
    if engine is not None:
        return engine.answer(prompts, max_new, sampling, seed, should_stop, how, keep)
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else sorted(target.eos_ids)[0]
    width = max(len(e) for e in prompts)
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in prompts], device=target.device)
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in prompts], device=target.device)
    if sampling:
        torch.manual_seed(seed)
    with torch.inference_mode():
        out = target.model.generate(ids, attention_mask=mask, max_new_tokens=max_new, pad_token_id=pad,
                                    eos_token_id=sorted(target.eos_ids), stopping_criteria=[_Stop(should_stop)],
                                    **({"do_sample": True, "top_k": 0, **how} if sampling else {"do_sample": False}))
    return out[:, width:].tolist()


def query_prefix(tokenizer) -> list[int] | None:
    """The token ids of a conversation opened at the user's turn, as the model's chat template lays it out
    (its default system prompt included): what the model continues as the user. None without a template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    mark = "\x01QUESTION\x01"
    text = tokenizer.apply_chat_template([{"role": "user", "content": mark}], tokenize=False)
    if mark not in text:
        return None
    return list(tokenizer.encode(text[: text.index(mark)], add_special_tokens=False))


def usable_query(text: str, ended: bool, asked: set[str]) -> bool:
    """Whether a question the model wrote is kept: finished (not cut at QUERY_TOKENS), 3 to 120 words, in
    plain text (nearly all printable ASCII: the runs that drift into other scripts or symbols are noise), and
    not asked before in this run."""
    words = text.split()
    if not ended or not 3 <= len(words) <= 120 or text in asked:
        return False
    plain = sum(1 for ch in text if 32 <= ord(ch) < 127 or ch in "\n\t")
    return plain >= 0.97 * len(text)


def held_out_first_turns(folder: Path) -> list[tuple[str, list[int]]]:
    """A data folder's held-out tenth (its first answers, which training holds out) as (kind, prompt token ids)
    of its first turns: "written by the model" (MODEL_QUERY) or "generated"."""
    answers = _read_answers(folder / "answers.jsonl")
    if not answers:
        raise SpeculaError(f"{folder} holds no training answers (answers.jsonl)")
    held = answers[: max(1, len(answers) // 10)]
    return [("written by the model" if a.written else "generated", a.prompt) for a in held if a.index >= 0]


def _write_queries(target, engine, fresh: list, seed: int, asked: set[str], written_ids: set[int],
                   should_stop: Callable[[], bool]) -> list:
    """`fresh` (conversation, index) with each MODEL_QUERY turn written by the model (sampled from its chat
    template opened at a user's turn; the question joins `asked`, its conversation's index `written_ids`); a
    question that is not usable drops its conversation."""
    tok = target.tokenizer
    prefix = query_prefix(tok)
    wanted = [j for j, (c, _) in enumerate(fresh) if c[0].content == MODEL_QUERY]
    written: dict[int, str] = {}
    if prefix is not None and len(prefix) + QUERY_TOKENS <= target.context_window:
        rows = _continuations(target, engine, [prefix] * len(wanted), QUERY_TOKENS, True, seed, should_stop,
                              QUERY_SAMPLING, keep=False)
        for j, row in zip(wanted, rows):
            ends = [n for n, t in enumerate(row) if t in target.eos_ids]
            cut = row[: ends[0]] if ends else row
            ended = bool(ends) or len(row) < QUERY_TOKENS  # one at a time, a row leaves out its end token
            text = tok.decode(cut, skip_special_tokens=True).strip()
            if usable_query(text, ended, asked):
                asked.add(text)
                written_ids.add(fresh[j][1])
                written[j] = text
    return [(c, index) if j not in wanted else ((Message("user", written[j]),), index)
            for j, (c, index) in enumerate(fresh) if j not in wanted or j in written]


class _Stop:
    """Ends a batched generate() as soon as the user cancels."""

    def __init__(self, should_stop: Callable[[], bool]) -> None:
        self.should_stop = should_stop

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.should_stop(), dtype=torch.bool, device=input_ids.device)


EAGLE3_CONTEXT = 256  # an EAGLE-3 head trains over an answer and at most this many prompt positions before it
TARGET_TOP = 32  # an EAGLE-3 head learns the target's distribution over its this many most likely next tokens
TTT_STEPS = 4  # steps an EAGLE-3 head is unrolled in training (its drafts' first four positions trained as used)


def with_features(target, answers: list[Answer], say: Callable[[str], None] = lambda s: None,
                  aux_layers: tuple[int, ...] = (), store: Path | None = None) -> list[Sequence]:
    """The target's features over each conversation, extracted once with the engine's own forward: its
    final hidden states, or with `aux_layers` the states entering those layers (EAGLE-3) over the answer
    and the EAGLE3_CONTEXT prompt positions before it. With `store`, each conversation's features are
    written there once and read back memory-mapped: a resumed run does not compute them again, and features
    larger than the machine's memory stay on disk (2 million answer tokens of EAGLE-3 features are ~18 GB)."""
    out = []
    computed, computing_s = 0, 0.0  # the time left follows the conversations computed, not those read back
    if store is not None:
        store.mkdir(parents=True, exist_ok=True)
    for n, a in enumerate(answers, 1):
        seq = _stored(store / f"{n - 1:06d}.pt", target, a, aux_layers) if store is not None else None
        if seq is None:
            t0 = time.perf_counter()
            seq = _with_features(target, a.prompt, a.answer, aux_layers)
            if store is not None:
                seq = _store(store / f"{n - 1:06d}.pt", seq)
            computed, computing_s = computed + 1, computing_s + time.perf_counter() - t0
        out.append(seq)
        if n % 20 == 0 or n == len(answers):
            read = f", {n - computed} read from the data folder" if n > computed else ""
            eta = f", eta {computing_s / computed * (len(answers) - n):.0f} s" if computed else ""
            say(f"features: {n}/{len(answers)} conversations{read}{eta}")
    return out


def _read_tokens(target, prompt: list[int], answer: list[int], aux_layers: tuple[int, ...]) -> tuple[torch.Tensor, int]:
    """The tokens the target reads for a conversation (cut at its window) and the first position whose
    features are kept: 0, or for an EAGLE-3 head the EAGLE3_CONTEXT prompt positions before the answer."""
    tokens = torch.tensor(prompt + answer, dtype=torch.long)[: target.context_window]
    return tokens, _first_kept(len(prompt)) if aux_layers else 0


def _first_kept(prompt_length: int) -> int:
    """The first position whose EAGLE-3 features are kept: EAGLE3_CONTEXT prompt positions before the answer."""
    return max(0, prompt_length - EAGLE3_CONTEXT)


def _stored(path: Path, target, answer: Answer, aux_layers: tuple[int, ...]) -> Sequence | None:
    """A conversation's features stored by an earlier run, memory-mapped; None when there are none, or they
    are of other tokens (another answers file) or unreadable (a run killed while writing)."""
    if not path.is_file():
        return None
    try:
        state = torch.load(path, mmap=True, weights_only=True)
        tokens, first = _read_tokens(target, answer.prompt, answer.answer, aux_layers)
        tokens = tokens[first:]
        width = target.model.config.hidden_size * max(1, len(aux_layers))
        if not torch.equal(state["tokens"], tokens) or state["features"].shape != (tokens.shape[0], width):
            return None
        if aux_layers and "top_ids" not in state:  # stored before the soft labels were: computed again
            return None
        return Sequence(state["tokens"], state["features"], int(state["answer_start"]),
                        state.get("top_ids"), state.get("top_p"))
    except Exception:  # a damaged file of ours: computed again
        return None


def _store(path: Path, seq: Sequence) -> Sequence:
    """Write a conversation's features (whole, then renamed) and return them memory-mapped from the file."""
    tmp = path.with_suffix(".tmp")
    state = {"tokens": seq.tokens, "features": seq.features, "answer_start": seq.answer_start}
    if seq.top_ids is not None:
        state |= {"top_ids": seq.top_ids, "top_p": seq.top_p}
    torch.save(state, tmp)
    tmp.replace(path)
    state = torch.load(path, mmap=True, weights_only=True)
    return Sequence(state["tokens"], state["features"], seq.answer_start, state.get("top_ids"), state.get("top_p"))


def _kept_sequence(target, a: Answer, aux_layers: tuple[int, ...], kept: tuple) -> Sequence:
    """An answer's features kept while it was made (`_BatchAnswers`), as `_with_features` lays them out: its
    last token, never read by the target, gets a row of zeros (an EAGLE-3 head's training reads every row but
    the last)."""
    tokens, first = _read_tokens(target, a.prompt, a.answer, aux_layers)
    feats, ids, probs = kept
    rows = tokens.shape[0] - first
    if feats.shape[0] < rows:
        pad = rows - feats.shape[0]
        feats = torch.cat([feats, feats.new_zeros(pad, feats.shape[1])])
        ids = torch.cat([ids, ids.new_zeros(pad, ids.shape[1])])
        probs = torch.cat([probs, probs.new_zeros(pad, probs.shape[1])])
    return Sequence(tokens[first:], feats[:rows], len(a.prompt) - first, ids[:rows], probs[:rows])


def _with_features(target, prompt: list[int], answer: list[int], aux_layers: tuple[int, ...] = ()) -> Sequence:
    runner = target.new_runner()
    tokens, first = _read_tokens(target, prompt, answer, aux_layers)
    if aux_layers:
        runner.keep_layers(aux_layers)
    if not aux_layers:
        runner.forward(tokens)
        return Sequence(tokens[first:], runner.features(first, runner.length).clone().cpu(), len(prompt) - first)
    # an EAGLE-3 head also learns the target's own next-token distribution at each position it reads
    top_ids, top_p = _top(runner.forward(tokens, last=tokens.shape[0] - first))
    return Sequence(tokens[first:], runner.aux_features(first, runner.length).clone().cpu(), len(prompt) - first,
                    top_ids, top_p)


class _Frozen:
    """The target's embedding, final norm and LM head in fp32, for training."""

    def __init__(self, target) -> None:
        model = target.model
        embed = model.get_input_embeddings()
        self.embed = weight_rows(embed, slice(None)).detach().float() * embedding_scale(embed)
        self.norm_w, self.eps = final_norm(model)
        self.lm = weight_rows(model.get_output_embeddings(), slice(None)).detach().float()
        self.device = self.embed.device  # where training runs: the target's device

    def logits(self, h: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over the whole vocabulary, or over the token ids `rows` only."""
        return F.linear(self.norm_w * F.rms_norm(h, (h.shape[-1],), eps=self.eps), self.lm if rows is None else self.lm[rows])


def _batch(seqs: list[Sequence], device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (B, T) tokens, (B, T, D) features and (B, T) validity of a group of sequences, on `device`."""
    width = max(s.tokens.shape[0] for s in seqs)
    dim = seqs[0].features.shape[-1]
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    feats = torch.zeros(len(seqs), width, dim)
    valid = torch.zeros(len(seqs), width, dtype=torch.bool)
    for b, s in enumerate(seqs):
        n = s.tokens.shape[0]
        tokens[b, :n], feats[b, :n], valid[b, :n] = s.tokens, s.features.float(), True
    if device is not None:
        return tokens.to(device), feats.to(device), valid.to(device)
    return tokens, feats, valid


def _loss(head: EagleHead, frozen: _Frozen, seqs: list[Sequence]) -> tuple[torch.Tensor, int, int]:
    """Pairs i = 0..T-2: (feature i, token i+1) -> feature i+1, whose logits should give token i+2.
    Padding sits at the end of each row, so causal attention never lets a real position see it."""
    tokens, feats, valid = _batch(seqs, frozen.device)
    pred = head(feats[:, :-1], frozen.embed[tokens[:, 1:]])  # (B, T-1, D) ~ features 1..T-1
    ok = valid[:, 1:]
    reg = F.smooth_l1_loss(pred[ok], feats[:, 1:][ok])
    ok2 = valid[:, 2:]
    logits = frozen.logits(pred[:, :-1][ok2])  # predictions for tokens 2..T-1
    labels = tokens[:, 2:][ok2]
    ce = F.cross_entropy(logits, labels)
    right = int((logits.argmax(-1) == labels).sum())
    return ce + 0.1 * reg, right, labels.shape[0]


def _draft_slots(head, vocab: int) -> torch.Tensor:
    """Each target token's row in the head's draft vocabulary, -1 outside it."""
    ids = head.draft_ids
    slot = torch.full((vocab,), -1, dtype=torch.long, device=ids.device)
    slot[ids] = torch.arange(ids.shape[0], device=ids.device)
    return slot


def _eagle3_loss(head: Eagle3Head, frozen: _Frozen, seqs: list[Sequence], steps: int | None = None) -> tuple[torch.Tensor, int, int]:
    """Row i reads (the target layers' states at i, token i+1) and should give token i+2; unrolled `steps`
    times as drafting feeds the head its own outputs (Eagle3Head.unrolled), step k weighted 0.8^k, on
    answer positions. The label is the target's own distribution over token i+2 (its most likely
    TARGET_TOP tokens inside the draft vocabulary, renormalised), where the target's first choice is a draft
    token: a sampled answer's token teaches less than what the target would have said, and the runners-up
    teach more than a single token does. Sequences without stored distributions learn the answer's token."""
    tokens, feats, valid = _batch(seqs, frozen.device)
    width = tokens.shape[1]
    outs = head.unrolled(feats[:, :-1], frozen.embed[tokens[:, 1:]], steps or TTT_STEPS)  # rows 0..T-2
    slot = _draft_slots(head, frozen.lm.shape[0])
    soft = _soft_labels(seqs, slot, width)
    labels = soft[0][..., 0] if soft is not None else slot[tokens[:, 2:]]  # rows 0..T-3: the first choice
    rows = torch.arange(width - 2, device=tokens.device)
    starts = torch.tensor([s.answer_start for s in seqs], device=tokens.device)
    base = valid[:, 2:] & (labels >= 0) & (rows[None, :] + 2 >= starts[:, None])
    loss, right, seen = 0.0, 0, 0
    for k, out in enumerate(outs):
        ok = base & (rows[None, :] >= k)  # a chain k deep starts at a position the head read
        logits = head.draft_logits(out[:, :-1][ok])
        if soft is not None:
            slots, weights = soft[0][ok], soft[1][ok]
            step_loss = -(weights * logits.log_softmax(-1).gather(1, slots.clamp(min=0))).sum(-1).mean()
        else:
            step_loss = F.cross_entropy(logits, labels[ok])
        loss = loss + step_loss * 0.8**k
        if k == 0:
            right, seen = int((logits.argmax(-1) == labels[ok]).sum()), int(ok.sum())
    return loss, right, seen


def _soft_labels(seqs: list[Sequence], slot: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For rows 0..width-3 (the distribution over token i+2, stored at position i+1): each candidate's row in
    the draft vocabulary (-1 outside it; the first is the target's first choice) and its weight, the stored
    probabilities inside the draft vocabulary renormalised to one; None when a sequence has none stored."""
    if any(s.top_ids is None for s in seqs):
        return None
    k = seqs[0].top_ids.shape[-1]
    ids = torch.zeros(len(seqs), width, k, dtype=torch.long)
    probs = torch.zeros(len(seqs), width, k)
    for b, s in enumerate(seqs):
        n = s.tokens.shape[0]
        ids[b, :n], probs[b, :n] = s.top_ids.long(), s.top_p.float()
    ids, probs = ids[:, 1:-1].to(slot.device), probs[:, 1:-1].to(slot.device)
    slots = slot[ids]
    weights = probs * (slots >= 0)
    weights = weights / weights.sum(-1, keepdim=True).clamp(min=1e-9)
    return slots, weights


def _medusa_loss(head: MedusaHead, frozen: _Frozen, seqs: list[Sequence]) -> tuple[torch.Tensor, int, int]:
    """Head i reads feature t and should give token t + 2 + i; the softmax runs over the draft vocabulary
    (tokens outside it are not drafted, so they are not trained for)."""
    tokens, feats, valid = _batch(seqs, frozen.device)
    ids = head.draft_ids
    slot = _draft_slots(head, frozen.lm.shape[0])
    preds = head(feats)  # (heads, B, T, D)
    loss, right, seen = 0.0, 0, 0
    for i, pred in enumerate(preds):
        ahead = 2 + i
        labels = slot[tokens[:, ahead:]]
        ok = valid[:, ahead:] & (labels >= 0)
        logits = frozen.logits(pred[:, :-ahead][ok], ids)
        ce = F.cross_entropy(logits, labels[ok])
        loss = loss + ce * 0.8**i  # nearer heads matter more: their guesses sit higher in the tree
        if i == 0:
            right, seen = int((logits.argmax(-1) == labels[ok]).sum()), int(ok.sum())
    return loss, right, seen


def _read_checkpoint(path: Path, say: Callable[[str], None]) -> dict | None:
    """A checkpoint's tensors and numbers, read without running code from the file (weights_only): a
    file that holds anything else is ignored, with a notice, and training starts over."""
    try:
        state = torch.load(path, weights_only=True)
    except Exception as exc:  # an unpickler error, a damaged file: all mean the same here
        say(f"training: the checkpoint {path} was not used ({type(exc).__name__}: {unsafe_pickle(exc)[:120]})")
        return None
    return state if isinstance(state, dict) else None


def _fast_bf16(device: torch.device) -> bool:
    """Whether training runs its products in bf16 (autocast, fp32 weights and optimizer): on a GPU, and on
    CPUs with bf16 instructions (AMX or AVX-512 BF16; 1.5x faster EAGLE-3 training than fp32 measured on
    one), where it is exact enough for a head that only proposes."""
    if device.type == "cuda":
        return True
    if device.type != "cpu":
        return False
    from ..cpu.step import cpu_features

    flags = cpu_features().split()
    return "amx_bf16" in flags or "avx512_bf16" in flags


def _bf16_autocast(device: torch.device, on: bool):
    import contextlib
    import warnings

    if not on:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")  # bf16 rows, fp32 norm weights
    stack.enter_context(torch.autocast(device.type, dtype=torch.bfloat16))
    return stack


def train_head(target, seqs: list[Sequence], epochs: int = 2, lr: float = 1e-3, seed: int = 0,
               say: Callable[[str], None] = lambda s: None, batch: int = 4,
               checkpoint: Path | None = None, kind: str = "eagle",
               draft_ids: torch.Tensor | None = None, start: torch.nn.Module | None = None) -> torch.nn.Module:
    """Train a head of this kind on these sequences. With `checkpoint` the state is saved every few
    minutes and at the end of each epoch, and a run with the same data and settings resumes from it.
    `start`: a head of this kind for the target (`start_head`) to continue training, with its draft
    vocabulary, instead of a new one."""
    torch.manual_seed(seed)
    config = HeadConfig.for_target(target.model.config)
    frozen = _Frozen(target)
    all_ids = torch.arange(frozen.lm.shape[0], device=frozen.device)
    if start is not None:
        head = start
    elif kind == "eagle3":  # its own LM head over the draft vocabulary, starting from the target's rows
        ids = draft_ids.to(frozen.device) if draft_ids is not None else all_ids
        config = replace(config, aux_layers=default_aux_layers(target.model.config.num_hidden_layers),
                         draft_vocab=int(ids.shape[0]))
        head = Eagle3Head(config)
        head.draft_ids = ids
        with torch.no_grad():
            head.lm.weight.copy_(frozen.lm[ids])
            head.final_norm.weight.copy_(frozen.norm_w)
    else:
        head = MedusaHead(config) if kind == "medusa" else EagleHead(config)
        if draft_ids is not None:
            head.draft_ids = draft_ids
        elif kind == "medusa":
            head.draft_ids = all_ids
    head.to(frozen.device)
    loss_of = {"medusa": _medusa_loss, "eagle3": _eagle3_loss}.get(kind, _loss)
    mixed = kind == "eagle3" and _fast_bf16(frozen.device)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    plan = []  # (epoch, the sequences of one optimizer step)
    for epoch in range(epochs):
        order = list(range(len(seqs)))
        rng.shuffle(order)
        plan += [(epoch, order[j : j + batch]) for j in range(0, len(order), batch)]
    total = len(plan)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, total) / max(1, total))))
    key = {"sequences": len(seqs), "tokens": sum(int(s.tokens.shape[0]) for s in seqs), "epochs": epochs,
           "lr": lr, "seed": seed, "batch": batch, "kind": kind}
    if start is not None:  # a checkpoint of a new head's training is not this run's
        key["start"] = _weights_digest(start)
    done = 0
    state = _read_checkpoint(checkpoint, say) if checkpoint is not None and checkpoint.is_file() else None
    if state is not None:
        if state.get("key") == key:
            head.load_state_dict(state["head"])
            opt.load_state_dict(state["opt"])
            sched.load_state_dict(state["sched"])
            done = state["step"]
            say(f"training: resuming at step {done}/{total}")

    def save(step: int) -> None:
        if checkpoint is not None:
            tmp = checkpoint.with_suffix(".tmp")
            torch.save({"key": key, "head": head.state_dict(), "opt": opt.state_dict(),
                        "sched": sched.state_dict(), "step": step}, tmp)
            tmp.replace(checkpoint)

    right = seen = 0
    t0 = last_save = time.perf_counter()
    for step in range(done, total):
        epoch, group = plan[step]
        with _bf16_autocast(frozen.device, mixed):
            loss, r, n = loss_of(head, frozen, [seqs[j] for j in group])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        sched.step()
        right, seen = right + r, seen + n
        end_of_epoch = step + 1 == total or plan[step + 1][0] != epoch
        if (step + 1) % 10 == 0 or end_of_epoch:
            eta = (time.perf_counter() - t0) / (step + 1 - done) * (total - step - 1)
            say(f"training: epoch {epoch + 1}/{epochs}, step {step + 1}/{total}, top-1 {right / max(1, seen):.0%}, eta {eta:.0f} s")
        if end_of_epoch or time.perf_counter() - last_save > 120:
            save(step + 1)
            last_save = time.perf_counter()
        if end_of_epoch:
            right = seen = 0
    return head.eval()


def start_head(folder: Path, target, kind: str) -> tuple[torch.nn.Module, dict]:
    """The head in `folder` to continue training as a head of `kind` for this target (fp32, trainable) and
    what its training was; refused in one line where it is of another kind, or not one of Specula's own."""
    from .store import load_head, read_info

    stored = "eagle" if kind == "eagle3" else kind
    info = read_info(folder)  # a folder without head.json: refused by check_options before the model loads
    reads_layers = bool(info.config.aux_layers)
    if info.kind != stored or (stored == "eagle" and reads_layers != (kind == "eagle3")):
        what = ("an EAGLE-3" if reads_layers else "an eagle") if info.kind == "eagle" else f"a {info.kind}"
        raise SpeculaError(f"{folder} holds {what} head: it cannot continue as --kind {kind}")
    head, _ = load_head(folder, target, dtype=torch.float32, kind=stored)  # a head for another model: said first
    if kind == "eagle3" and tuple(info.config.aux_layers) != default_aux_layers(target.model.config.num_hidden_layers):
        raise SpeculaError(f"{folder} reads target layers {list(info.config.aux_layers)}, not the ones training reads")
    return head.train().requires_grad_(True), dict(info.training)


def _weights_digest(head: torch.nn.Module) -> str:
    """A short digest of a head's weights: which head a checkpoint continued."""
    import hashlib

    h = hashlib.sha256()
    for name, t in sorted(head.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@torch.inference_mode()
def chain_acceptance(head: EagleHead, target, seqs: list[Sequence], k: int = 5, stride: int = 4) -> float:
    """Mean new tokens per target pass a chain of k drafts would give on these (held-out) answers, with
    real features up to each starting point: 1 + the mean common prefix of the drafts and the answer."""
    frozen = _Frozen(target)
    head = head.float().to(frozen.device)
    kept = []
    for seq in seqs:
        feats, tokens = seq.features.float().to(frozen.device), seq.tokens.to(frozen.device)
        for t in range(max(1, seq.answer_start - 1), tokens.shape[0] - 2, stride):
            # the head has read positions 0..t-1 with real features; token t is the newest one
            head.truncate(0)
            out = head(feats[None, :t], frozen.embed[tokens[1 : t + 1]][None], use_cache=True)[0, -1]
            n = 0
            for j in range(k):
                logits = frozen.logits(out[None])[0]
                ids = head.draft_ids
                guess = int(ids[logits[ids].argmax()]) if ids.numel() else int(logits.argmax())
                if t + 1 + j >= tokens.shape[0] or guess != int(tokens[t + 1 + j]):
                    break
                n += 1
                out = head(out[None, None], frozen.embed[[guess]][None], start=t + j, use_cache=True)[0, -1]
            kept.append(n)
    return 1.0 + sum(kept) / max(1, len(kept))


@torch.inference_mode()
def medusa_acceptance(head: MedusaHead, target, seqs: list[Sequence]) -> float:
    """Mean new tokens per target pass the chain of the heads' top guesses would give on these answers:
    1 + the mean common prefix of the guesses and the answer."""
    frozen = _Frozen(target)
    head = head.float().to(frozen.device)
    ids = head.draft_ids if head.draft_ids.numel() else None
    kept = []
    for seq in seqs:
        feats, tokens = seq.features.float().to(frozen.device), seq.tokens.to(frozen.device)
        t = torch.arange(max(0, seq.answer_start - 1), tokens.shape[0] - 2, device=frozen.device)
        if t.numel() == 0:
            continue
        guess = frozen.logits(head(feats[t]), ids).argmax(-1)  # (heads, n)
        guess = ids[guess] if ids is not None else guess
        run = torch.ones(t.shape[0], dtype=torch.bool, device=frozen.device)
        n = torch.zeros(t.shape[0], dtype=torch.long, device=frozen.device)
        for i in range(guess.shape[0]):
            where = t + 2 + i
            inside = where < tokens.shape[0]
            run &= inside & (guess[i] == tokens[where.clamp(max=tokens.shape[0] - 1)])
            n += run.long()
        kept += n.tolist()
    return 1.0 + sum(kept) / max(1, len(kept))


@torch.inference_mode()
def unrolled_acceptance(head: Eagle3Head, target, seqs: list[Sequence], k: int = 5, stride: int = 4) -> float:
    """chain_acceptance for an EAGLE-3 head, from its unrolled steps (a chain's j-th draft is step j's
    output, the tokens before it the answer's own: the ones a chain that got that far had drafted)."""
    frozen = _Frozen(target)
    head = head.float().to(frozen.device)
    kept = []
    for seq in seqs:
        tokens, n = seq.tokens.to(frozen.device), seq.tokens.shape[0]
        if n < 3:
            continue
        outs = head.unrolled(seq.features.float().to(frozen.device)[None, :-1], frozen.embed[tokens[1:]][None], k)
        guesses = [head.draft_ids[head.draft_logits(out[0]).argmax(-1)].tolist() for out in outs]  # (T-1,) each
        tokens = tokens.tolist()
        for r in range(max(0, seq.answer_start - 2), n - 2, stride):  # the last row the head read for real
            depth = 0
            while depth < k and r + depth + 2 < n and guesses[depth][r + depth] == tokens[r + depth + 2]:
                depth += 1
            kept.append(depth)
    return 1.0 + sum(kept) / max(1, len(kept))


def frequent_tokens(seqs: list[Sequence], size: int) -> torch.Tensor:
    """The `size` token ids that occur most often in the answers (the head's draft vocabulary)."""
    counts = torch.zeros(int(max(int(s.tokens.max()) for s in seqs)) + 1, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(s.tokens[s.answer_start :], minlength=counts.shape[0])
    size = min(size, int((counts > 0).sum()))
    return counts.topk(size).indices.sort().values


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
    from ..api.paths import data_dir

    slug = "".join(c if c.isalnum() else "-" for c in model_name.lower()).strip("-")[:60] or "model"
    return data_dir() / "heads" / f"{slug}-{kind}"


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
    if o.start is not None and not (o.start / "head.json").is_file():
        raise SpeculaError(f"no head to continue from in {o.start}: it needs a head.json as `specula train-head` writes")


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
            raise TrainingCancelled("training cancelled: the answers made so far are kept, and the next run continues from them")
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
    from .store import save_head

    about = {"target": target_fingerprint(target.model), "seed": o.seed, "max_new_tokens": o.max_new_tokens}
    if o.written != MODEL_QUERY_SHARE:  # other prompts than the default's (folders of the default stay as they were)
        about["model_questions"] = o.written
    try:
        work.mkdir(parents=True, exist_ok=True)
        stored = json.loads((work / "about.json").read_text(encoding="utf-8")) if (work / "about.json").is_file() else None
    except (OSError, ValueError) as exc:
        raise SpeculaError(f"the training data folder {work} is unusable: {exc}") from None
    if stored is not None and stored != about:
        raise SpeculaError(f"{work} holds training data for another model or other settings: choose another data folder")
    (work / "about.json").write_text(json.dumps(about), encoding="utf-8")
    start, before = started if started is not None else (None, None)
    aux = default_aux_layers(target.model.config.num_hidden_layers) if o.kind == "eagle3" else ()
    store = work / ("features-" + ("-".join(map(str, aux)) if aux else "final"))
    answers = self_distill(target, o.tokens, max_new=o.max_new_tokens, batch=o.batch, seed=o.seed, say=report,
                           store=work / "answers.jsonl", should_stop=should_stop, drafter=drafter,
                           aux_layers=aux, features=store if aux else None, written=o.written)
    if len(answers) < 2:
        raise SpeculaError("the model gave too few usable answers to train on (each needs at least 4 tokens before its end)")
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
