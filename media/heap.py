"""Keep a long video run's resident memory flat: glibc's malloc settings for frame-sized buffers.

A run allocates and frees frame-sized buffers (6 MB for a 1080x1920 frame, 10-50 MB chunks) on
several threads, thousands of times. glibc serves a freed large block's size from the heap afterwards
(its mmap threshold rises to 32 MB) and gives each thread an arena, so freed frames stay in fragmented
heaps and the process grew by ~0.75 MB per output frame on a 1080x1920 video (2.7 GB after a minute,
RESULTS.md "Bounded memory"). A fixed 4 MB threshold sends every frame-sized buffer to mmap, returned
to the system when freed, and two arenas bound the per-thread heaps. Linux/glibc only; elsewhere
nothing is changed. Called by the CLI and batch workers, never inside ComfyUI (its process is the
user's, not ours).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger("digital_human")

_M_MMAP_THRESHOLD = -3  # glibc malloc.h
_M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 4 << 20
ARENA_MAX = 2


def bound_heap_growth() -> bool:
    """Apply the settings above once, at process start; True where they took effect (glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries: no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(_M_ARENA_MAX, ARENA_MAX))
    log.debug("malloc: mmap threshold %d bytes, %d arenas: %s", MMAP_THRESHOLD_BYTES, ARENA_MAX,
              "set" if ok else "refused")
    return ok
