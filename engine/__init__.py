"""Specula's engine: token ids in, events out. A speculative decoding loop, its drafters and the worker
that owns the models; it never imports Qt.

Output is lossless: greedy speculation reproduces the target's own greedy tokens, and sampling follows
the exact acceptance rule, so every emitted token is distributed as the target alone would draw it.

Its rooms, from the ground up (a room imports only rooms below it; tests/test_layout.py checks):

    api/       the contract, torch-free: requests, events, errors, strategies, paths, the wire format
    remote/    other machines over HTTP, torch-free: Specula's own server (the client), OpenAI-compatible
               servers as a backend, the Hugging Face Hub
    cpu/       the CPU's compiled step and matrix products, and the thread governor
    decoding/  the speculative loop and what it needs: verify, sampling, the token tree, the drafter and
               model interfaces, the draft length policy, the live speedup
    models/    models loaded from a source (bundled, Hub id, folder, GGUF), the lean Llama forward
    heads/     trained draft heads (EAGLE, Medusa): the networks, their files, their training
    drafters/  one module per strategy, and the registry that builds them
    serving/   the session that owns the models, the worker thread, and `specula serve`'s routes
    cli/       the `specula` command, one module per subcommand; the bench in cli/bench/

The window (`specula.app`) imports `api` and `remote` only, so its process never loads torch.
"""

__version__ = "0.1.0"
