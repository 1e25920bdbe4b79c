"""Sonic as a whole-frame talking-head model: the photo's face (FaceAlign's box, the reference's framing) and
the speech -> GeneratedFrames at the output clock (the model's 25 fps frames mapped by time, so the frame count
is the audio's: ceil(seconds x fps)). A video reference uses its first frame (said in the warnings)."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import numpy as np

from ..driver import GeneratedFrames, output_frame_count, paste_whole_frames, validate_audio, validate_track

log = logging.getLogger(__name__)
MODEL_FRAME_RATE = 25.0
_CACHE: dict[tuple, Any] = {}
_LOCK = threading.Lock()
VRAM_MODES = ("auto", "high", "low")


def _networks(device: str, dtype_name: str):
    """The release's networks, loaded once per (files, device, precision)."""
    import torch

    from ...engines.sonic.files import locate
    from ...engines.sonic.load import load_networks

    files = locate()
    key = (str(files.root), files.unet.stat().st_mtime_ns, device, dtype_name)
    with _LOCK:
        if key not in _CACHE:
            _CACHE.clear()  # one release in memory at a time (SVD-XT is ~4 GB in FP16)
            dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(dtype_name, torch.float32)
            _CACHE[key] = load_networks(files, device, dtype)
        return _CACHE[key]


def _device_and_precision(backend: str, precision: str) -> tuple[str, str]:
    from ...engines.devices import torch_cuda_usable

    cuda = torch_cuda_usable() and backend not in ("cpu", "onnxruntime-cpu")
    device = "cuda" if cuda else "cpu"
    if precision in ("fp16", "bf16") and cuda:
        return device, precision
    return device, "fp16" if (cuda and precision == "auto") else "fp32"


def _auto_vram(device: str) -> str:
    """high (the three guidance branches in one batch: 8.8 GiB peak at 512 px, FP16, H200-measured) when the GPU
    has room for it beside the networks, else low (one branch at a time: 4.9 GiB peak)."""
    if device != "cuda":
        return "high"
    import torch

    free, _total = torch.cuda.mem_get_info()
    return "high" if free > 14 * 2**30 else "low"


def sonic_frames(faces: Any, wave: Any, rate: int, fps: float, *, backend: str = "auto", precision: str = "auto",
                 max_audio_seconds: float = 600.0, progress: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, streaming: bool = False, steps: int = 25,
                 appearance_guidance: float = 2.0, audio_guidance: float = 7.5, dynamic_scale: float = 1.0,
                 seed: int = 72589, vram: str = "auto", paste_back: bool = False,
                 resolution: int = 512, speed: str = "reference", compile_unet: bool = False) -> GeneratedFrames:
    from .crop import frame_photo
    from .pipeline import SPEEDS, SonicFrames, SonicLatents, SonicSettings, resample_to_16k

    validate_track(faces)
    audio = validate_audio(wave, rate, max_audio_seconds)
    if vram not in VRAM_MODES:
        raise ValueError(f"vram must be one of {', '.join(VRAM_MODES)}, got {vram!r}")
    if speed not in SPEEDS:
        raise ValueError(f"speed must be one of {', '.join(SPEEDS)}, got {speed!r}")
    if not 1 <= int(steps) <= 200:
        raise ValueError(f"steps must be 1..200, got {steps}")
    if int(resolution) % 64 or not 128 <= int(resolution) <= 1024:
        raise ValueError(f"resolution must be a multiple of 64 in 128..1024, got {resolution}")
    warnings: list[str] = []
    found = np.flatnonzero(np.asarray(faces.found))
    ref = int(found[0])
    if len(faces) > 1:
        warnings.append(f"sonic animates one photo: the video reference's frame {ref} (its first with a face) is used")
    photo = np.asarray(faces.frames[ref])
    x0, y0, x1, y1 = (float(v) for v in faces.boxes[ref])
    t0 = time.perf_counter()
    device, prec = _device_and_precision(backend, precision)
    nets = _networks(device, prec)
    framing = frame_photo(photo, (x0, y0, x1, y1), short_side=int(resolution))
    if vram == "auto":
        vram = _auto_vram(device)
    settings = SonicSettings(steps=int(steps), appearance_guidance=float(appearance_guidance),
                             audio_guidance=float(audio_guidance), dynamic_scale=float(dynamic_scale),
                             seed=int(seed), resolution=int(resolution), vram=vram, speed=speed,
                             # a step's windows batched as far as the GPU has room; compiled: one window a call,
                             # so the compiled shapes do not depend on the clip's length (H200: 0.27 s a window
                             # either way, benchmarks/RESULTS_sonic.md)
                             window_batch=1 if (compile_unet and device == "cuda") else 0,
                             # several 8-frame VAE chunks a call as far as it has room; compiled: always four
                             # (the compiled decoder's one shape), vram low: one
                             decode_batch=(1 if vram == "low" else 4) if (compile_unet and device == "cuda") else 0)
    if compile_unet and device == "cuda":
        from ...engines.sonic.accelerate import fast_path

        done = fast_path(nets, decoder=vram != "low")
        if done:
            warnings.append(f"sonic fast path ({', '.join(done)}): compiled on this first run (torch.compile; "
                            "minutes once per process and shape); later runs reuse it")
    elif compile_unet:
        warnings.append("sonic: the fast path (compiled UNet) applies on CUDA only; running eager")
    latents = SonicLatents(nets, framing, resample_to_16k(audio, rate), settings, progress=progress,
                           should_stop=should_stop)
    settings = latents.settings  # speed="fast" / "fastest" resolved: its steps and deep-feature reuse
    if speed != "reference":
        warnings.append(f"sonic speed={speed}: {settings.steps} steps, deep UNet features reused every "
                        f"{settings.deep_cache_interval} steps (approximate; differs from the reference settings)")
    made = SonicFrames(latents)
    if made.count < 1:
        raise ValueError("the speech is shorter than one Sonic frame (0.08 s)")
    windows = -(-latents.count // 25)
    per_call = 1 if vram == "low" else latents._windows_per_call(windows, framing.image.shape[0] // 8,
                                                                 framing.image.shape[1] // 8)
    calls = settings.steps * -(-windows // per_call) * (3 if vram == "low" else 1)
    if device == "cpu":
        warnings.append(f"sonic on the CPU: {calls} UNet calls of 25 frames at {framing.image.shape[1]}x"
                        f"{framing.image.shape[0]}; with the full SVD-XT UNet that is minutes per call")
    n_out = output_frame_count(len(audio) / float(rate), fps)
    # output frame j shows the model's frame at its time (25 fps); the model stops a frame or two before the
    # audio ends (whole 80 ms steps), so the last frames hold
    src = np.minimum(np.floor(np.arange(n_out) * (MODEL_FRAME_RATE / fps) + 1e-6).astype(np.int64), made.count - 1)
    cx0, cy0, cx1, cy1 = framing.crop_box
    mh, mw = framing.image.shape[:2]
    if paste_back:
        size = photo.shape[:2]
        to_output = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    else:
        size = (mh, mw)
        sx, sy = mw / float(cx1 - cx0), mh / float(cy1 - cy0)
        to_output = np.array([[sx, 0.0, -cx0 * sx], [0.0, sy, -cy0 * sy]])
    cache: dict[int, np.ndarray] = {}

    def render(start: int, stop: int) -> np.ndarray:
        ks = src[start:stop]
        lo, hi = int(ks.min()), int(ks.max()) + 1
        for old in [k for k in cache if k < lo]:
            del cache[old]  # frames are asked for in order: only the range's own stay
        missing = [k for k in range(lo, hi) if k not in cache]
        if missing:  # one call for the range: RIFE middles in batches, VAE chunks several at a time
            a, b = missing[0], missing[-1] + 1
            for k, frame in zip(range(a, b), made.uint8(a, b)):
                cache[k] = frame
        frames = np.stack([cache[int(k)] for k in ks])
        return paste_whole_frames(photo, frames, framing.crop_box) if paste_back else frames

    if not streaming:
        latents.run()
    return GeneratedFrames(track=faces, fps=float(fps), count=n_out, size=tuple(size), render=render, model="sonic",
                           backend=f"torch-{device}-{prec}", to_output=to_output,
                           timings={"setup": time.perf_counter() - t0}, warnings=warnings,
                           notes={"unet_calls": calls, "model_frames": made.count})
