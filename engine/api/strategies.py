"""The catalogue of draft strategies, without torch: names, what each does, what it needs, its default
draft length, and the options they take (one schema for the command line's flags, the server's
`specula.options`, the app's settings and the drafters' builders). `drafters.DRAFTERS` adds the code that
builds each; the app and clients read this one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StrategyCard:
    name: str
    description: str
    needs_draft_model: bool = False
    default_k: int = 4  # draft length when the user sets none
    needs_head: str = ""  # the kind of trained draft head it needs (`specula train-head --kind KIND`)
    uses_heads: bool = False  # takes every head found for the model (option "heads"), needs none

    @property
    def needs(self) -> str | None:
        """What a model must have for this strategy, in words; None when nothing."""
        if self.needs_draft_model:
            return "a draft model"
        return f"a trained {self.needs_head} head" if self.needs_head else None


STRATEGIES: dict[str, StrategyCard] = {
    card.name: card
    for card in (
        StrategyCard("none", "plain decoding through the same loop (the baseline)"),
        # its drafts shrink to twice the match length on their own, so a higher cap only pays
        StrategyCard("prompt-lookup", "copy what followed the latest longest earlier match of the last tokens "
                                      "(no extra weights)", default_k=8),
        StrategyCard("draft-model", "a smaller model with the same tokenizer drafts the tokens it is confident "
                                    "of (needs a draft model)", needs_draft_model=True, default_k=8),
        StrategyCard("layer-skip", "the target's first layers draft for the whole model (no extra weights)"),
        StrategyCard("eagle", "a trained head drafts from the target's own features, in token trees that also "
                              "hold prompt lookup's draft where the engine verifies trees exactly (needs a head "
                              "trained for this model, or a published EAGLE head)", needs_head="eagle", default_k=6),
        StrategyCard("medusa", "trained heads guess several tokens at once from the target's last feature, "
                               "verified as a token tree", needs_head="medusa", default_k=4),
        StrategyCard("lookahead", "Jacobi iteration on a window of guesses plus a pool of n-grams collected from "
                                  "it (no extra weights)", default_k=5),
        StrategyCard("suffix", "continuations of the last tokens found in this conversation and in every earlier "
                               "answer of the model, scored by how often each followed (no extra weights)",
                     default_k=8),
        StrategyCard("auto", "chooses each step's drafter (prompt lookup, the model's earlier answers, its own "
                             "phrases, lookahead, trained heads, a loaded draft model) and draft length, or no "
                             "draft, by the speed each has measured here",
                     uses_heads=True,
                     default_k=8),
    )
}


# a draft model's vocabulary, cut to its most frequent ids (option draft_vocab) where the vocabulary is at least half
# as large again: with Qwen2.5's tokenizer the ids below 65,536 are 97-99% of English and code (92% of translations)
DRAFT_VOCAB = 65536


def default_k(strategy: str) -> int:
    card = STRATEGIES.get(strategy)
    return card.default_k if card else 4


@dataclass(frozen=True)
class StrategyOption:
    """An option a request may carry for its strategy (GenerateRequest.options), and how the app's settings
    keep it and Settings > Strategies offers it."""

    name: str  # as requests carry it, and the drafters' builders take it
    kinds: tuple[type, ...]  # the JSON types a request may give it in
    strategies: tuple[str, ...]  # the strategies that read it (auto passes some on to its members)
    help: str
    on_command_line: bool = True  # `specula generate/chat --NAME`
    # Settings > Strategies: the strategies under whose row it is offered (none: not there), its words and tooltip
    shown_under: tuple[str, ...] = ()
    label: str = ""
    tip: str = ""
    # what a request that leaves it out gets, where one value says it (a switch that is on unless turned off);
    # None: the drafter's own choice (see help)
    default: object = None
    # an int option's range in the app's settings: a smaller value means the default, the larger is the most offered
    bounds: tuple[int, int] | None = None
    at_most: str = ""  # another option of its strategy that it must not exceed (the app's settings swap the two)
    requires: str = ""  # a switch it acts under only (Settings > Strategies greys it while that switch is off)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def switch(self) -> bool:
        """On or off (a check box in the app; --NAME/--no-NAME on the command line)."""
        return bool in self.kinds

    def accepts(self, value: object) -> bool:
        return type(value) in self.kinds


STRATEGY_OPTIONS: dict[str, StrategyOption] = {
    option.name: option
    for option in (
        StrategyOption("min_n", (int,), ("prompt-lookup",), "prompt-lookup: shortest n-gram to match",
                       shown_under=("prompt-lookup",), label="Shortest n-gram",
                       tip="Shortest n-gram prompt lookup matches (default 1)", bounds=(1, 16), at_most="max_n"),
        StrategyOption("max_n", (int,), ("prompt-lookup",), "prompt-lookup: longest n-gram to match",
                       shown_under=("prompt-lookup",), label="Longest n-gram",
                       tip="Longest n-gram prompt lookup matches (default 16)", bounds=(1, 16)),
        StrategyOption("exit_layer", (int,), ("layer-skip",), "layer-skip: layers used for drafting",
                       shown_under=("layer-skip",), label="Exit layer",
                       tip="Layer skip drafts with the layers up to this one (default: half the model's layers)",
                       bounds=(1, 256)),
        StrategyOption("head", (str,), ("eagle", "medusa", "auto"), "eagle: a folder written by `specula train-head`"),
        StrategyOption("tree", (bool, int), ("eagle", "medusa", "lookahead", "suffix", "draft-model", "auto"),
                       "token trees (--no-tree: chains only). By default eagle drafts EAGLE-2 dynamic trees, sized by "
                       "measured costs, where tree passes decide as chains do (the compiled step on a CPU, a GPU), and "
                       "medusa and lookahead send trees on a GPU; --tree forces them (a tree pass that runs eagerly "
                       "on a CPU can part from plain decoding at a near tie). draft-model (and auto's): its next "
                       "choices join its chain as leaves where a verify row costs less than they are likely to win, "
                       "on greedy steps where tree passes decide as chains do",
                       shown_under=("eagle",), label="Token trees", default=True,
                       tip="Eagle drafts EAGLE-2 token trees, sized by what its passes cost here, wherever the engine "
                           "verifies trees exactly; off: one chain of guesses per step"),
        StrategyOption("lookup", (bool, int), ("eagle", "auto"),
                       "eagle: its trees also hold the conversation's own continuation, prompt lookup's draft "
                       "(default on; --no-lookup: the head's nodes only); auto: so do its draft model's passes, "
                       "where lookup's figures say the branch is worth its rows",
                       shown_under=("eagle",), label="With prompt lookup's branch", default=True, requires="tree",
                       tip="Eagle's trees also hold what followed the conversation's last words earlier on (prompt "
                           "lookup's draft): the head guesses free text, lookup copied text"),
        StrategyOption("draft_vocab", (int,), ("draft-model", "auto"),
                       "draft-model: the draft model proposes only the ids below this, the most frequent tokens of a "
                       "byte-pair vocabulary, and reads only their rows of its LM head (0: every id; default: "
                       f"{DRAFT_VOCAB:,} where the vocabulary is at least {DRAFT_VOCAB * 3 // 2:,})",
                       bounds=(0, 1 << 20)),
        StrategyOption("confident", (bool, int), ("draft-model", "layer-skip", "auto"),
                       "draft-model, layer-skip: draft only the tokens they are confident enough of to pay for their "
                       "cost, as measured here (default on; --no-confident: always the full draft length)",
                       shown_under=("draft-model",), label="Draft only confident tokens", default=True,
                       tip="The draft model stops guessing where a guess would more likely be rejected than pay for "
                           "the time it takes, from what the target kept of its guesses so far"),
        StrategyOption("skip", (str,), ("auto",), "auto: comma-separated strategies it must not use",
                       on_command_line=False),
        StrategyOption("phrases", (bool, int), ("auto",),
                       "auto: also drafts the model's own frequent phrases, the token that most often followed the "
                       "last 2-4 tokens in its earlier answers (a table shipped for the model, and this session's "
                       "answers), where prompt lookup has no longer match (default on; --no-phrases: off)",
                       shown_under=("auto",), label="May draft the model's own phrases", default=True,
                       tip="Auto may also draft what most often followed the last few words in the model's earlier "
                           "answers (a table shipped for the bundled model, and this session's answers), where prompt "
                           "lookup finds nothing longer"),
    )
}


def shown_options(strategy: str) -> tuple[StrategyOption, ...]:
    """The options Settings > Strategies offers under a strategy, in the schema's order."""
    return tuple(option for option in STRATEGY_OPTIONS.values() if strategy in option.shown_under)


def request_options(values: dict[str, object]) -> tuple[tuple[str, object], ...]:
    """GenerateRequest.options from named values: the known options that are set, in the schema's order."""
    return tuple((name, values[name]) for name in STRATEGY_OPTIONS
                 if values.get(name) is not None and values.get(name) != "")
