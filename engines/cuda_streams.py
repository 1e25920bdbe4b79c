"""CUDA streams other than the default one for the live server's stages: a session's TTS and talking-head threads,
and the batched talking-head step, queue their device work on streams of their own instead of the default stream.

Why: every thread of a process starts on the default stream, and the device runs one stream's work in order. A
live session's TTS thread queues its next pieces' work (LM steps, the flow's CUDA-graph replays of 50-80 ms, HiFT)
while its talking-head thread needs a few milliseconds of whisper and UNet work for the first frame; on one stream
that frame's work queues behind what the TTS queued before it (the likely cause of 169 ms from the first TTS piece to
the first frame on an H200, 2026-12-03, for a 4-frame step of a few ms; benchmarks/gpu_live.py --face-profile
measures both ways). On streams of their own the two run side by side, and the talking
head's streams get a higher priority (its frames have deadlines; a later TTS piece has the slack of the speech
already made).

What a thread must still do itself: a tensor made on one stream and used on another needs the other to wait for it
(an event, or wait_stream) and, if it is freed while that use may still be queued, `record_stream`; the live stages
hand each other host data only (numpy pieces and frames), and the call batcher synchronises its callers' rows.

One stream per role, not one per thread (`role`): cuBLAS keeps a workspace (up to 32 MB on a Hopper GPU) per
(thread's handle, stream) pair and never frees it, and torch hands streams out round-robin from a pool of 32 per
priority, so a new stream for every session's threads would let a long-running server's workspaces grow with the
sessions it has served (render_video's paste stream is one per device for the same reason). The live TTS calls are
serialised by the voice's lock, so one TTS stream loses nothing - except with TTS lanes (serve --tts-lanes), whose
calls run at the same time: lane k > 0 has a stream of its own (tts_lane_role); the sessions' talking-head threads share one
high-priority stream for their few milliseconds of whisper work and copies (the batched model step runs on the
call batcher's own stream).

Off switch: DIGITAL_HUMAN_LIVE_STREAMS=0 keeps every thread on its current (default) stream, as before (the A/B of
benchmarks/gpu_live.py --face-profile). Nothing here imports torch unless a CUDA device is named.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any

log = logging.getLogger("digital_human.engines")
STREAMS_ENV = "DIGITAL_HUMAN_LIVE_STREAMS"  # "0": no streams of their own (every stage on the default stream)
FACE_PRIORITY = -1  # the talking head's streams (frames have deadlines); lower numbers run first
TTS_PRIORITY = 0    # CUDA's default, the lowest
FACE_ROLE, TTS_ROLE = "live-face", "live-tts"
# An integer: the TTS streams' priority instead of TTS_PRIORITY (lower runs first; torch clamps it to the device's
# range). For A/B runs of benchmarks/gpu_live.py (--tts-priority): a first piece has no slack, and under 8 sessions
# its thousands of small kernels may wait behind the talking head's large ones. Unset: TTS_PRIORITY, as measured.
TTS_PRIORITY_ENV = "DIGITAL_HUMAN_LIVE_TTS_PRIORITY"


def tts_priority() -> int:
    """The TTS streams' priority: TTS_PRIORITY_ENV when set (a whole number, else refused naming it), else
    TTS_PRIORITY. Read at each call: the streams are made at a stage's first call."""
    raw = os.environ.get(TTS_PRIORITY_ENV, "").strip()
    if not raw:
        return TTS_PRIORITY
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{TTS_PRIORITY_ENV}={raw!r}: give a whole number (0 = CUDA's lowest priority, -1 = the "
                         "talking head's), or leave it unset") from None


class ReplayOrder:
    """One owner's CUDA-graph calls one at a time, also on the device (FastCFM, HiftGraphs, FastEncoder: graphs that
    share a memory pool and static inputs). The lock orders the calls' queueing only: callers on different streams
    (the live stages' threads each have one) would have their copy-in, replay and copy-out run side by side on the
    device over the same buffers, so each call's stream first waits for the event recorded after the previous
    call's copy-out. Off CUDA only the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._done: Any = None  # the event after the previous call's copy-out

    @contextlib.contextmanager
    def turn(self, device: Any):
        """Hold the lock; on a CUDA `device` the current stream waits for the previous call, and an event marks the
        end of this one's work (queued within the block) when the block ends without an error."""
        with self.lock:
            stream = None
            if getattr(device, "type", None) == "cuda":
                import torch

                stream = torch.cuda.current_stream(device)
                if self._done is not None:
                    stream.wait_event(self._done)  # the previous call's copy-out, whatever stream it was queued on
            yield
            if stream is not None:
                import torch

                self._done = torch.cuda.Event()
                self._done.record(stream)


def tts_lane_role(lane: int) -> str:
    """The stream role of TTS lane `lane`: lane 0 is the TTS stage's own stream (TTS_ROLE), each other lane one more,
    so that lanes' device work runs side by side instead of in one stream's order."""
    return TTS_ROLE if lane <= 0 else f"{TTS_ROLE}-{int(lane)}"


_ROLES: dict[tuple[str, int, str], Any] = {}  # (device type, index, role) -> its stream (or None: none could be made)
_ROLES_LOCK = threading.Lock()


def streams_enabled() -> bool:
    """Whether stage threads get streams of their own (read at each call: DIGITAL_HUMAN_LIVE_STREAMS=0 = no)."""
    return os.environ.get(STREAMS_ENV, "").strip() != "0"


def cuda_device_name(device: Any) -> str | None:
    """`device` (a string, a torch.device, or None) as a CUDA device string ("cuda", "cuda:1"), or None when it is
    not a CUDA device. Imports nothing."""
    if device is None:
        return None
    text = str(device)
    return text if text == "cuda" or text.startswith("cuda:") else None


def _cuda(device: Any) -> Any:
    """`device` as a torch.device when it names a usable CUDA device and streams are on, else None (torch is
    imported only for a CUDA name)."""
    name = cuda_device_name(device)
    if name is None or not streams_enabled():
        return None
    import torch

    return torch.device(name) if torch.cuda.is_available() else None


def new_stream(device: Any, priority: int = 0) -> Any:
    """A torch.cuda.Stream on `device` at `priority` (clamped to the device's range by torch), or None: not a CUDA
    device, CUDA unusable, streams switched off, or the stream could not be made (logged)."""
    try:
        dev = _cuda(device)
        if dev is None:
            return None
        import torch

        return torch.cuda.Stream(device=dev, priority=int(priority))
    except Exception as exc:  # noqa: BLE001 - no stream of its own is slower, never wrong
        log.warning("[digital_human] no CUDA stream of its own for this thread (%s); using the current one", exc)
        return None


def role_stream(device: Any, role: str, priority: int = 0) -> Any:
    """The process's one stream for `role` on `device` (made at the first call's `priority`), or None as new_stream."""
    try:
        dev = _cuda(device)
        if dev is None:
            return None
        import torch

        key = (dev.type, torch.cuda.current_device() if dev.index is None else dev.index, role)
    except Exception as exc:  # noqa: BLE001
        log.warning("[digital_human] no CUDA stream for %s (%s); using the current one", role, exc)
        return None
    with _ROLES_LOCK:
        if key not in _ROLES:
            _ROLES[key] = new_stream(f"cuda:{key[1]}", priority)
        return _ROLES[key]


def thread_stream(device: Any, priority: int = 0, role: str | None = None) -> contextlib.AbstractContextManager:
    """A context in which the calling thread's device work on `device` goes to a stream other than the default one:
    the process's stream for `role` (role_stream; the live stages: FACE_ROLE, TTS_ROLE), or without a role a new
    stream at `priority`. contextlib.nullcontext() when `device` is None or not CUDA, CUDA is unusable, or streams are
    switched off (DIGITAL_HUMAN_LIVE_STREAMS=0): the CPU path is unchanged."""
    stream = role_stream(device, role, priority) if role is not None else new_stream(device, priority)
    if stream is None:
        return contextlib.nullcontext()
    import torch

    return torch.cuda.stream(stream)


_CAPTURE_STREAMS: dict[str, set[int]] = {}  # device -> raw handles of the streams capture_stream gave out


def capture_stream(device: Any) -> Any:
    """A torch.cuda.Stream on CUDA `device` for one owner's CUDA-graph captures (a decoder's, a flow solver's, a
    compiled model's), not given to any other owner by this function; its warm-up runs should run on it too.

    Why: PyTorch (2.11 at least) keys cuBLAS's workspace by (the thread's handle, the current stream), and a captured
    GEMM keeps that workspace's address. torch.cuda.graph captures on one process-wide stream unless told otherwise,
    so every graph captured on one thread shared one workspace: two of them replayed at the same time on different
    streams (live mode's TTS lanes, or the TTS beside the talking head) write the same scratch memory - on an H200 two
    lanes at once gave other audio than each alone, and four hung (benchmarks/RESULTS_live.md, 2026-12-03; pytorch
    issue 193402 describes the shared workspace). torch hands streams out round-robin from a pool of 32 per priority,
    so this draws until it gets one not given out yet (both priorities: 64 owners a device); past that it reuses one,
    with a warning. Not subject to DIGITAL_HUMAN_LIVE_STREAMS: a capture always needs a stream of its own."""
    import torch

    dev = torch.device(device)
    index = torch.cuda.current_device() if dev.index is None else dev.index
    with _ROLES_LOCK:
        taken = _CAPTURE_STREAMS.setdefault(f"cuda:{index}", set())
        stream = None
        for priority in (0, -1):
            for _ in range(32):
                stream = torch.cuda.Stream(device=f"cuda:{index}", priority=priority)
                if stream.cuda_stream not in taken:
                    taken.add(stream.cuda_stream)
                    return stream
        log.warning("[digital_human] more than 64 CUDA-graph owners on cuda:%d: some share a capture stream (and its "
                    "cuBLAS workspace); do not replay their graphs at the same time", index)
        return stream


def release_capture_stream(stream: Any) -> None:
    """Give back a capture_stream once every graph captured on it is destroyed (destroying them freed its cuBLAS
    workspace; the next owner's warm-up makes a new one), so that an owner that comes and goes (an engine runner's
    graph per input shape) does not use up the 64."""
    with _ROLES_LOCK:
        for taken in _CAPTURE_STREAMS.values():
            taken.discard(getattr(stream, "cuda_stream", None))
