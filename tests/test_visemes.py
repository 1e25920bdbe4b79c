"""Visemes from phone timings (issue 17): token durations -> phones, phones -> per-frame mouth targets,
the AUDIO side channel TRT_TTS -> TRT_TalkingHead, Kokoro's exposed durations, and `portrait` left
unchanged without phones."""
from __future__ import annotations

import numpy as np
import pytest

from digital_human.audio import to_comfy_audio
from digital_human.audio.phone_channel import PHONES_KEY, phones_from_audio, with_phones
from digital_human.talking_head.visemes import VISEME_INDEX, detect_alphabet, viseme_track
from digital_human.voice.phone_timing import token_phones

FPS = 25.0
FRAME_S = 0.025  # Kokoro: 600 samples at 24 kHz per duration frame


def _frames_inside(start: float, end: float, n: int, fps: float = FPS) -> np.ndarray:
    t = np.arange(n) / fps
    return np.flatnonzero((t >= start) & (t < end))


# --- token durations -> phones (no models) ------------------------------------------------------------
def test_token_durations_give_exact_phone_times():
    # "bˈɑb pˈi." with pads: leading 4 frames, b 3, ˈ 1, ɑ 8, b 4, space 2, p 3, ˈ 1, i 6, . 5, trailing 3
    tokens = list("bˈɑb pˈi.")
    dur = np.array([4, 3, 1, 8, 4, 2, 3, 1, 6, 5, 3], np.float32)
    phones = token_phones(tokens, dur, FRAME_S)
    f = FRAME_S
    expected = [("b", 4, 7),
                ("ɑ", 7, 16),   # the stress mark's frame belongs to the vowel it stresses
                ("b", 16, 21),  # the word gap (frames 20-22) is shared by the phones either side
                ("p", 21, 25),
                ("i", 25, 32)]  # "." (32-37) is a pause: not a phone, the gap is silence
    assert [p[0] for p in phones] == [e[0] for e in expected]
    np.testing.assert_allclose([p[1:] for p in phones], [(a * f, b * f) for _, a, b in expected], atol=1e-6)
    # a later chunk: offset, and a formant shift that plays the audio 1.1x faster
    shifted = token_phones(tokens, dur, FRAME_S, offset_s=2.0, time_scale=1 / 1.1)
    assert shifted[0] == ("b", pytest.approx(2.0 + 4 * f / 1.1), pytest.approx(2.0 + 7 * f / 1.1))
    # the model's sounds lead its duration boundaries: every time moves earlier, never before the call's start
    early = token_phones(tokens, dur, FRAME_S, offset_s=1.0, lead_s=0.05)
    np.testing.assert_allclose([p[1] for p in early], [1.0 + p[1] - 0.05 for p in phones], atol=1e-6)
    assert min(p[1] for p in token_phones(tokens, dur, FRAME_S, offset_s=1.0, lead_s=0.2)) == 1.0
    with pytest.raises(ValueError, match=r"\+2 pads"):
        token_phones(tokens, dur[:-1], FRAME_S)


def test_mandarin_tone_marks_fold_into_their_syllable():
    tokens = list("ni↓ xau↗")
    dur = np.array([2, 2, 3, 1, 2, 2, 3, 2, 2, 2], np.float32)
    labels = [p[0] for p in token_phones(tokens, dur, FRAME_S)]
    assert labels == ["n", "i", "x", "a", "u"]
    assert token_phones(tokens, dur, FRAME_S)[1][2] == pytest.approx(9 * FRAME_S)  # i 4-7, ↓ 7-8, half the gap 8-10


# --- phones -> viseme track (no models) ---------------------------------------------------------------
# "pa pi mu wo" with the closures long enough to hold frames, and one /b/ shorter than a frame
PHONES = [("p", 0.20, 0.32), ("a", 0.32, 0.60), ("p", 0.60, 0.72), ("i", 0.72, 1.00), ("m", 1.00, 1.12),
          ("u", 1.12, 1.40), ("w", 1.40, 1.50), ("o", 1.50, 1.80), ("b", 1.905, 1.925), ("a", 1.925, 2.20)]
N = 60


def test_frames_inside_bilabials_are_closed_and_nowhere_else():
    track = viseme_track(PHONES, FPS, N)
    closed = np.flatnonzero(track.closure > 0)
    expected = np.concatenate([_frames_inside(s, e, N) for p, s, e in PHONES if p in "pbm" and e - s > 0.04])
    short_b = int(round(0.5 * (1.905 + 1.925) * FPS))  # no frame time falls inside: the nearest closes
    assert sorted(closed.tolist()) == sorted(expected.tolist() + [short_b])
    assert (track.lip_open[closed] == 0).all() and (track.lip_open[_frames_inside(0.35, 0.55, N)] > 0.3).all()
    assert (track.viseme[closed] == VISEME_INDEX["PBM"]).all()


def test_vowel_shapes_jaw_and_rounding():
    track = viseme_track(PHONES, FPS, N)
    frame_a, frame_i = int(0.46 * FPS), int(0.86 * FPS)
    assert track.jaw_open[frame_a] > track.jaw_open[frame_i] + 0.3
    assert track.width[frame_i] > track.width[frame_a] + 0.3
    for start, end in ((1.12, 1.40), (1.40, 1.50), (1.50, 1.80)):  # u, w, o round
        mid = int(round(0.5 * (start + end) * FPS))
        assert track.round[mid] > 0.5 > max(track.round[frame_a], track.round[frame_i])
    assert track.jaw_open[:3].max() < 0.05 and track.confidence.min() == 1.0  # silence before speech: at rest


def test_coarticulation_blends_neighbours():
    # /t/ takes its jaw from the vowels around it (low dominance); rounding of /u/ starts before it
    ata = viseme_track([("a", 0.2, 0.5), ("t", 0.5, 0.56), ("a", 0.56, 0.9)], FPS, 25)
    iti = viseme_track([("i", 0.2, 0.5), ("t", 0.5, 0.56), ("i", 0.56, 0.9)], FPS, 25)
    assert ata.jaw_open[13] > iti.jaw_open[13] + 0.2
    su = viseme_track([("s", 0.4, 0.52), ("u", 0.52, 0.9)], FPS, 25)
    si = viseme_track([("s", 0.4, 0.52), ("i", 0.52, 0.9)], FPS, 25)
    assert su.round[12] > si.round[12] + 0.2  # frame 12 (0.48 s) is inside /s/


def test_arpabet_and_ipa_agree():
    arpa = [("P", 0.20, 0.32), ("AA1", 0.32, 0.60), ("SIL", 0.60, 0.8), ("M", 0.8, 0.92), ("UW", 0.92, 1.2)]
    ipa = [("p", 0.20, 0.32), ("ɑ", 0.32, 0.60), ("m", 0.8, 0.92), ("u", 0.92, 1.2)]
    assert detect_alphabet(p[0] for p in arpa) == "arpabet" and detect_alphabet(p[0] for p in ipa) == "ipa"
    a, b = viseme_track(arpa, FPS, 35), viseme_track(ipa, FPS, 35)
    for name in ("jaw_open", "lip_open", "width", "round", "closure"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), atol=1e-6)

    class AlignedPhone:  # the aligner's Phone objects (label/start/end) are read as well
        def __init__(self, label, start, end):
            self.label, self.start, self.end = label, start, end

    c = viseme_track([AlignedPhone(*p) for p in arpa], FPS, 35)
    np.testing.assert_allclose(c.jaw_open, a.jaw_open)


def test_confidence_follows_the_phones():
    sure = viseme_track([("a", 0.2, 0.6)], FPS, 20)
    unsure = viseme_track([("a", 0.2, 0.6, 0.3)], FPS, 20)
    unknown = viseme_track([("☃", 0.2, 0.6)], FPS, 20)
    assert sure.confidence.min() == 1.0 and np.allclose(unsure.confidence, 0.3, atol=1e-6)
    assert np.allclose(unknown.confidence, 0.5, atol=1e-6)
    assert viseme_track([], FPS, 10).confidence.max() == 0.0


# --- the AUDIO side channel (no models) -----------------------------------------------------------------
def test_side_channel_round_trip_and_stale_times_dropped():
    pytest.importorskip("torch")
    audio = with_phones(to_comfy_audio(np.full(24000, 0.1, np.float32), 24000), [("a", 0.1, 0.5)])
    assert phones_from_audio(audio) == [("a", 0.1, 0.5)]
    assert phones_from_audio(to_comfy_audio(np.full(100, 0.1, np.float32), 24000)) is None  # user audio
    trimmed = dict(audio, waveform=audio["waveform"][..., :4800])  # a node cut the audio but kept the key
    assert phones_from_audio(trimmed) is None
    assert phones_from_audio(dict(audio, **{PHONES_KEY: [("a", 0.5, 0.1)]})) is None  # malformed
    assert phones_from_audio(None) is None


def test_registry_gives_phones_only_to_models_that_read_them(monkeypatch):
    from digital_human.talking_head import registry
    from digital_human.talking_head.contract import TalkingHeadModel

    seen = {}

    def old_style(faces, wave, rate, fps, *, loop_mode, batch_size, strength, max_audio_seconds, backend,
                  precision, avatar, progress, should_stop, streaming):  # a model that predates phones
        seen["old"] = True

    def new_style(faces, wave, rate, fps, *, phones=None, **_):
        seen["new"] = phones

    monkeypatch.setitem(registry.MODELS, "old", TalkingHeadModel("old", "", "", "", "", old_style))
    monkeypatch.setitem(registry.MODELS, "new", TalkingHeadModel("new", "", "", "", "", new_style, reads_phones=True))
    registry.generate_crops(None, None, 16000, "old", 25.0, phones=[("a", 0, 1)])
    registry.generate_crops(None, None, 16000, "new", 25.0, phones=[("a", 0, 1)])
    assert seen == {"old": True, "new": [("a", 0, 1)]}


# --- portrait with and without phones (face models) -------------------------------------------------------
@pytest.fixture(scope="module")
def photo_faces(data_dir, setup_models):
    from PIL import Image

    from digital_human.nodes.image_convert import uint8_to_image
    from digital_human.nodes.video_nodes import FaceAlign

    with Image.open(data_dir / "image" / "face_03_male.jpg") as img:
        image = uint8_to_image(np.asarray(img.convert("RGB").resize((384, 384)))[None])
    return FaceAlign().align(image)[0]


def _speechlike(seconds: float = 1.6, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    env = np.clip(np.sin(2 * np.pi * 2.5 * t), 0, None)  # syllable-like bursts
    return (0.3 * env * np.sign(np.sin(2 * np.pi * 150 * t))).astype(np.float32)


def test_portrait_without_phones_is_the_audio_drive_exactly(photo_faces, monkeypatch):
    from digital_human.talking_head.portrait import animate
    from digital_human.talking_head.portrait.speech_drive import mouth_params
    from digital_human.talking_head.registry import generate_crops

    wave = _speechlike()
    n = 40
    np.testing.assert_array_equal(animate._drive(wave, 16000, FPS, n, None).jaw_open,
                                  mouth_params(wave, 16000, FPS, n).jaw_open)
    base = generate_crops(photo_faces, wave, 16000, "portrait", FPS)
    with monkeypatch.context() as m:  # no phones: the viseme code is never reached
        m.setattr("digital_human.talking_head.visemes.viseme_track", lambda *a, **k: pytest.fail("called"))
        again = generate_crops(photo_faces, wave, 16000, "portrait", FPS, phones=None)
    np.testing.assert_array_equal(base.crops, again.crops)
    phones = [("p", 0.0, 0.3), ("a", 0.3, 0.7), ("m", 0.7, 1.0), ("u", 1.0, 1.5)]
    timed = generate_crops(photo_faces, wave, 16000, "portrait", FPS, phones=phones)
    assert not np.array_equal(base.crops, timed.crops) and "visemes" in timed.backend


# --- Kokoro (real model) ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kokoro(setup_models):
    from digital_human.engines.kokoro import assets as kassets

    try:
        return kassets.kokoro_assets()
    except kassets.KokoroAssetError as exc:
        pytest.skip(str(exc))


def test_kokoro_durations_sum_to_the_audio_and_leave_it_unchanged(kokoro):
    import onnx
    import onnxruntime as ort

    from digital_human.engines.kokoro import controls, synth

    ids = synth.tokens_from_phonemes("bˈɑb bˈɔt ɐ pˈI.", kokoro.vocab)
    feeds = synth.model_inputs(ids, synth.style_for(kokoro.voices["jm_kumo"], len(ids)), 1.15, 0.95)
    run = synth.ort_cpu_runner(synth.int8_control_graph())
    wave, durations = synth.synthesize_timed(ids, feeds["style"], 1.15, run, f0_scale=0.95)
    assert durations.shape == (len(ids) + 2,) and (durations >= 1).all()
    assert abs(durations.sum() * controls.DURATION_HOP - len(wave)) < controls.DURATION_HOP  # within one hop
    # the same graph without the durations output speaks the same samples
    plain = controls.add_pitch_control(onnx.load(str(kokoro.int8_onnx)))
    session = ort.InferenceSession(plain.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["audio"]
    without = session.run(None, feeds)[0].reshape(-1)
    np.testing.assert_array_equal(without, wave)


def test_float_graph_declares_durations(kokoro):
    import onnx

    from digital_human.engines.kokoro import graph_rewrite, synth

    model = onnx.load(str(graph_rewrite.float_graph()), load_external_data=False)
    assert tuple(o.name for o in model.graph.output) == synth.OUTPUT_NAMES == ("audio", "durations")


def test_tts_phones_match_its_audio(kokoro):
    from digital_human.voice.tts import synthesize_speech

    # two sentences (a pause between them) and a formant shift (the audio is resampled: times too)
    result = synthesize_speech("Bob, buy me a map. Papa ate a pie!", formant_scale=1.1,
                               voice_pack=kokoro.voices["jm_kumo"])
    phones, wave, rate = result.phones, result.waveform, result.sample_rate
    assert phones and all(a < b for _, a, b in phones) and all(p[1] >= q[2] - 1e-6 for q, p in zip(phones, phones[1:]))
    assert phones[-1][2] <= len(wave) / rate + 1e-6
    labels = "".join(p[0] for p in phones)
    assert labels.count("b") + labels.count("p") + labels.count("m") >= 8
    # the timings are the audio's: bilabial closures are much quieter than the open vowels
    def rms(s, e):
        seg = wave[int(s * rate): int(e * rate)]
        return float(np.sqrt(np.mean(seg ** 2))) if seg.size else 0.0
    closed = np.median([rms(s, e) for p, s, e in phones if p in "pb"])
    open_ = np.median([rms(s, e) for p, s, e in phones if p in "æɑaɐ"])
    assert closed < 0.5 * open_, (closed, open_)


def test_side_channel_survives_tts_to_talking_head(kokoro, photo_faces):
    from digital_human.nodes.talking_head_nodes import TRT_TalkingHead
    from digital_human.nodes.voice_nodes import TRT_TTS

    audio, _ = TRT_TTS().speak("Bob may hum.")["result"]
    assert phones_from_audio(audio) and audio[PHONES_KEY][0][0] == "b"
    head = TRT_TalkingHead()
    frames, _, report = head.animate(photo_faces, audio, model="portrait", fps=FPS)["result"]
    off_frames, _, off_report = head.animate(photo_faces, audio, model="portrait", fps=FPS, visemes="off")["result"]
    assert "visemes from phone timings" in report and "visemes" not in off_report
    assert frames.shape == off_frames.shape and not np.array_equal(frames.numpy(), off_frames.numpy())


def test_feature_windows_centre_each_frame_and_repeat_the_edges():
    from digital_human.talking_head.visemes import FEATURE_NAMES, feature_windows, frame_features, viseme_track

    feats = np.arange(5 * 6, dtype=np.float32).reshape(5, 6)
    win = feature_windows(feats, 3)
    assert win.shape == (5, 18)
    assert np.array_equal(win[2], feats[1:4].reshape(-1))
    assert np.array_equal(win[0], np.concatenate([feats[0], feats[0], feats[1]]))
    assert np.array_equal(win[4], np.concatenate([feats[3], feats[4], feats[4]]))
    with pytest.raises(ValueError, match="odd"):
        feature_windows(feats, 4)
    assert not frame_features(None, 7).any() and frame_features(None, 7).shape == (7, len(FEATURE_NAMES))
    win = feature_windows(frame_features(viseme_track([("P", 0.0, 0.1), ("AA", 0.1, 0.4)], 25.0, 10), 10), 1)
    closure, confidence = win[:, FEATURE_NAMES.index("closure")], win[:, FEATURE_NAMES.index("confidence")]
    assert closure[:2].all() and not closure[5:].any() and confidence[:8].min() > 0.5
    assert win[5, FEATURE_NAMES.index("jaw_open")] > 0.5  # the open vowel drops the jaw
