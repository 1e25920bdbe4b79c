"""`digital-human serve` on loopback (CPU: Kokoro + portrait on a 256-px photo): a Python client opens sessions
over the websocket, decodes the fragmented MP4 it receives (PyAV) and checks what it decoded: speech arrives
with moving lips, audio and lips agree within a frame, interrupt returns to idle, two sessions stream at once,
bad input gets clear errors and the server keeps serving. Needs the [live] extra (aiohttp, av; aiortc)."""
from __future__ import annotations

import argparse
import time

import numpy as np
import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("av")

RATE, SPF = 24000, 960
INNER_LIPS = [78, 95, 88, 178, 87, 14, 317, 402, 318, 324, 308, 191, 80, 81, 82, 13, 312, 311, 310, 415]


@pytest.fixture(scope="module")
def live(setup_models, data_dir):
    from digital_human.pipeline.live.run import add_serve_arguments, build_live
    from digital_human.pipeline.live.server import LiveServer, RunningServer

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["--base-voice", "auto", "--face", str(data_dir / "image" / "face_01_female.jpg"),
                              "--max-side", "256", "--max-sessions", "3"])
    manager = build_live(args)
    server = RunningServer(LiveServer(manager))
    yield server.url, manager
    server.stop()


def _open(url):
    from digital_human.pipeline.live.client import LiveClient, http

    status, body = http(url, "POST", "/sessions")
    assert status == 201, body
    client = LiveClient(url, body["id"])
    assert client.wait_for(lambda d: len(d.video) >= 3, 20), f"no idle frames decoded: {client.error}"
    return body["id"], client


def _state_becomes(url: str, sid: str, state: str, which: int = 0, timeout: float = 5.0) -> bool:
    from digital_human.pipeline.live.client import http

    end = time.perf_counter() + timeout
    while time.perf_counter() < end:
        if http(url, "GET", f"/sessions/{sid}")[1]["utterances"][which]["state"] == state:
            return True
        time.sleep(0.05)
    return False


def _mouth_signal(frames: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
    """Mean darkness of the inner-lip box per frame: rises as the mouth opens (the photo's mouth is closed)."""
    pts = np.asarray(landmarks)[INNER_LIPS, :2]
    x0, y0 = (pts.min(0) - 2).astype(int)
    x1, y1 = (pts.max(0) + 3).astype(int)
    return -frames[:, y0:y1, x0:x1].astype(np.float32).mean(axis=(1, 2, 3))


def _audio_track(decoded) -> np.ndarray:
    """The decoded audio placed at its media times (a tick the server dropped for a slow client is a gap)."""
    if not decoded.audio:
        return np.zeros(0, np.float32)
    end = max(int(round(t * RATE)) + len(pcm) for t, _, pcm in decoded.audio)
    out = np.zeros(end, np.float32)
    for t, _, pcm in decoded.audio:
        s = int(round(t * RATE))
        out[s:s + len(pcm)] = pcm
    return out


def _envelope(audio: np.ndarray, times: np.ndarray) -> np.ndarray:
    """RMS of the audio shown with each video frame (media time t .. t + 1 frame)."""
    out = np.zeros(len(times))
    for i, t in enumerate(times):
        s = int(round(t * RATE))
        if 0 <= s and s + SPF <= len(audio):
            out[i] = np.sqrt(np.mean(audio[s:s + SPF] ** 2))
    return out


def _lag_ms(mouth: np.ndarray, envelope: np.ndarray, max_lag: int = 6) -> float:
    """Lag of the mouth behind the sound (ms, + = mouth late) at the cross-correlation peak, to a sub-frame."""
    a = (mouth - mouth.mean()) / (mouth.std() + 1e-9)
    b = (envelope - envelope.mean()) / (envelope.std() + 1e-9)
    n = len(a)
    cc = []
    for lag in range(-max_lag, max_lag + 1):
        i = np.arange(max(0, -lag), min(n, n - lag))
        cc.append(float(np.mean(a[i + lag] * b[i])))
    k = int(np.argmax(cc))
    frac = 0.0
    if 0 < k < len(cc) - 1:  # parabola through the peak and its neighbours
        den = cc[k - 1] - 2 * cc[k] + cc[k + 1]
        frac = 0.5 * (cc[k - 1] - cc[k + 1]) / den if den else 0.0
    return (k - max_lag + frac) * 1000.0 * SPF / RATE


def test_speech_arrives_with_lips_in_sync(live):
    from digital_human.pipeline.live.client import http

    url, manager = live
    sid, client = _open(url)
    try:
        status, body = http(url, "POST", f"/sessions/{sid}/say", {"text": "Hello there, how are you today?"})
        assert status == 202 and body["utterance"] == 1
        assert client.wait_for(lambda d: any(e["type"] == "speech_end" for e in d.events), 60), client.decoded.events
        assert _state_becomes(url, sid, "done", timeout=30)
        last_end = [e["t"] for e in client.decoded.events if e["type"] == "speech_end"][-1]
        assert client.wait_for(lambda d: d.audio[-1][0] > last_end + 0.3 and d.video[-1][0] > last_end + 0.3, 10)
        with client.lock:
            video = [(t, f) for t, _, f in client.decoded.video]
            audio = _audio_track(client.decoded)
            start = next(e["t"] for e in client.decoded.events if e["type"] == "speech_start")
        times = np.array([t for t, _ in video])
        frames = np.stack([f for _, f in video])
        env = _envelope(audio, times)
        speaking = env > 0.05 * env.max()
        # the first frames with sound are at or after the clock's speech start, and before it all is silent
        assert speaking.any() and times[speaking].min() >= start - 1e-3
        assert env[times < start - 0.05].max(initial=0.0) < 1e-3
        mouth = _mouth_signal(frames, manager.face.track.landmarks[0])
        idle_level = np.median(mouth[times < start])
        assert mouth[speaking].max() > idle_level + 5.0, "the lips never open while the audio speaks"
        lag = _lag_ms(mouth, env)
        assert abs(lag) <= 40.0, f"mouth and sound are {lag:.0f} ms apart"
        status, metrics = http(url, "GET", "/metrics")
        assert {"tts_first_audio", "first_frame", "first_sent", "first_packet"} <= set(metrics["stages"])
        assert metrics["stages"]["first_frame"]["p50_ms"] >= metrics["stages"]["tts_first_audio"]["p50_ms"]
    finally:
        client.close()
        http(url, "DELETE", f"/sessions/{sid}")


def test_interrupt_returns_to_idle_within_200_ms(live):
    from digital_human.pipeline.live.client import http

    url, _ = live
    sid, client = _open(url)
    try:
        text = "This is a long answer that keeps on going. " * 4
        assert http(url, "POST", f"/sessions/{sid}/say", {"text": text})[0] == 202
        assert client.wait_for(lambda d: any(e["type"] == "speech_start" for e in d.events), 60)
        # let some speech arrive, then interrupt: the media time received so far is where it was cut
        assert client.wait_for(lambda d: len(d.audio) > 0 and d.audio[-1][0] > d.events[-1]["t"] + 0.4, 30)
        asked = time.perf_counter()
        assert http(url, "POST", f"/sessions/{sid}/interrupt")[0] == 200
        # (a host too slow for real time shows a gap mid-speech as idle too: the end after the request counts)
        after = lambda d: [e for e in d.events if e["type"] == "speech_end" and e["arrival"] >= asked]  # noqa: E731
        assert client.wait_for(lambda d: bool(after(d)), 10)
        end = after(client.decoded)[0]["t"]
        assert client.wait_for(lambda d: d.audio[-1][0] > end + 1.0, 10)
        with client.lock:
            audio = _audio_track(client.decoded)
            first_idle = min(arrival for t, arrival, _ in client.decoded.video if t >= end - 1e-3)
        # the first frame after the speech was decoded here within 200 ms of asking, and from it on all is silent
        assert first_idle - asked <= 0.2, f"idle came back {1000 * (first_idle - asked):.0f} ms after the interrupt"
        # (AAC's overlapping 1024-sample blocks smear the last speech over the next ~43 ms, faintly)
        assert np.abs(audio[int(round((end + 0.05) * RATE)):]).max() < 0.01, "sound after the interrupt"
        assert np.abs(audio[:int(round(end * RATE))]).max() > 0.05
        assert _state_becomes(url, sid, "interrupted")
    finally:
        client.close()
        http(url, "DELETE", f"/sessions/{sid}")


def test_two_sessions_stream_at_once(live):
    from digital_human.pipeline.live.client import http

    url, _ = live
    opened = [_open(url) for _ in range(2)]
    try:
        for sid, _ in opened:
            assert http(url, "POST", f"/sessions/{sid}/say", {"text": "Good morning."})[0] == 202
        for sid, client in opened:
            assert client.wait_for(lambda d: any(e["type"] == "speech_end" for e in d.events), 60), sid
            end = next(e["t"] for e in client.decoded.events if e["type"] == "speech_end")
            assert client.wait_for(lambda d: d.audio[-1][0] > end + 0.3, 10)
            with client.lock:
                audio = _audio_track(client.decoded)
                frames = len(client.decoded.video)
            assert np.abs(audio).max() > 0.05 and frames > 20
    finally:
        for sid, client in opened:
            client.close()
            http(url, "DELETE", f"/sessions/{sid}")


def test_bad_input_gets_clear_errors_and_the_server_keeps_serving(live):
    from digital_human.pipeline.live.client import http

    url, manager = live
    status, body = http(url, "POST", "/sessions/nope/say", {"text": "hi"})
    assert status == 404 and "no live session 'nope'" in body["error"]
    assert http(url, "DELETE", "/sessions/nope")[0] == 404
    sid, client = _open(url)
    try:
        status, body = http(url, "POST", f"/sessions/{sid}/say", {"text": "   "})
        assert status == 400 and "text is empty" in body["error"]
        status, body = http(url, "POST", f"/sessions/{sid}/say", {"text": "word " * 1000})
        assert status == 400 and "5000 characters" in body["error"] and "at most 2000" in body["error"]
        status, body = http(url, "POST", f"/sessions/{sid}/say", b"{not json")
        assert status == 400 and "not JSON" in body["error"]
        # capacity: 3 sessions at most; the 4th is refused with what to do
        others = [http(url, "POST", "/sessions")[1]["id"] for _ in range(2)]
        status, body = http(url, "POST", "/sessions")
        assert status == 503 and "at capacity (3 live sessions)" in body["error"]
        for other in others:
            assert http(url, "DELETE", f"/sessions/{other}")[0] == 200
        # the client disconnects mid-utterance: the speech stops cleanly, the server keeps serving
        assert http(url, "POST", f"/sessions/{sid}/say", {"text": "I will be cut off in the middle of this."})[0] == 202
        assert client.wait_for(lambda d: any(e["type"] == "speech_start" for e in d.events), 60)
    finally:
        client.close()
    assert _state_becomes(url, sid, "interrupted", -1)
    assert http(url, "GET", "/metrics")[0] == 200
    sid2, client2 = _open(url)  # a new client is served as before
    client2.close()
    for s in (sid, sid2):
        assert http(url, "DELETE", f"/sessions/{s}")[0] == 200
    assert not manager.sessions


def test_webrtc_client_receives_video_and_speech(live):
    """aiortc as the client: an offer (receive only) -> the server's answer -> decoded VP8/H.264 frames and Opus
    audio; speech comes through as sound."""
    pytest.importorskip("aiortc")
    import asyncio

    from aiortc import RTCPeerConnection, RTCSessionDescription

    from digital_human.pipeline.live.client import http

    url, _ = live
    status, body = http(url, "POST", "/sessions")
    assert status == 201
    sid = body["id"]

    async def main() -> tuple[tuple[int, int], float, float]:
        pc = RTCPeerConnection()
        pc.addTransceiver("video", direction="recvonly")
        pc.addTransceiver("audio", direction="recvonly")
        tracks: dict[str, object] = {}
        pc.on("track", lambda track: tracks.__setitem__(track.kind, track))
        await pc.setLocalDescription(await pc.createOffer())
        status, answer = await asyncio.to_thread(http, url, "POST", f"/sessions/{sid}/webrtc",
                                                 {"type": "offer", "sdp": pc.localDescription.sdp})
        assert status == 200, answer
        await pc.setRemoteDescription(RTCSessionDescription(**answer))
        for _ in range(200):
            if len(tracks) == 2:
                break
            await asyncio.sleep(0.05)
        video = await asyncio.wait_for(tracks["video"].recv(), 20)
        quiet = 0.0
        for _ in range(5):
            quiet = max(quiet, float(np.abs((await tracks["audio"].recv()).to_ndarray()).max()))
        assert (await asyncio.to_thread(http, url, "POST", f"/sessions/{sid}/say", {"text": "Hi there."}))[0] == 202
        loud, deadline = 0.0, time.perf_counter() + 40
        while loud < 3000 and time.perf_counter() < deadline:  # s16 Opus frames: speech peaks in the thousands
            loud = max(loud, float(np.abs((await asyncio.wait_for(tracks["audio"].recv(), 10)).to_ndarray()).max()))
        await pc.close()
        return (video.width, video.height), quiet, loud

    try:
        size, quiet, loud = asyncio.run(main())
    finally:
        http(url, "DELETE", f"/sessions/{sid}")
    assert size == (256, 256)
    assert quiet < 100 and loud >= 3000, (quiet, loud)
    status, body = http(url, "POST", f"/sessions/{sid}/webrtc", {"type": "answer"})
    assert status == 404
