"""Read a small float TFLite model and rebuild it as a torch module (for a one-time ONNX export).

Only what MediaPipe's face detector and face mesh use is supported: CONV_2D, DEPTHWISE_CONV_2D,
MAX/AVERAGE_POOL_2D, ADD, RELU/RELU6, PRELU, PAD, RESHAPE, CONCATENATION and DEQUANTIZE of fp16
constants. Anything else raises `UnsupportedTflite` naming the op, so a changed model fails loudly
instead of converting silently wrong.

The flatbuffer is parsed with `struct` against the field numbers of TensorFlow's `schema.fbs`
(Apache-2.0), so neither `tflite` nor `tensorflow` is needed at setup time.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class UnsupportedTflite(ValueError):
    """The .tflite file uses a feature this reader does not implement."""


# --- enums from tensorflow/lite/schema/schema.fbs --------------------------------------------
_DTYPES = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 9: np.int8, 7: np.int16}
_OPS = {0: "ADD", 1: "AVERAGE_POOL_2D", 2: "CONCATENATION", 3: "CONV_2D", 4: "DEPTHWISE_CONV_2D",
        6: "DEQUANTIZE", 17: "MAX_POOL_2D", 19: "RELU", 21: "RELU6", 22: "RESHAPE", 34: "PAD",
        54: "PRELU"}
_ACTIVATIONS = {0: None, 1: "RELU", 3: "RELU6"}
_SAME, _VALID = 0, 1


class _Table:
    """A flatbuffer table: a position in the buffer plus its vtable."""

    def __init__(self, buf: bytes, pos: int) -> None:
        self.buf, self.pos = buf, pos
        vtable = pos - struct.unpack_from("<i", buf, pos)[0]
        vt_size = struct.unpack_from("<H", buf, vtable)[0]
        self._slots = [struct.unpack_from("<H", buf, vtable + 4 + 2 * i)[0] for i in range((vt_size - 4) // 2)]

    def _off(self, field_id: int) -> int:
        return self._slots[field_id] if field_id < len(self._slots) else 0

    def scalar(self, field_id: int, fmt: str, default: Any = 0) -> Any:
        off = self._off(field_id)
        return struct.unpack_from("<" + fmt, self.buf, self.pos + off)[0] if off else default

    def _target(self, field_id: int) -> int | None:
        off = self._off(field_id)
        if not off:
            return None
        at = self.pos + off
        return at + struct.unpack_from("<I", self.buf, at)[0]

    def table(self, field_id: int) -> "_Table | None":
        at = self._target(field_id)
        return None if at is None else _Table(self.buf, at)

    def vector(self, field_id: int, fmt: str) -> list[Any]:
        at = self._target(field_id)
        if at is None:
            return []
        n = struct.unpack_from("<I", self.buf, at)[0]
        return list(struct.unpack_from(f"<{n}{fmt}", self.buf, at + 4))

    def raw_bytes(self, field_id: int) -> bytes:
        at = self._target(field_id)
        if at is None:
            return b""
        n = struct.unpack_from("<I", self.buf, at)[0]
        return self.buf[at + 4:at + 4 + n]

    def tables(self, field_id: int) -> list["_Table"]:
        at = self._target(field_id)
        if at is None:
            return []
        n = struct.unpack_from("<I", self.buf, at)[0]
        out = []
        for i in range(n):
            elem = at + 4 + 4 * i
            out.append(_Table(self.buf, elem + struct.unpack_from("<I", self.buf, elem)[0]))
        return out

    def string(self, field_id: int) -> str:
        return self.raw_bytes(field_id).decode("utf-8")


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: Any
    data: np.ndarray | None  # constant weights, None for activations


@dataclass
class Op:
    kind: str
    inputs: list[int]
    outputs: list[int]
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class TfliteGraph:
    tensors: list[Tensor]
    ops: list[Op]
    inputs: list[int]
    outputs: list[int]


def _options(kind: str, t: _Table | None) -> dict[str, Any]:
    if t is None:
        return {}
    if kind == "CONV_2D":
        return {"padding": t.scalar(0, "b"), "stride": (t.scalar(2, "i"), t.scalar(1, "i")),
                "act": t.scalar(3, "b"), "dilation": (t.scalar(5, "i", 1), t.scalar(4, "i", 1))}
    if kind == "DEPTHWISE_CONV_2D":
        return {"padding": t.scalar(0, "b"), "stride": (t.scalar(2, "i"), t.scalar(1, "i")),
                "act": t.scalar(4, "b"), "dilation": (t.scalar(6, "i", 1), t.scalar(5, "i", 1))}
    if kind in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
        return {"padding": t.scalar(0, "b"), "stride": (t.scalar(2, "i"), t.scalar(1, "i")),
                "kernel": (t.scalar(4, "i"), t.scalar(3, "i")), "act": t.scalar(5, "b")}
    if kind == "ADD":
        return {"act": t.scalar(0, "b")}
    if kind == "CONCATENATION":
        return {"axis": t.scalar(0, "i"), "act": t.scalar(1, "b")}
    if kind == "RESHAPE":
        return {"new_shape": t.vector(0, "i")}
    return {}


def read_tflite(path: Path) -> TfliteGraph:
    """Parse the first subgraph of a .tflite file into tensors (with constant data) and ops."""
    buf = Path(path).read_bytes()
    if len(buf) < 8 or buf[4:8] != b"TFL3":
        raise UnsupportedTflite(f"{path} is not a TFLite flatbuffer (missing 'TFL3' identifier); "
                                "re-run `python -m digital_human setup` to fetch it again")
    model = _Table(buf, struct.unpack_from("<I", buf, 0)[0])
    codes = []
    for oc in model.tables(1):
        # builtin_code (field 3) supersedes the int8 deprecated_builtin_code (field 0) above 127
        codes.append(max(oc.scalar(0, "b"), oc.scalar(3, "i")))
    buffers = model.tables(4)
    graphs = model.tables(2)
    if len(graphs) != 1:
        raise UnsupportedTflite(f"{path}: expected one subgraph, found {len(graphs)}")
    g = graphs[0]
    tensors: list[Tensor] = []
    for t in g.tables(0):
        shape = tuple(t.vector(0, "i"))
        ttype = t.scalar(1, "b")
        if ttype not in _DTYPES:
            raise UnsupportedTflite(f"{path}: tensor type {ttype} is not supported")
        dtype = _DTYPES[ttype]
        quant = t.table(4)
        if quant is not None and quant.vector(2, "f") and dtype not in (np.float32, np.float16, np.int32):
            raise UnsupportedTflite(f"{path}: integer-quantized tensor '{t.string(3)}' is not supported")
        data = None
        b = buffers[t.scalar(2, "I")]
        raw = b.raw_bytes(0)
        offset, size = b.scalar(1, "Q"), b.scalar(2, "Q")
        if not raw and offset > 1:  # large models keep buffers after the flatbuffer
            raw = buf[offset:offset + size]
        if raw:
            data = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        tensors.append(Tensor(t.string(3), shape, dtype, data))
    ops: list[Op] = []
    for o in g.tables(3):
        code = codes[o.scalar(0, "I")]
        kind = _OPS.get(code)
        if kind is None:
            raise UnsupportedTflite(f"{path}: builtin operator {code} is not supported by this reader")
        ops.append(Op(kind, o.vector(1, "i"), o.vector(2, "i"), _options(kind, o.table(4))))
    return TfliteGraph(tensors, ops, g.vector(1, "i"), g.vector(2, "i"))


# --- torch rebuild -----------------------------------------------------------------------------
_NHWC_TO_NCHW_AXIS = {0: 0, 1: 2, 2: 3, 3: 1}


def _same_pads(size: int, kernel: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TFLite 'SAME': output = ceil(in / stride); the odd extra pixel goes after (bottom/right)."""
    eff = (kernel - 1) * dilation + 1
    total = max((math.ceil(size / stride) - 1) * stride + eff - size, 0)
    return total // 2, total - total // 2


def _act(x: torch.Tensor, act: int) -> torch.Tensor:
    if act not in _ACTIVATIONS:
        raise UnsupportedTflite(f"fused activation {act} is not supported")
    name = _ACTIVATIONS[act]
    if name == "RELU":
        return F.relu(x)
    if name == "RELU6":
        return F.relu6(x)
    return x


class TfliteModule(nn.Module):
    """Runs a parsed TFLite graph with torch ops, NCHW inside, NHWC at the input like TFLite.

    The op list is replayed in forward(); tracing/exporting unrolls it into a static graph. Weights
    are converted once (OHWI -> OIHW, depthwise 1HWC -> C1HW, fp16 -> fp32), so results match the
    TFLite interpreter, which also computes in fp32 on dequantized weights.
    """

    def __init__(self, graph: TfliteGraph) -> None:
        super().__init__()
        self.graph = graph
        consts: dict[int, np.ndarray] = {i: t.data for i, t in enumerate(graph.tensors) if t.data is not None}
        self._plan: list[tuple[Op, dict[str, Any]]] = []
        self.params = nn.ParameterDict()
        for op in graph.ops:
            if op.kind == "DEQUANTIZE":
                src = consts.get(op.inputs[0])
                if src is None or src.dtype != np.float16:
                    raise UnsupportedTflite("DEQUANTIZE of a non-constant or non-fp16 tensor is not supported")
                consts[op.outputs[0]] = src.astype(np.float32)
                continue
            self._plan.append((op, self._prepare(op, consts)))
        self.output_shapes = [graph.tensors[i].shape for i in graph.outputs]

    def _param(self, key: str, value: np.ndarray) -> str:
        self.params[key] = nn.Parameter(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)),
                                        requires_grad=False)
        return key

    def _prepare(self, op: Op, consts: dict[int, np.ndarray]) -> dict[str, Any]:
        t = self.graph.tensors
        name = t[op.outputs[0]].name.replace("/", "_").replace(".", "_").replace(":", "_")
        prep: dict[str, Any] = {}
        if op.kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            w = consts[op.inputs[1]]
            in_shape = t[op.inputs[0]].shape
            if op.kind == "CONV_2D":
                weight = w.transpose(0, 3, 1, 2)  # OHWI -> OIHW
                prep["groups"] = 1
            else:
                weight = w[0].transpose(2, 0, 1)[:, None]  # 1HW(C*M) -> (C*M)1HW
                prep["groups"] = in_shape[3]
            prep["weight"] = self._param(name + "_w", weight)
            if len(op.inputs) > 2 and op.inputs[2] >= 0:
                prep["bias"] = self._param(name + "_b", consts[op.inputs[2]])
            kh, kw = weight.shape[2:]
            prep["pads"] = self._pads(op, in_shape, (kh, kw))
        elif op.kind in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
            if op.kind == "AVERAGE_POOL_2D" and op.options["padding"] == _SAME:
                pads = self._pads(op, t[op.inputs[0]].shape, op.options["kernel"])
                if any(pads):  # TFLite excludes padding from the average; not worth emulating here
                    raise UnsupportedTflite("AVERAGE_POOL_2D with non-zero SAME padding is not supported")
            prep["pads"] = self._pads(op, t[op.inputs[0]].shape, op.options["kernel"])
        elif op.kind == "PRELU":
            alpha = consts[op.inputs[1]].reshape(-1)
            prep["alpha"] = self._param(name + "_alpha", alpha)
        elif op.kind == "PAD":
            pads = consts[op.inputs[1]]  # [rank, 2] in NHWC order
            if pads.shape[0] != 4 or pads[0].any():
                raise UnsupportedTflite("PAD is supported on NHWC tensors without batch padding only")
            (ht, hb), (wl, wr), (cl, cr) = pads[1], pads[2], pads[3]
            prep["pad"] = (int(wl), int(wr), int(ht), int(hb), int(cl), int(cr))  # F.pad order for NCHW
        elif op.kind == "ADD":
            for i in op.inputs:
                if i in consts:
                    c = consts[i]
                    if c.ndim > 1 and np.prod(c.shape[:-1]) != 1:
                        raise UnsupportedTflite("ADD with a non per-channel constant is not supported")
                    prep.setdefault("const", {})[i] = self._param(f"{name}_c{i}", c.reshape(-1))
        elif op.kind == "RESHAPE":
            shape = op.options.get("new_shape") or list(consts[op.inputs[1]])
            prep["shape"] = [int(s) for s in shape]
        elif op.kind == "CONCATENATION":
            rank = len(t[op.outputs[0]].shape)
            axis = op.options["axis"] % rank
            prep["axis"] = _NHWC_TO_NCHW_AXIS[axis] if rank == 4 else axis
        return prep

    def _pads(self, op: Op, in_shape: tuple[int, ...], kernel: tuple[int, int]) -> tuple[int, int, int, int]:
        if op.options["padding"] == _VALID:
            return (0, 0, 0, 0)
        sh, sw = op.options["stride"]
        dh, dw = op.options.get("dilation", (1, 1))
        top, bottom = _same_pads(in_shape[1], kernel[0], sh, dh)
        left, right = _same_pads(in_shape[2], kernel[1], sw, dw)
        return (left, right, top, bottom)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values: dict[int, torch.Tensor] = {self.graph.inputs[0]: x.permute(0, 3, 1, 2)}
        for op, prep in self._plan:
            values[op.outputs[0]] = self._run(op, prep, values)
        outs = []
        for i in self.graph.outputs:
            y = values[i]
            outs.append(y.permute(0, 2, 3, 1) if y.dim() == 4 else y)  # back to TFLite's NHWC
        return tuple(outs)

    def _run(self, op: Op, prep: dict[str, Any], values: dict[int, torch.Tensor]) -> torch.Tensor:
        kind, opt = op.kind, op.options
        if kind in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            x = values[op.inputs[0]]
            left, right, top, bottom = prep["pads"]
            if left == right and top == bottom:
                padding: Any = (top, left)
            else:  # TFLite SAME with stride 2 pads only bottom/right: make it explicit
                x = F.pad(x, (left, right, top, bottom))
                padding = 0
            bias = self.params[prep["bias"]] if "bias" in prep else None
            y = F.conv2d(x, self.params[prep["weight"]], bias, opt["stride"], padding, opt["dilation"],
                         prep["groups"])
            return _act(y, opt["act"])
        if kind in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
            x = values[op.inputs[0]]
            left, right, top, bottom = prep["pads"]
            if any(prep["pads"]):
                x = F.pad(x, (left, right, top, bottom), value=-math.inf)
            pool = F.max_pool2d if kind == "MAX_POOL_2D" else F.avg_pool2d
            return _act(pool(x, opt["kernel"], opt["stride"]), opt["act"])
        if kind == "ADD":
            terms = []
            for i in op.inputs:
                if i in prep.get("const", {}):
                    c = self.params[prep["const"][i]]
                    ref = values[next(j for j in op.inputs if j in values)]
                    terms.append(c.reshape(1, -1, 1, 1) if ref.dim() == 4 else c)
                else:
                    terms.append(values[i])
            return _act(terms[0] + terms[1], opt["act"])
        if kind == "RELU":
            return F.relu(values[op.inputs[0]])
        if kind == "RELU6":
            return F.relu6(values[op.inputs[0]])
        if kind == "PRELU":
            return F.prelu(values[op.inputs[0]], self.params[prep["alpha"]])
        if kind == "PAD":
            return F.pad(values[op.inputs[0]], prep["pad"])
        if kind == "RESHAPE":
            x = values[op.inputs[0]]
            if x.dim() == 4:
                x = x.permute(0, 2, 3, 1)  # TFLite reshapes NHWC memory order
            shape = prep["shape"]
            out = x.reshape(x.shape[0], *shape[1:])  # keep the batch axis dynamic
            return out.permute(0, 3, 1, 2) if out.dim() == 4 else out
        if kind == "CONCATENATION":
            return _act(torch.cat([values[i] for i in op.inputs], dim=prep["axis"]), opt["act"])
        raise UnsupportedTflite(f"operator {kind} is not supported")


def load_tflite_module(path: Path) -> TfliteModule:
    """The .tflite file as an eval-mode torch module taking NHWC float input."""
    return TfliteModule(read_tflite(path)).eval()



def export_onnx(module: nn.Module, input_shape: tuple[int, ...], onnx_path: Path, input_name: str,
                output_names: list[str]) -> float:
    """Export with a dynamic batch axis, constant-fold, and return max |ONNX - torch| (batch of 2).

    Files are written under temporary names first so a failed export never leaves a half-written
    model behind.
    """
    import onnx

    from ..onnx_export import export_onnx as torch_to_onnx
    from ..onnx_export import parity

    onnx_path = Path(onnx_path)
    raw = onnx_path.with_name(f".{onnx_path.name}.raw")
    tidy = onnx_path.with_name(f".{onnx_path.name}.tmp")
    dynamic = {input_name: {0: "batch"}, **{n: {0: "batch"} for n in output_names}}
    try:
        torch_to_onnx(module, (torch.zeros(input_shape),), raw, [input_name], output_names, dynamic)
        _fold_constants(raw, tidy)
        onnx.checker.check_model(str(tidy), full_check=True)
        probe = np.random.default_rng(0).uniform(-1, 1, (2, *input_shape[1:])).astype(np.float32)
        report = parity(module, tidy, [probe], onnx_path.stem)
        tidy.replace(onnx_path)
    finally:
        raw.unlink(missing_ok=True)
        tidy.unlink(missing_ok=True)
    return report.max_abs_diff


def _fold_constants(src: Path, dst: Path) -> None:
    """Constant-fold the exported graph with ONNX Runtime's *basic* level (standard ops only).

    The TorchScript exporter writes every F.pad as a Shape/Slice/Concat chain; folding leaves one
    Pad node each and static output shapes, which TensorRT parses more happily. Basic level never
    introduces com.microsoft contrib ops; the opset imports ORT adds for its own domains are dropped.
    """
    import onnx
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.optimized_model_filepath = str(dst)
    ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
    model = onnx.load(str(dst))
    used = {node.domain for node in model.graph.node}
    if used - {"", "ai.onnx"}:
        raise UnsupportedTflite(f"constant folding introduced non-standard ops from {used}")
    keep = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    onnx.save(onnx.shape_inference.infer_shapes(model), str(dst))

