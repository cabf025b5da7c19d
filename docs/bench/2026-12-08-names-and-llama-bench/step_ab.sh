#!/bin/bash
# The step before (a worktree of 48c5848 at /tmp/old-wt, imported through /tmp/oldpkg/specula -> /tmp/old-wt) and after
# (this tree), interleaved: scripts/step_costs.py, real Qwen2.5-Coder-1.5B Q4_K_M, compiled step, context 64, median of 25
# A/B of the step: old (HEAD worktree) and new (working tree), interleaved
M=~/.cache/specula-models/qwen-coder-1.5b.gguf
for round in 1 2 3 4; do
  for side in old new; do
    if [ $side = old ]; then PP=/tmp/oldpkg; S=/tmp/old-wt/scripts/step_costs.py; else PP=; S=/work/main/scripts/step_costs.py; fi
    cd /tmp && PYTHONPATH=$PP /work/main/.venv/bin/python $S --model $M --step compiled --context 64 --tokens ${TOKENS:-1,4,8,16} --repeats 25 2>/dev/null | grep "^| [0-9]" | awk -v s=$side -v r=$round '{printf "%s r%s %s rows %s ms (%s)\n", s, r, $2, $4, $6}'
  done
done
