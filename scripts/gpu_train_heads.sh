#!/usr/bin/env bash
# Train the bundled model's draft heads on an NVIDIA GPU in one run: its own answers generated in large
# batches, then an EAGLE-3 head and a Medusa head trained on them; heads, answers and timings in one folder.
#
# usage: scripts/gpu_train_heads.sh [OUT_DIR]        (default ./gpu-heads)
#   MODEL=bundled            the model the heads are for (a folder, a .gguf, a Hub id in the cache); where it
#                            cannot be loaded (a machine that carries only the working tree), a random-weight
#                            model of the bundled model's shape is built instead: its heads are useless and
#                            only the timings count (SPECULA_TOKENIZER=DIR: tokenizer files for it)
#   MODEL_PARTS=DIR          the model file in parts (`scripts/model_parts.sh`, carried to the GPU machine a
#                            few calls apart, where a call carries too little for the whole file): joined,
#                            checked against DIR/SHA256SUMS, and used as MODEL
#   ANSWERS=DIR              answers already made (training/smollm2-135m-instruct: every answers-*.jsonl.xz
#                            under DIR, seeds in order) as the data to start from: no generation when TOKENS
#                            is at most what they hold (the default then)
#   TOKENS=2000000           answer tokens to train on (generated where the data holds fewer)
#   MODEL_QUESTIONS=0.25     of the generated first turns without a pasted text, the share the model writes itself
#   BATCH=256                conversations answered together (transformers' generate() on the GPU)
#   TRAIN_BATCH=32           conversations per optimizer step
#   EPOCHS=2
#   FROM=HEAD_DIR  LR=1e-3   continue the eagle head in HEAD_DIR (train-head --from), at this learning rate
#   KINDS="eagle3 medusa"    the heads to train
#   PYTHON=.venv/bin/python  the environment with a CUDA build of torch
#
# Copy OUT_DIR/eagle3 and OUT_DIR/medusa into engine/heads/bundled/ (as eagle and medusa) to ship them;
# OUT_DIR/timings.txt holds each stage's wall time and the log lines with tokens/s.
set -u -o pipefail

out="$(realpath -m "${1:-./gpu-heads}")"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 2
ns=$(mktemp -d) && mkdir "$ns/specula" && ln -s "$root/engine" "$root/app" "$ns/specula/"
export PYTHONPATH="$ns${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-.venv/bin/python}"
if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "torch in $py sees no CUDA GPU: install a CUDA build (make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128)" >&2
    exit 2
fi
mkdir -p "$out"
model="${MODEL:-bundled}"
if [ -n "${MODEL_PARTS:-}" ]; then
    sums="$(realpath "$MODEL_PARTS/SHA256SUMS")"
    joined="$out/model/$(sed -n '1s/^[0-9a-f]*  *//p' "$sums")"
    mkdir -p "$out/model" && cat "$MODEL_PARTS"/part-* > "$joined" || exit 1
    if ! (cd "$out/model" && sha256sum --quiet -c "$sums"); then
        echo "the parts in $MODEL_PARTS do not make the file they were cut from (a part missing or damaged)" >&2
        exit 2
    fi
    model="$joined"
fi
tokens="${TOKENS:-2000000}"
if [ -n "${ANSWERS:-}" ]; then
    mkdir -p "$out/data"
    find "$ANSWERS" -name 'answers-*.jsonl.xz' | sort | xargs xz -dc > "$out/data/answers.jsonl" || exit 1
    held=$("$py" -c 'import json, sys; print(sum(len(json.loads(l)["answer"]) for l in open(sys.argv[1])))' "$out/data/answers.jsonl")
    tokens="${TOKENS:-$held}"
    echo "$(wc -l < "$out/data/answers.jsonl") stored answers, $held answer tokens, from $ANSWERS"
fi
if ! "$py" -c 'import sys; from specula.engine.api.types import ModelChoice; from specula.engine.models.loading import load_model; load_model(ModelChoice(sys.argv[1], "cuda", "bf16"))' "$model" > "$out/model-check.txt" 2>&1; then
    echo "the model '$model' does not load here ($(tail -1 "$out/model-check.txt")): a random-weight model of its shape, timings only"
    model="$out/random-smollm-135m"
    "$py" scripts/random_model.py smollm-135m "$model" --device cuda --dtype bf16 || exit 1
fi

{
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    git rev-parse HEAD 2>/dev/null
    nvidia-smi --query-gpu=name,memory.total --format=csv 2>/dev/null
    echo "model $model, tokens $tokens, batch ${BATCH:-256}, train batch ${TRAIN_BATCH:-32}, epochs ${EPOCHS:-2}," \
        "answers from ${ANSWERS:-generation}, from ${FROM:-scratch}, lr ${LR:-1e-3}"
} > "$out/timings.txt"

train() {  # train KIND: one head from the shared answers (the first run makes them), timed
    local kind="$1" start from=() questions=()
    start=$(date +%s)
    [ -n "${FROM:-}" ] && [ "$kind" = eagle3 ] && from=(--from "$FROM")
    [ -n "${MODEL_QUESTIONS:-}" ] && questions=(--model-questions "$MODEL_QUESTIONS")
    "$py" -m specula.engine.cli train-head --model "$model" --device cuda --dtype bf16 --kind "$kind" \
        --tokens "$tokens" --batch "${BATCH:-256}" --train-batch "${TRAIN_BATCH:-32}" --lr "${LR:-1e-3}" "${from[@]}" \
        "${questions[@]}" --epochs "${EPOCHS:-2}" --data "$out/data" --out "$out/$kind" --overwrite 2>&1 | tr '\r' '\n' | tee "$out/$kind.log" |
        grep -E "tokens/s|epoch [0-9]+/[0-9]+, step|saved" | tail -n 3
    local rc=${PIPESTATUS[0]}
    echo "$kind: exit $rc, $(( $(date +%s) - start )) s" | tee -a "$out/timings.txt"
    grep -E "answers: .*tokens/s" "$out/$kind.log" | tail -n 1 >> "$out/timings.txt"
    grep -E "epoch [0-9]+/[0-9]+, step" "$out/$kind.log" | tail -n 1 >> "$out/timings.txt"
    return "$rc"
}

status=0
for kind in ${KINDS:-eagle3 medusa}; do
    train "$kind" || status=1
done
echo "results in $out"
exit $status
