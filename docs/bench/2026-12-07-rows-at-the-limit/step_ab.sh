#!/bin/bash
# The step before (8eea989) and after (the tree it ran in), interleaved, four rounds: scripts/step_costs.py, real
# Qwen2.5-Coder-1.5B Q4_K_M, compiled step, context 64, median of 25 (scripts/step_ab.sh does the worktree)
exec "$(git rev-parse --show-toplevel)/scripts/step_ab.sh" 8eea989
