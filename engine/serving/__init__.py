"""The engine at work: the models it owns and the ways requests reach them.

- `session.py`: the loaded models and the strategies built for them: requests in, events out
- `runner.py`: the worker thread that owns the session (or a remote backend); cancel between steps
- `service.py`: that worker seen from asyncio; `routes.py`: `specula serve`'s routes (docs/SERVER.md)
- `guard.py`: what the server checks before a route sees a request (web pages, the API key, bounded work)
- `openai.py`: OpenAI's request and response shapes; `prometheus.py`: the /metrics page
"""
