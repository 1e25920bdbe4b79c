"""Extra control inputs grafted onto the Kokoro graph.

`f0_scale` [1]: multiplies the predicted pitch contour before the decoder and the harmonic source.
Kokoro's vocoder synthesises from that contour, so scaling it moves the voice's pitch without the
artefacts of resampling or phase-vocoder shifting; voice imitation uses it to match the reference
speaker's median pitch. Scale 1.0 reproduces the original graph exactly.
"""
from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from ...atomic_file import atomic_path

F0_TENSOR = "/encoder/F0_proj/Conv_output_0"  # predictor.F0_proj output [1, 1, frames]
F0_SCALE_INPUT = "f0_scale"
CONTROLS_VERSION = "1"


class ControlGraftError(RuntimeError):
    """The graph does not have the tensor the control attaches to (a different Kokoro export)."""


def add_pitch_control(model: onnx.ModelProto) -> onnx.ModelProto:
    """Insert `F0 * f0_scale` and re-point every consumer of the pitch tensor (in place; returned)."""
    if any(i.name == F0_SCALE_INPUT for i in model.graph.input):
        return model
    if not any(F0_TENSOR in node.output for node in model.graph.node):
        raise ControlGraftError(f"pitch tensor '{F0_TENSOR}' not found: is this the kokoro-v1.0 ONNX export?")
    scaled = F0_TENSOR + "_scaled"
    for node in model.graph.node:
        for index, name in enumerate(node.input):
            if name == F0_TENSOR:
                node.input[index] = scaled
    mul = helper.make_node("Mul", [F0_TENSOR, F0_SCALE_INPUT], [scaled], name="/controls/f0_scale/Mul")
    producer = next(i for i, node in enumerate(model.graph.node) if F0_TENSOR in node.output)
    model.graph.node.insert(producer + 1, mul)  # keep the node list topologically sorted
    model.graph.input.append(helper.make_tensor_value_info(F0_SCALE_INPUT, TensorProto.FLOAT, [1]))
    return model


def controlled_copy(source: Path, out_path: Path, source_sha256: str) -> Path:
    """`source` graph + controls, written once per (source hash, controls version), atomically."""
    key = f"{source_sha256} controls-v{CONTROLS_VERSION}"
    stamp = out_path.with_suffix(out_path.suffix + ".source")
    if out_path.is_file() and stamp.is_file() and stamp.read_text().strip() == key:
        return out_path
    model = add_pitch_control(onnx.load(str(source)))
    with atomic_path(out_path) as tmp:
        onnx.save(model, str(tmp))
    stamp.write_text(key + "\n")
    return out_path
