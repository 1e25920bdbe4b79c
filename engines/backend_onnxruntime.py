"""ONNX Runtime backend (CUDA or CPU execution provider)."""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from .runner import Runner, RunnerInfo
from .spec import ModelSpec

_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(double)": np.float64,
    "tensor(bool)": np.bool_,
}


def available_providers() -> list[str]:
    try:
        import onnxruntime as ort
    except ImportError:
        return []
    return list(ort.get_available_providers())


def cuda_available() -> bool:
    """ONNX Runtime's CUDA provider is installed AND may work here: an NVIDIA driver is present and
    ComfyUI was not started with --cpu (onnxruntime-gpu lists the provider on any machine)."""
    from .devices import gpu_allowed

    return "CUDAExecutionProvider" in available_providers() and gpu_allowed()


@contextlib.contextmanager
def _quiet_ort_logging(ort: Any) -> Iterator[None]:
    """Silence ONNX Runtime's process-wide logger while a CUDA session is tried: when the CUDA or cuDNN
    libraries are missing it prints red ERROR lines although we fall back cleanly (the reason is
    still raised, and the loader logs it at debug level). 2 (warning) is ONNX Runtime's default."""
    ort.set_default_logger_severity(4)
    try:
        yield
    finally:
        ort.set_default_logger_severity(2)


class OnnxRuntimeRunner(Runner):
    def __init__(self, session: Any, info: RunnerInfo) -> None:
        super().__init__(info)
        self.session = session
        self._inputs = {i.name: _ORT_TYPES.get(i.type, np.float32) for i in session.get_inputs()}
        self._outputs = [o.name for o in session.get_outputs()]

    def input_names(self) -> list[str]:
        return list(self._inputs)

    def output_names(self) -> list[str]:
        return list(self._outputs)

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        # Cast to the graph's declared dtypes so callers can pass plain Python/NumPy values.
        prepared = {name: np.ascontiguousarray(np.asarray(_to_numpy(feeds[name]), dtype=dtype))
                    for name, dtype in self._inputs.items()}
        values = self.session.run(self._outputs, prepared)
        return dict(zip(self._outputs, values))

    def release(self) -> None:
        self.session = None


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor from an upstream GPU stage
        return value.detach().cpu().numpy()
    return np.asarray(value)


def load(spec: ModelSpec, device: str, precision: str, threads: int | None = None) -> OnnxRuntimeRunner:
    """Open a session. On CPU prefer the spec's CPU graph (e.g. int8), which is why precision can change."""
    import onnxruntime as ort

    start = time.perf_counter()
    use_cpu_graph = device == "cpu" and spec.cpu_onnx_path is not None and precision in ("auto", "int8")
    path = Path(spec.cpu_onnx_path if use_cpu_graph else spec.onnx_path)
    if not path.is_file():
        raise FileNotFoundError(f"ONNX graph for '{spec.name}' not found at {path}")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    threads = threads or int(os.environ.get("DIGITAL_HUMAN_ORT_THREADS", "0")) or None
    if threads:
        options.intra_op_num_threads = threads
    options.log_severity_level = 3
    if device == "cuda":
        if not cuda_available():
            raise RuntimeError("onnxruntime cannot use CUDA here (needs onnxruntime-gpu and an NVIDIA driver; "
                               "ComfyUI's --cpu turns it off)")
        providers: list[Any] = [("CUDAExecutionProvider", {"cudnn_conv_algo_search": "HEURISTIC"}),
                                "CPUExecutionProvider"]
    else:
        providers = ["CPUExecutionProvider"]
    if device == "cuda":
        with _quiet_ort_logging(ort):
            session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    else:
        session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    if device == "cuda" and "CUDAExecutionProvider" not in session.get_providers():
        raise RuntimeError("onnxruntime could not create a CUDA session (CUDA/cuDNN libraries missing?)")
    graph_precision = "int8" if use_cpu_graph else "fp32"
    info = RunnerInfo(model=spec.name, backend=f"onnxruntime-{device}", device=device,
                      precision=graph_precision, load_seconds=time.perf_counter() - start)
    return OnnxRuntimeRunner(session, info)
