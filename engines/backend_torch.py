"""PyTorch backend: CUDA with FP16 and CUDA graphs for repeated shapes, or CPU FP32.

The module comes from `spec.torch_factory` (a native port sharing the ONNX weights) or, failing
that, from a generic ONNX->torch conversion (`onnx2torch`, optional dependency).
"""
from __future__ import annotations

import os
import time
from typing import Any, Mapping

import numpy as np

from .cuda_streams import capture_stream, release_capture_stream
from .runner import Runner, RunnerInfo
from .spec import ModelSpec

MAX_CUDA_GRAPHS = 8  # one captured graph per distinct input-shape signature; bounded memory


def cuda_available() -> bool:
    """torch sees a CUDA device and ComfyUI was not started with --cpu."""
    from .devices import torch_cuda_usable

    return torch_cuda_usable()


def build_module(spec: ModelSpec) -> Any:
    if spec.torch_factory is not None:
        return spec.torch_factory()
    try:
        from onnx2torch import convert
    except ImportError as exc:
        raise RuntimeError(
            f"'{spec.name}' has no native torch port and onnx2torch is not installed "
            "(pip install onnx2torch) - use the onnxruntime backend instead"
        ) from exc
    return convert(str(spec.onnx_path))


class _CapturedGraph:
    """A CUDA graph with its static input/output buffers (replay = copy in, replay, read out)."""

    def __init__(self, module: Any, example: list[Any]) -> None:
        import torch

        self.static_inputs = [t.clone() for t in example]
        # a capture stream of this graph's own: its cuBLAS workspace is not another graph's (capture_stream)
        self.stream = stream = capture_stream(self.static_inputs[0].device if self.static_inputs else "cuda")
        current = torch.cuda.current_stream()
        stream.wait_stream(current)
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):  # warm-up on the capture stream, as CUDA graph capture requires
                module(*self.static_inputs)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=stream), torch.inference_mode():
            self.static_outputs = module(*self.static_inputs)
        current.wait_stream(stream)

    def __del__(self) -> None:
        stream = getattr(self, "stream", None)
        self.graph = None  # destroyed first: its stream is free only once no graph holds its workspace
        if stream is not None:
            release_capture_stream(stream)

    def __call__(self, inputs: list[Any]) -> Any:
        for static, value in zip(self.static_inputs, inputs):
            static.copy_(value)
        self.graph.replay()
        return self.static_outputs


class TorchRunner(Runner):
    accepts_torch = True

    def __init__(self, module: Any, spec: ModelSpec, info: RunnerInfo, use_cuda_graphs: bool) -> None:
        super().__init__(info)
        import torch

        self.module = module
        self.torch = torch
        self._inputs, self._outputs = spec.io_names()
        self._fp32_inputs = set(spec.fp32_inputs)
        self._device = torch.device(info.device)
        self._half = info.precision == "fp16" and spec.fp16_mode == "half"
        self._autocast = info.precision == "fp16" and spec.fp16_mode == "autocast"
        self._use_graphs = use_cuda_graphs and spec.cuda_graphs and self._device.type == "cuda"
        self._graphs: dict[tuple, _CapturedGraph] = {}

    def input_names(self) -> list[str]:
        return list(self._inputs)

    def output_names(self) -> list[str]:
        return list(self._outputs)

    def _to_device(self, name: str, value: Any) -> Any:
        torch = self.torch
        tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))
        tensor = tensor.to(self._device, non_blocking=True)
        if tensor.is_floating_point():
            keep_fp32 = name in self._fp32_inputs or not self._half
            tensor = tensor.float() if keep_fp32 else tensor.half()
        return tensor

    def run_torch(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Like run() but returns device tensors, so a next GPU stage can consume them without a copy."""
        inputs = [self._to_device(name, feeds[name]) for name in self._inputs]
        autocast = self.torch.autocast(device_type="cuda", dtype=self.torch.float16, enabled=self._autocast)
        with self.torch.inference_mode(), autocast:
            if self._use_graphs:
                signature = tuple((tuple(t.shape), t.dtype) for t in inputs)
                graph = self._graphs.get(signature)
                if graph is None:
                    if len(self._graphs) >= MAX_CUDA_GRAPHS:
                        self._graphs.pop(next(iter(self._graphs)))
                    graph = self._graphs[signature] = _CapturedGraph(self.module, inputs)
                result = graph(inputs)
            else:
                result = self.module(*inputs)
        if not isinstance(result, (tuple, list)):
            result = (result,)
        return dict(zip(self._outputs, result))

    def run(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        out = self.run_torch(feeds)
        return {name: t.detach().float().cpu().numpy() if t.is_floating_point() else t.detach().cpu().numpy()
                for name, t in out.items()}

    def release(self) -> None:
        self._graphs.clear()
        self.module = None
        if self._device.type == "cuda":
            self.torch.cuda.empty_cache()


def load(spec: ModelSpec, device: str, precision: str, use_cuda_graphs: bool = True) -> TorchRunner:
    import torch

    start = time.perf_counter()
    if device == "cuda" and not cuda_available():
        raise RuntimeError("torch reports no CUDA device (or ComfyUI runs with --cpu)")
    # FP16 only pays off (and is only well supported) on the GPU; CPU stays FP32.
    resolved = precision if precision in ("fp16", "fp32") else (spec.torch_auto_precision if device == "cuda" else "fp32")
    if device == "cpu":
        resolved = "fp32"
    module = build_module(spec).eval().to(device)
    if resolved == "fp16" and spec.fp16_mode == "half":
        module = module.half()
    compile_env = os.environ.get("DIGITAL_HUMAN_TORCH_COMPILE")
    use_compile = (compile_env == "1") if compile_env in ("0", "1") else spec.torch_compile
    if use_compile and device == "cuda":
        # dynamic=True: token counts and output lengths vary per call; recompiling per shape would stall
        module = torch.compile(module, dynamic=True)
    info = RunnerInfo(model=spec.name, backend=f"torch-{device}", device=device, precision=resolved)
    runner = TorchRunner(module, spec, info, use_cuda_graphs=use_cuda_graphs)
    info.load_seconds = time.perf_counter() - start
    if runner._use_graphs:
        info.notes.append("CUDA graphs per input shape")
    if runner._autocast:
        info.notes.append("FP16 autocast (FP32 weights)")
    if use_compile and device == "cuda":
        info.notes.append("torch.compile (dynamic shapes)")
    return runner
