"""vision.parallel: every frame runs once, errors surface, the thread count is configurable."""
from __future__ import annotations

import threading

import pytest

from digital_human.parallel import for_each_frame, frame_workers


@pytest.mark.parametrize("workers", [1, 4])
def test_every_index_once(workers):
    seen, lock = [], threading.Lock()

    def visit(i: int) -> None:
        with lock:
            seen.append(i)

    for_each_frame(visit, 3, 40, workers=workers)
    assert sorted(seen) == list(range(3, 40))


def test_error_in_a_frame_propagates():
    def boom(i: int) -> None:
        if i == 5:
            raise RuntimeError("frame 5 failed")

    with pytest.raises(RuntimeError, match="frame 5 failed"):
        for_each_frame(boom, 0, 10, workers=3)


def test_thread_count_from_environment(monkeypatch):
    monkeypatch.setenv("DIGITAL_HUMAN_FRAME_THREADS", "3")
    assert frame_workers() == 3
    monkeypatch.setenv("DIGITAL_HUMAN_FRAME_THREADS", "lots")
    with pytest.raises(ValueError, match="DIGITAL_HUMAN_FRAME_THREADS"):
        frame_workers()
    monkeypatch.delenv("DIGITAL_HUMAN_FRAME_THREADS")
    assert 1 <= frame_workers() <= 8
