"""A process-wide least-recently-used store of read-only numpy arrays, bounded in bytes.

Used for what is kept between requests on the same reference video (decoded frames in media.frame_source,
Wav2Lip's network inputs and paste masks): a repeat request reads them instead of making them again, and the
bound keeps a long or large video from growing memory.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np


class KeptArrays:
    """Arrays by key, least recently used out first once their bytes pass `limit_bytes` (an int, or a callable
    read at every put so a limit changed at run time applies at once). Stored arrays are read-only: every later
    request gets the same object."""

    def __init__(self, limit_bytes: int | Callable[[], int]) -> None:
        self._limit = limit_bytes
        self.items: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()

    @property
    def limit(self) -> int:
        return int(self._limit() if callable(self._limit) else self._limit)

    def get(self, key: Hashable) -> np.ndarray | None:
        with self.lock:
            hit = self.items.get(key)
            if hit is not None:
                self.items.move_to_end(key)
            return hit

    def put(self, key: Hashable, value: np.ndarray) -> np.ndarray:
        """Keep `value` (copied when it is a view or not contiguous, then made read-only) and return what is kept;
        an array larger than the whole limit is returned without being kept."""
        value = np.array(value, copy=True) if value.base is not None or not value.flags.c_contiguous else value
        value.flags.writeable = False
        limit = self.limit
        with self.lock:
            old = self.items.pop(key, None)
            if old is not None:
                self.bytes -= old.nbytes
            if value.nbytes <= limit:
                self.items[key] = value
                self.bytes += value.nbytes
            while self.bytes > limit and self.items:
                self.bytes -= self.items.popitem(last=False)[1].nbytes
        return value

    def clear(self) -> None:
        with self.lock:
            self.items.clear()
            self.bytes = 0
