"""What the engine layer needs to know about a model: its graph(s) and the shapes it will see."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class TensorProfile:
    """Shape range of one dynamic input (a TensorRT optimization profile entry)."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def __post_init__(self) -> None:
        if not (len(self.min) == len(self.opt) == len(self.max)):
            raise ValueError(f"profile ranks differ: {self.min} / {self.opt} / {self.max}")
        for lo, mid, hi in zip(self.min, self.opt, self.max):
            if not (0 < lo <= mid <= hi):
                raise ValueError(f"profile needs 0 < min <= opt <= max per axis, got {self.min}/{self.opt}/{self.max}")

    def contains(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == len(self.min) and all(lo <= s <= hi for lo, s, hi in zip(self.min, shape, self.max))

    def key(self) -> str:
        fmt = lambda dims: "x".join(str(d) for d in dims)  # noqa: E731
        return f"{fmt(self.min)}-{fmt(self.opt)}-{fmt(self.max)}"


# eq=False: specs hold dicts/callables; the loader keys them by content, not by value equality.
@dataclass(frozen=True, eq=False)
class ModelSpec:
    """A model as the loader sees it.

    `onnx_path` is the portable float graph every backend can start from (ONNX Runtime runs it,
    TensorRT parses it, the torch backend converts it). `cpu_onnx_path` is an optional variant that is
    faster on CPU (e.g. Kokoro's int8 graph). `torch_factory` builds an equivalent nn.Module directly
    (cleaner and faster than a generic ONNX->torch conversion when the pack has a native port).
    """

    name: str
    onnx_path: Path
    profiles: dict[str, TensorProfile] = field(default_factory=dict)
    cpu_onnx_path: Path | None = None
    torch_factory: Callable[[], object] | None = field(default=None, compare=False, hash=False)
    # Inputs the torch/TensorRT backends must keep in FP32 even at FP16 precision (e.g. integer
    # token ids never change; a `speed` scalar would lose precision).
    fp32_inputs: tuple[str, ...] = ()
    # FP16 on the torch backend: "half" converts the weights (fastest, for plain CNN/RNN stacks);
    # "autocast" keeps FP32 weights and runs matmul/conv in FP16, for graphs with precision-critical
    # parts (Kokoro's sine source is a running phase sum that FP16 would wreck).
    fp16_mode: str = "half"
    # What precision="auto" means for the torch backend on a GPU. FP16 unless measured otherwise
    # (Kokoro is launch-bound on an H200: autocast FP16 ran slower than FP32, see benchmarks/RESULTS.md).
    torch_auto_precision: str = "fp16"
    # CUDA graphs need static shapes and no host syncs; graphs with data-dependent output sizes
    # (a TTS waveform) must turn them off.
    cuda_graphs: bool = True
    # Wrap the torch module in torch.compile on CUDA (fewer kernel launches for launch-bound graphs).
    # DIGITAL_HUMAN_TORCH_COMPILE=1/0 overrides it for every model.
    torch_compile: bool = False
    # Graph input/output names in order; read from the ONNX file when left empty.
    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()

    def io_names(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(inputs, outputs) in graph order, without loading the weights."""
        if self.input_names and self.output_names:
            return self.input_names, self.output_names
        import onnx

        model = onnx.load(str(self.onnx_path), load_external_data=False)
        initializers = {init.name for init in model.graph.initializer}
        inputs = tuple(i.name for i in model.graph.input if i.name not in initializers)
        outputs = tuple(o.name for o in model.graph.output)
        return inputs, outputs

    def profile_key(self) -> str:
        if not self.profiles:
            return "static"
        return ";".join(f"{name}={prof.key()}" for name, prof in sorted(self.profiles.items()))
