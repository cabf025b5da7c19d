#!/bin/sh
# Greedy identity on the bundled model: every strategy's token ids must equal `none`'s.
# usage: scripts/check_identity.sh PROMPTS.jsonl [DTYPE] [MAX_NEW_TOKENS]
set -eu
prompts="$1"; dtype="${2:-fp32}"; n="${3:-64}"
out=$(mktemp -d)
for s in none prompt-lookup layer-skip draft-model; do
    .venv/bin/specula generate --model bundled --draft-model bundled --chat --temperature 0 --dtype "$dtype" \
        --max-new-tokens "$n" --strategy "$s" --prompts "$prompts" --json > "$out/$s.jsonl"
done
.venv/bin/python - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
load = lambda s: [json.loads(l) for l in (out / f"{s}.jsonl").read_text().splitlines()]
base = load("none")
ids = lambda r: [r["token_ids"]] + [t["token_ids"] for t in r.get("turns", [])]
for s in ("prompt-lookup", "layer-skip", "draft-model"):
    rows = load(s)
    same = sum(ids(a) == ids(b) for a, b in zip(rows, base))
    print(f"{s}: {same}/{len(base)} identical to none")
PY
