"""What a model needs in memory, what the machine has free, and giving back what a let-go model held: torch-free,
for the loader, the session and the Models view."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc

RUNTIME_BYTES = 1 << 30  # torch, the tokenizer and the rest of a process, besides weights and cache


def available_memory() -> int | None:
    """Bytes of memory a new allocation can take without swapping (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def needed_for(weight_bytes: int) -> int:
    """What running a model whose weights take `weight_bytes` in memory needs, before its cache."""
    return weight_bytes + RUNTIME_BYTES


def gigabytes(n: int) -> str:
    return f"{n / (1 << 30):.1f} GB"


def give_back_freed() -> None:
    """Free what is unreachable (cycles included) and hand the C heap's free pages back to the system: glibc keeps
    what a let-go model's many allocations freed for the process's next ones, so each reload of a model left the
    process larger (a 1.1 GB file: 1.5, 2.4, 2.9, 3.0 GB after four loads; 1.5 GB after each with this)."""
    gc.collect()
    trim = getattr(_libc(), "malloc_trim", None)  # glibc's; other C libraries (musl, macOS, Windows) have none
    if trim is not None:
        trim(0)


@functools.cache  # find_library may run ldconfig: once per process
def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):  # no C library found by that name
        return None
