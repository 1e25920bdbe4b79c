"""A Python client of the live server's websocket: opens a session, decodes the fragmented MP4 as it arrives
(PyAV), and keeps each decoded video frame and audio block with its media time and arrival time. Tests and
benchmarks/live.py measure from what it decodes, not from what the server says it sent."""
from __future__ import annotations

import asyncio
import io
import json
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


class _Pipe(io.RawIOBase):
    """A blocking read end for the decoder, fed by the websocket (not seekable: the demuxer streams)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._cv = threading.Condition()
        self._eof = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def feed(self, data: bytes) -> None:
        with self._cv:
            self._buf += data
            self._cv.notify_all()

    def end(self) -> None:
        with self._cv:
            self._eof = True
            self._cv.notify_all()

    def readinto(self, b) -> int:  # type: ignore[override]
        with self._cv:
            while not self._buf and not self._eof:
                self._cv.wait()
            n = min(len(b), len(self._buf))
            b[:n] = self._buf[:n]
            del self._buf[:n]
            return n


@dataclass
class Decoded:
    video: list[tuple[float, float, np.ndarray]] = field(default_factory=list)  # (media s, arrival perf s, rgb)
    audio: list[tuple[float, float, np.ndarray]] = field(default_factory=list)  # (media s, arrival, float32 mono)
    events: list[dict[str, Any]] = field(default_factory=list)                   # speech_start/end, with arrival
    init: dict[str, Any] = field(default_factory=dict)


def http(base: str, method: str, path: str, body: Any = None, timeout: float = 30.0) -> tuple[int, dict[str, Any]]:
    """(status, JSON) of one API call; errors are answers too (status >= 400)."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


class LiveClient:
    """Connects to session `sid`'s websocket on its own thread; `decoded` fills as media arrives.
    keep_frames: keep the RGB pixels (else only the `on_video(media_s, arrival, rgb)` callback sees them); a video
    frame's record (media time, arrival) is kept either way."""

    def __init__(self, base: str, sid: str, *, keep_frames: bool = True,
                 on_video: Callable[[float, float, np.ndarray], None] | None = None,
                 on_audio: Callable[[float, float, np.ndarray], None] | None = None, keep_audio: bool = True,
                 audio: str = "opus") -> None:
        """keep_audio=False: decoded audio blocks go only to `on_audio` (a long stream's measurement keeps its own
        summary instead of every sample). audio: the stream's audio codec ("opus" or "aac"); decoded audio is
        given at the session's sample rate either way (Opus decodes at 48 kHz: resampled here)."""
        self.base, self.sid, self.keep_frames, self.on_video = base, sid, keep_frames, on_video
        self.audio = audio
        self.on_audio, self.keep_audio = on_audio, keep_audio
        self.decoded = Decoded()
        self.lock = threading.Lock()
        self._pipe = _Pipe()
        self._loop = asyncio.new_event_loop()
        self._closing: asyncio.Event | None = None
        self.connected = threading.Event()
        self.error: BaseException | None = None
        self._net = threading.Thread(target=self._run_net, daemon=True)
        self._dec = threading.Thread(target=self._run_decoder, daemon=True)
        self._net.start()
        self._dec.start()
        if not self.connected.wait(30):
            raise TimeoutError(f"no websocket connection to {base} session {sid}: {self.error}")

    def _run_net(self) -> None:
        import aiohttp

        async def main() -> None:
            self._closing = asyncio.Event()
            url = self.base.replace("http", "ws", 1) + f"/sessions/{self.sid}/ws?audio={self.audio}"
            async with aiohttp.ClientSession() as client, client.ws_connect(url, max_msg_size=0) as ws:
                self._ws = ws
                self.connected.set()
                reader = asyncio.ensure_future(self._read(ws))
                closing = asyncio.ensure_future(self._closing.wait())
                await asyncio.wait([reader, closing], return_when=asyncio.FIRST_COMPLETED)
                reader.cancel()
                await ws.close()

        try:
            self._loop.run_until_complete(main())
        except BaseException as exc:  # noqa: BLE001
            self.error = exc
            self.connected.set()
        finally:
            self._pipe.end()

    async def _read(self, ws: Any) -> None:
        import aiohttp

        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                self._pipe.feed(msg.data)
            elif msg.type == aiohttp.WSMsgType.TEXT:
                event = json.loads(msg.data)
                event["arrival"] = time.perf_counter()
                with self.lock:
                    if event.get("type") == "init":
                        self.decoded.init = event
                    else:
                        self.decoded.events.append(event)

    def send(self, message: dict[str, Any]) -> None:
        asyncio.run_coroutine_threadsafe(self._ws.send_json(message), self._loop).result(10)

    def _run_decoder(self) -> None:
        import av

        try:
            container = av.open(self._pipe, format="mp4", options={"probesize": "32", "analyzeduration": "0"},
                                buffer_size=4096)
            resampler = None
            for packet in container.demux():
                for frame in packet.decode():
                    now = time.perf_counter()
                    t = float(frame.pts * frame.time_base) if frame.pts is not None else float("nan")
                    if isinstance(frame, av.VideoFrame):
                        rgb = frame.to_ndarray(format="rgb24")
                        if self.on_video is not None:
                            self.on_video(t, now, rgb)
                        with self.lock:
                            self.decoded.video.append((t, now, rgb if self.keep_frames else None))
                    else:
                        with self.lock:
                            rate = int(self.decoded.init.get("sample_rate") or frame.sample_rate)
                        if frame.sample_rate != rate or frame.layout.nb_channels != 1:
                            # one resampler for the stream (it keeps its filter state between blocks); the block
                            # keeps the decoder's time stamp (the filter's delay is well under a millisecond)
                            if resampler is None:
                                resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
                            blocks = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
                            pcm = np.concatenate(blocks).astype(np.float32) if blocks else np.zeros(0, np.float32)
                        else:
                            pcm = frame.to_ndarray().astype(np.float32).reshape(-1)
                        if not pcm.size:  # the resampler's first block may be held back
                            continue
                        if self.on_audio is not None:
                            self.on_audio(t, now, pcm)
                        if self.keep_audio:
                            with self.lock:
                                self.decoded.audio.append((t, now, pcm))
        except Exception as exc:  # noqa: BLE001 - the stream ended mid-fragment when the client closed
            if self.error is None and not (self._closing and self._closing.is_set()):
                self.error = exc

    def wait_for(self, predicate: Callable[[Decoded], bool], timeout: float) -> bool:
        end = time.perf_counter() + timeout
        while time.perf_counter() < end:
            with self.lock:
                if predicate(self.decoded):
                    return True
            time.sleep(0.01)
        return False

    def speech_marks(self, utterance: int, timeout: float = 10.0) -> tuple[list[dict], list[dict], int]:
        """The stream's speech_start / speech_end events of one utterance, once its speech_end arrived (or after
        `timeout`), and the idle frames inside its speech (the ticks the clock showed idle between a speech_end
        and the next speech_start: the talking head or the TTS was late)."""
        self.wait_for(lambda d: any(e["type"] == "speech_end" and e["utterance"] == utterance for e in d.events),
                      timeout)
        with self.lock:
            events = [e for e in self.decoded.events if e.get("utterance") == utterance]
        starts = [e for e in events if e["type"] == "speech_start"]
        ends = [e for e in events if e["type"] == "speech_end"]
        late = sum(s["frame"] - e["frame"] for e, s in zip(ends, starts[1:]))
        return starts, ends, int(late)

    def close(self) -> None:
        if self._closing is not None:
            self._loop.call_soon_threadsafe(self._closing.set)
        self._net.join(10)
        self._dec.join(10)
