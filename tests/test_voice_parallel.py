"""Issue 18: the voice fit's side-by-side evaluation (voice/parallel.py) scores exactly what the
sequential fit scores, on the real models (Kokoro, GE2E)."""
import numpy as np
import pytest

SR = 24000


@pytest.fixture(scope="module")
def reference(data_dir):
    from digital_human.audio import decode_audio, prepare_reference

    wave, rate = decode_audio(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=8)
    return prepare_reference(wave, rate, source="spk_en_male_01 (8 s)")


def test_chunks_spoken_side_by_side_are_the_sequential_speech(setup_models):
    from digital_human.voice import parallel
    from digital_human.voice.tts import VoiceChoice, bundled_voices, synthesize_speech, synthesize_voices

    text = "Please call Stella. How much juice did Joe squeeze on Thursday?"
    voices = bundled_voices()
    choices = [VoiceChoice(voices["jm_kumo"], 1.2, "a", None, 1.05), VoiceChoice(voices["jf_alpha"], 0.9, "b")]
    sequential = [synthesize_speech(text, voice_pack=c.pack, f0_scale=c.f0_scale, formant_scale=c.formant)
                  for c in choices]
    runner = parallel.kokoro_runner("auto", "auto", 2)
    with parallel.WorkerPool(2) as pool:
        together = synthesize_voices(text, choices, runner=runner, map_fn=pool.map)
    for seq, par in zip(sequential, together):
        assert seq.chunks == par.chunks == 2
        assert seq.waveform.shape == par.waveform.shape
        assert np.max(np.abs(seq.waveform - par.waveform)) < 1e-4  # float noise between ORT thread counts
        assert [p[0] for p in seq.phones] == [p[0] for p in par.phones]
        assert np.allclose([p[1:] for p in seq.phones], [p[1:] for p in par.phones], atol=1e-4)


def test_parallel_scorer_gives_the_sequential_scores_and_eq(reference, setup_models):
    from digital_human.voice import clone
    from digital_human.voice.tts import bundled_voices

    target = np.random.default_rng(0).standard_normal(256).astype(np.float32)  # any target: scores must agree
    spectra = clone.reference_spectra(reference)
    voices = bundled_voices()
    candidates = [(voices["jm_kumo"], 1.3, 1.0), (voices["jm_kumo"], 1.3, 1.07), (voices["jf_alpha"], 0.6, 0.93)]
    with clone.ProbeScorer(target, clone.PROBES["en"], "auto", "auto", spectra, workers=1) as seq:
        assert seq.workers == 1 and seq.runner is None  # the loader's session, one call at a time
        expected = [seq(*c) for c in candidates]
        expected_eq = [seq.eq(*c) for c in candidates]
    with clone.ProbeScorer(target, clone.PROBES["en"], "auto", "auto", spectra, workers=2) as par:
        if par.workers < 2:
            pytest.skip("Kokoro does not run on ONNX Runtime's CPU session here: the fit stays sequential")
        batch = par.score_many(candidates[:2])  # a batch: the candidates side by side
        lone = par(*candidates[2])  # a lone candidate: its chunks and EQ variants side by side
        got_eq = [par.eq(*c) for c in candidates]  # cached, no new synthesis
    assert np.allclose(batch + [lone], expected, atol=1e-4)
    for a, b in zip(got_eq, expected_eq):
        assert np.allclose(a, b, atol=1e-3)


def test_fit_sessions_released_when_the_last_fit_ends(reference, setup_models):
    """The fit's own single-thread sessions (~180 MB) are not held by a long-lived process between fits:
    they stay open while any fit runs and are released when the last one closes."""
    from digital_human.voice import clone, parallel

    target = np.zeros(256, np.float32)
    spectra = clone.reference_spectra(reference)
    first = clone.ProbeScorer(target, clone.PROBES["en"], "auto", "auto", spectra, workers=2)
    if first.workers < 2:
        first.close()
        pytest.skip("Kokoro does not run on ONNX Runtime's CPU session here: the fit stays sequential")
    second = clone.ProbeScorer(target, clone.PROBES["en"], "auto", "auto", spectra, workers=2)
    assert len(parallel._SESSIONS) == 2  # Kokoro and GE2E, shared by both fits
    first.close()
    first.close()  # a second close is a no-op: it must not count as another fit ending
    assert len(parallel._SESSIONS) == 2 and second.runner is not None  # the second fit still runs
    second.close()
    assert parallel._SESSIONS == {}


def test_scorer_speaks_the_probe_faster_and_keeps_speed_1_apart(reference, setup_models):
    """The search scores the probe spoken at SEARCH_SPEED (cheaper: Kokoro's cost follows the speech's
    length); the bundled voices' pitch is measured at speed 1, and the two are cached apart."""
    from digital_human.voice import clone
    from digital_human.voice.tts import bundled_voices

    pack = bundled_voices()["jm_kumo"]
    with clone.ProbeScorer(np.zeros(256, np.float32), clone.PROBES["en"], "auto", "auto",
                           clone.reference_spectra(reference), workers=1) as scorer:
        assert scorer.speed == clone.SEARCH_SPEED > 1
        fast = scorer.speech(pack, 1.0)
        normal = scorer.speech(pack, 1.0, speed=1.0)
        assert scorer.speech(pack, 1.0) is fast  # cached per speed, not one for the other
    ratio = len(fast) / len(normal)
    assert abs(ratio - 1 / clone.SEARCH_SPEED) < 0.08, ratio
