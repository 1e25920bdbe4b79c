"""Per-frame CPU work on a few threads (shared by vision, media and the talking-head models).

Warping, blending and mouth rendering are numpy/OpenCV calls on arrays of a few hundred KB; both
libraries release the GIL inside them, so frames processed on separate threads overlap. Used by the
paste-back and the portrait renderer: each frame writes only its own output slot, so no locking.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

MAX_WORKERS = 8  # beyond this the GIL-held Python parts of each frame dominate


def frame_workers() -> int:
    """Threads for per-frame work: DIGITAL_HUMAN_FRAME_THREADS, else min(CPU count, MAX_WORKERS)."""
    env = os.environ.get("DIGITAL_HUMAN_FRAME_THREADS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"DIGITAL_HUMAN_FRAME_THREADS must be a whole number of threads, got {env!r}") from None
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


def for_each_frame(fn: Callable[[int], None], start: int, stop: int, workers: int | None = None) -> None:
    """Call fn(i) for i in [start, stop), on `workers` threads (1: in this thread). Exceptions from
    any frame propagate (the first one raised)."""
    n = stop - start
    workers = frame_workers() if workers is None else max(1, int(workers))
    if workers == 1 or n < 2:
        for i in range(start, stop):
            fn(i)
        return
    with ThreadPoolExecutor(max_workers=min(workers, n), thread_name_prefix="dh-frames") as pool:
        for future in [pool.submit(fn, i) for i in range(start, stop)]:
            future.result()
