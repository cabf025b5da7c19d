"""`specula bench` argument handling; the measuring is in bench.py, the reporting in bench_report.py."""

from __future__ import annotations

import json

from .bench import PEERS, load_items, run_bench, split_variant
from .bench_report import public_json, summarize, to_markdown, write_out
from .decoder import DecodeConfig
from .drafters import DRAFTERS, default_k
from .errors import SpeculaError
from .loading import ModelSpec
from .sampling import SamplingParams
from .session import LoadRequest, Session


def run_bench_cmd(args) -> int:
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for name in strategies:
        if split_variant(name)[0] not in DRAFTERS:
            raise SpeculaError(f"unknown strategy '{name}': choose from {', '.join(DRAFTERS)} (a variant: eagle+tree)")
    for name in peers:
        if name not in PEERS:
            raise SpeculaError(f"unknown peer '{name}': choose from {', '.join(PEERS)}")
    if args.repeat < 1:
        raise SpeculaError(f"--repeat must be at least 1, got {args.repeat}")
    if args.temperature != 0:
        raise SpeculaError("the bench compares greedy outputs: use --temperature 0")
    config = DecodeConfig(k=4 if args.k is None else args.k, adaptive_k=args.adaptive_k, max_new_tokens=args.max_new_tokens,
                          params=SamplingParams(), seed=0)
    items = load_items(args.prompts, args.categories, args.limit_per_category)
    names = strategies + peers
    session = Session()
    spec = ModelSpec(args.model, args.device, args.dtype)
    loaded = session.load(LoadRequest(spec, args.draft_model, measure_baseline=False))
    options = (("head", args.head),) if args.head else ()
    results = run_bench(session, items, names, config, chat=not args.no_chat, repeat=args.repeat, k=args.k, options=options)
    summary = summarize(results, loaded.target, loaded.device, loaded.dtype, args.max_new_tokens)
    summary["k"] = {name: default_k(split_variant(name)[0]) if args.k is None else args.k for name in strategies}
    if args.out:
        write_out(args.out, summary, results)
    if args.json:
        print(json.dumps(public_json(summary)))
    else:
        print(to_markdown(summary))
    return 0
