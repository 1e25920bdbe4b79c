"""media/heap.py: glibc's malloc settings take effect, so frame-sized buffers are mapped on their own
(and unmapped when freed) even after a larger block was freed - which, with glibc's defaults, moves
them into the heap, where a long video run's freed frames piled up (RESULTS.md "Bounded memory")."""
import subprocess
import sys

import pytest

CHILD = r"""
import ctypes, ctypes.util, sys
import numpy as np
from digital_human.media.heap import bound_heap_growth

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
if not hasattr(libc, "mallinfo2"):
    print("skip"); sys.exit(0)
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "on":
    assert bound_heap_growth()
first = np.ones(20 << 20, np.uint8)  # a freed 20 MB mapping raises glibc's dynamic threshold to 20 MB
del first
before = libc.mallinfo2().hblkhd
frames = [np.ones(6 << 20, np.uint8) for _ in range(8)]  # eight 1080x1920 RGB frames
print((libc.mallinfo2().hblkhd - before) / 2**20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt: Linux only")
def test_frame_sized_buffers_are_mapped_on_their_own_with_the_settings():
    mapped = {}
    for mode in ("on", "off"):
        out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True).stdout
        if out.strip() == "skip":
            pytest.skip("no glibc mallinfo2 (glibc < 2.33 or another C library)")
        mapped[mode] = float(out)
    assert mapped["on"] >= 47, mapped   # all eight 6 MB frames in their own mappings
    assert mapped["off"] < 1, mapped    # glibc's defaults: all eight in the heap
