"""The clock's ticks as WebRTC tracks (aiortc: VP8 or H.264 video, Opus audio). Both tracks stamp their frames
from the tick's clock frame (video in 90 kHz, audio in samples), so the receiver's lip sync follows the one
media clock. ICE servers: none by default (loopback and LAN); a UDP port range may be set for firewalls."""
from __future__ import annotations

import asyncio
import logging
import random
from fractions import Fraction
from typing import Any

import numpy as np

log = logging.getLogger("digital_human.live")
TRACK_QUEUE = 8  # ticks a track may hold; a receiver that stalls loses ticks, never delays the clock


def ice_servers(urls: list[str]) -> list[Any]:
    from aiortc import RTCIceServer

    servers = []
    for url in urls:  # turn:user:password@host:port is written as turn://user:password@host:port
        if "@" in url and url.startswith(("turn:", "turns:")):
            scheme, rest = url.split(":", 1)
            cred, host = rest.lstrip("/").rsplit("@", 1)
            user, _, password = cred.partition(":")
            servers.append(RTCIceServer(urls=f"{scheme}:{host}", username=user, credential=password))
        else:
            servers.append(RTCIceServer(urls=url))
    return servers


def limit_udp_ports(loop: asyncio.AbstractEventLoop, low: int, high: int) -> None:
    """ICE binds its UDP sockets to port 0 (any); make those binds take a free port in low..high instead.
    Only datagram endpoints asking for port 0 are changed (the server itself speaks TCP)."""
    original = loop.create_datagram_endpoint

    async def create_datagram_endpoint(factory, local_addr=None, **kwargs):  # type: ignore[no-untyped-def]
        if local_addr is None or local_addr[1] != 0:
            return await original(factory, local_addr=local_addr, **kwargs)
        ports = list(range(low, high + 1))
        random.shuffle(ports)
        last: OSError | None = None
        for port in ports:
            try:
                return await original(factory, local_addr=(local_addr[0], port), **kwargs)
            except OSError as exc:
                last = exc
        raise OSError(f"no free UDP port in --udp-ports {low}-{high}: {last}")

    loop.create_datagram_endpoint = create_datagram_endpoint  # type: ignore[method-assign]


def make_tracks(loop: asyncio.AbstractEventLoop, rate: int, samples_per_frame: int) -> tuple[Any, Any, Any]:
    """(video track, audio track, output(tick) for Session.add_output) fed from the session's clock thread."""
    import av
    from aiortc import MediaStreamTrack

    class _Track(MediaStreamTrack):
        def __init__(self, kind: str) -> None:
            super().__init__()
            self.kind = kind
            self.queue: asyncio.Queue = asyncio.Queue(maxsize=TRACK_QUEUE)

        def offer(self, item: Any) -> None:
            if self.readyState != "live":
                return
            if self.queue.full():  # drop the oldest: the receiver stalled
                self.queue.get_nowait()
            self.queue.put_nowait(item)

    class VideoTrack(_Track):
        def __init__(self) -> None:
            super().__init__("video")

        async def recv(self) -> Any:
            index, frame = await self.queue.get()
            out = av.VideoFrame.from_ndarray(frame, format="rgb24")
            out.pts, out.time_base = index * samples_per_frame * 90000 // rate, Fraction(1, 90000)
            return out

    class AudioTrack(_Track):
        def __init__(self) -> None:
            super().__init__("audio")

        async def recv(self) -> Any:
            index, pcm = await self.queue.get()
            out = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
            out.sample_rate, out.pts, out.time_base = rate, index * samples_per_frame, Fraction(1, rate)
            return out

    video, audio = VideoTrack(), AudioTrack()

    def output(tick: Any) -> None:
        frame, pcm = np.ascontiguousarray(tick.frame), np.asarray(tick.audio, np.int16)
        loop.call_soon_threadsafe(video.offer, (tick.index, frame))
        loop.call_soon_threadsafe(audio.offer, (tick.index, pcm))
    return video, audio, output
