"""The remote backend: chat through an OpenAI-compatible server (vLLM first) with the engine's events."""
