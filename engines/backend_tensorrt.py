"""TensorRT 10 backend: ONNX -> serialized engine (FP16, optimization profiles, timing cache),
cached on disk under models/tensorrt/digital_human/, executed with torch-allocated CUDA buffers.

Written against the TensorRT 10 Python API (name-based I/O: `num_io_tensors`, `set_input_shape`,
`set_tensor_address`, `execute_async_v3`). TensorRT could not be installed where this pack was
developed, so this module is exercised by tests only up to the TensorRT calls themselves (cache
names, profiles, rebuild decisions, fallback); see docs/performance.md, "What was verified where".
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..atomic_file import write_bytes_atomic
from .cache_keys import engine_file_name
from .runner import Runner, RunnerInfo
from .spec import ModelSpec

log = logging.getLogger(__name__)

WORKSPACE_BYTES = 4 << 30


def import_tensorrt() -> Any:
    """Import tensorrt or raise a RuntimeError that says how to get it."""
    try:
        import tensorrt as trt  # type: ignore[import-not-found]
    except ImportError as exc:
        raise RuntimeError("TensorRT is not installed (pip install tensorrt-cu12 on an NVIDIA GPU machine)") from exc
    major = int(str(trt.__version__).split(".")[0])
    if major < 10:
        raise RuntimeError(f"TensorRT {trt.__version__} is too old; this pack targets the TensorRT 10 API")
    return trt


def engine_cache_dir() -> Path:
    from ..paths import models_root

    # DESIGN.md: engines live in models/tensorrt/digital_human/. Inside ComfyUI models_root() is
    # models/digital_human, so go one level up; stand-alone keep them under our own root.
    root = models_root()
    folder = (root.parent / "tensorrt" / "digital_human") if root.name == "digital_human" else (root / "tensorrt")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def compute_capability() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}"


def engine_path_for(spec: ModelSpec, precision: str, trt_version: str, capability: str) -> Path:
    return engine_cache_dir() / engine_file_name(spec, precision, trt_version, capability)


def set_profile_shapes(profile: Any, spec: ModelSpec) -> None:
    """Copy the spec's dynamic-shape ranges into a TensorRT optimization profile."""
    for name, prof in spec.profiles.items():
        profile.set_shape(name, prof.min, prof.opt, prof.max)


def build_engine(trt: Any, spec: ModelSpec, precision: str, engine_path: Path) -> bytes:
    """Parse the ONNX graph and build a serialized engine; write it (and the timing cache) atomically."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: explicit batch is the only mode
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(spec.onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise RuntimeError(f"TensorRT could not parse {spec.onnx_path.name}: " + " | ".join(errors[:5]))
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    if precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    if spec.profiles:
        profile = builder.create_optimization_profile()
        set_profile_shapes(profile, spec)
        config.add_optimization_profile(profile)
    timing_path = engine_path.parent / "timing.cache"
    timing_cache = config.create_timing_cache(timing_path.read_bytes() if timing_path.is_file() else b"")
    config.set_timing_cache(timing_cache, ignore_mismatch=True)
    start = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"TensorRT failed to build an engine for {spec.name} (see the TensorRT log above)")
    log.info("built TensorRT engine %s in %.1f s", engine_path.name, time.perf_counter() - start)
    data = bytes(serialized)
    write_bytes_atomic(engine_path, data)
    write_bytes_atomic(timing_path, bytes(config.get_timing_cache().serialize()))
    return data


def load_or_build(trt: Any, spec: ModelSpec, precision: str, engine_path: Path) -> tuple[Any, bool]:
    """Deserialize the cached engine; rebuild when absent or when deserialization fails."""
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    built = False
    if engine_path.is_file():
        engine = runtime.deserialize_cuda_engine(engine_path.read_bytes())
        if engine is not None:
            return engine, built
        log.warning("cached engine %s failed to deserialize; rebuilding", engine_path.name)
        engine_path.unlink(missing_ok=True)
    data = build_engine(trt, spec, precision, engine_path)
    built = True
    engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        raise RuntimeError(f"freshly built engine for {spec.name} failed to deserialize")
    return engine, built


def _torch_dtype(trt: Any, dtype: Any) -> Any:
    import torch

    mapping = {trt.float32: torch.float32, trt.float16: torch.float16, trt.int32: torch.int32,
               trt.int64: torch.int64, trt.bool: torch.bool, trt.int8: torch.int8}
    return mapping[dtype]


class _OutputAllocator:
    """Grows a torch buffer for outputs whose shape depends on the data (e.g. a TTS waveform)."""

    def __init__(self, trt: Any, torch_dtype: Any) -> None:
        import torch

        trt.IOutputAllocator.__init__(self)
        self.torch = torch
        self.dtype = torch_dtype
        self.buffer = None
        self.shape: tuple[int, ...] = ()

    def reallocate_output(self, tensor_name: str, memory: int, size: int, alignment: int) -> int:
        count = max(1, size // self.torch.empty((), dtype=self.dtype).element_size())
        if self.buffer is None or self.buffer.numel() < count:
            self.buffer = self.torch.empty(count, dtype=self.dtype, device="cuda")
        return self.buffer.data_ptr()

    def notify_shape(self, tensor_name: str, shape: Any) -> None:
        self.shape = tuple(shape)


class TensorRTRunner(Runner):
    accepts_torch = True

    def __init__(self, trt: Any, engine: Any, spec: ModelSpec, info: RunnerInfo) -> None:
        super().__init__(info)
        import torch

        self.trt = trt
        self.torch = torch
        self.engine = engine
        self.context = engine.create_execution_context()
        self.stream = torch.cuda.Stream()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self._inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self._dtypes = {n: _torch_dtype(trt, engine.get_tensor_dtype(n)) for n in names}
        self._allocators: dict[str, Any] = {}
        # Subclass IOutputAllocator lazily: the base class only exists when tensorrt is importable.
        allocator_cls = type("TorchOutputAllocator", (_OutputAllocator, trt.IOutputAllocator), {})
        for name in self._outputs:
            if -1 in tuple(engine.get_tensor_shape(name)):
                allocator = allocator_cls(trt, self._dtypes[name])
                self.context.set_output_allocator(name, allocator)
                self._allocators[name] = allocator

    def input_names(self) -> list[str]:
        return list(self._inputs)

    def output_names(self) -> list[str]:
        return list(self._outputs)

    def run_torch(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        torch = self.torch
        keep_alive = []
        with torch.cuda.stream(self.stream):
            for name in self._inputs:
                value = feeds[name]
                tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))
                tensor = tensor.to("cuda", dtype=self._dtypes[name], non_blocking=True).contiguous()
                keep_alive.append(tensor)
                self.context.set_input_shape(name, tuple(tensor.shape))
                self.context.set_tensor_address(name, tensor.data_ptr())
            fixed: dict[str, Any] = {}
            for name in self._outputs:
                if name in self._allocators:
                    continue
                shape = tuple(self.context.get_tensor_shape(name))
                fixed[name] = torch.empty(shape, dtype=self._dtypes[name], device="cuda")
                self.context.set_tensor_address(name, fixed[name].data_ptr())
            if not self.context.execute_async_v3(self.stream.cuda_stream):
                raise RuntimeError(f"TensorRT execution failed for {self.info.model}")
        self.stream.synchronize()
        outputs = dict(fixed)
        for name, allocator in self._allocators.items():
            count = int(np.prod(allocator.shape)) if allocator.shape else 0
            outputs[name] = allocator.buffer[:count].view(allocator.shape)
        return {name: outputs[name] for name in self._outputs}

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {name: t.float().cpu().numpy() if t.is_floating_point() else t.cpu().numpy()
                for name, t in self.run_torch(feeds).items()}

    def release(self) -> None:
        self.context = None
        self.engine = None
        self._allocators.clear()


def load(spec: ModelSpec, device: str, precision: str) -> TensorRTRunner:
    if device != "cuda":
        raise RuntimeError("TensorRT needs an NVIDIA GPU")
    from .devices import torch_cuda_usable

    if not torch_cuda_usable():  # before importing tensorrt: nothing is probed on a CPU-only run
        raise RuntimeError("TensorRT backend needs torch with CUDA for its buffers (none here, or ComfyUI "
                           "runs with --cpu)")
    trt = import_tensorrt()
    resolved = "fp32" if precision == "fp32" else "fp16"
    start = time.perf_counter()
    path = engine_path_for(spec, resolved, str(trt.__version__), compute_capability())
    engine, built = load_or_build(trt, spec, resolved, path)
    info = RunnerInfo(model=spec.name, backend="tensorrt", device="cuda", precision=resolved,
                      cache_key=path.name, load_seconds=time.perf_counter() - start)
    info.notes.append(("built engine " if built else "cached engine ") + path.name)
    return TensorRTRunner(trt, engine, spec, info)
