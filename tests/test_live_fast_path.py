"""`serve`'s fast path (pipeline/live/run.py): on by default where CUDA is usable, off on the CPU, chosen by
--fast-path / --no-fast-path; build_live hands the choice to the face (MuseTalk's compiled step) and to the voice
(the engine's fast-path options)."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from digital_human.pipeline.live import run as live_run


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    live_run.add_serve_arguments(parser)
    return parser.parse_args(["--base-voice", "af_heart", "--face", "face.jpg", *argv])


@pytest.mark.parametrize("argv, cuda, expected", [((), True, True), ((), False, False),
                                                   (("--no-fast-path",), True, False),
                                                   (("--fast-path",), False, True)])
def test_the_switch_defaults_to_the_gpu(monkeypatch, argv, cuda, expected):
    import digital_human.engines.devices as devices

    monkeypatch.setattr(devices, "torch_cuda_usable", lambda: cuda)
    assert live_run.live_fast_path(_args(*argv).fast_path) is expected


def test_build_live_hands_the_choice_to_the_face_and_the_voice(monkeypatch):
    import digital_human.engines.devices as devices
    import digital_human.pipeline.live.face as face_module
    import digital_human.pipeline.live.voice as voice_module
    import digital_human.voice.engines as engines

    made: dict = {}

    class Face:
        fps = 25.0
        report = "photo"

        def __init__(self, path, **kw):
            made["face"] = kw

        def warm(self, wave, rate):
            made["face_warmed"] = len(wave)

    class Voice:
        rate = 24000

        def __init__(self, engine, *a, **kw):
            made["voice"] = (engine, kw)

        def warm(self):
            return voice_module.Piece(np.zeros(960, np.float32))

    monkeypatch.setattr(devices, "torch_cuda_usable", lambda: True)
    monkeypatch.setattr(face_module, "LiveFace", Face)
    monkeypatch.setattr(voice_module, "LiveVoice", Voice)
    monkeypatch.setattr(engines, "engine_options", lambda name, fast: {"asked": (name, fast)})
    live_run.build_live(_args("--engine", "kokoro"))
    assert made["face"]["fast_path"] is True
    assert made["voice"] == ("kokoro", {"engine_options": {"asked": ("kokoro", True)}, "lanes": 1, "batch_rows": 1})
    live_run.build_live(_args("--engine", "kokoro", "--no-fast-path", "--tts-lanes", "3"))
    assert made["face"]["fast_path"] is False
    assert made["voice"][1] == {"engine_options": {"asked": ("kokoro", False)}, "lanes": 3,
                                "batch_rows": 1}  # --tts-lanes passed on
    live_run.build_live(_args("--engine", "kokoro", "--tts-batch", "4"))
    assert made["voice"][1]["batch_rows"] == 4  # and --tts-batch
