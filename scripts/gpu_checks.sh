#!/usr/bin/env bash
# Everything Specula checks on an NVIDIA GPU, in one run; the results go under one folder.
#
# usage: scripts/gpu_checks.sh [OUT_DIR]            (default ./gpu-results)
#   PRESETS="smollm-135m llama-1b"   random-weight model shapes to build and time (scripts/random_model.py --list;
#                                    default smollm-135m llama-1b llama-8b)
#   CONTEXTS=512,4000                 cache lengths the step costs are timed at
#   BENCH="smollm-135m"              the presets that also get a short bench
#   PROMPTS=path/to/question.jsonl   Spec-Bench prompts for the bench
#   PYTHON=.venv/bin/python          the environment with a CUDA build of torch (make setup TORCH_INDEX=...)
#   LIMIT=2                          prompts per Spec-Bench category in each bench
#   SPECULA_TOKENIZER=DIR            tokenizer files for the random models where the bundled model is not installed
#
# Steps: the GPU's description -> the cuda-marked tests (greedy identity on the GPU, eager, static steps and
# CUDA graphs) -> for every preset, a random-weight model built on the GPU and its step costs
# (scripts/step_costs.py: eager against graphs, steps of at least 32 rows as the engine runs them and of the
# rows asked for) -> a short bench for the BENCH presets. Meant to finish inside 8 minutes.
# Random weights make acceptance and speedup figures meaningless; the step costs are the result.
# The models live in a temporary folder that is removed at the end (KEEP_MODELS=1 keeps it).
set -u -o pipefail

# paths the caller gives are relative to the caller's folder
out="$(realpath -m "${1:-./gpu-results}")"
prompts="${PROMPTS:+$(realpath -m "$PROMPTS")}"
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 2
# scripts/*.py import specula.engine, installed or not: a specula/ folder of links to this tree's engine/ and app/
ns=$(mktemp -d) && mkdir "$ns/specula" && ln -s "$root/engine" "$root/app" "$ns/specula/"
export PYTHONPATH="$ns${PYTHONPATH:+:$PYTHONPATH}"
prompts="${prompts:-$root/../shared/datasets/spec_bench/question.jsonl}"
py="${PYTHON:-.venv/bin/python}"
if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "torch in $py sees no CUDA GPU: install a CUDA build (make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128)" >&2
    exit 2
fi

mkdir -p "$out" && : > "$out/timings.txt"  # each step's wall time
presets="${PRESETS:-smollm-135m llama-1b llama-8b}"
models="$(mktemp -d "${TMPDIR:-/tmp}/specula-models.XXXXXX")"
if [ "${KEEP_MODELS:-0}" = 1 ]; then
    echo "models are kept in $models"
else
    trap 'rm -rf "$models"' EXIT
fi
failed=()

step() {  # step NAME LOGFILE COMMAND...: run, keep stdout and stderr in LOGFILE, remember failures
    local name="$1" log="$2" start=$SECONDS
    shift 2
    echo "== $name"
    if ! "$@" 2>&1 | tee "$log"; then
        failed+=("$name")
        echo "!! $name failed (log: $log)"
    fi
    echo "$name: $((SECONDS - start)) s" >> "$out/timings.txt"
}

table() {  # table NAME FILE COMMAND...: like step, but FILE gets stdout only (a Markdown table)
    local name="$1" file="$2" start=$SECONDS
    shift 2
    echo "== $name"
    if ! "$@" | tee "$file"; then
        failed+=("$name")
        echo "!! $name failed"
    fi
    echo "$name: $((SECONDS - start)) s" >> "$out/timings.txt"
}

{
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    git rev-parse HEAD 2>/dev/null
    nvidia-smi 2>/dev/null || echo "nvidia-smi not found"
    "$py" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "|", torch.cuda.get_device_name(0)); print("transformers", transformers.__version__)'
} > "$out/environment.txt" 2>&1
cat "$out/environment.txt"

step "pytest -m cuda" "$out/pytest-cuda.txt" "$py" -m pytest -q -rs -m cuda tests/engine/test_cuda.py

for preset in $presets; do
    model="$models/$preset"
    step "$preset: build" "$out/$preset-build.txt" \
        "$py" scripts/random_model.py "$preset" "$model" --device cuda --dtype bf16
    [ -f "$model/config.json" ] || continue
    table "$preset: step costs" "$out/$preset-step-costs.md" \
        "$py" scripts/step_costs.py --model "$model" --device cuda --dtype bf16 --context "${CONTEXTS:-512,4000}" \
        --step eager,auto --floor 32,1 --tokens 1,2,4,8,16,32,64 --repeats 20
    case " ${BENCH-smollm-135m} " in *" $preset "*) ;; *) rm -rf "$model"; continue ;; esac
    step "$preset: bench" "$out/$preset-bench.txt" \
        "$py" -m specula.engine.cli bench --model "$model" --device cuda --dtype bf16 --prompts "$prompts" \
        --limit-per-category "${LIMIT:-2}" --strategies none,prompt-lookup,lookahead,auto --peers hf --max-new-tokens 64 \
        --out "$out/$preset-bench"
    rm -rf "$model"  # the next preset's room on the disk
done

echo
echo "results in $out"
if [ ${#failed[@]} -gt 0 ]; then
    printf 'failed: %s\n' "${failed[@]}"
    exit 1
fi
echo "all steps passed"
