"""The face tracker's per-frame model calls with the frame on the GPU: one upload, one replay, one read-back.

Why: the tracker is sequential (each frame's mesh crop comes from the last frame's landmarks), so its calls
cannot be batched, and on an H200 each call was mostly overhead around a tiny network (FaceAlign 0.8-1.0 s for
a 10-s 512x512 clip, RESULTS.md): the crop region cut on the host and uploaded per call, its sampling
launched op by op, the outputs read back one by one. Here a frame is uploaded once (through a pinned buffer)
and kept on the device for all of that frame's calls, and each call is one CUDA graph of sampling + network
whose only inputs are that frame and a 2x3 map, with one packed read-back.

Same arithmetic as detect.py's device path (warp_torch) up to float rounding:
- detector: the letterbox region, pre-filter and sampling map depend on the frame size alone, so the graph
  holds exactly detect.detector_input's steps (same region, same avg-pool blocks, same grid);
- mesh: without a pre-filter (k = 1, the crop does not shrink the image 2x) sampling the whole frame equals
  sampling the cut region: the region holds every bilinear tap of the crop (detect.input_region adds 1 px
  round the crop), and where the region is clipped at the image edge, clamping to the region is clamping to
  the image. Only grid_sample's normalised coordinates are relative to the frame instead of the region
  (~1e-5 px). Crops that shrink the image 2x or more (a pre-filter aligned to the region's corner) go
  through detect.face_landmarks as before.
Landmarks, presence and detections come back to the host and are post-processed by detect.py's own code.
"""
from __future__ import annotations

import logging
import math
import threading
import weakref
from typing import Any, Callable

import numpy as np

from .detect import (DETECTOR_SIZE, MESH_SIZE, FaceBox, _check_image, decode_detections, face_landmarks,
                     input_region, landmarks_to_image, mesh_crop_transform)

log = logging.getLogger("digital_human.face")

Runner = Callable[[np.ndarray], dict]
MAX_SHAPES = 4  # frame sizes with graphs kept per mesh runner (each a few MB of static buffers and pools)
_NUM_LANDMARK_VALUES = 468 * 3


def _sample(frame, theta, out_size: int, padding: str):
    """warp_torch.warp_region's sampling of an already pre-filtered float32 NCHW source; [S, S, 3] view."""
    import torch.nn.functional as F

    grid = F.affine_grid(theta, [1, 3, out_size, out_size], align_corners=False)
    out = F.grid_sample(frame, grid, mode="bilinear", padding_mode=padding, align_corners=False)
    return out[0].permute(1, 2, 0)


def _dtype(module: Any) -> Any:
    """The dtype a module's input is cast to, as TorchRunner does (its weights'; float32 without any)."""
    import torch

    return next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)


class DeviceFaceModels:
    """detect_faces / face_landmarks for frames of one size, with the detector's and the mesh's torch modules
    on `device`. Thread-safe (one call at a time: the static buffers are shared). graphs: capture the two
    calls as CUDA graphs (CUDA only; a failed capture is logged and the same functions run eagerly)."""

    def __init__(self, detector: Any, mesh: Any, height: int, width: int, device: Any, graphs: bool = True):
        import torch

        self.torch, self.device = torch, torch.device(device)
        self.detector, self.mesh = detector, mesh
        self.height, self.width = int(height), int(width)
        self._dtypes = tuple(_dtype(m) for m in (detector, mesh))
        cuda = self.device.type == "cuda"
        self.frame = torch.zeros((self.height, self.width, 3), dtype=torch.uint8, device=self.device)
        self._staging = torch.empty((self.height, self.width, 3), dtype=torch.uint8, pin_memory=cuda)
        self._staging_np = self._staging.numpy()
        self._copied = torch.cuda.Event() if cuda else None
        self._theta_host = torch.zeros((1, 2, 3), dtype=torch.float32, pin_memory=cuda)
        self.theta = torch.zeros((1, 2, 3), dtype=torch.float32, device=self.device)
        self._last: Any = None  # the frame object whose pixels are in self.frame
        self._lock = threading.Lock()
        self.graphs_note: str | None = None
        # the letterbox: a function of the frame size only (detect.detector_input)
        scale = DETECTOR_SIZE / max(self.width, self.height)
        self._det_undo = (scale, (DETECTOR_SIZE - self.width * scale) / 2, (DETECTOR_SIZE - self.height * scale) / 2)
        _, pad_x, pad_y = self._det_undo
        out_to_in = np.array([[1 / scale, 0, -pad_x / scale], [0, 1 / scale, -pad_y / scale]])
        (rx0, ry0, rx1, ry1), k, m = input_region((self.height, self.width), out_to_in, DETECTOR_SIZE)
        self._det_region, self._det_k = (slice(ry0, ry1), slice(rx0, rx1)), k
        h, w = ((ry1 - ry0) // k, (rx1 - rx0) // k) if k >= 2 else (ry1 - ry0, rx1 - rx0)
        from .warp_torch import region_theta

        theta = region_theta(m / k if k >= 2 else m, w, h, DETECTOR_SIZE)[None].astype(np.float32)
        self._det_theta = torch.from_numpy(theta).to(self.device)
        self._calls: dict[str, Callable[[], Any]] = {"detect": self._detect_step, "mesh": self._mesh_step}
        if graphs and cuda:
            for name in ("detect", "mesh"):
                try:
                    self._calls[name] = self._capture(self._calls[name])
                except Exception as exc:  # noqa: BLE001 - any capture failure: said once, then eager
                    note = f"face {name} CUDA graph failed ({type(exc).__name__}: {exc}"[:300] + "); eager"
                    self.graphs_note = note if self.graphs_note is None else self.graphs_note + "; " + note
                    log.warning("[digital_human] %s", note)

    # --- the two steps (what the graphs hold) -------------------------------------------------------------
    def _detect_step(self):
        import torch.nn.functional as F

        src = self.frame[self._det_region].permute(2, 0, 1)[None].to(self.torch.float32)
        if self._det_k >= 2:  # blocks from the region's corner, a partial last block dropped, as detect.py
            src = F.avg_pool2d(src, self._det_k, stride=self._det_k)
        x = (_sample(src, self._det_theta, DETECTOR_SIZE, "zeros") / 127.5 - 1.0)[None]
        regressors, scores = self.detector(x.to(self._dtypes[0]))
        return self.torch.cat([regressors.reshape(1, -1), scores.reshape(1, -1)], 1).float()

    def _mesh_step(self):
        src = self.frame.permute(2, 0, 1)[None].to(self.torch.float32)
        x = (_sample(src, self.theta, MESH_SIZE, "border") / 255.0)[None]
        landmarks, flag = self.mesh(x.to(self._dtypes[1]))
        return self.torch.cat([landmarks.reshape(1, -1), flag.reshape(1, -1)], 1).float()

    def _capture(self, step: Callable[[], Any]) -> Callable[[], Any]:
        """step as a replay of one CUDA graph over the static frame and map (warmed up on a side stream first,
        as capture needs: lazy cuDNN/cuBLAS set-up outside the graph)."""
        torch = self.torch
        from ..cuda_streams import capture_stream

        side = capture_stream(self.device)  # this graph's own cuBLAS workspace (capture_stream)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(2):
                step()
        side.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"), torch.inference_mode():
            out = step()
        torch.cuda.current_stream(self.device).wait_stream(side)

        def replay():
            graph.replay()
            return out

        replay.graph = graph  # type: ignore[attr-defined]  # kept alive with the function
        return replay

    # --- per frame ------------------------------------------------------------------------------------------
    def _load(self, frame: np.ndarray) -> None:
        """Put `frame` into the device frame, once per frame object (the tracker passes one array object to
        all of a frame's calls and never writes frames)."""
        if frame is self._last:
            return
        if self._copied is not None:
            self._copied.synchronize()  # the staging buffer's last upload has been read
        np.copyto(self._staging_np, frame)
        self.frame.copy_(self._staging, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        self._last = frame

    def _check(self, frame: np.ndarray) -> np.ndarray:
        frame = _check_image(frame, "frame")
        if frame.shape[:2] != (self.height, self.width):
            raise ValueError(f"frame is {frame.shape[1]}x{frame.shape[0]}, these graphs are for "
                             f"{self.width}x{self.height}")
        return frame

    def _run(self, name: str) -> np.ndarray:
        with self.torch.inference_mode():
            return self._calls[name]().cpu().numpy()[0]  # the one wait for the device

    def detect(self, frame: np.ndarray, min_score: float = 0.5, iou_threshold: float = 0.3) -> list[FaceBox]:
        """detect.detect_faces(frame, run_detector, min_score, iou_threshold) with these modules."""
        frame = self._check(frame)
        with self._lock:
            self._load(frame)
            packed = self._run("detect")
        n = packed.size // 17  # [896, 16] regressors then [896, 1] logits
        regressors, logits = packed[:n * 16].reshape(n, 16), packed[n * 16:].reshape(n, 1)
        scale, pad_x, pad_y = self._det_undo
        faces = []
        for row, score in decode_detections(regressors, logits, min_score, iou_threshold):
            pts = row.reshape(-1, 2) * DETECTOR_SIZE
            pts = (pts - (pad_x, pad_y)) / scale
            (x0, y0), (x1, y1) = pts[0], pts[1]
            faces.append(FaceBox(float(x0), float(y0), float(x1), float(y1), score, pts[2:].astype(np.float32)))
        return faces

    def landmarks(self, frame: np.ndarray, box: FaceBox, run_mesh: Runner | None = None
                  ) -> tuple[np.ndarray, float]:
        """detect.face_landmarks(frame, box, run_mesh) with this mesh module; a crop that needs the pre-filter
        goes through face_landmarks itself with `run_mesh` (required then)."""
        frame = self._check(frame)
        crop_to_image = mesh_crop_transform(box)
        _, k, _ = input_region(frame.shape, crop_to_image, MESH_SIZE)
        if k >= 2:
            if run_mesh is None:
                raise ValueError("this crop shrinks the image 2x or more: pass run_mesh for face_landmarks")
            return face_landmarks(frame, box, run_mesh)
        from .warp_torch import region_theta

        theta = region_theta(crop_to_image, self.width, self.height, MESH_SIZE)
        with self._lock:
            self._load(frame)
            self._theta_host.numpy()[0] = theta.astype(np.float32)
            self.theta.copy_(self._theta_host, non_blocking=True)
            packed = self._run("mesh")  # waits for the copies above too: the pinned map is free again
        flag = float(np.clip(packed[_NUM_LANDMARK_VALUES], -100, 100))
        presence = 1.0 / (1.0 + math.exp(-flag))
        return landmarks_to_image(packed[:_NUM_LANDMARK_VALUES].reshape(468, 3), crop_to_image), presence


# graphs per (mesh runner, detector module, frame size): they live as long as the runner object (the loader's
# release() drops it, and with it these; a reloaded runner gets new ones)
_SESSIONS: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
_SESSIONS_LOCK = threading.Lock()


def device_face_models(runners: tuple[Runner, Runner], height: int, width: int) -> DeviceFaceModels | None:
    """The DeviceFaceModels for these runners and frame size, or None where they do not run torch on CUDA
    (ONNX Runtime, the CPU, a custom callable: the tracker then calls the runners as before)."""
    live = [getattr(r, "live", None) for r in runners]
    if any(getattr(r, "device", None) is None or fn is None for r, fn in zip(runners, live)):
        return None
    det_runner, mesh_runner = live[0](), live[1]()
    det, mesh = getattr(det_runner, "module", None), getattr(mesh_runner, "module", None)
    if det is None or mesh is None:
        return None
    device = runners[1].device
    key = (id(det), id(mesh), int(height), int(width))
    with _SESSIONS_LOCK:
        per_runner = _SESSIONS.setdefault(mesh_runner, {})
        hit = per_runner.get(key)
        if hit is not None:
            return hit
        made = DeviceFaceModels(det, mesh, height, width, device)
        per_runner[key] = made
        while len(per_runner) > MAX_SHAPES:
            per_runner.pop(next(iter(per_runner)))
        return made
