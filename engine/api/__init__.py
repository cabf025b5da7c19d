"""The engine's contract, without torch: what a client (the window, `specula serve`'s callers, the
command line) builds and reads.

- `types.py`: requests (load, generate, train, a remote server) and their settings
- `events.py`: what the engine yields (frozen dataclasses), `errors.py`: the errors a user can act on
- `strategies.py`: the catalogue of draft strategies and their options
- `wire.py`: requests and events as JSON, `prompts.py`: messages and the chat template
- `paths.py`: the app's id, folders and choices, `metrics.py`: step counts and the speedup's text
"""
