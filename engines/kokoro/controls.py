"""Extra control inputs grafted onto the Kokoro graph.

`f0_scale` [1]: multiplies the predicted pitch contour before the decoder and the harmonic source.
Kokoro's vocoder synthesises from that contour, so scaling it moves the voice's pitch without the
artefacts of resampling or phase-vocoder shifting; voice imitation uses it to match the reference
speaker's median pitch. Scale 1.0 reproduces the original graph exactly.

Extra output `durations` float32 [1, N+2]: the duration predictor's frames per input token (pads
included), after `speed` and rounding - exactly what the length regulator expands, so each frame is
DURATION_HOP samples of the output audio and sum(durations) * DURATION_HOP == len(audio). The talking
head reads it to time visemes; exposing an existing tensor changes no computation.
"""
from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from ...atomic_file import atomic_path

F0_TENSOR = "/encoder/F0_proj/Conv_output_0"  # predictor.F0_proj output [1, 1, frames]
F0_SCALE_INPUT = "f0_scale"
# Round(ReduceSum(Sigmoid(duration_proj)) / speed) clipped at 1: the integer frames per token
DURATION_TENSOR = "/encoder/Clip_output_0"
DURATION_OUTPUT = "durations"
DURATION_HOP = 600  # output samples per duration frame at 24 kHz (measured: sum * 600 == len(audio))
# The sounds come out earlier than the duration boundaries say, by about 60 ms of speech time (divided
# by `speed`): the lag that best correlates a phone-class loudness curve with the audio's 5 ms level was
# 50-70 ms (mean 61) on 8 utterances x 2 voices at speed 1, 65-90 ms at 0.7 and 35-50 ms at 1.5; with
# this correction the remaining best lag was within +-20 ms (mean |8| ms) at all three speeds.
AUDIO_LEAD_S = 0.060
CONTROLS_VERSION = "3"  # 3: + durations output (2 had it through an Identity)


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


def add_duration_output(model: onnx.ModelProto) -> onnx.ModelProto:
    """Expose the predicted per-token durations as graph output `durations` (in place; returned).

    The tensor is renamed (producer and consumers alike) rather than copied: no node is added, so
    nothing is computed differently and converters without an Identity of this opset (onnx2torch)
    still take the graph. float32 (the length regulator casts to int64 after it), so TensorRT needs
    no int64 output."""
    if any(o.name == DURATION_OUTPUT for o in model.graph.output):
        return model
    if not any(DURATION_TENSOR in node.output for node in model.graph.node):
        raise ControlGraftError(f"duration tensor '{DURATION_TENSOR}' not found: is this the kokoro-v1.0 ONNX export?")
    for node in model.graph.node:
        for names in (node.input, node.output):
            for index, name in enumerate(names):
                if name == DURATION_TENSOR:
                    names[index] = DURATION_OUTPUT
    model.graph.output.append(helper.make_tensor_value_info(DURATION_OUTPUT, TensorProto.FLOAT, [1, "tokens_padded"]))
    return model


def add_controls(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every control of this module: the f0_scale input and the durations output."""
    return add_duration_output(add_pitch_control(model))


def controlled_copy(source: Path, out_path: Path, source_sha256: str) -> Path:
    """`source` graph + controls, written once per (source hash, controls version), atomically."""
    key = f"{source_sha256} controls-v{CONTROLS_VERSION}"
    stamp = out_path.with_suffix(out_path.suffix + ".source")
    if out_path.is_file() and stamp.is_file() and stamp.read_text().strip() == key:
        return out_path
    model = add_controls(onnx.load(str(source)))
    with atomic_path(out_path) as tmp:
        onnx.save(model, str(tmp))
    stamp.write_text(key + "\n")
    return out_path
