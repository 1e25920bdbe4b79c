"""Nodes that hold per-frame memory estimate it first and stop with a clear error naming the input to lower."""
from __future__ import annotations

import pytest

from digital_human.nodes import memory_guard


def test_require_memory_names_the_fix():
    memory_guard.require_memory(10 * 2**20, "Node", "x", "lower y", available=2**30)  # fits: no error
    with pytest.raises(MemoryError, match=r"Node: 300 frames of 1920x1080 needs about 7\.0 GB .*lower max_side"):
        memory_guard.require_memory(memory_guard.image_bytes(300, 1080, 1920), "Node", "300 frames of 1920x1080",
                                    "lower max_side", available=4 * 2**30)


def test_available_memory_is_known_here():
    assert memory_guard.available_bytes() > 2**28


def test_talking_head_refuses_an_output_that_cannot_fit(monkeypatch):
    import numpy as np

    from digital_human.nodes.talking_head_nodes import TRT_TalkingHead

    class Faces:  # only what the estimate reads: frames' shape
        frames = np.zeros((1, 1080, 1920, 3), np.uint8)

    monkeypatch.setattr(memory_guard, "available_bytes", lambda: 2 * 2**30)
    audio = {"waveform": __import__("torch").zeros(1, 1, 16000 * 60), "sample_rate": 16000}
    with pytest.raises(MemoryError, match="TRT_TalkingHead: 1500 output frames of 1920x1080 .*shorten the speech"):
        TRT_TalkingHead().animate(Faces(), audio, model="portrait", fps=25.0)
