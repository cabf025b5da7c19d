"""`specula serve`: the engine behind an OpenAI-compatible HTTP server (see docs/SERVER.md).

- `api.py`: request bodies -> engine requests (checked, with OpenAI-shaped errors), events -> responses
- `service.py`: the engine's worker thread seen from asyncio: submit, per-request event queues, cancel
- `prom.py`: the Prometheus page (vLLM's spec-decode counter names, and Specula's own)
- `app.py`: the routes (Starlette), the API key, the control endpoints under /specula/v1
"""
