"""Other machines over HTTP, without torch.

- `client.py`: Specula's own server (`specula serve`) as an engine: requests in, events out
- `backend.py`: any OpenAI-compatible server (vLLM first) as the engine's backend, with its events
- `http.py`, `chunks.py`, `telemetry.py`, `keys.py`: requests and streams, answer chunks, a server's
  metrics page, API keys in the OS keyring
- `hub.py`: the Hugging Face Hub: the catalogue, downloads with progress and cancel, the local cache
"""
