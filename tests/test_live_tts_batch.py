"""Live mode's --tts-batch: CosyVoice 2 flow solves of several sessions as rows of one solve (flow_batch.FlowRowBatcher)
and their LM tokens from one batched decode loop (lm_batch.LMBatchLoop, tests/test_cosyvoice_lm_batch.py). On the CPU with the fast path's padded solver (no CUDA graphs,
FP32): every row comes out as its solve alone, the rows padded in length and count as the graphs need, and
sessions speaking at once get the audio each gets alone (random-weight reduced release: the plumbing)."""
from __future__ import annotations

import functools
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers", reason="CosyVoice 2 needs the optional extra: pip install .[cosyvoice]")
import torch  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "cosyvoice" / "reduced.npz"
TEXTS = ("Hello there, how are you today?", "The parcel left the depot this morning.")


def _limits(_text: str) -> dict:
    return {"min_tokens": 30, "max_tokens": 30}  # random weights draw no sensible stop token


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from digital_human.engines.cosyvoice.parity import write_release_from_fixture

    torch.set_num_threads(2)
    data = dict(np.load(FIXTURE, allow_pickle=False))
    return write_release_from_fixture(data, tmp_path_factory.mktemp("cv2batch") / "CosyVoice2-0.5B")


def _engine(release):
    from digital_human.engines.cosyvoice.engine import CosyVoice2Engine, CosyVoice2Runtime, FastPath

    engine = CosyVoice2Engine(release)
    # the fast path's decoder and padded flow solver, FP32, without compile or CUDA graphs
    engine._runtime = CosyVoice2Runtime(release, "cpu", fast=FastPath(lm_compile=False, flow_half=False))
    return engine


@pytest.fixture(scope="module")
def engine_and_speaker(release, data_dir):
    from digital_human.audio import load_reference
    from digital_human.voice.speaker import SpeakerProfile

    engine = _engine(release)
    prepared = load_reference(data_dir / "audio" / "spk_en_male_01.wav", max_seconds=7)
    base = SpeakerProfile(embedding=np.ones(256, np.float32) / 16, segment_embeddings=np.zeros((0, 256), np.float32),
                          content_hash="x", speech_seconds=prepared.speech_seconds, name="male01")
    return engine, engine.prepare_speaker(prepared, "Hello there, this is my voice.", base)


def _solve_inputs(frames: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    mu, cond = torch.randn(1, 80, frames, generator=g), torch.randn(1, 80, frames, generator=g)
    return mu, torch.ones(1, 1, frames), torch.randn(1, 80, generator=g), cond


def test_row_sizes():
    from digital_human.engines.cosyvoice.flow_batch import row_sizes

    assert row_sizes(1) == (1,) and row_sizes(3) == (1, 2, 3) and row_sizes(8) == (1, 2, 4, 8)
    assert row_sizes(12) == (1, 2, 4, 8, 12)


def test_rows_of_one_solve_equal_each_solve_alone(release):
    """Four threads' solves of different lengths (two length buckets): the first runs alone, the three that queue
    behind it run as one solve padded to 4 rows and to the longest bucket; each row equals its solve alone."""
    from digital_human.engines.cosyvoice.flow import FastCFM
    from digital_human.engines.cosyvoice.flow_batch import FlowRowBatcher
    from digital_human.engines.cosyvoice.release import load_models

    flow = load_models(release).flow
    solver = FastCFM(flow.decoder, torch.float32, bucket=16, cuda_graph=False)
    inputs = [_solve_inputs(frames, seed) for seed, frames in enumerate((20, 9, 33, 16))]
    alone = [solver(*x, steps=4) for x in inputs]
    batcher = FlowRowBatcher(solver, max_rows=4, steps=4, window_s=1.0)
    shapes: list[tuple] = []
    solve = batcher._batcher.fn

    def slow_first(*args):
        shapes.append(tuple(args[0].shape))
        if len(shapes) == 1:
            time.sleep(0.3)  # the other three queue meanwhile
        return solve(*args)

    batcher._batcher.fn = slow_first
    got: list = [None] * 4

    def run(i: int) -> None:
        got[i] = batcher(*inputs[i], steps=4)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(60)
    assert shapes == [(1, 80, 32), (4, 80, 48)]  # 9, 33 and 16 frames: padded to 48 (3 x 16) and 3 rows to 4
    assert batcher.calls == 2 and batcher.rows_run == 4 and batcher.largest == 3
    for mine, theirs in zip(got, alone):
        assert mine.shape == theirs.shape
        assert float((mine - theirs).abs().max()) < 1e-5
    with pytest.raises(ValueError, match="4 steps, not 10"):
        batcher(*inputs[0], steps=10)
    batcher.close()


def test_deferred_pieces_are_the_same_audio(engine_and_speaker):
    engine, speaker = engine_and_speaker
    plain = list(engine.live_stream(TEXTS[0], speaker, seed=5, limits=_limits))
    jobs = engine.live_stream(TEXTS[0], speaker, seed=5, limits=_limits, deferred=True)
    deferred = [job() for job in jobs if not getattr(job, "is_pause", False)]  # each made before the next is asked
    # for, as LiveVoice does (pauses: points where the LM may go to another utterance's first piece)
    assert len(plain) == len(deferred) == 3  # seed 5: three pieces (random weights draw stop tokens early)
    for a, b in zip(plain, deferred):
        np.testing.assert_array_equal(a, b)


def test_sessions_speaking_at_once_get_what_each_gets_alone(release, engine_and_speaker):
    from digital_human.pipeline.live.voice import LiveVoice

    engine, speaker = engine_and_speaker
    seeded = _engine(release)
    seeded.live_stream = functools.partial(seeded.live_stream, seed=5)  # a seed whose random tokens make 3 + 2 pieces
    voice = LiveVoice(seeded, speaker, token_limits=_limits)
    alone = [np.concatenate([p.wave for p in voice.pieces(text)]) for text in TEXTS]
    batched_engine = _engine(release)
    batched_engine.live_stream = functools.partial(batched_engine.live_stream, seed=5)
    batched = LiveVoice(batched_engine, speaker, token_limits=_limits, batch_rows=2)
    assert batched.batch_rows == 2
    together: dict[int, np.ndarray] = {}
    start = threading.Barrier(2)

    def run(i: int) -> None:
        start.wait()
        together[i] = np.concatenate([p.wave for p in batched.pieces(TEXTS[i])])

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sorted(together) == [0, 1]
    for i in (0, 1):
        assert together[i].shape == alone[i].shape
        np.testing.assert_allclose(together[i], alone[i], atol=1e-4)
    stats = batched.flow_batching
    assert stats is not None and stats["max_rows"] == 2
    assert stats["solves"] == 5 and stats["calls"] <= 5  # every piece's solve went through it
    lm = batched.lm_batching  # the LM's half: both sessions' tokens came from the one batched loop, sharing steps
    assert batched.lm_rows == 2 and lm is not None and lm["largest"] == 2 and lm["row_steps"] > lm["steps"]
    batched_engine.runtime().flow_batcher.close()
    batched_engine.runtime().lm_batch.close()


def test_batch_rows_checked_and_announced(caplog, engine_and_speaker):
    from digital_human.pipeline.live.voice import LiveVoice

    engine, speaker = engine_and_speaker
    with pytest.raises(ValueError, match="--tts-batch must be at least 1"):
        LiveVoice(engine, speaker, token_limits=_limits, batch_rows=0)

    class OnePiece:  # an engine without set_flow_rows
        name, sample_rate = "plain", 16000

        def check_files(self) -> None:
            pass

    with caplog.at_level("WARNING", logger="digital_human.live"):
        voice = LiveVoice(OnePiece(), None, batch_rows=4)
    assert voice.batch_rows == 1 and voice.flow_batching is None
    assert "--tts-batch 4 ignored" in caplog.text


class _FlowRowsEngine:
    """A fake voice engine with --tts-batch's flow half only (set_flow_rows; no LM half, so LiveVoice takes LM turns);
    each test gives its own live_stream."""
    name, sample_rate = "fake", 16000

    def check_files(self) -> None:
        pass

    def set_flow_rows(self, rows: int) -> int:
        return rows


@pytest.mark.parametrize("batch_rows", [2, 1])
def test_a_first_piece_takes_the_lm_at_the_next_pause_of_a_long_hop(batch_rows):
    """The live stream pauses every PAUSE_TOKENS tokens without a piece, and LiveVoice gives the LM up there when an
    utterance's first piece waits (not before: no needless turns). With --tts-batch (2 rows) the lane's lock is held
    for a piece's tokens (deferred pieces); without (1 row) for its tokens and its audio, and the pauses are
    CosyVoice2Engine.live_stream's `pausable`, which LiveVoice asks for (before 2026-12-04 a first piece waited for a
    whole hop there: the 8-session run of 2026-12-03 waited P50 338 ms for its first audio against 86.5 ms alone).
    Fake engine: utterance A's second piece is 200 pauses long; B's first piece comes after a few of them."""
    from digital_human.pipeline.live.voice import LiveVoice

    pause = type("Pause", (), {"is_pause": True})()
    log: list[str] = []
    b_waiting = threading.Event()
    deferred_pieces = batch_rows > 1

    def piece():
        return (lambda: np.ones(10, np.float32)) if deferred_pieces else np.ones(10, np.float32)

    class Engine(_FlowRowsEngine):
        def live_stream(self, text, speaker, language="auto", limits=None, deferred=False, pausable=False):
            assert deferred == deferred_pieces and pausable  # LiveVoice asks for the pauses
            yield piece()  # the first piece
            if text == "B":
                return
            for k in range(200):  # a long hop: its tokens come with pauses between
                log.append(f"A{k}")
                if k == 5:
                    b_waiting.set()  # B asks for its first piece now
                    time.sleep(0.2)  # and is waiting on the lock by the next pause
                yield pause
            yield piece()

    voice = LiveVoice(Engine(), None, batch_rows=batch_rows)
    assert voice.batch_rows == batch_rows
    a = voice.pieces("A")
    next(a)
    got: list = []
    worker = threading.Thread(target=lambda: (b_waiting.wait(30), got.append(next(voice.pieces("B")).wave.size),
                                               log.append("B")))
    worker.start()
    assert next(a).wave.size == 10  # A's second piece, after B's first
    worker.join(30)
    assert got == [10]
    assert log.index("B") < 10, log[:12]  # B's first piece at one of A's next pauses, not after its 200


def test_serve_refuses_a_bad_batch_before_any_model_loads(capsys, data_dir):
    from digital_human.cli import main

    face = str(data_dir / "image" / "face_01_female.jpg")
    code = main(["serve", "--base-voice", "auto", "--face", face, "--tts-batch", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "--tts-batch must be at least 1, got 0" in err, err[-400:]


def test_the_first_piece_carries_when_it_got_the_lock_and_its_tokens():
    """Piece.marks: an utterance's first piece says when the lane's lock was granted (tts_lock) and, deferred, when
    its tokens were ready (tts_tokens); the session records them as stage borders before tts_first_audio (the split
    of the first audio's wait under load: queued for the LM, the LM, the flow + vocoder). Later pieces carry none."""
    from digital_human.pipeline.live.metrics import STAGES, Utterance
    from digital_human.pipeline.live.voice import LiveVoice

    class Engine(_FlowRowsEngine):
        def live_stream(self, text, speaker, language="auto", limits=None, deferred=False, **_):
            time.sleep(0.02)  # the LM's tokens of the first piece
            yield lambda: (time.sleep(0.03), np.ones(10, np.float32))[1]  # its flow + vocoder
            yield lambda: np.ones(10, np.float32)

    utterance = Utterance(1, "A", 0)
    pieces = list(LiveVoice(Engine(), None, batch_rows=2).pieces("A"))
    first, second = pieces
    assert set(first.marks) == {"tts_lock", "tts_tokens"} and second.marks == {}
    for stage, at in first.marks.items():
        utterance.mark(stage, at)
    utterance.mark("tts_first_audio")
    t = utterance.times
    assert 0 <= t["tts_lock"] < t["tts_tokens"] < t["tts_first_audio"]
    assert t["tts_tokens"] - t["tts_lock"] >= 0.015 and t["tts_first_audio"] - t["tts_tokens"] >= 0.025
    assert STAGES.index("tts_lock") < STAGES.index("tts_tokens") < STAGES.index("tts_first_audio")
