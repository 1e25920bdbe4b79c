"""The fast-path switches (fast_path.py): node inputs and CLI options reach MuseTalk's compile flag and
CosyVoice's fast engine, the variables override them, and the first-use cost is in the tooltip and the log."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from digital_human import fast_path
from digital_human.cli import build_parser
from digital_human.talking_head import registry
from digital_human.talking_head.contract import TalkingHeadModel
from digital_human.voice import engines


@pytest.mark.parametrize("env,requested,expected", [
    (None, None, None), (None, True, True), (None, False, False),
    ("1", False, True), ("0", True, False), ("", True, True), ("yes", False, False)])
def test_the_variable_overrides_the_switch(env, requested, expected, monkeypatch):
    if env is None:
        monkeypatch.delenv(fast_path.MUSETALK_COMPILE_ENV, raising=False)
    else:
        monkeypatch.setenv(fast_path.MUSETALK_COMPILE_ENV, env)
    assert fast_path.switch(requested, fast_path.MUSETALK_COMPILE_ENV) is expected


def test_the_variables_are_the_ones_the_engines_read():
    from digital_human.engines.cosyvoice.engine import FAST_ENV
    from digital_human.engines.musetalk.pipeline import COMPILE_ENV

    assert (COMPILE_ENV, FAST_ENV) == (fast_path.MUSETALK_COMPILE_ENV, fast_path.COSYVOICE_FAST_ENV)


def test_fast_path_reaches_only_models_that_have_one(monkeypatch):
    seen = []

    def generate(faces, wave, rate, fps, **options):
        seen.append(options.get("fast_path", "absent"))
        return "crops"

    for name, options in (("probe_fast", ("fast_path",)), ("probe_plain", ())):
        monkeypatch.setitem(registry.MODELS, name, TalkingHeadModel(
            name=name, summary="s", needs="", speech_features="f", crop_size="c", generate=generate, options=options))
    for model in ("probe_fast", "probe_plain"):
        registry.generate_crops("faces", np.zeros(10), 16000, model, 25.0, fast_path=True)
    registry.generate_crops("faces", np.zeros(10), 16000, "probe_fast", 25.0)  # not asked: the model's default
    assert seen == [True, "absent", "absent"]
    assert "fast_path" in registry.MODELS["musetalk"].options


def test_musetalk_switch_becomes_its_compile_flag_and_logs_the_cost(monkeypatch, caplog):
    """The registry's musetalk entry hands the resolved switch to musetalk_crops (its `compile`)."""
    from digital_human.talking_head.musetalk import crops

    calls = []
    monkeypatch.setattr(crops, "musetalk_crops", lambda *a, **k: calls.append(k["compile"]) or "crops")
    monkeypatch.setattr(fast_path, "_announced", set())
    monkeypatch.delenv(fast_path.MUSETALK_COMPILE_ENV, raising=False)
    with caplog.at_level(logging.INFO, logger="digital_human"):
        registry.generate_crops("faces", np.zeros(10), 16000, "musetalk", 25.0, fast_path=True)
    assert "first video of a process compiles" in caplog.text
    registry.generate_crops("faces", np.zeros(10), 16000, "musetalk", 25.0, fast_path=False)
    monkeypatch.setenv(fast_path.MUSETALK_COMPILE_ENV, "1")
    registry.generate_crops("faces", np.zeros(10), 16000, "musetalk", 25.0, fast_path=False)
    assert calls == [True, False, True]


def test_cosyvoice_switch_asks_for_the_fast_engine_on_cuda(monkeypatch, caplog):
    from digital_human.engines import devices

    monkeypatch.delenv(fast_path.COSYVOICE_FAST_ENV, raising=False)
    monkeypatch.setattr(fast_path, "_announced", set())
    monkeypatch.setattr(devices, "torch_cuda_usable", lambda: True)
    with caplog.at_level(logging.INFO, logger="digital_human"):
        assert engines.engine_options("cosyvoice2", True) == {"fast": True, "device": "cuda"}
    assert "first synthesis of a process compiles" in caplog.text
    assert engines.engine_options("cosyvoice2", False) == {} and engines.engine_options("kokoro", True) == {}
    monkeypatch.setenv(fast_path.COSYVOICE_FAST_ENV, "0")
    assert engines.engine_options("cosyvoice2", True) == {}
    monkeypatch.setenv(fast_path.COSYVOICE_FAST_ENV, "1")
    assert engines.engine_options("cosyvoice2", None) == {"fast": True, "device": "cuda"}
    monkeypatch.setattr(devices, "torch_cuda_usable", lambda: False)  # no GPU: eager, said in the log
    with caplog.at_level(logging.WARNING, logger="digital_human"):
        assert engines.engine_options("cosyvoice2", True) == {}
    assert "needs a CUDA GPU" in caplog.text


def test_nodes_offer_the_switch_with_its_cost_as_an_optional_input():
    from digital_human.nodes.talking_head_nodes import TalkingHeadVideo, TRT_TalkingHead
    from digital_human.nodes.voice_nodes import TRT_TTS

    for node, cost in ((TRT_TalkingHead, "75 s"), (TalkingHeadVideo, "75 s"), (TRT_TTS, "30 s")):
        kind, spec = node.INPUT_TYPES()["optional"]["fast_path"]
        assert kind == "BOOLEAN" and spec["default"] is False and cost in spec["tooltip"], node
        assert "fast_path" not in node.INPUT_TYPES()["required"]


def test_cli_options():
    parser = build_parser()
    common = ["--face", "f.jpg", "--out", "o.mp4"]
    assert parser.parse_args(["animate", "--audio", "a.wav", *common, "--fast-path"]).fast_path is True
    assert parser.parse_args(["animate", "--audio", "a.wav", *common]).fast_path is None
    assert parser.parse_args(["run", "--text", "t", "--voice", "v.wav", *common, "--fast-path"]).fast_path is True
    args = parser.parse_args(["speak", "--text", "t", "--out", "o.wav", "--engine", "cosyvoice2", "--fast-path"])
    assert args.fast_path is True


def test_sonic_switch_becomes_its_compiled_unet_and_settings_pass_through(monkeypatch, caplog):
    """The registry's sonic entry hands the resolved switch to sonic_frames (`compile_unet`) beside the model
    settings (speed among them); the variable overrides the switch."""
    from digital_human.talking_head.sonic import model

    calls = []
    monkeypatch.setattr(model, "sonic_frames", lambda *a, **k: calls.append((k["compile_unet"], k.get("speed"))) or "f")
    monkeypatch.setattr(fast_path, "_announced", set())
    monkeypatch.delenv(fast_path.SONIC_COMPILE_ENV, raising=False)
    with caplog.at_level(logging.INFO, logger="digital_human"):
        registry.generate_crops("faces", np.zeros(10), 16000, "sonic", 25.0, fast_path=True, settings={"speed": "fast"})
    assert "Sonic fast path" in caplog.text
    registry.generate_crops("faces", np.zeros(10), 16000, "sonic", 25.0, fast_path=False)
    monkeypatch.setenv(fast_path.SONIC_COMPILE_ENV, "1")
    registry.generate_crops("faces", np.zeros(10), 16000, "sonic", 25.0, fast_path=False)
    assert calls == [(True, "fast"), (False, None), (True, None)]
