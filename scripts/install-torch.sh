#!/bin/sh
# Install torch into the virtual environment whose python is $1, without a CUDA download on machines
# that have no NVIDIA GPU.
#   TORCH_INDEX set        -> that index (a GPU user's CUDA build, e.g. .../whl/cu128)
#   an NVIDIA GPU present  -> PyPI's default Linux wheel, which carries CUDA
#   otherwise              -> a CPU wheel: a +cpu build pip can find (one on this machine through its find-links,
#                             its dependencies from the index), else PyTorch's CPU index, else PyPI (macOS and
#                             Windows wheels there are CPU builds)
set -eu
py="$1"
version="${TORCH_VERSION:-2.13.0}"
if "$py" -c "import torch" 2>/dev/null; then
    exit 0
fi
pip() { "$py" -m pip install --quiet "$@"; }
if [ -n "${TORCH_INDEX:-}" ]; then
    pip "torch==$version" --index-url "$TORCH_INDEX"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    pip "torch==$version"
else
    pip "torch==$version+cpu" 2>/dev/null \
        || pip "torch==$version" --index-url https://download.pytorch.org/whl/cpu 2>/dev/null \
        || pip "torch==$version"
fi
