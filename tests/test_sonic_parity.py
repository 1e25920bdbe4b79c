"""Sonic equals its reference: tests/fixtures/sonic/parity_reduced.npz holds what the reference code
(jixiaozhong/Sonic, its own pipeline, RIFE and preprocessing) made from a seeded random-weight release in the
release's layout (reduced widths), a synthetic photo with a given face box and 1.1 s of speech, 2 steps at 128 px,
FP32 on the CPU (benchmarks/sonic_parity.py made it). Ours runs on the same files and inputs here."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "sonic" / "parity_reduced.npz"


def _parity_module():
    path = Path(__file__).parents[1] / "benchmarks" / "sonic_parity.py"
    spec = importlib.util.spec_from_file_location("sonic_parity", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("diffusers", reason="Sonic is an optional extra: pip install .[sonic]")
    pytest.importorskip("transformers", reason="Sonic is an optional extra: pip install .[sonic]")
    from digital_human.engines.sonic.random_release import write_random_release

    parity = _parity_module()
    work = tmp_path_factory.mktemp("sonic_parity")
    parity.make_inputs(work)
    write_random_release(work / "models", seed=0, reduced=True)
    return dict(np.load(FIXTURE)), parity.run_ours(work, float_frames=False)


def test_framing_equals_the_reference(runs):
    ref, ours = runs
    assert tuple(ref["crop_box"]) == tuple(ours["crop_box"])
    assert np.array_equal(ref["ref_img"], ours["ref_img"])      # crop, Lanczos resize, normalisation
    assert np.array_equal(ref["face_mask"], ours["face_mask"])  # the 1.1x face box, resized the same way


def test_audio_tokens_and_motion_buckets_equal_the_reference(runs):
    ref, ours = runs
    assert ref["tokens"].shape == ours["tokens"].shape
    assert np.abs(ref["tokens"] - ours["tokens"]).max() < 1e-4
    assert np.abs(ref["buckets"] - ours["buckets"]).max() < 1e-3


def test_denoised_latents_and_frames_equal_the_reference(runs):
    ref, ours = runs
    assert ref["latents"].shape == ours["latents"].shape
    assert np.abs(ref["latents"] - ours["latents"]).max() < 2e-3  # measured 1.2e-4 (scale 5.7)
    assert ref["frames"].shape == ours["frames"].shape == (25, 128, 128, 3)  # 2 x 13 - 1 with RIFE's middles
    diff = np.abs(ref["frames"].astype(int) - ours["frames"].astype(int))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99
