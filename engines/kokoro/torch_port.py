"""Run the rewritten Kokoro float graph as a torch nn.Module (for the torch CUDA/FP16 backend).

Uses `onnx2torch` (Apache-2.0) on the default-domain float graph from graph_rewrite. onnx2torch
imports torchvision at import time only for its NMS / RoiAlign converters, which Kokoro does not use;
where torchvision is absent or broken (a CPU-only torch without a matching torchvision), a placeholder
module is registered for that import alone, and any use of it raises.
"""
from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any


def _placeholder_torchvision() -> types.ModuleType:
    def _missing(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("torchvision is not usable here; this graph needs it (NMS/RoiAlign): install torchvision")

    tv = types.ModuleType("torchvision")
    ops = types.ModuleType("torchvision.ops")
    ops.nms = ops.batched_nms = ops.roi_align = _missing  # type: ignore[attr-defined]
    tv.ops = ops  # type: ignore[attr-defined]
    return tv


def _import_onnx2torch() -> Any:
    try:
        return importlib.import_module("onnx2torch")
    except ImportError as exc:
        if "onnx2torch" in str(exc) and "torchvision" not in str(exc):
            raise RuntimeError("the torch backend for Kokoro needs onnx2torch: pip install onnx2torch") from exc
    except RuntimeError:  # torchvision present but its C ops don't match this torch build
        pass
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "torchvision" or k.startswith(("torchvision.", "onnx2torch"))}
    tv = _placeholder_torchvision()
    sys.modules["torchvision"], sys.modules["torchvision.ops"] = tv, tv.ops
    try:
        return importlib.import_module("onnx2torch")
    finally:
        # later `import torchvision` elsewhere must not see the placeholder
        for k in ("torchvision", "torchvision.ops"):
            sys.modules.pop(k, None)
        for k, v in saved.items():
            if k.startswith("torchvision"):
                sys.modules[k] = v


# onnx2torch 1.5 registers converters per (op, since-version) and stops at opset ~16-17 for several
# ops; the float graph is opset 20. These ops only widened their type lists (or gained inputs and
# attributes Kokoro leaves at defaults - checked in _check_defaults) since, so the older converter is
# exact for them.
_ALIASES = {
    ("Cast", 19): 13,
    ("ConstantOfShape", 20): 9,
    ("Equal", 19): 13,
    ("GreaterOrEqual", 16): 12,
    ("Reshape", 19): 14,
    ("Shape", 19): 15,
    ("ScatterND", 18): 16,
    ("Pad", 18): 13,
    ("Pad", 19): 13,
    ("Resize", 18): 13,
    ("Resize", 19): 13,
    ("Split", 18): 13,
}
_registered = False


def _check_defaults(model: Any) -> None:
    """Refuse graphs that use the newer inputs/attributes the aliased converters would ignore."""
    from onnx import helper

    for n in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        bad = (
            (n.op_type == "Pad" and len(n.input) > 3 and n.input[3])
            or (n.op_type == "Resize" and (attrs.get("antialias", 0) or attrs.get("axes")))
            or (n.op_type == "Split" and "num_outputs" in attrs)
            or (n.op_type == "ScatterND" and attrs.get("reduction", b"none") not in (b"none", "none"))
        )
        if bad:
            raise RuntimeError(f"torch port: {n.op_type} node '{n.name}' uses an opset-18+ feature onnx2torch lacks")


def _register_converters() -> None:
    global _registered
    if _registered:
        return
    from onnx2torch.node_converters.reduce import OnnxReduceStaticAxes
    from onnx2torch.node_converters.registry import _CONVERTER_REGISTRY, OperationDescription, add_converter
    from onnx2torch.utils.common import OnnxMapping, OperationConverterResult, get_const_value

    for (op, new), old in _ALIASES.items():
        key = OperationDescription(domain="", operation_type=op, version=new)
        if key not in _CONVERTER_REGISTRY:
            _CONVERTER_REGISTRY[key] = _CONVERTER_REGISTRY[OperationDescription(domain="", operation_type=op, version=old)]

    @add_converter(operation_type="ReduceMean", version=18)
    def _reduce_mean_18(node: Any, graph: Any) -> Any:  # axes moved from attribute to (constant) input
        axes = None
        if len(node.input_values) > 1 and node.input_values[1]:
            axes = get_const_value(node.input_values[1], graph).tolist()
        return OperationConverterResult(
            torch_module=OnnxReduceStaticAxes("ReduceMean", axes=axes, keepdims=node.attributes.get("keepdims", 1)),
            onnx_mapping=OnnxMapping(inputs=(node.input_values[0],), outputs=node.output_values),
        )

    @add_converter(operation_type="LSTM", version=14)
    def _lstm_14(node: Any, graph: Any) -> Any:
        ins = list(node.input_values) + [""] * (8 - len(node.input_values))
        w = get_const_value(ins[1], graph)
        r = get_const_value(ins[2], graph)
        b = get_const_value(ins[3], graph) if ins[3] else None
        module = _OnnxLSTM(w, r, b, node.attributes)
        inputs = (ins[0], ins[5] or None, ins[6] or None)
        if ins[4] or ins[7]:
            raise RuntimeError("torch port: LSTM with sequence_lens or peepholes is not supported")
        return OperationConverterResult(
            torch_module=module,
            onnx_mapping=OnnxMapping(inputs=tuple(i for i in inputs if i), outputs=node.output_values),
        )

    _registered = True


def _make_lstm_class() -> Any:
    import torch
    from torch import nn

    class OnnxLSTM(nn.Module):
        """ONNX LSTM (layout 0, gates i,o,f,c) as torch.nn.LSTM (gates i,f,g,o)."""

        def __init__(self, w: Any, r: Any, b: Any, attrs: dict) -> None:
            super().__init__()
            direction = attrs.get("direction", "forward")
            direction = direction.decode() if isinstance(direction, bytes) else direction
            if direction == "reverse" or attrs.get("layout", 0) or attrs.get("input_forget", 0):
                raise RuntimeError(f"torch port: LSTM direction={direction} layout/input_forget unsupported")
            if attrs.get("activations") or attrs.get("clip"):
                raise RuntimeError("torch port: LSTM with custom activations/clip unsupported")
            dirs, four_h, n_in = w.shape
            hidden = four_h // 4
            self.hidden = hidden
            self.lstm = nn.LSTM(n_in, hidden, batch_first=False, bidirectional=dirs == 2)
            order = torch.cat([torch.arange(0, hidden), torch.arange(2 * hidden, 3 * hidden),
                               torch.arange(3 * hidden, 4 * hidden), torch.arange(hidden, 2 * hidden)])  # iofc -> ifco
            b = torch.zeros(dirs, 8 * hidden) if b is None else b
            with torch.no_grad():
                for d in range(dirs):
                    sfx = "_reverse" if d else ""
                    getattr(self.lstm, f"weight_ih_l0{sfx}").copy_(w[d][order])
                    getattr(self.lstm, f"weight_hh_l0{sfx}").copy_(r[d][order])
                    getattr(self.lstm, f"bias_ih_l0{sfx}").copy_(b[d, : 4 * hidden][order])
                    getattr(self.lstm, f"bias_hh_l0{sfx}").copy_(b[d, 4 * hidden :][order])
            self.dirs = dirs

        def forward(self, x: Any, h0: Any = None, c0: Any = None) -> Any:
            state = None if h0 is None else (h0, c0 if c0 is not None else torch.zeros_like(h0))
            y, (h, c) = self.lstm(x, state)
            seq, batch = y.shape[0], y.shape[1]
            y = y.view(seq, batch, self.dirs, self.hidden).permute(0, 2, 1, 3)  # -> [seq, dirs, batch, hidden]
            return y, h, c

    return OnnxLSTM


class _LazyLSTM:
    cls: Any = None

    def __call__(self, *args: Any) -> Any:
        if self.cls is None:
            self.cls = _make_lstm_class()
        return self.cls(*args)


_OnnxLSTM = _LazyLSTM()


def torch_module_from_onnx(path: str | Path) -> Any:
    """nn.Module (eval mode, CPU, float32) equivalent to the ONNX graph at `path`.

    Called as module(tokens int64 [1, N+2], style float32 [1, 256], speed float32 [1]) -> audio [T].
    """
    import onnx

    onnx2torch = _import_onnx2torch()
    _register_converters()
    model = onnx.load(str(path))
    _check_defaults(model)
    for n in model.graph.node:  # onnx2torch reads a trailing "" (omitted optional input) as a name
        while n.input and not n.input[-1]:
            n.input.pop()
    module = onnx2torch.convert(model)
    _make_autocast_safe(module)
    return module.eval()


def _make_autocast_safe(module: Any) -> None:
    """Under FP16 autocast a convolution's output is half while ONNX-side constants stay float;
    index_put (ScatterND) refuses mixed dtypes where ONNX has one type, so align them to the
    destination. Other ops promote types on their own."""
    for sub in module.modules():
        if type(sub).__name__ == "OnnxScatterND":
            original = sub.forward

            def forward(data: Any, indices: Any, updates: Any, _orig: Any = original) -> Any:
                return _orig(data, indices, updates.to(data.dtype))

            sub.forward = forward


def kokoro_torch_module() -> Any:
    """Factory for ModelSpec.torch_factory: the cached float graph, converted."""
    from .graph_rewrite import float_graph

    return torch_module_from_onnx(float_graph())
