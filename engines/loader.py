"""The one loader: `get(spec, backend, precision)` returns a ready runner, loading once per process.

Runners are cached by (graph hash, backend, device, precision, shape profile, library version) and
evicted least-recently-used when a VRAM budget is exceeded; `release()` drops them all (or one
stage). `auto` tries the fastest backend first and falls back, announcing every fallback in the
runner's info (which the nodes show) and in the log.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Callable

from . import backend_onnxruntime, backend_torch
from .cache_keys import runner_cache_key
from .runner import Runner
from .spec import ModelSpec

log = logging.getLogger("digital_human.engines")

BACKENDS = ("auto", "tensorrt", "torch", "onnxruntime")
PRECISIONS = ("auto", "fp16", "fp32")


def cuda_device_available() -> bool:
    """A CUDA backend may run here (GPU present and allowed: ComfyUI's --cpu says no)."""
    return backend_torch.cuda_available() or backend_onnxruntime.cuda_available()


def candidate_order(backend: str, has_cuda: bool) -> list[tuple[str, str]]:
    """(backend, device) pairs to try, best first.

    GPU: TensorRT, then torch CUDA (FP16 + CUDA graphs), then ONNX Runtime CUDA, then CPU.
    CPU: ONNX Runtime first - it runs our graphs (and Kokoro's int8 graph) faster than eager torch.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got '{backend}'")
    if backend == "auto":
        gpu = [("tensorrt", "cuda"), ("torch", "cuda"), ("onnxruntime", "cuda")] if has_cuda else []
        return gpu + [("onnxruntime", "cpu"), ("torch", "cpu")]
    if backend == "tensorrt":
        # An explicit TensorRT request still gets a working (announced) fallback rather than a dead node.
        gpu_rest = [("torch", "cuda"), ("onnxruntime", "cuda")] if has_cuda else []
        return [("tensorrt", "cuda")] + gpu_rest + [("onnxruntime", "cpu")]
    if backend == "torch":
        return ([("torch", "cuda")] if has_cuda else []) + [("torch", "cpu")]
    return ([("onnxruntime", "cuda")] if has_cuda else []) + [("onnxruntime", "cpu")]


def _lib_version(backend: str) -> str:
    try:
        if backend == "tensorrt":
            import tensorrt

            return f"trt{tensorrt.__version__}"
        if backend == "torch":
            import torch

            return f"torch{torch.__version__}"
        import onnxruntime

        return f"ort{onnxruntime.__version__}"
    except ImportError:
        return "missing"


def _load_one(spec: ModelSpec, backend: str, device: str, precision: str) -> Runner:
    if backend == "tensorrt":
        from . import backend_tensorrt

        return backend_tensorrt.load(spec, device, precision)
    if backend == "torch":
        return backend_torch.load(spec, device, precision)
    return backend_onnxruntime.load(spec, device, precision)


def _free_comfy_memory(bytes_needed: int) -> None:
    """Ask ComfyUI to unload its own models before we load a big engine (no-op outside ComfyUI)."""
    try:
        import comfy.model_management as mm  # type: ignore[import-not-found]
    except ImportError:
        return
    try:
        mm.free_memory(bytes_needed, mm.get_torch_device())
    except Exception as exc:  # never fail a load because ComfyUI's memory manager complained
        log.debug("comfy free_memory failed: %s", exc)


class EngineLoader:
    """Process-wide cache of runners (use the module-level `get`/`release`, not this class)."""

    def __init__(self, vram_budget_bytes: int | None = None) -> None:
        self._runners: OrderedDict[str, tuple[Runner, int, str]] = OrderedDict()
        self._failed: dict[str, str] = {}  # cache key -> why that backend could not load (until release())
        self._lock = threading.RLock()  # guards the dicts; never held while a model loads
        self._key_locks: dict[str, threading.Lock] = {}
        self.vram_budget = vram_budget_bytes
        self.load_count = 0  # how many real loads happened (tests check cache hits with it)
        self._loader: Callable[[ModelSpec, str, str, str], Runner] = _load_one
        self._has_cuda: Callable[[], bool] = cuda_device_available

    def get(self, spec: ModelSpec, backend: str = "auto", precision: str = "auto", stage: str = "") -> Runner:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got '{precision}'")
        tried: list[str] = []
        for name, device in candidate_order(backend, self._has_cuda()):
            key = runner_cache_key(spec, name, device, precision, _lib_version(name))
            # One load per key at a time, but different models load in parallel: the CLI opens the
            # TTS session on a background thread while the main thread checks inputs and loads others.
            with self._key_lock(key):
                with self._lock:
                    if key in self._runners:
                        self._runners.move_to_end(key)
                        return self._runners[key][0]
                    if key in self._failed:  # said once already; a missing library does not appear mid-run
                        tried.append(self._failed[key])
                        continue
                try:
                    runner = self._load_with_budget(spec, name, device, precision)
                except Exception as exc:  # fall through to the next backend, and say why
                    reason = f"{name}-{device}: {exc}"
                    tried.append(reason)
                    # a missing library or a broken file stays so until release(); running out of memory
                    # does not (another model may be freed), so that backend is tried again next time
                    if not (isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()):
                        with self._lock:
                            self._failed[key] = reason
                    # details for whoever debugs a backend; the user gets one line below
                    log.debug("[digital_human] %s could not load on %s (%s); trying the next backend",
                              spec.name, f"{name}-{device}", exc)
                    continue
                runner.info.fallback_from = tried
                runner.info.cache_key = runner.info.cache_key or key
                _announce(spec, runner, backend, tried)
                size = _estimate_bytes(spec) if runner.info.device == "cuda" else 0
                with self._lock:
                    self._runners[key] = (runner, size, stage)
                    self.load_count += 1
                return runner
        raise RuntimeError(f"no backend could load '{spec.name}':\n  " + "\n  ".join(tried))

    def _key_lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._key_locks.setdefault(key, threading.Lock())

    def _load_with_budget(self, spec: ModelSpec, backend: str, device: str, precision: str) -> Runner:
        if device == "cuda":
            estimate = _estimate_bytes(spec)
            _free_comfy_memory(estimate)
            self._evict_until(estimate)
        start = time.perf_counter()
        runner = self._loader(spec, backend, device, precision)
        runner.info.load_seconds = runner.info.load_seconds or (time.perf_counter() - start)
        return runner

    def _evict_until(self, needed: int) -> None:
        if self.vram_budget is None:
            return
        with self._lock:
            used = sum(size for _, size, _ in self._runners.values())
            while self._runners and used + needed > self.vram_budget:
                key, (runner, size, _) = self._runners.popitem(last=False)
                log.info("[digital_human] evicting %s to stay under the VRAM budget", key)
                runner.release()
                used -= size

    def release(self, stage: str | None = None) -> int:
        """Drop cached runners (all, or those loaded for one stage, e.g. "voice"); returns how many."""
        with self._lock:
            keys = [k for k, (_, _, s) in self._runners.items() if stage is None or s == stage]
            for key in keys:
                self._runners.pop(key)[0].release()
            self._failed.clear()  # e.g. the user freed VRAM or installed TensorRT: try again
        if keys:
            try:
                import torch

                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            except ImportError:
                pass
        return len(keys)

    def loaded(self) -> list[str]:
        with self._lock:
            return [runner.info.summary() for runner, _, _ in self._runners.values()]


def _announce(spec: ModelSpec, runner: Runner, requested: str, tried: list[str]) -> None:
    """One short line per load saying which backend runs the model. A warning only when the user
    asked for a backend by name and got another; `auto` falling through to what this machine has is
    the expected path (the reasons are in the debug log)."""
    ran = f"{runner.info.backend} {runner.info.precision}"
    skipped = ", ".join(reason.split(":", 1)[0] for reason in tried)
    if requested != "auto" and not runner.info.backend.startswith(requested):
        log.warning("[digital_human] %s: %s asked for but not available here (tried %s); running on %s "
                    "(-v for why)", spec.name, requested, skipped, ran)
    else:
        log.info("[digital_human] %s runs on %s%s", spec.name, ran, f" (not available: {skipped})" if skipped else "")


def _estimate_bytes(spec: ModelSpec) -> int:
    """Weights size on disk x2 (weights + activations/workspace) - coarse but cheap."""
    try:
        return int(os.path.getsize(spec.onnx_path) * 2)
    except OSError:
        return 0


_LOADER = EngineLoader(
    vram_budget_bytes=int(os.environ["DIGITAL_HUMAN_VRAM_BUDGET_MB"]) << 20
    if os.environ.get("DIGITAL_HUMAN_VRAM_BUDGET_MB") else None
)


def get(spec: ModelSpec, backend: str = "auto", precision: str = "auto", stage: str = "") -> Runner:
    """Return a ready runner for `spec` (loaded once per process and cached)."""
    return _LOADER.get(spec, backend, precision, stage)


def bound(spec: ModelSpec, backend: str = "auto", precision: str = "auto", stage: str = "") -> Callable[[dict], dict]:
    """A callable `feeds -> outputs` that looks its runner up in the loader on every call (a dict
    lookup), so code that keeps it (per-module caches, trackers) never runs a runner that was
    released by `release(stage)` or evicted under the VRAM budget: it is loaded again instead.
    The first load happens here, so missing models fail at once. `.info`/`.input_names()` describe
    the runner loaded now."""
    first = get(spec, backend, precision, stage)

    def run(feeds: dict) -> dict:
        return get(spec, backend, precision, stage)(feeds)

    run.info = first.info  # type: ignore[attr-defined]
    run.input_names = first.input_names  # type: ignore[attr-defined]
    return run


def release(stage: str | None = None) -> int:
    """Free cached runners: all of them, or one stage's ("voice", "face") for small GPUs."""
    return _LOADER.release(stage)


def loader() -> EngineLoader:
    return _LOADER
