"""The remote backend against a real vLLM (CPU) server with n-gram speculation, started as
`make vllm-server` starts it (tests/vllm_server.py). Skipped, with the reason printed, where vLLM
cannot be set up."""

from __future__ import annotations

import threading

import pytest

from specula.engine.api.events import Finished, ServerStats, Step
from specula.engine.api.prompts import Message
from specula.engine.api.types import DecodeConfig, GenerateRequest, RemoteLoadRequest
from specula.engine.remote.backend import RemoteBackend
from specula.engine.remote.http import RemoteError

COPY = ("Copy this text exactly, twice: The quick brown fox jumps over the lazy dog. "
        "The quick brown fox jumps over the lazy dog.")


def ask(text: str, n: int = 64) -> GenerateRequest:
    return GenerateRequest((Message("user", text),), config=DecodeConfig(max_new_tokens=n))


@pytest.fixture(scope="module")
def backend(vllm_server) -> RemoteBackend:
    b = RemoteBackend()
    loaded = b.load(RemoteLoadRequest(vllm_server.url))
    assert loaded.backend == "remote" and loaded.target == "smollm2-135m-instruct"
    assert b.info.kind == "vllm" and b.info.speculates
    return b


def test_a_chat_streams_with_the_servers_speculation_counted(backend):
    events = list(backend.generate(ask(COPY)))
    steps = [e for e in events if isinstance(e, Step)]
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.reason in ("eos", "length")
    assert "quick brown fox" in finished.text
    assert "".join(t.text for s in steps for t in s.tokens) == finished.text
    assert len(finished.token_ids) == finished.totals.new_tokens
    assert any(len(s.tokens) > 1 for s in steps), "copying the prompt, n-gram drafts are accepted"
    stats = [e for e in events if isinstance(e, ServerStats)]
    assert stats and stats[-1].drafts > 0 and stats[-1].accepted > 0
    # one request alone on the server: every engine step emits its accepted drafts and one token of its
    # own, the stop token included, and sends them in one chunk, or in one with the next steps' when its
    # API process falls behind; so the counters' accepted drafts are at most tokens - chunks
    emitted = finished.totals.new_tokens + (finished.reason == "eos")
    assert 0 < finished.totals.accepted <= emitted - len(steps)
    assert all(len(s.tokens) <= 6 or all(t.origin == "target" for t in s.tokens) for s in steps)


def test_stopping_mid_stream_ends_the_reply_and_the_server_carries_on(backend):
    stop = threading.Event()
    seen = []
    for event in backend.generate(ask("Write a long story about a lighthouse keeper.", 400), should_stop=stop.is_set):
        seen.append(event)
        if isinstance(event, Step) and event.step >= 3:
            stop.set()
    finished = seen[-1]
    assert finished.reason == "cancelled" and 3 <= finished.totals.new_tokens < 400
    again = list(backend.generate(ask("Say hello.", 16)))[-1]
    assert again.reason in ("eos", "length") and again.text


def test_generate_command_reports_the_servers_acceptance(vllm_server, capsys):
    from specula.engine.cli.main import main

    code = main(["generate", "--backend", "remote", "--server", vllm_server.url, "--chat", "--prompt", COPY,
                 "--max-new-tokens", "48"])
    out, err = capsys.readouterr()
    assert code == 0 and "quick brown fox" in out
    assert "acceptance" in err and "server-wide counters" in err and "n/a" not in err.split("acceptance")[-1][:6]


def test_bench_runs_the_server_as_a_peer(vllm_server, tmp_path, capsys):
    from specula.engine.cli.main import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"question_id": 1, "category": "copy", "turns": ["%s"]}\n' % COPY)
    code = main(["bench", "--model", "bundled", "--dtype", "bf16", "--prompts", str(prompts), "--strategies", "none",
                 "--peers", f"vllm={vllm_server.url}", "--max-new-tokens", "24", "--json"])
    assert code == 0
    import json

    summary = json.loads(capsys.readouterr().out)
    assert set(summary["overall"]) == {"none", "vllm"}
    assert summary["overall"]["vllm"]["tokens_per_s"] > 0
    assert summary["overall"]["vllm"]["mean_accepted_length"] > 1.0


@pytest.mark.kills_server
def test_a_baseline_from_a_real_server_gives_a_speedup_and_the_servers_death_is_a_clear_error(vllm_server):
    """A baseline measured on a real server; then the server is killed mid-answer (this runs after every
    other test on it)."""
    try:
        b = RemoteBackend()
        b.load(RemoteLoadRequest(vllm_server.url, baseline_server=vllm_server.url))
        assert b.baseline is not None and b.baseline.a > 0
        assert list(b.generate(ask(COPY, 48)))[-1].speedup > 0
        seen = []
        with pytest.raises(RemoteError) as failure:
            for event in b.generate(ask("Write a long story about a lighthouse keeper.", 400)):
                seen.append(event)
                if isinstance(event, Step) and event.step == 3:
                    vllm_server.kill()
        assert "before the answer ended" in str(failure.value) or "broke" in str(failure.value)
        assert sum(len(e.tokens) for e in seen if isinstance(e, Step)) >= 4  # what came before is kept
        with pytest.raises(RemoteError, match="connection refused"):
            b.load(RemoteLoadRequest(vllm_server.url))
    finally:
        vllm_server.kill()
