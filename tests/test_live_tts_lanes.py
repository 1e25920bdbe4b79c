"""Live mode's TTS lanes (serve --tts-lanes): CosyVoice 2 utterances of different sessions voiced at the same time, each
lane a decoder (KV cache, sampler state) and flow solver of its own over one copy of the weights. On the CPU with
the fast path's decoder and solver (no CUDA graphs): what a lane speaks equals what one lane speaks alone, and one
lane's lock held does not stop another lane (random-weight reduced release: the plumbing, not the voice)."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "cosyvoice" / "reduced.npz"
TEXTS = ("Hello there, how are you today?", "The parcel left the depot this morning.")


def _limits(_text: str) -> dict:
    return {"min_tokens": 30, "max_tokens": 30}  # random weights draw no sensible stop token


@pytest.fixture(scope="module")
def engine_and_speaker(tmp_path_factory, data_dir):
    pytest.importorskip("transformers", reason="CosyVoice 2 needs the optional extra: pip install .[cosyvoice]")
    import torch

    from digital_human.audio import load_reference
    from digital_human.engines.cosyvoice.engine import CosyVoice2Engine, CosyVoice2Runtime, FastPath
    from digital_human.engines.cosyvoice.parity import write_release_from_fixture
    from digital_human.voice.speaker import SpeakerProfile

    torch.set_num_threads(2)
    data = dict(np.load(FIXTURE, allow_pickle=False))
    folder = write_release_from_fixture(data, tmp_path_factory.mktemp("cv2lanes") / "CosyVoice2-0.5B")
    engine = CosyVoice2Engine(folder)
    # the fast path's decoder (device sampling, fused weights) and flow solver, without compile or CUDA graphs
    engine._runtime = CosyVoice2Runtime(folder, "cpu", fast=FastPath(lm_compile=False, flow_half=False))
    prepared = load_reference(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=7)
    base = SpeakerProfile(embedding=np.ones(256, np.float32) / 16, segment_embeddings=np.zeros((0, 256), np.float32),
                          content_hash="x", speech_seconds=prepared.speech_seconds, name="male01")
    return engine, engine.prepare_speaker(prepared, "Hello there, this is my voice.", base)


def _speak(engine, speaker, text, seed, lane):
    return np.concatenate(list(engine.live_stream(text, speaker, seed=seed, limits=_limits, lane=lane)))


def test_lanes_share_every_weight_and_keep_their_own_state(engine_and_speaker):
    engine, speaker = engine_and_speaker
    assert engine.set_lanes(2) == 2
    first, second = engine.runtime(0), engine.runtime(1)
    assert second.models is first.models and second.hift is first.hift and second.tokenizer is first.tokenizer
    assert second._lm_decoder() is not first._lm_decoder()
    assert second._lm_decoder()._fused is first._lm_decoder()._fused  # the fused LM weights: one copy
    assert second._lm_decoder().keys[0].data_ptr() != first._lm_decoder().keys[0].data_ptr()  # a KV cache each
    assert second._flow_solver() is not first._flow_solver()
    assert second._flow_solver().estimator is first._flow_solver().estimator  # the solver's weights: one copy
    with pytest.raises(ValueError, match="lane 2 does not exist"):
        engine.runtime(2)


def test_two_lanes_at_once_speak_what_one_lane_speaks_alone(engine_and_speaker):
    engine, speaker = engine_and_speaker
    engine.set_lanes(2)
    alone = [_speak(engine, speaker, text, seed, 0) for seed, text in enumerate(TEXTS)]
    together: dict[int, np.ndarray] = {}
    start = threading.Barrier(2)

    def run(lane: int) -> None:
        start.wait()
        together[lane] = _speak(engine, speaker, TEXTS[lane], lane, lane)

    threads = [threading.Thread(target=run, args=(lane,)) for lane in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sorted(together) == [0, 1]
    for lane in (0, 1):
        np.testing.assert_array_equal(together[lane], alone[lane])  # no lane saw the other's state
    assert not np.array_equal(alone[0][:1000], alone[1][:1000])  # two different utterances (the check can fail)


def test_a_busy_lane_does_not_hold_up_an_utterance_on_another(engine_and_speaker):
    """LiveVoice gives a new utterance the lane with the fewest under way; with lane 0's lock held by someone else,
    an utterance that lands on lane 1 still gets its first piece (with one lane it would wait)."""
    from digital_human.pipeline.live.voice import LiveVoice

    engine, speaker = engine_and_speaker
    voice = LiveVoice(engine, speaker, token_limits=_limits, lanes=2)
    assert voice.lanes == 2
    first = voice.pieces(TEXTS[0])
    next(first)  # under way on lane 0
    assert voice._under_way == [1, 0]
    got: list = []
    with voice._locks[0].hold(0):  # lane 0 busy for as long as this block runs
        worker = threading.Thread(target=lambda: got.append(next(voice.pieces(TEXTS[1]))))
        worker.start()
        worker.join(120)
        assert got and got[0].wave.size > 0, "the utterance on lane 1 waited for lane 0"
    first.close()
    worker.join()
    assert voice._under_way == [0, 0]  # closed generators give their lane back


def test_an_engine_without_lanes_gets_one_and_says_so(caplog):
    from digital_human.pipeline.live.voice import LiveVoice

    class OnePieceAtATime:
        name, sample_rate = "plain", 24000

        def check_files(self):
            pass

    with caplog.at_level("WARNING", logger="digital_human.live"):
        voice = LiveVoice(OnePieceAtATime(), lanes=3)
    assert voice.lanes == 1 and "--tts-lanes 3 ignored" in caplog.text
    with pytest.raises(ValueError, match="at least 1"):
        LiveVoice(OnePieceAtATime(), lanes=0)


def test_serve_refuses_a_bad_lane_count_before_any_model_loads(capsys, data_dir):
    from digital_human.cli import main

    face = str(data_dir / "image" / "face_01_female.jpg")
    for lanes in ("0", "9"):
        code = main(["serve", "--base-voice", "auto", "--face", face, "--tts-lanes", lanes])
        err = capsys.readouterr().err
        assert code == 2 and f"--tts-lanes must be 1 to 8, got {lanes}" in err, err[-400:]


def test_each_lane_queues_its_device_work_on_a_stream_of_its_own(engine_and_speaker, monkeypatch):
    """Every session's TTS stage shares one CUDA stream; lanes on it would run one after another on the device.
    So with several lanes each call runs on its lane's stream (lane 0: the stage's own). The CPU has no streams:
    the choice of stream is what is checked (the device's overlap is benchmarks/gpu_live.py's)."""
    from contextlib import nullcontext

    from digital_human.engines import cuda_streams
    from digital_human.pipeline.live.voice import LANES_CUDA_ENV, LiveVoice

    engine, speaker = engine_and_speaker
    roles: list[str] = []

    def thread_stream(device, priority=0, role=None):
        roles.append((device, role))
        return nullcontext()

    monkeypatch.setattr(cuda_streams, "thread_stream", thread_stream)
    monkeypatch.setattr(LiveVoice, "cuda_device", property(lambda self: "cuda:0"))
    monkeypatch.setenv(LANES_CUDA_ENV, "1")  # lanes on CUDA are refused without it
    voice = LiveVoice(engine, speaker, token_limits=_limits, lanes=2)
    first, second = voice.pieces(TEXTS[0]), voice.pieces(TEXTS[1])
    next(first), next(second)
    assert roles == [("cuda:0", "live-tts"), ("cuda:0", "live-tts-1")]
    first.close(), second.close()
    one = LiveVoice(engine, speaker, token_limits=_limits, lanes=1)
    next(one.pieces(TEXTS[0]))
    assert len(roles) == 2  # one lane: the stage's stream, nothing added


def test_lanes_on_a_cuda_voice_are_refused_unless_asked_for(monkeypatch):
    """Several lanes hung on an H200 (benchmarks/RESULTS_live.md, 2026-12-03): refused there with the way out."""
    from digital_human.pipeline.live.voice import LANES_CUDA_ENV, LiveVoice, check_tts_lanes

    monkeypatch.delenv(LANES_CUDA_ENV, raising=False)
    assert check_tts_lanes(1, cuda=True) == 1 and check_tts_lanes(4, cuda=False) == 4
    with pytest.raises(ValueError, match="--tts-lanes 4 is turned off on a CUDA GPU.*--tts-lanes 1"):
        check_tts_lanes(4, cuda=True)

    class CudaVoiceWithLanes:  # says it runs on CUDA; set_lanes must not be reached
        name, sample_rate, device = "lanes", 24000, "cuda"

        def check_files(self):
            pass

        def live_stream(self, *a, **k):
            raise AssertionError("not spoken")

        def set_lanes(self, count):
            raise AssertionError("lanes were made")

    with pytest.raises(ValueError, match="turned off on a CUDA GPU"):
        LiveVoice(CudaVoiceWithLanes(), lanes=2)
    monkeypatch.setenv(LANES_CUDA_ENV, "1")
    assert check_tts_lanes(4, cuda=True) == 4


def test_serve_refuses_lanes_on_cuda_before_any_model_loads(monkeypatch, capsys, data_dir):
    from digital_human.cli import main
    from digital_human.engines import devices
    from digital_human.pipeline.live.voice import LANES_CUDA_ENV

    monkeypatch.delenv(LANES_CUDA_ENV, raising=False)
    monkeypatch.setattr(devices, "torch_cuda_usable", lambda: True)  # as on a GPU host
    face = str(data_dir / "image" / "face_01_female.jpg")
    code = main(["serve", "--engine", "cosyvoice2", "--speaker", str(data_dir / "none.npz"), "--face", face,
                 "--tts-lanes", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "--tts-lanes 2 is turned off on a CUDA GPU" in err, err[-400:]
