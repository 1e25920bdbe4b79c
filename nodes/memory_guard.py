"""Estimate a node's per-frame memory before allocating it, and stop with a clear error instead of
being killed by the kernel (DESIGN 5c: inside ComfyUI, IMAGE batches are in memory by convention)."""
from __future__ import annotations

import os

# what a node may plan to take of the memory available right now; the rest is for ComfyUI, the
# models and the copies the next node makes
SHARE_OF_AVAILABLE = 0.7


def available_bytes() -> int | None:
    """Memory the system can give without swapping (Linux MemAvailable; elsewhere None = unknown)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:  # other POSIX systems: free physical pages
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def image_bytes(frames: int, height: int, width: int, bytes_per_value: int = 4) -> int:
    """Bytes of an IMAGE batch [frames, height, width, 3] (float32 by default)."""
    return int(frames) * int(height) * int(width) * 3 * int(bytes_per_value)


def require_memory(needed: int, node: str, what: str, fix: str, available: int | None = None) -> None:
    """Raise MemoryError naming the input to lower when `needed` bytes will not fit."""
    available = available_bytes() if available is None else available
    if available is None or needed <= SHARE_OF_AVAILABLE * available:
        return
    raise MemoryError(f"{node}: {what} needs about {needed / 2**30:.1f} GB but only {available / 2**30:.1f} GB of "
                      f"memory is free; {fix}")
