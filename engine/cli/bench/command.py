"""`specula bench` argument handling; the measuring is in run.py, the reporting in report.py."""

from __future__ import annotations

import json

from ...api.errors import SpeculaError
from ...api.paths import make_folder
from ...api.strategies import default_k
from ...api.types import DecodeConfig, LoadRequest, ModelSpec
from ...cpu.step import step_mode
from ...drafters import DRAFTERS
from ...drafters.suffix import keep_apart
from ...serving.session import Session
from .report import public_json, summarize, to_markdown, write_out
from .run import load_items, parse_peers, run_bench, split_variant


def run_bench_cmd(args) -> int:
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not strategies:
        raise SpeculaError("--strategies names no strategy: give at least one, e.g. none,prompt-lookup")
    peers, servers = parse_peers(args.peers)
    for name in strategies:
        if split_variant(name)[0] not in DRAFTERS:
            raise SpeculaError(f"unknown strategy '{name}': choose from {', '.join(DRAFTERS)} (a variant: eagle+tree)")
    if servers and args.no_chat:
        raise SpeculaError("server peers speak chat: drop --no-chat")
    if args.repeat < 1:
        raise SpeculaError(f"--repeat must be at least 1, got {args.repeat}")
    if args.temperature != 0:
        raise SpeculaError("the bench compares greedy outputs: use --temperature 0")
    # greedy, seeded; each strategy takes its own k unless --k (run_bench), the baseline's is none's
    config = DecodeConfig.for_strategy("none", args.k, adaptive_k=args.adaptive_k, max_new_tokens=args.max_new_tokens,
                                       seed=0)
    items = load_items(args.prompts, args.categories, args.limit_per_category)
    if args.out:
        make_folder(args.out, "--out")  # before the bench runs, so its results have somewhere to go
    names = strategies + peers + list(servers)
    remotes = connect_servers(servers, args.api_key_env or "", not args.insecure, args.allow_http_key)
    session = Session()
    keep_apart()  # each strategy drafts from its own answers in this run only
    # every row measures the same step: with "auto" the bench waits for the compiled one (or its reason)
    step = step_mode(args.step)
    spec = ModelSpec(args.model, args.device, args.dtype, args.weights, "compiled" if step == "auto" else step)
    loaded = session.load(LoadRequest(spec, args.draft_model, measure_baseline=False, draft_head=args.draft_head))
    options = (("head", args.head),) if args.head else ()
    results = run_bench(session, items, names, config, chat=not args.no_chat, repeat=args.repeat, k=args.k,
                        options=options, remotes=remotes)
    summary = summarize(results, loaded.target, loaded.device, loaded.dtype, args.max_new_tokens, set(servers))
    summary["weights"] = loaded.weights or loaded.dtype
    summary["step"] = session.target.step_status
    for name, backend in remotes.items():
        summary.setdefault("servers", {})[name] = backend.describe().device
    summary["same_machine"] = [name for name, url in servers.items() if on_this_machine(url)]
    summary["k"] = {name: default_k(split_variant(name)[0]) if args.k is None else args.k for name in strategies}
    if args.out:
        write_out(args.out, summary, results)
    if args.json:
        print(json.dumps(public_json(summary)))
    else:
        print(to_markdown(summary))
    return 0


def connect_servers(servers: dict[str, str], api_key_env: str, verify_tls: bool, allow_http_key: bool = False) -> dict:
    """Each server peer connected (before any model loads, so a wrong URL fails at once)."""
    from ...api.types import RemoteLoadRequest
    from ...remote.backend import RemoteBackend

    remotes = {}
    for name, url in servers.items():
        backend = RemoteBackend()
        backend.load(RemoteLoadRequest(url, api_key_env=api_key_env, verify_tls=verify_tls,
                                       allow_http_key=allow_http_key))
        remotes[name] = backend
    return remotes


def on_this_machine(url: str) -> bool:
    """Whether a server peer's URL names this machine (loopback, or one of its own addresses)."""
    import ipaddress
    import socket
    from urllib.parse import urlsplit

    from ...remote.http import is_loopback

    host = urlsplit(url).hostname or ""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    try:
        own = set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        own = set()
    def here(address: str) -> bool:
        address = address.split("%")[0]  # an IPv6 address's zone (fe80::1%eth0)
        return is_loopback(address) or ipaddress.ip_address(address).is_unspecified or address in own

    return any(here(a) for a in addresses)
