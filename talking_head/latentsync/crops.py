"""`latentsync` as a talking-head model of the shared driver (same contract as musetalk/portrait/clone).

Per reference frame r (its FaceAlign mesh): LatentSync's three points and smoothed affine to its face template
(geometry.py), chained over the reference video's frames in order as the reference does; the face is cut
from the source frame exactly as the reference cuts it. Output frames go through the UNet in windows of the
config's num_frames (16), in order, from one seeded generator (the reference's order of random draws: the
video's one noise, then per window the masked-image and reference latents' posterior samples). Each generated
face is restored as the reference's restore_img does, but into the track's aligned crop instead of the frame:
the crop (face pixels) and the paste weight go to the shared driver, whose paste into the frame is the
reference's blend (weight x face + (1 - weight) x frame). The paste weight's erosion and blur are sized from
the face's area in crop pixels (the reference: frame pixels; the same fraction of the face).

Memory: one or two windows' faces on the device, a few windows' crops on the host (streamed) and on a GPU one window
queued ahead (its faces cut while the model runs the window before it; see _Renderer._compute), the affines of the
reference frames (N x 2 x 3): flat in the video's length.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from ...engines.latentsync.files import LICENCE_NOTE
from ..driver import (GeneratedCrops, frame_schedule, output_frame_count, reference_warnings, validate_audio,
                      validate_track)

log = logging.getLogger("digital_human.latentsync")
MODEL_NAME = "latentsync"
BACKENDS = ("auto", "torch", "onnxruntime", "tensorrt")
PRECISIONS = ("auto", "fp32", "fp16", "bf16")
# The settings (`steps`, `guidance`, `deepcache`: the node's inputs, the CLI's --set) and their variables, which
# win when set (a deployment can force them without editing workflows; the report says so)
STEPS_ENV = "DIGITAL_HUMAN_LATENTSYNC_STEPS"      # inference_steps (reference: 20; its README: 20-50)
GUIDANCE_ENV = "DIGITAL_HUMAN_LATENTSYNC_GUIDANCE"  # guidance_scale (reference: 1.5; its README: 1.0-3.0)
CACHE_ENV = "DIGITAL_HUMAN_LATENTSYNC_DEEPCACHE"    # 0 = exact; n > 1: the DeepCache-style faster mode (pipeline.py)
RANGES = {"steps": (1, 200), "guidance": (1.0, 10.0), "deepcache": (0, 10)}


def resolve_runtime(backend: str, precision: str) -> tuple[str, str, list[str]]:
    """(device, precision, notes): torch on CUDA when there is one (FP16 by default, as the reference), else CPU FP32."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    from ...engines.devices import torch_cuda_usable

    notes = []
    if backend in ("onnxruntime", "tensorrt"):
        notes.append(f"LatentSync runs on torch; backend {backend!r} is not wired for it")
    device = "cuda" if torch_cuda_usable() else "cpu"
    if precision == "auto":
        precision = "fp16" if device == "cuda" else "fp32"
    if device == "cpu" and precision != "fp32":
        notes.append(f"{precision} on the CPU is slower than FP32; running FP32")
        precision = "fp32"
    for note in notes:
        log.warning("[digital_human] %s", note)
    return device, precision, notes


def _env_number(name: str, low: float, high: float) -> float | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be within {low}-{high}, got {value}")
    return value


def resolve_setting(name: str, given: float | None, default: float, env: str) -> tuple[float, str | None]:
    """(value, note): the variable `env` when set (it wins; the note says it overrode a given value), else the
    given setting (checked against RANGES; None = `default`, the reference's)."""
    low, high = RANGES[name]
    forced = _env_number(env, low, high)
    if forced is not None:
        note = None if given is None or float(given) == forced else \
            f"{env}={forced:g} overrides the {name} setting {float(given):g}"
        return forced, note
    if given is None:
        return default, None
    try:
        value = float(given)
    except (TypeError, ValueError):
        raise ValueError(f"latentsync setting {name} must be a number, got {given!r}") from None
    if not low <= value <= high:
        raise ValueError(f"latentsync setting {name} must be within {low:g}-{high:g}, got {value:g}")
    return value, None


WINDOWS_AHEAD = 1  # windows queued on a GPU beyond the one being restored (0: one window at a time)
_POOL: Any = None
_PREP: Any = None
_DENOISE: Any = None


def _pool() -> Any:
    """The renderer's worker threads for the per-frame warps (shared by the process)."""
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="latentsync-warp")
    return _POOL


def windows_ahead(device: Any) -> int:
    """Windows to queue ahead on `device`: WINDOWS_AHEAD on CUDA, where the CPU work of a window overlaps the GPU's
    denoising of the next; 0 on the CPU, where both would share the same cores (and a window queued ahead of a
    render that failed would hold the process for as long as a CPU window takes)."""
    return WINDOWS_AHEAD if getattr(device, "type", str(device)) == "cuda" else 0


class _HostCopy:
    """A window's generated faces on their way to the host. On CUDA the copy goes into pinned memory, queued behind
    the window's work, so the denoise thread starts the next window at once: the device no longer idles between
    windows while this copy and the next window's set-up run on the host. `get` waits for it; half precision is
    copied as is and widened on the host (exact, and half the bytes)."""

    def __init__(self, out: Any, started: float) -> None:
        import torch

        self.started = started
        self.event = None
        self.host = out
        if out.is_cuda:
            self.host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
            self.host.copy_(out, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()

    def get(self) -> Any:
        if self.event is not None:
            self.event.synchronize()
        return self.host.float()


def _single(name: str) -> Any:
    """One worker thread of the process (`prep` cuts windows' faces; `denoise` runs windows on the model in the
    order they were asked for: the draws of a video's generator are a sequence)."""
    global _PREP, _DENOISE
    from concurrent.futures import ThreadPoolExecutor

    if name == "prep":
        _PREP = _PREP or ThreadPoolExecutor(max_workers=1, thread_name_prefix="latentsync-prep")
        return _PREP
    _DENOISE = _DENOISE or ThreadPoolExecutor(max_workers=1, thread_name_prefix="latentsync-denoise")
    return _DENOISE


class _Renderer:
    """Generated crops and paste weights of output frames on demand, window by window in order."""

    def __init__(self, pipe: Any, track: Any, idx: np.ndarray, features: Any, fps: float, seed: int,
                 should_stop: Callable[[], bool] | None, timings: dict[str, float], keep_windows: int = 4):
        from .geometry import smoothed_affines, three_points

        self.pipe, self.track, self.idx, self.features, self.fps = pipe, track, idx, features, fps
        self.seed, self.should_stop, self.timings = seed, should_stop, timings
        self.res = pipe.net.resolution
        self.win = pipe.net.num_frames
        self.size = track.crop_size
        # the reference chains its smoothing over the video's frames in order, once (before any looping)
        pts = np.stack([three_points(track.landmarks[r]) for r in range(len(track))])
        self.affines = smoothed_affines(pts, self.res)   # source -> face box
        self._windows: OrderedDict[int, tuple[np.ndarray, list[np.ndarray]]] = OrderedDict()
        self._keep = keep_windows
        self._masks: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()
        self._ahead: dict[int, Any] = {}  # window -> future of (refs, _HostCopy of its generated faces)
        self._windows_total = -(-len(idx) // self.win)
        self._restart()

    def _restart(self) -> None:
        import torch

        self._drain()
        self.generator = torch.Generator(device="cpu").manual_seed(int(self.seed))
        self.noise = self.pipe.initial_noise(self.generator)
        self.next_window = 0

    def _drain(self) -> None:
        """Let the windows launched ahead finish (they draw from the generator) and forget them."""
        ahead, self._ahead = getattr(self, "_ahead", {}), {}
        for future in ahead.values():
            try:
                future.result()
            except BaseException:  # noqa: BLE001 - an unread window ahead; its error is not this caller's
                pass

    def crop_affine(self, r: int) -> np.ndarray:
        """crop -> face box: the face box affine after the inverse of the track's source -> crop affine."""
        a = np.eye(3)
        a[:2] = np.asarray(self.track.affines[r], np.float64)
        m = np.eye(3)
        m[:2] = self.affines[r]
        return (m @ np.linalg.inv(a))[:2]

    def _support(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """(paste weight float32 [S, S], support bool [S, S]) of reference frame r (a function of its affine only)."""
        hit = self._masks.get(r)
        if hit is None:
            from .geometry import paste_weight

            soft, support = paste_weight(self.crop_affine(r), (self.size, self.size), self.res)
            hit = self._masks[r] = (soft, (support > 0)[..., None])
            while len(self._masks) > 64:  # S x S x 5 bytes each: 84 MB at a 512 crop
                self._masks.popitem(last=False)
        return hit

    def mask(self, r: int) -> np.ndarray:
        with self._lock:
            return self._support(int(r))[0]

    def _window(self, w: int) -> list[np.ndarray]:
        """Crops (uint8 [S, S, 3]) of window w's output frames, computing windows in order up to it."""
        hit = self._windows.get(w)
        if hit is not None:
            return hit[1]
        if w < self.next_window:  # evicted: the draws are a stream, so start it again (never in streaming order)
            self._restart()
        while self.next_window <= w:
            k = self.next_window
            crops = self._compute(k)
            self._windows[k] = (np.arange(k * self.win, k * self.win + len(crops)), crops)
            while len(self._windows) > self._keep:
                self._windows.popitem(last=False)
            self.next_window += 1
        return self._windows[w][1]

    def _prepare(self, k: int) -> tuple[list[int], np.ndarray, Any]:
        """(reference frames, uint8 faces cut for the model, audio windows) of window k: CPU work."""
        from ...engines.latentsync.audio import frame_windows
        from .geometry import face_crop

        t0 = time.perf_counter()
        lo, hi = k * self.win, min((k + 1) * self.win, len(self.idx))
        refs = [int(r) for r in self.idx[lo:hi]]
        # the per-frame warps are independent CPU work (torch and OpenCV release the GIL): a few threads
        faces = np.stack(list(_pool().map(
            lambda r: face_crop(np.asarray(self.track.frames[r]), self.affines[r], self.res), refs)))
        audio = frame_windows(self.features, range(lo, hi), self.fps, self.pipe.net.feat_length)
        self._add_time("faces", time.perf_counter() - t0)
        return refs, faces, audio

    def _denoise(self, k: int, prepared: Any) -> tuple[list[int], Any]:
        """Window k through the model (on the denoise thread, windows in order); the faces back on the host."""
        if self.should_stop is not None and self.should_stop():
            raise InterruptedError("stopped")
        refs, faces, audio = prepared.result()
        t0 = time.perf_counter()
        return refs, _HostCopy(self.pipe.window(faces, audio, self.noise, self.generator, keys=refs), t0)

    def _launch(self, k: int) -> None:
        """Queue window k (its faces cut on the prep thread, then the model on the denoise thread), once."""
        if k in self._ahead or not 0 <= k < self._windows_total:
            return
        prepared = _single("prep").submit(self._prepare, k)
        self._ahead[k] = _single("denoise").submit(self._denoise, k, prepared)

    def _add_time(self, key: str, seconds: float) -> None:
        self.timings[key] = self.timings.get(key, 0.0) + seconds  # (a float add under the GIL: threads may call)

    def _compute(self, k: int) -> list[np.ndarray]:
        """Window k's crops. The next window is queued before this one's faces are restored: the model runs it
        while this thread (and the caller, pasting into the frames) does the CPU work of this one, and its
        faces are cut while this one denoises. One window ahead at most: one more window's faces on the host, and
        on a GPU two windows' work queued at most (the denoise thread queues the next one without waiting for the
        one running: pipeline.upload)."""
        import torch

        from .geometry import face_back

        if self.should_stop is not None and self.should_stop():
            raise InterruptedError("stopped")
        for j in range(windows_ahead(self.pipe.net.device) + 1):
            self._launch(k + j)
        refs, pending = self._ahead.pop(k).result()
        out = pending.get()
        self._add_time("unet", time.perf_counter() - pending.started)  # a window's start to its faces on the host
        t2 = time.perf_counter()
        for r in refs:  # the paste masks are cached per reference frame: made once, outside the threads
            self._support(r)

        def crop(j: int) -> np.ndarray:
            r = refs[j]
            base = np.asarray(self.track.crops[r], np.uint8)
            face = face_back(out[j], self.crop_affine(r), base.shape[:2], self.res).permute(1, 2, 0).to(torch.uint8)
            return np.where(self._masks[r][1], face.numpy(), base)

        crops = list(_pool().map(crop, range(len(refs))))
        self._add_time("faces", time.perf_counter() - t2)
        return crops

    def render(self, start: int, stop: int) -> tuple[np.ndarray, None]:
        with self._lock:
            out = np.empty((stop - start, self.size, self.size, 3), np.uint8)
            for i in range(start, stop):
                out[i - start] = self._window(i // self.win)[i % self.win]
            return out, None


def latentsync_crops(track, audio: np.ndarray, sample_rate: int, fps: float | None = None, *,
                     loop_mode: str = "ping-pong", batch_size: int = 0, backend: str = "auto", precision: str = "auto",
                     max_audio_seconds: float = 600.0, progress: Callable[[int, int], None] | None = None,
                     should_stop: Callable[[], bool] | None = None, streaming: bool = False, seed: int = 1247,
                     models_root: Any = None, steps: int | None = None, guidance: float | None = None,
                     deepcache: int | None = None, compile: bool = False) -> GeneratedCrops:
    """LatentSync's crop for every output frame (no paste-back yet); arguments as musetalk_crops.
    batch_size: unused (the window is the config's num_frames, 16: the temporal layers see that many frames).
    seed: the generator of the noise and the VAE posterior draws (the reference's default: 1247).
    steps / guidance / deepcache: DDIM steps (1-200), guidance scale (1-10) and the DeepCache-style cache
    interval (0 = exact, 2-10); None = the reference's 20 / 1.5 / 0; DIGITAL_HUMAN_LATENTSYNC_STEPS / _GUIDANCE /
    _DEEPCACHE, when set, win over them (said in the warnings). compile: the fast path (pipeline.py; CUDA only).
    Raises LatentSyncFilesError (every missing file) before any work, ValueError for a setting out of range."""
    from ...engines.latentsync.audio import whisper_features
    from ...engines.latentsync.files import locate
    from ...engines.latentsync.pipeline import GUIDANCE, STEPS, LatentSyncPipeline, cached_networks
    from ...engines.musetalk.audio import resample_16k

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    locate(models_root)  # the files first: the clearest error
    validate_track(track)
    wave = validate_audio(audio, sample_rate, max_audio_seconds)
    notes: list[str] = []
    values = {}
    for name, given, default, env in (("steps", steps, STEPS, STEPS_ENV), ("guidance", guidance, GUIDANCE, GUIDANCE_ENV),
                                      ("deepcache", deepcache, 0, CACHE_ENV)):
        values[name], note = resolve_setting(name, given, default, env)
        if note:
            notes.append(note)
    if values["steps"] != int(values["steps"]) or values["deepcache"] != int(values["deepcache"]):
        raise ValueError(f"latentsync settings steps and deepcache are whole numbers, got {values['steps']:g} and "
                         f"{values['deepcache']:g}")
    steps, guidance, cache_interval = int(values["steps"]), float(values["guidance"]), int(values["deepcache"])
    if cache_interval == 1:
        cache_interval = 0  # a full UNet every step: the exact pipeline
    device, prec, runtime_notes = resolve_runtime(backend, precision)
    notes += runtime_notes
    net = cached_networks(device, prec, models_root)
    timings["load"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    fps = float(fps) if fps and fps > 0 else float(track.fps)
    n_out = output_frame_count(len(wave) / float(sample_rate), fps)
    idx = frame_schedule(len(track), n_out, loop_mode, track.fps, fps)
    features = whisper_features(net.whisper, resample_16k(wave, int(sample_rate)))
    timings["audio"] = time.perf_counter() - t1

    pipe = LatentSyncPipeline(net, steps=steps, guidance=guidance, cache_interval=cache_interval, compile=compile)
    mode = f", DeepCache-style faster mode (interval {cache_interval}; not the exact frames)" if cache_interval > 1 else ""
    fast = ", compiled fast path" if pipe.fast is not None else ""
    if pipe.compile_note:
        notes.append(pipe.compile_note)
    version = getattr(net.files, "version", "")
    warnings = list(notes) + [f"LatentSync {version} at {net.resolution}x{net.resolution}, {steps} DDIM steps, "
                              f"guidance {guidance:g}, seed {seed}{mode}{fast}"] + \
        reference_warnings(track, idx, n_out, fps, loop_mode)
    renderer = _Renderer(pipe, track, idx, features, fps, seed, should_stop, timings)
    gen = GeneratedCrops(track=track, idx=idx, fps=fps, crops=None, masks={}, model=MODEL_NAME,
                         backend=f"torch-{device} {prec}", timings=timings, warnings=warnings,
                         render=renderer.render, mask_of=renderer.mask, renders_landmarks=False)
    return gen.finished(streaming, progress, should_stop, batch=net.num_frames)


DESCRIPTION = f"LatentSync lip-sync: {LICENCE_NOTE}."
