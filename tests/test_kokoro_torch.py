"""Kokoro float graph as a torch module (onnx2torch + our converters) matches ONNX Runtime."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("onnx2torch") is None:  # imported via torch_port, which shims torchvision
    pytest.skip("onnx2torch not installed", allow_module_level=True)
pytest.importorskip("librosa")

from digital_human.engines.kokoro import assets as kassets
from digital_human.engines.kokoro import graph_rewrite, synth
from digital_human.engines.kokoro.torch_port import torch_module_from_onnx

PHONEMES = "həlˈoʊ wˈɜɹld."


def test_torch_port_matches_onnxruntime():
    import librosa

    try:
        a = kassets.kokoro_assets()
    except kassets.KokoroAssetError as exc:
        pytest.skip(str(exc))
    path = graph_rewrite.float_graph()
    ids = synth.tokens_from_phonemes(PHONEMES, a.vocab)
    style = synth.style_for(a.voices["jm_kumo"], len(ids))
    ref, ref_durations = synth.synthesize_timed(ids, style, 1.0, synth.ort_cpu_runner(path))

    module = torch_module_from_onnx(path)

    def run(feeds):
        with torch.inference_mode():
            out = module(*(torch.from_numpy(feeds[k]) for k in synth.INPUT_NAMES))
        return dict(zip(synth.OUTPUT_NAMES, (o.numpy() for o in out)))  # graph order, as TorchRunner zips them

    got, durations = synth.synthesize_timed(ids, style, 1.0, run)
    assert len(got) == len(ref)  # same predicted durations (exercises the LSTM gate reordering)
    np.testing.assert_array_equal(durations, ref_durations)  # ... and the exposed durations output agrees
    mel = lambda y: np.log(librosa.feature.melspectrogram(y=y, sr=24000, n_fft=1024, hop_length=256) + 1e-5)  # noqa: E731
    dist = float(np.abs(mel(got) - mel(ref)).mean())
    assert dist < 0.3, dist  # measured 0.07 nats on a longer sentence
