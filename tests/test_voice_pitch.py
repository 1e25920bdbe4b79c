"""Issue 18: a fitted voice keeps the speaker's pitch (real models, real male speech), and the fit reports progress."""
import numpy as np
import pytest

from digital_human.voice.pitch import median_f0


def test_median_f0_of_a_tone_and_of_silence():
    rate = 16000
    t = np.arange(rate) / rate
    tone = 0.3 * np.sign(np.sin(2 * np.pi * 130.0 * t)).astype(np.float32)  # harmonic-rich, like voiced speech
    assert abs(median_f0(tone, rate) / 130.0 - 1) < 0.03
    assert np.isnan(median_f0(np.zeros(rate, np.float32), rate))


@pytest.fixture(scope="module")
def male_clip(data_dir):
    from digital_human.audio import decode_audio, prepare_reference

    # the first 12 s: a short clip keeps the test's fit small; still several seconds of speech
    wave, rate = decode_audio(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=12)
    return prepare_reference(wave, rate, source="spk_en_male_01 (12 s)")


def test_fitted_voice_of_a_male_speaker_keeps_his_pitch(male_clip, setup_models):
    from digital_human.voice.clone import KEY_FITTED_PITCH, fit_voice, median_pitch
    from digital_human.voice.speaker import extract_speaker_profile
    from digital_human.voice.tts import synthesize_speech

    profile = extract_speaker_profile(male_clip, cache=False)
    assert 90 < profile.pitch_hz_median < 170  # a man's voice
    calls = []
    fitted, result = fit_voice(profile, budget=6, seed=0, language="en", reference=male_clip,
                               progress=lambda done, total: calls.append((done, total)))
    # progress: called per synthesis, never backwards, ends full, one total throughout
    assert len(calls) >= result.evaluations and calls[-1][0] == calls[-1][1]
    assert [d for d, _ in calls] == sorted(d for d, _ in calls) and len({t for _, t in calls}) == 1
    # a man's voice: jm_kumo with only the five Japanese voices (the only male one), else an English man's
    from digital_human.voice.tts import bundled_voices
    from digital_human.voice.voice_pool import language_pool

    men = [name for name in language_pool(bundled_voices(), "en") if name[1:3] == "m_"]
    assert result.base_voice in men and (len(men) > 1 or men == ["jm_kumo"]), (result.base_voice, men)
    speech = synthesize_speech("The old lighthouse keeper wrote a letter to his daughter every winter evening.",
                               fitted).waveform
    ratio = median_pitch(speech) / profile.pitch_hz_median
    assert abs(ratio - 1) <= 0.15, f"fitted voice at {ratio:.2f} x the speaker's pitch"
    assert abs(float(fitted.extras[KEY_FITTED_PITCH]) / profile.pitch_hz_median - 1) <= 0.15


def test_cli_progress_draws_a_bar_on_a_terminal(monkeypatch):
    import io
    import sys

    from digital_human.nodes import comfy_glue

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(comfy_glue, "in_comfyui", lambda: False)
    monkeypatch.setattr(comfy_glue, "_console", False)
    comfy_glue.enable_console_progress()
    bar = comfy_glue.Progress(4, "voice fit")
    for _ in range(4):
        bar.update()
    frames = err.getvalue().split("\r")[1:]
    assert len(frames) == 4 and frames[0].startswith("voice fit [") and "1/4" in frames[0]
    assert frames[-1].rstrip().endswith("s") and "4/4" in frames[-1] and frames[-1].endswith("\n")
