"""The engine at work: the models it owns and the ways requests reach them.

- `session.py`: the loaded models and the strategies built for them: requests in, events out
- `worker.py`: the worker thread that owns the session (or a remote backend); cancel between steps
- `service.py`: that worker seen from asyncio; `routes.py`: `specula serve`'s routes (docs/SERVER.md)
- `guard.py`: what the server checks before a route sees a request (web pages, the API key, bounded work)
- `faults.py`: the API's errors (OpenAI's shape) and the vocabulary request bodies are declared and worded in
- `openai.py`: the chat and completions bodies, parsed into engine requests; `replies.py`: the answers' shapes
- `control.py`: the control endpoints' bodies (load, train); `prometheus.py`: the /metrics page
"""
