"""The talking-head registry: one entry per model, read by the CLI checks, the nodes and generate_crops."""
from __future__ import annotations

import numpy as np
import pytest

from digital_human.talking_head import registry
from digital_human.talking_head.contract import TalkingHeadModel
from digital_human.talking_head.registry import (MODELS, UnknownModelError, generate_crops, model_choices,
                                                 model_problem, resolve)


def test_every_entry_meets_the_contract():
    assert set(MODELS) == {"portrait", "musetalk", "clone", "wav2lip", "sonic", "latentsync"}
    for key, entry in MODELS.items():
        assert isinstance(entry, TalkingHeadModel) and entry.name == key
        assert entry.summary and entry.speech_features and entry.crop_size and callable(entry.generate)


@pytest.mark.parametrize("model, name, avatar", [("portrait", "portrait", None), ("musetalk", "musetalk", None),
                                                  ("clone:anna", "clone", "anna"), ("wav2lip", "wav2lip", None)])
def test_resolve_names_the_entry_and_the_avatar(model, name, avatar):
    entry, got = resolve(model)
    assert entry.name == name and got == avatar


@pytest.mark.parametrize("model", ["clone", "portrait:anna", "wav2lip:anna", "sadtalker", ""])
def test_resolve_refuses_what_is_not_a_model(model):
    with pytest.raises(UnknownModelError, match="'portrait' or 'musetalk' or 'clone:<avatar name>' or 'wav2lip' or 'sonic' or 'latentsync'"):
        resolve(model)


def test_a_given_avatar_overrides_the_model_name():
    entry, avatar = resolve("portrait", avatar="an avatar object")
    assert entry.name == "clone" and avatar == "an avatar object"


def test_problems_name_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(tmp_path))
    assert model_problem("portrait") is None
    musetalk = model_problem("musetalk")
    assert musetalk and "musetalkV15" in musetalk and "unet.pth" in musetalk
    assert "not found" in model_problem("clone:nobody")
    wav2lip = model_problem("wav2lip")
    assert wav2lip and "wav2lip.pth" in wav2lip and "wav2lip_gan.pth" in wav2lip


def test_a_new_model_is_one_registry_line(tmp_path, monkeypatch):
    """Everything that takes a model name reads the registry: a model added there is generated,
    offered in the node's menu, checked by the CLI and by node validation, with no other change."""
    from digital_human.nodes.talking_head_nodes import TRT_TalkingHead
    from digital_human.preflight import PreflightError, check_model

    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(tmp_path))
    calls = []

    def generate(faces, wave, rate, fps, **options):
        calls.append((faces, rate, fps, options["batch_size"], options["avatar"]))
        return "crops"

    ready = {"value": "probe.bin is missing: place it in models/digital_human/probe/"}
    probe = TalkingHeadModel(name="probe", summary="s", needs="n", speech_features="f", crop_size="c",
                             generate=generate, problem=lambda model: ready["value"])
    monkeypatch.setitem(registry.MODELS, "probe", probe)

    assert generate_crops("faces", np.zeros(10), 16000, "probe", 25.0, batch_size=3) == "crops"
    assert calls == [("faces", 16000, 25.0, 3, None)]
    assert "probe" in model_choices()
    assert TRT_TalkingHead.VALIDATE_INPUTS(model="probe") == ready["value"]
    with pytest.raises(PreflightError, match="--model probe: probe.bin is missing"):
        check_model("probe")
    ready["value"] = None
    assert TRT_TalkingHead.VALIDATE_INPUTS(model="probe") is True
    check_model("probe")
