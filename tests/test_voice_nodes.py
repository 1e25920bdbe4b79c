"""The voice chain as ComfyUI runs it: node classes called with node inputs, and the `speak` CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from digital_human.audio import AudioInputError, to_comfy_audio
from digital_human.nodes.voice_nodes import TRT_TTS, ExtractSpeakerEmbedding, LoadReferenceAudio, LoadSpeaker
from digital_human.text import EmptyTextError, UnsupportedLanguageError


@pytest.fixture(scope="module")
def reference(data_dir):
    wave, rate = sf.read(data_dir / "audio" / "spk_en_03.wav", dtype="float32", always_2d=True)
    audio, report = LoadReferenceAudio().load(audio=to_comfy_audio(wave.T, rate))
    assert "s of speech" in report
    return audio


def test_load_reference_outputs_comfy_audio_with_segments(reference):
    assert reference["waveform"].ndim == 3 and reference["sample_rate"] == 24000
    prepared = reference["dh_prepared"]
    assert prepared.segments and abs(float(reference["waveform"].abs().max()) - 0.891) < 2e-3


def test_load_reference_missing_file_names_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="audio_file"):
        LoadReferenceAudio().load(audio_file=str(tmp_path / "nope.wav"))
    with pytest.raises(ValueError, match="no file chosen"):
        LoadReferenceAudio().load(audio_file="")


def test_load_reference_too_little_speech(data_dir):
    wave, rate = sf.read(data_dir / "audio" / "spk_en_03.wav", dtype="float32")
    with pytest.raises(AudioInputError, match="speech"):
        LoadReferenceAudio().load(audio=to_comfy_audio(wave[: int(1.5 * rate)], rate))


def test_extract_speaker_caches_and_tts_speaks(reference, setup_models, tmp_path):
    node = ExtractSpeakerEmbedding()
    speaker, report = node.extract_node(reference, imitate=False, save_name="pytest_voice")
    assert speaker.embedding.shape == (256,) and abs(np.linalg.norm(speaker.embedding) - 1) < 1e-4
    assert "saved pytest_voice.npz" in report
    again, _ = node.extract_node(reference, imitate=False)
    assert np.allclose(again.embedding, speaker.embedding)
    reloaded, _ = LoadSpeaker().load("pytest_voice.npz")
    assert np.allclose(reloaded.embedding, speaker.embedding)
    from digital_human.paths import model_dir

    (model_dir("speakers") / "pytest_voice.npz").unlink()
    with pytest.raises(ValueError, match="outside the allowed folders"):
        LoadSpeaker().load("../../etc/passwd")

    out = TRT_TTS().speak("Good morning, everyone.", speaker=speaker)
    audio, text = out["result"]
    wave = audio["waveform"].numpy().reshape(-1)
    assert audio["sample_rate"] == 24000 and 0.6 < len(wave) / 24000 < 4.0
    assert np.abs(wave).max() > 0.05 and "backend onnxruntime-cpu" in text
    assert out["ui"]["audio"][0]["type"] == "temp"


def test_voice_fitting_runs_and_is_reused(reference, setup_models):
    from digital_human.voice.embedding_cache import default_cache

    node = ExtractSpeakerEmbedding()
    plain, _ = node.extract_node(reference, imitate=False)
    cache = default_cache()  # start from an unfitted profile even if an earlier run cached a fit
    cache._path(plain.content_hash).unlink(missing_ok=True)
    cache.clear_memory()
    fitted, report = node.extract_node(reference, imitate=True, search_budget=6, seed=3)
    assert "imitation_base_voice" in fitted.extras and fitted.extras["imitation_timbre_offset"].shape == (128,)
    assert "syntheses" in report
    _, report_again = node.extract_node(reference, imitate=True, search_budget=6, seed=3)
    assert "reused from cache" in report_again
    speech, _ = TRT_TTS().speak("Thank you.", speaker=fitted, imitation_strength=0.5)["result"]
    assert speech["waveform"].abs().max() > 0.05


@pytest.mark.parametrize("text, error", [("   ", EmptyTextError), ("Привет, как дела?", UnsupportedLanguageError)])
def test_tts_text_errors(text, error, setup_models):
    with pytest.raises(error):
        TRT_TTS().speak(text)


def test_cli_speak_writes_nonsilent_wav(tmp_path, setup_models):
    out = tmp_path / "speech.wav"
    text = "The train leaves at 7:15 tomorrow morning, and it costs $12.50."
    proc = subprocess.run([sys.executable, "-m", "digital_human", "speak", "--text", text, "--out", str(out),
                           "--json"], capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["outputs"] == [str(out)] and report["backend"].startswith("onnxruntime")
    assert {"tts", "tts.synthesis"} <= set(report["timings"])
    # quiet backend probing: no ONNX Runtime errors about CUDA, no fallback story in the status, one line
    # per model saying what ran (on this CPU machine; a GPU machine may show its own backend)
    assert "onnxruntime:" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr[-2000:]
    assert not any(w.startswith("backend fallback") for w in report["warnings"])
    assert len([line for line in proc.stderr.splitlines() if "kokoro-82m-fp32 runs on" in line]) == 1
    wave, rate = sf.read(out, dtype="float32")
    words = 18  # as spoken: "the train leaves at seven fifteen ... twelve dollars and fifty cents"
    assert rate == 24000 and 0.15 * words < len(wave) / rate < 0.6 * words
    assert np.sqrt(np.mean(wave**2)) > 0.02


def test_cli_reports_user_errors_as_json(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "digital_human", "speak", "--text", "   ", "--out",
                           str(tmp_path / "x.wav"), "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and not (tmp_path / "x.wav").exists()
    assert json.loads(proc.stdout.strip().splitlines()[-1])["ok"] is False


def test_imitate_false_ignores_a_cached_fit(reference, setup_models):
    node = ExtractSpeakerEmbedding()
    fitted, _ = node.extract_node(reference, imitate=True, search_budget=6, seed=3)
    plain, _ = node.extract_node(reference, imitate=False)
    assert "imitation_timbre_offset" in fitted.extras and "imitation_timbre_offset" not in plain.extras
    _, report = TRT_TTS().speak("Thank you.", speaker=plain)["result"]
    assert "imitated" not in report.splitlines()[0]  # a bundled voice speaks
