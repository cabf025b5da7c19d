"""`specula bench` argument handling; the measuring is in run.py, the reporting in report.py."""

from __future__ import annotations

import json
from dataclasses import replace

from ...api.errors import SpeculaError
from ...api.paths import make_folder
from ...api.types import LoadRequest
from ...cpu.step import step_mode
from ...drafters.suffix import keep_apart
from ...serving.session import Session
from ..common import check_strategy, read_flags
from .report import public_json, summarize, to_markdown, write_out
from .run import load_items, parse_peers, run_bench, split_variant


def run_bench_cmd(args) -> int:
    # the settings every strategy shares (bad numbers fail here, as generate's do); each strategy's own draft
    # length comes from them in the run (Asked.config_for); run_bench warms every strategy up itself
    asked = read_flags(args, measure_baseline=False, prepare=False)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not strategies:
        raise SpeculaError("--strategies names no strategy: give at least one, e.g. none,prompt-lookup")
    peers, servers = parse_peers(args.peers)
    for name in strategies:
        check_strategy(split_variant(name)[0], args.draft_model)
    if servers and not asked.chat:
        raise SpeculaError("server peers speak chat: drop --no-chat")
    if args.repeat < 1:
        raise SpeculaError(f"--repeat must be at least 1, got {args.repeat}")
    items = load_items(args.prompts, args.categories, args.limit_per_category)
    if args.out:
        make_folder(args.out, "--out")  # before the bench runs, so its results have somewhere to go
    names = strategies + peers + list(servers)
    remotes = connect_servers(servers, args.api_key_env or "", not args.insecure, args.allow_http_key)
    session = Session()
    keep_apart()  # each strategy drafts from its own answers in this run only
    loaded = session.load(compiled_step(asked.load))
    results = run_bench(session, items, names, asked, repeat=args.repeat, remotes=remotes)
    summary = summarize(results, loaded.target, loaded.device, loaded.dtype, asked.config.max_new_tokens,
                        set(servers), asked.config.params.temperature)
    summary["weights"] = loaded.weights or loaded.dtype
    summary["step"] = session.target.step_status
    for name, backend in remotes.items():
        summary.setdefault("servers", {})[name] = backend.describe().device
    summary["same_machine"] = [name for name, url in servers.items() if on_this_machine(url)]
    summary["k"] = {name: asked.config_for(split_variant(name)[0]).k for name in strategies}
    if args.out:
        write_out(args.out, summary, results)
    if args.json:
        print(json.dumps(public_json(summary)))
    else:
        print(to_markdown(summary))
    return 0


def compiled_step(load: LoadRequest) -> LoadRequest:
    """The load with the step every row measures: with "auto" the bench waits for the compiled one (or its
    reason) instead of starting on the eager one while it builds."""
    step = step_mode(load.target.step)
    return replace(load, target=replace(load.target, step="compiled" if step == "auto" else step))


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
