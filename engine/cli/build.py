"""`specula build-step`: build the compiled decoding step for this CPU now (make setup runs it), so that no start
waits for the C++ compiler. Without a compiler it says what that costs and succeeds: Specula runs without the step."""

from __future__ import annotations

import sys
import time

from ..cpu import step


def run_build_step(args) -> int:
    if step.built():
        print(f"the compiled step is built for this CPU: {step.build()}")  # built: build() only finds it
        return 0
    print(f"about {round(step.build_estimate())} s: building the compiled step for this CPU, once...", flush=True)
    began = time.monotonic()
    try:
        path = step.build()
    except step.Unavailable as exc:
        print(f"specula: the compiled step cannot be built here: {exc}. Specula runs without it: GGUF files load "
              "dequantized (more memory) and decoding on the CPU is slower", file=sys.stderr)
        return 0
    print(f"built in {time.monotonic() - began:.0f} s: {path}")
    return 0
