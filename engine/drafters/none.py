"""`none`: drafts nothing, so every step is one plain decoding step of the target (the baseline). The drafter
is the decoding loop's own (`decoding.drafter.NoDraft`), which also decodes plainly for callers below the
strategies (training's answers)."""

from __future__ import annotations

from ..decoding.drafter import NoDraft

__all__ = ["NoDraft"]
