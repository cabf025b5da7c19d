"""A fixed-capacity float buffer for live plots: O(1) append, the newest `capacity` values as an array."""

from __future__ import annotations

import numpy as np


class RingBuffer:
    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._data = np.zeros(2 * capacity)  # room to append; compacted when full
        self._start = 0
        self._end = 0

    def __len__(self) -> int:
        return self._end - self._start

    def append(self, value: float) -> None:
        if self._end == self._data.shape[0]:
            keep = self._data[self._end - self.capacity + 1 : self._end].copy()
            self._data[: keep.shape[0]] = keep
            self._start, self._end = 0, keep.shape[0]
        self._data[self._end] = value
        self._end += 1
        if self._end - self._start > self.capacity:
            self._start += 1

    def clear(self) -> None:
        self._start = self._end = 0

    def values(self) -> np.ndarray:
        """A copy of the newest values, oldest first."""
        return self._data[self._start : self._end].copy()
