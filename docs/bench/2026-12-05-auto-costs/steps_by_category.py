"""Per category and strategy of a bench record: steps, tokens per step, drafting and pass time per step, and
the share of `none`'s wall time spent before the first decoding step (reading the prompt, the first token).

usage: python steps_by_category.py RECORD_DIR   (a `specula bench --out` folder; .jsonl or .jsonl.xz)
"""

import json
import lzma
import sys
from collections import defaultdict
from pathlib import Path


def rows(folder: Path, name: str) -> list[dict]:
    plain, packed = folder / f"{name}.jsonl", folder / f"{name}.jsonl.xz"
    text = plain.read_text() if plain.is_file() else lzma.decompress(packed.read_bytes()).decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def main() -> None:
    folder = Path(sys.argv[1])
    steps = [r for r in rows(folder, "steps") if r["step"] > 0]
    by = defaultdict(list)
    for r in steps:
        by[(r["category"], r["strategy"])].append(r)
    print("| category | strategy | steps | tokens/step | drafting ms/step | pass ms/step |")
    print("|---|---|---|---|---|---|")
    for (category, strategy), rs in sorted(by.items()):
        n = len(rs)
        print(f"| {category} | {strategy} | {n} | {sum(r['new_tokens'] for r in rs) / n:.2f} | "
              f"{sum(r['draft_ms'] for r in rs) / n:.3f} | {sum(r['verify_ms'] for r in rs) / n:.2f} |")
    wall, decode = defaultdict(float), defaultdict(float)
    for r in rows(folder, "trace"):
        if r["strategy"] == "none":
            wall[r["category"]] += r["wall_s"]
            decode[r["category"]] += r["decode_s"]
    print("\n| category | none: share of the wall time before the first decoding step |")
    print("|---|---|")
    for category in wall:
        print(f"| {category} | {(wall[category] - decode[category]) / wall[category]:.2f} |")


if __name__ == "__main__":
    main()
