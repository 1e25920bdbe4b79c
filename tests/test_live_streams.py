"""Live sessions' CUDA streams (engines/cuda_streams.py) as far as a CPU can check them: the helper is a no-op
context without a CUDA device (and imports no torch for it), the session's TTS and talking-head stages each run
their whole loop inside a stream of their own on their part's device (the face's at the higher priority), and
the face and voice say their device without loading anything. That the streams overlap on a GPU is measured by
benchmarks/gpu_live.py --face-profile."""
from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from digital_human.engines import cuda_streams
from digital_human.pipeline.live.metrics import StageMetrics
from digital_human.pipeline.live.session import Session, SessionManager

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("device", [None, "cpu", "cuda-like", "mps", "cpu:0"])
def test_no_stream_without_a_cuda_device(device):
    for role in (None, cuda_streams.FACE_ROLE):
        ctx = cuda_streams.thread_stream(device, priority=cuda_streams.FACE_PRIORITY, role=role)
        assert isinstance(ctx, contextlib.nullcontext)
        with ctx:
            pass
    assert cuda_streams.new_stream(device) is None
    assert cuda_streams.role_stream(device, cuda_streams.TTS_ROLE) is None
    assert cuda_streams.cuda_device_name(device) is None


def test_cuda_names_and_the_off_switch(monkeypatch):
    assert cuda_streams.cuda_device_name("cuda") == "cuda"
    assert cuda_streams.cuda_device_name("cuda:1") == "cuda:1"
    monkeypatch.setenv(cuda_streams.STREAMS_ENV, "0")
    assert not cuda_streams.streams_enabled()
    assert isinstance(cuda_streams.thread_stream("cuda:0"), contextlib.nullcontext)  # switched off: no torch asked
    monkeypatch.setenv(cuda_streams.STREAMS_ENV, "1")
    assert cuda_streams.streams_enabled()
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():  # a CUDA name on a machine without CUDA: still the CPU path
        assert isinstance(cuda_streams.thread_stream("cuda"), contextlib.nullcontext)
        assert isinstance(cuda_streams.thread_stream("cuda", role=cuda_streams.TTS_ROLE), contextlib.nullcontext)
        assert isinstance(cuda_streams.thread_stream(torch.device("cpu")), contextlib.nullcontext)
    else:  # on a GPU: another stream, current inside the context only; one per role, whatever the thread
        outer = torch.cuda.current_stream()
        with cuda_streams.thread_stream("cuda", priority=cuda_streams.FACE_PRIORITY):
            assert torch.cuda.current_stream() != outer
        assert torch.cuda.current_stream() == outer
        face = cuda_streams.role_stream("cuda", cuda_streams.FACE_ROLE, cuda_streams.FACE_PRIORITY)
        assert face is not None and face == cuda_streams.role_stream("cuda:0", cuda_streams.FACE_ROLE)
        assert face != cuda_streams.role_stream("cuda", cuda_streams.TTS_ROLE)


def test_the_helper_imports_no_torch_for_the_cpu():
    code = ("import sys, digital_human.engines.cuda_streams as c; c.thread_stream(None); c.thread_stream('cpu'); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    env_root = str(ROOT.parent)
    load = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('digital_human', "
            f"{str(ROOT / '__init__.py')!r}, submodule_search_locations=[{str(ROOT)!r}]); "
            "m = importlib.util.module_from_spec(spec); sys.modules['digital_human'] = m; spec.loader.exec_module(m); ")
    proc = subprocess.run([sys.executable, "-c", load + code], capture_output=True, text=True, cwd=env_root,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


class _Recorder:
    """thread_stream stand-in: records (device, priority, role, thread) and which threads are inside their context."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.inside: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, device, priority=0, role=None):
        recorder = self

        @contextlib.contextmanager
        def ctx():
            name = threading.current_thread().name
            with recorder.lock:
                recorder.calls.append((device, priority, role, name))
                recorder.inside.add(name)
            try:
                yield
            finally:
                with recorder.lock:
                    recorder.inside.discard(name)
        return ctx()

    def active(self) -> bool:
        with self.lock:
            return threading.current_thread().name in self.inside


class _Voice:
    rate = 24000
    cuda_device = "cuda:5"

    def __init__(self, recorder: _Recorder) -> None:
        self.recorder, self.inside = recorder, []

    def pieces(self, text):
        self.inside.append(self.recorder.active())
        for _ in range(2):
            self.inside.append(self.recorder.active())
            yield SimpleNamespace(wave=0.1 * np.ones(960 * 3, np.float32), phones=None)


class _Face:
    fps = 25.0
    cuda_device = "cuda:3"

    def __init__(self, recorder: _Recorder) -> None:
        self.recorder, self.inside = recorder, []

    def idle(self, k):
        return np.zeros((8, 8, 3), np.uint8)

    def finish(self, frame, k):
        return frame

    def speech(self, wave, rate, k0, phones=None, should_stop=None):
        self.inside.append(self.recorder.active())
        for _ in range(len(wave) // 960):
            yield np.full((8, 8, 3), 200, np.uint8)


def test_session_stages_run_inside_streams_of_their_own(monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(cuda_streams, "thread_stream", recorder)
    voice, face = _Voice(recorder), _Face(recorder)
    session = Session("t1", face, voice, StageMetrics())
    try:
        utterance = session.say("hello there")
        end = time.perf_counter() + 10
        while utterance.state not in ("done", "failed") and time.perf_counter() < end:
            time.sleep(0.02)
        assert utterance.state == "done", utterance.state
    finally:
        session.close()
    by_thread = {name: (device, priority, role) for device, priority, role, name in recorder.calls}
    tts = [v for k, v in by_thread.items() if k.endswith("_tts_stage")]
    faces = [v for k, v in by_thread.items() if k.endswith("_face_stage")]
    assert tts == [("cuda:5", cuda_streams.TTS_PRIORITY, cuda_streams.TTS_ROLE)]
    assert faces == [("cuda:3", cuda_streams.FACE_PRIORITY, cuda_streams.FACE_ROLE)]
    assert cuda_streams.FACE_PRIORITY < cuda_streams.TTS_PRIORITY  # CUDA: lower numbers run first
    assert len(recorder.calls) == 2  # the clock does no device work: no stream asked for it
    # the models were called on the stage threads inside their contexts (the whole loop runs in the stream)
    assert voice.inside and all(voice.inside)
    assert face.inside and all(face.inside)
    assert not recorder.inside  # both left their context when the session closed


def test_parts_without_a_device_get_no_stream(monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(cuda_streams, "thread_stream", recorder)
    voice, face = _Voice(recorder), _Face(recorder)
    voice.cuda_device = face.cuda_device = None
    session = Session("t2", face, voice, StageMetrics())
    session.close()
    assert [d for d, _, _, _ in recorder.calls] == [None, None]  # asked with None: the helper's no-op


def test_face_and_voice_say_their_cuda_device():
    torch = pytest.importorskip("torch")
    from digital_human.pipeline.live.face import LiveFace
    from digital_human.pipeline.live.voice import LiveVoice

    voice = LiveVoice.__new__(LiveVoice)  # the property reads the engine only
    for device, want in (("cuda", "cuda"), ("cuda:1", "cuda:1"), ("cpu", None), (torch.device("cuda", 2), "cuda:2"),
                         (None, None)):
        voice.engine = SimpleNamespace(device=device)
        assert voice.cuda_device == want
    voice.engine = SimpleNamespace()  # Kokoro on ONNX Runtime: no device attribute
    assert voice.cuda_device is None

    face = LiveFace.__new__(LiveFace)
    face.model, face.smooth, face.device = "musetalk", 0.0, None
    face._stream = SimpleNamespace(pipe=SimpleNamespace(device=torch.device("cuda", 0)))
    assert face.cuda_device == "cuda:0"
    face._stream = SimpleNamespace(pipe=SimpleNamespace(device=torch.device("cpu")))
    assert face.cuda_device is None
    face._stream, face.model = None, "portrait"
    assert face.cuda_device is None  # the host warp
    face.model, face.device = "wav2lip", "cuda:1"
    assert face.cuda_device == "cuda:1"


def test_the_musetalk_batcher_runs_at_the_face_priority():
    from digital_human.engines.musetalk.pipeline import MuseTalkPipeline

    fake = SimpleNamespace(_batcher=None, _generate_now=lambda latents, windows: latents * 2)
    MuseTalkPipeline.share_batches(fake)
    try:
        assert fake._batcher.stream_priority == cuda_streams.FACE_PRIORITY
        out = fake._batcher(np.ones((4, 2)), np.zeros((4, 1)))  # host arrays: no stream asked for
        assert np.array_equal(out, 2 * np.ones((4, 2)))
    finally:
        fake._batcher.close()


def test_each_graph_owner_gets_a_capture_stream_of_its_own(monkeypatch, caplog):
    """cuBLAS's workspace is keyed by (thread, stream) and baked into captured graphs: owners whose graphs may replay
    at the same time (TTS lanes, TTS beside the talking head) must capture on different streams. torch hands streams
    out round-robin from 32 per priority; the CPU has none, so a pool like torch's stands in for it."""
    import torch

    from digital_human.engines import cuda_streams

    drawn: list = []

    class PoolStream:  # torch.cuda.Stream's pool: 32 raw streams per priority, handed out in turn
        def __init__(self, device=None, priority=0):
            n = sum(1 for p in drawn if p == priority)
            drawn.append(priority)
            self.cuda_stream = (1000 if priority else 0) + n % 32
            self.priority = priority

    monkeypatch.setattr(torch.cuda, "Stream", PoolStream)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda_streams, "_CAPTURE_STREAMS", {})
    PoolStream()  # someone else (a role stream) took the pool's first stream: capture owners may share it, no harm
    owners = [cuda_streams.capture_stream("cuda") for _ in range(64)]
    assert len({s.cuda_stream for s in owners}) == 64  # both priorities' pools, no stream twice
    before = len(drawn)
    cuda_streams.capture_stream("cuda:1")
    assert len(drawn) == before + 1  # another device keeps its own record: its first draw is free
    with caplog.at_level("WARNING", logger="digital_human.engines"):
        extra = cuda_streams.capture_stream("cuda:0")
    assert extra is not None and "share a capture stream" in caplog.text
    cuda_streams.release_capture_stream(owners[5])  # its graphs are gone: the next owner may have its stream
    assert cuda_streams.capture_stream("cuda:0").cuda_stream == owners[5].cuda_stream


def test_the_tts_priority_variable(monkeypatch):
    """DIGITAL_HUMAN_LIVE_TTS_PRIORITY sets the TTS streams' priority (gpu_live.py --tts-priority's A/B); unset the
    default; not a whole number: refused naming the variable. A session's TTS stage asks for that priority."""
    monkeypatch.delenv(cuda_streams.TTS_PRIORITY_ENV, raising=False)
    assert cuda_streams.tts_priority() == cuda_streams.TTS_PRIORITY
    monkeypatch.setenv(cuda_streams.TTS_PRIORITY_ENV, " -1 ")
    assert cuda_streams.tts_priority() == -1
    recorder = _Recorder()
    monkeypatch.setattr(cuda_streams, "thread_stream", recorder)
    session = Session("t2", _Face(recorder), _Voice(recorder), StageMetrics())
    try:
        utterance = session.say("hello there")
        end = time.perf_counter() + 10
        while utterance.state not in ("done", "failed") and time.perf_counter() < end:
            time.sleep(0.02)
    finally:
        session.close()
    assert ("cuda:5", -1, cuda_streams.TTS_ROLE) in [call[:3] for call in recorder.calls]
    monkeypatch.setenv(cuda_streams.TTS_PRIORITY_ENV, "high")
    with pytest.raises(ValueError, match=cuda_streams.TTS_PRIORITY_ENV):
        cuda_streams.tts_priority()
    with pytest.raises(ValueError, match=cuda_streams.TTS_PRIORITY_ENV):  # a server refuses it at start
        SessionManager(_Face(recorder), _Voice(recorder))


def test_serve_refuses_a_bad_tts_priority_before_any_model_loads(capsys, data_dir, monkeypatch):
    from digital_human.cli import main

    monkeypatch.setenv(cuda_streams.TTS_PRIORITY_ENV, "urgent")
    code = main(["serve", "--base-voice", "auto", "--face", str(data_dir / "image" / "face_01_female.jpg")])
    err = capsys.readouterr().err
    assert code == 2 and f"{cuda_streams.TTS_PRIORITY_ENV}='urgent'" in err, err[-400:]


def test_serve_refuses_bad_flow_kernels_before_any_model_loads(capsys, data_dir, monkeypatch):
    from digital_human.cli import main
    from digital_human.engines.cosyvoice.engine import FLOW_KERNELS_ENV

    monkeypatch.setenv(FLOW_KERNELS_ENV, "fused,turbo")
    code = main(["serve", "--engine", "cosyvoice2", "--base-voice", "auto",
                 "--face", str(data_dir / "image" / "face_01_female.jpg")])
    err = capsys.readouterr().err
    assert code == 2 and FLOW_KERNELS_ENV in err and "turbo unknown" in err, err[-400:]
