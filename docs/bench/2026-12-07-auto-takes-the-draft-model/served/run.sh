#!/bin/bash
# served: specula none / auto / draft-model, each from an empty data folder
set -e
WORK=${WORK:-/tmp/specula-served}; mkdir -p $WORK
cd "$(git rev-parse --show-toplevel)"
M=~/.cache/specula-models
OUT=${1:?usage: run.sh OUT}
start() { # PORT STRATEGY
  d=$(mktemp -d $WORK/data-$2-XXXX)
  .venv/bin/specula serve --model $M/qwen-coder-1.5b.gguf --draft-model $M/qwen-coder-0.5b.gguf --step compiled \
     --strategy $2 --port $1 --data-dir $d > $WORK/serve-$2.log 2>&1 &
  echo $! >> $WORK/pids
}
rm -f $WORK/pids
ready() { for i in $(seq 1 300); do curl -sf http://127.0.0.1:$1/health >/dev/null && break; sleep 2; done; curl -s http://127.0.0.1:$1/health; echo; }
start 8095 none; ready 8095; start 8093 auto; ready 8093; start 8096 draft-model; ready 8096
.venv/bin/specula bench --model $M/qwen-coder-1.5b.gguf --step compiled --prompts ../shared/datasets/spec_bench/question.jsonl \
  --categories coding,writing,humanities,translation,qa,math_reasoning,summarization,rag,stem,reasoning --limit-per-category 1 \
  --strategies none --max-new-tokens 128 --repeat 1 \
  --peers specula-none=http://127.0.0.1:8095,specula-auto=http://127.0.0.1:8093,specula-draft-model=http://127.0.0.1:8096 --out $OUT
kill $(cat $WORK/pids) || true
