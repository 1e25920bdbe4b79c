"""LatentSync's settings (steps, guidance, deepcache, fast_path): read from the node's inputs and the CLI's --set
like Sonic's, the DIGITAL_HUMAN_LATENTSYNC_* variables winning when set, out-of-range values refused with the
setting's name before any model work. The end-to-end run with --set is in test_latentsync.py."""
from __future__ import annotations

import argparse

import pytest

from digital_human.talking_head.latentsync.crops import resolve_setting


def test_a_given_setting_is_used_and_none_means_the_reference_value(monkeypatch):
    monkeypatch.delenv("DIGITAL_HUMAN_LATENTSYNC_STEPS", raising=False)
    assert resolve_setting("steps", 30, 20, "DIGITAL_HUMAN_LATENTSYNC_STEPS") == (30, None)
    assert resolve_setting("steps", None, 20, "DIGITAL_HUMAN_LATENTSYNC_STEPS") == (20, None)


def test_the_variable_wins_and_the_note_says_so(monkeypatch):
    monkeypatch.setenv("DIGITAL_HUMAN_LATENTSYNC_DEEPCACHE", "3")
    value, note = resolve_setting("deepcache", 0, 0, "DIGITAL_HUMAN_LATENTSYNC_DEEPCACHE")
    assert value == 3 and note == "DIGITAL_HUMAN_LATENTSYNC_DEEPCACHE=3 overrides the deepcache setting 0"
    assert resolve_setting("deepcache", None, 0, "DIGITAL_HUMAN_LATENTSYNC_DEEPCACHE") == (3, None)
    monkeypatch.setenv("DIGITAL_HUMAN_LATENTSYNC_DEEPCACHE", "many")
    with pytest.raises(ValueError, match="DIGITAL_HUMAN_LATENTSYNC_DEEPCACHE must be a number"):
        resolve_setting("deepcache", None, 0, "DIGITAL_HUMAN_LATENTSYNC_DEEPCACHE")


@pytest.mark.parametrize("name,value", [("steps", 0), ("steps", 500), ("guidance", 0.5), ("deepcache", 11),
                                        ("guidance", "loud")])
def test_out_of_range_settings_are_refused_by_name(monkeypatch, name, value):
    for env in ("STEPS", "GUIDANCE", "DEEPCACHE"):
        monkeypatch.delenv(f"DIGITAL_HUMAN_LATENTSYNC_{env}", raising=False)
    with pytest.raises(ValueError, match=f"latentsync setting {name} must be"):
        resolve_setting(name, value, 1, f"DIGITAL_HUMAN_LATENTSYNC_{name.upper()}")


def test_the_model_reads_its_settings_and_the_cli_refuses_others():
    from digital_human.pipeline.main_job import model_settings
    from digital_human.pipeline.run_args import setting_arg
    from digital_human.talking_head.registry import model_options

    assert set(model_options("latentsync")) == {"steps", "guidance", "deepcache", "fast_path"}
    args = argparse.Namespace(model="latentsync", set=[setting_arg("steps=30"), setting_arg("guidance=2")])
    assert model_settings(args) == {"steps": 30, "guidance": 2}
    with pytest.raises(ValueError, match="model latentsync reads steps, guidance, deepcache, fast_path"):
        model_settings(argparse.Namespace(model="latentsync", set=[setting_arg("vram=low")]))


def test_the_node_passes_steps_and_guidance_only_when_set():
    """0 in the node's steps / guidance = the model's own reference value (sonic 25 steps, latentsync 20): not
    passed; deepcache 0 (exact) is a value and is passed."""
    from digital_human.nodes.talking_head_nodes import MODEL_SETTING_INPUTS, TRT_TalkingHead, _settings

    optional = TRT_TalkingHead.INPUT_TYPES()["optional"]
    for name in ("steps", "guidance", "deepcache"):
        assert name in optional and optional[name][1]["default"] == 0
    defaults = {k: v[1]["default"] for k, v in MODEL_SETTING_INPUTS.items()}
    given = _settings(7, defaults)
    assert "steps" not in given and "guidance" not in given and given["deepcache"] == 0 and given["seed"] == 7
    assert _settings(7, dict(defaults, steps=30, guidance=2.0))["steps"] == 30


def test_the_fast_path_is_cuda_only_and_says_so_on_the_cpu():
    pytest.importorskip("diffusers", reason="LatentSync is an optional extra: pip install .[latentsync]")
    import torch

    from digital_human.engines.latentsync.pipeline import LatentSyncPipeline, Networks
    from digital_human.engines.latentsync.random_release import DATA, UNET_MODEL_REDUCED
    from digital_human.engines.latentsync.unet import LatentSyncUNet

    net = Networks(files=None, config={"model": UNET_MODEL_REDUCED, "data": dict(DATA, resolution=64)},
                   unet=LatentSyncUNet(UNET_MODEL_REDUCED).eval(), vae=None, whisper=None,
                   mask_image=torch.ones(3, 64, 64), device=torch.device("cpu"), dtype=torch.float32)
    pipe = LatentSyncPipeline(net, steps=2, compile=True)
    assert pipe.fast is None and "CUDA only" in pipe.compile_note and not net.compiled
