#!/usr/bin/env bash
# Cut a model file into parts small enough to travel to a GPU machine that takes only a few tens of MB per
# call: carried a few calls apart into the same folder there, `gpu_train_heads.sh` (MODEL_PARTS=DIR) joins
# them and checks the whole against DIR/SHA256SUMS.
#
# usage: scripts/model_parts.sh [FILE] [DIR] [SIZE]
#   FILE  the model file (default: the bundled GGUF)
#   DIR   where the parts go (default build/gpu-model, which git ignores); emptied first
#   SIZE  the largest part (default 24M: what a call carries beside this repository's working tree)
set -eu -o pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
file="${1:-$(cd "$root" && "$py" -c 'from engine.api.paths import bundled_gguf_path; print(bundled_gguf_path())')}"
dir="${2:-$root/build/gpu-model}"
size="${3:-24M}"
[ -f "$file" ] || { echo "no such file: $file" >&2; exit 2; }
rm -rf "$dir" && mkdir -p "$dir"
split -b "$size" -d -a 2 "$file" "$dir/part-"
(cd "$(dirname "$file")" && sha256sum "$(basename "$file")") > "$dir/SHA256SUMS"
echo "$(basename "$file") in $(find "$dir" -name 'part-*' | wc -l) parts under $dir:"
ls -l "$dir"
