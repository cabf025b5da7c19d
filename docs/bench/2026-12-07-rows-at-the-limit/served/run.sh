#!/bin/bash
# Both sides served (scripts/served_pair.sh): specula serve none / auto / draft-model, each from an empty data folder,
# and llama.cpp b11434 built for this CPU: plain, the same 0.5B draft (its defaults), ngram-mod. One Spec-Bench prompt
# of ten kinds, 128 tokens, greedy.
exec "$(git rev-parse --show-toplevel)/scripts/served_pair.sh" "${1:?usage: run.sh OUT}"
