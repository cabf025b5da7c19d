"""What a model needs in memory, and what the machine has free: torch-free, for the loader and the Models view."""

from __future__ import annotations

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
