#!/bin/bash
# The step before (a worktree of BASE) and after (this tree), interleaved: scripts/step_costs.py, the real
# Qwen2.5-Coder-1.5B Q4_K_M (../shared/models/real-models.sh qwen-coder-1.5b), compiled step, context 64, median of 25.
# Usage: [TOKENS=1,4,8,16] [ROUNDS=4] scripts/step_ab.sh BASE
set -e
BASE=${1:?usage: [TOKENS=1,4,8,16] [ROUNDS=4] scripts/step_ab.sh BASE}
ROOT=$(git rev-parse --show-toplevel)
M=${MODEL:-$HOME/.cache/specula-models/qwen-coder-1.5b.gguf}
OLD=$(mktemp -d /tmp/step-ab-XXXX)
git -C "$ROOT" worktree add -q "$OLD/wt" "$BASE"
ln -s "$OLD/wt" "$OLD/specula"  # the old engine imported as `specula` from $OLD
trap 'git -C "$ROOT" worktree remove --force "$OLD/wt"; rm -rf "$OLD"' EXIT
for round in $(seq 1 "${ROUNDS:-4}"); do
  for side in old new; do
    if [ $side = old ]; then PP=$OLD; S=$OLD/wt/scripts/step_costs.py; else PP=; S=$ROOT/scripts/step_costs.py; fi
    (cd /tmp && PYTHONPATH=$PP "$ROOT/.venv/bin/python" "$S" --model "$M" --step compiled --context 64 \
      --tokens "${TOKENS:-1,4,8,16}" --repeats 25 2>/dev/null) | grep "^| [0-9]" |
      awk -v s=$side -v r=$round '{printf "%s r%s %s rows %s ms (%s)\n", s, r, $2, $4, $6}'
  done
done
