#!/bin/bash
# The real pair (../shared/models/real-models.sh qwen-coder-1.5b and qwen-coder-0.5b), both sides served: specula serve none / auto / draft-model (each from an empty data folder) and llama.cpp b11434 built
# for this CPU (`../shared/peers/llamacpp.sh build newest`): plain, the same 0.5B draft (its defaults), ngram-mod.
# One Spec-Bench prompt of ten kinds, MAX tokens (default 128), at temperature TEMP (default 0: greedy); the in-process
# `none` is the bench's own baseline. Usage: [MAX=512] [TEMP=0.7] scripts/served_pair.sh OUT
set -e
WORK=${WORK:-/tmp/specula-served}; mkdir -p $WORK
cd "$(git rev-parse --show-toplevel)"
M=~/.cache/specula-models
OUT=${1:?usage: [MAX=N] [TEMP=T] scripts/served_pair.sh OUT}
rm -f $WORK/pids
start() { # PORT STRATEGY
  d=$(mktemp -d $WORK/data-$2-XXXX)
  .venv/bin/specula serve --model $M/qwen-coder-1.5b.gguf --draft-model $M/qwen-coder-0.5b.gguf --step compiled \
     --strategy $2 --port $1 --data-dir $d > $WORK/serve-$2.log 2>&1 &
  echo $! >> $WORK/pids
}
llama() { # PORT SPEC
  LLAMA_NEWEST=1 ../shared/peers/llamacpp.sh serve $1 $2 $M/qwen-coder-1.5b.gguf > $WORK/llama-$1.log 2>&1 &
  echo $! >> $WORK/pids
}
ready() { for i in $(seq 1 300); do curl -sf http://127.0.0.1:$1/health >/dev/null && break; sleep 2; done; curl -s http://127.0.0.1:$1/health; echo; }
start 8095 none; ready 8095; start 8093 auto; ready 8093; start 8096 draft-model; ready 8096
llama 8181 none; ready 8181; llama 8182 draft:$M/qwen-coder-0.5b.gguf; ready 8182; llama 8183 ngram-mod; ready 8183
.venv/bin/specula bench --model $M/qwen-coder-1.5b.gguf --step compiled --prompts ../shared/datasets/spec_bench/question.jsonl \
  --categories coding,writing,humanities,translation,qa,math_reasoning,summarization,rag,stem,reasoning --limit-per-category 1 \
  --strategies none --max-new-tokens ${MAX:-128} --temperature ${TEMP:-0} --repeat 1 \
  --peers specula-none=http://127.0.0.1:8095,specula-auto=http://127.0.0.1:8093,specula-draft-model=http://127.0.0.1:8096,llama-plain=http://127.0.0.1:8181,llama-draft=http://127.0.0.1:8182,llama-ngram-mod=http://127.0.0.1:8183 \
  --out $OUT
kill $(cat $WORK/pids) || true
