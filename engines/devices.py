"""Which accelerators this process may use: the one place that answers "is there a GPU for us?".

ComfyUI started with `--cpu` means "do not touch the GPU" (comfy.model_management.cpu_mode() in
0.3.64, set from `args.cpu`), and a machine without an NVIDIA driver cannot run CUDA whatever
packages are installed (onnxruntime-gpu lists its CUDA provider even there, then prints red errors
about missing CUDA libraries when asked to use it). Backends ask here before trying CUDA, so a
CPU-only run never probes GPU backends at all.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import sys

log = logging.getLogger("digital_human.engines")

_DRIVER_LIBRARIES = {"win32": ("nvcuda.dll",), "darwin": ()}
_LINUX_DRIVER_LIBRARIES = ("libcuda.so.1", "libcuda.so")


def comfy_cpu_mode() -> bool:
    """True inside a ComfyUI started with --cpu. Never imports ComfyUI: outside it (CLI, tests) the
    module is absent from sys.modules and this is False."""
    mm = sys.modules.get("comfy.model_management")
    if mm is None:
        return False
    try:
        if hasattr(mm, "cpu_mode"):
            return bool(mm.cpu_mode())
        state = getattr(mm, "cpu_state", None)
        return getattr(state, "name", "") == "CPU"
    except Exception as exc:  # an unexpected ComfyUI version: assume the GPU is allowed, as before
        log.debug("could not read ComfyUI's cpu mode: %s", exc)
        return False


@functools.lru_cache(maxsize=1)
def nvidia_driver_present() -> bool:
    """The CUDA driver library loads (it is what every CUDA runtime needs first). Loading it has no
    side effects beyond mapping it; it is not initialised here."""
    names = _DRIVER_LIBRARIES.get(sys.platform, _LINUX_DRIVER_LIBRARIES)
    for name in names:
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    log.debug("no NVIDIA driver library (%s) on this machine: GPU backends are not tried", ", ".join(names) or "-")
    return False


@functools.lru_cache(maxsize=1)
def _rocm_present() -> bool:
    """AMD's HIP runtime loads (ROCm builds of torch report their GPU as a CUDA device)."""
    try:
        ctypes.CDLL("libamdhip64.so")
        return True
    except OSError:
        return False


def gpu_allowed() -> bool:
    """CUDA may be tried: a driver is present and ComfyUI was not told to stay on the CPU."""
    return not comfy_cpu_mode() and nvidia_driver_present()


def torch_cuda_usable() -> bool:
    """torch can run on a CUDA device now (and ComfyUI's --cpu does not forbid it)."""
    if comfy_cpu_mode():
        return False
    if "torch" not in sys.modules and not (nvidia_driver_present() or _rocm_present()):
        return False  # no GPU driver at all: answer without importing torch (seconds on a small CPU)
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


GPU_PIPELINING_ENV = "DIGITAL_HUMAN_GPU_PIPELINING"


def gpu_pipelining_enabled() -> bool:
    """The face tracker's per-call CUDA graphs with the frame kept on the GPU, and the MuseTalk renderer
    queueing its next batch before reading the current one. On by default; DIGITAL_HUMAN_GPU_PIPELINING=0 runs the
    per-call tracker and the serial renderer instead (the A/B of benchmarks/gpu_musetalk_video.py)."""
    import os

    return os.environ.get(GPU_PIPELINING_ENV, "").strip() != "0"
