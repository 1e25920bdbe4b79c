"""Turn the int8 Kokoro graph into a plain float32 ONNX graph that TensorRT / torch converters accept.

The shipped graph was made by ONNX Runtime's dynamic quantizer plus its transformer optimizer, so it
holds (a) integer ops with run-time activation quantization and (b) ONNX Runtime contrib ops that only
ONNX Runtime executes. Both are undone here from the graph's own initializers:

dequantize (weights become float initializers, activations stay float):
  DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(x_scale*w_scale)           => MatMul
  DynamicQuantizeLinear -> ConvInteger [-> Add(Floor(bias/scale))] -> Cast -> Mul  => Conv (float bias)
  com.microsoft.DynamicQuantizeLSTM (W, R as int8 [dirs, in, 4h])                   => LSTM (W, R [dirs, 4h, in])
  Gather(int8 table) -> DequantizeLinear                                           => Gather(float table)
contrib ops (rewritten to the default ONNX domain):
  FastGelu(x, bias)                    => Add + tanh-GELU formula (or opset-20 Gelu(approximate="tanh"))
  SkipLayerNormalization(x, skip, g, b[, bias]) => Add(+Add) + LayerNormalization(axis=-1)
  FusedMatMul(A, B; transA/transB/alpha) => Transpose + MatMul (+ Mul alpha)
and, optionally, STFT => Conv1d with a windowed DFT basis (TensorRT has no STFT layer; onnx2torch
neither), which is exact up to float summation order.

Dequantizing makes the graph *more* accurate, not less: the float weights are the int8 weights
times their scales, and the activations are no longer rounded to 8 bits.
"""
from __future__ import annotations

import collections
import math
from pathlib import Path
from typing import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...atomic_file import atomic_path

CONTRIB_DOMAIN = "com.microsoft"
TARGET_OPSET = 20  # the source graph's default-domain opset; LayerNormalization needs >= 17
REWRITE_VERSION = "6"  # 6: + durations output (controls.py); bump when the rewrite changes so cached float graphs are rebuilt


class GraphRewriteError(RuntimeError):
    """The graph does not have the structure this rewrite expects (a different Kokoro export?)."""


class _Graph:
    """Small mutable view: producers, consumers, initializers, and a node list edited in place."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.g = model.graph
        self.inits = {t.name: t for t in self.g.initializer}
        self.nodes: list[onnx.NodeProto | None] = list(self.g.node)
        self._reindex()
        self._uid = 0

    def _reindex(self) -> None:
        self.prod: dict[str, int] = {}
        self.cons: dict[str, list[int]] = collections.defaultdict(list)
        for idx, n in enumerate(self.nodes):
            if n is None:
                continue
            for o in n.output:
                self.prod[o] = idx
            for i in n.input:
                self.cons[i].append(idx)

    def producer(self, name: str) -> onnx.NodeProto | None:
        idx = self.prod.get(name)
        return None if idx is None else self.nodes[idx]

    def only_consumer(self, name: str, op_type: str) -> onnx.NodeProto:
        users = [self.nodes[i] for i in self.cons.get(name, [])]
        if len(users) != 1 or users[0].op_type != op_type:
            got = [u.op_type for u in users]
            raise GraphRewriteError(f"expected '{name}' to feed exactly one {op_type}, found {got}")
        return users[0]

    def array(self, name: str) -> np.ndarray:
        if name not in self.inits:
            raise GraphRewriteError(f"expected '{name}' to be a constant initializer")
        return numpy_helper.to_array(self.inits[name])

    def add_init(self, base: str, value: np.ndarray) -> str:
        self._uid += 1
        name = f"{base}__f{self._uid}"
        tensor = numpy_helper.from_array(np.ascontiguousarray(value), name)
        self.g.initializer.append(tensor)
        self.inits[name] = tensor
        return name

    def fresh(self, base: str) -> str:
        self._uid += 1
        return f"{base}__r{self._uid}"

    def replace(self, anchor: onnx.NodeProto, new_nodes: list[onnx.NodeProto], remove: Iterable[onnx.NodeProto]) -> None:
        """Put `new_nodes` where `anchor` was (keeps topological order: every input of the chain being
        replaced is computed before its last node) and drop `remove`; dead producers go in prune()."""
        idx = self.nodes.index(anchor)
        for n in remove:
            if n is not anchor:
                self.nodes[self.nodes.index(n)] = None
        self.nodes[idx : idx + 1] = new_nodes
        self.nodes = [n for n in self.nodes if n is not None]
        self._reindex()

    def prune(self) -> None:
        """Drop nodes and initializers that no graph output depends on (the orphaned quantizers)."""
        needed = {o.name for o in self.g.output}
        keep: list[onnx.NodeProto] = []
        for n in reversed(self.nodes):
            if any(o in needed for o in n.output):
                keep.append(n)
                needed.update(i for i in n.input if i)
        self.nodes = keep[::-1]
        del self.g.node[:]
        self.g.node.extend(self.nodes)
        used = {i for n in self.nodes for i in n.input} | {o.name for o in self.g.output}
        inits = [t for t in self.g.initializer if t.name in used]
        del self.g.initializer[:]
        self.g.initializer.extend(inits)
        self.inits = {t.name: t for t in inits}
        self._reindex()


def _dequant(q: np.ndarray, zero_point: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return ((q.astype(np.float32) - zero_point.astype(np.float32)) * scale.astype(np.float32)).astype(np.float32)


def _weight_scale(g: _Graph, scales_mul_out: str) -> np.ndarray:
    """The output scale is Mul(dynamic x_scale, constant w_scale); return the constant factor."""
    mul = g.producer(scales_mul_out)
    if mul is None or mul.op_type != "Mul":
        raise GraphRewriteError(f"expected a Mul of scales producing '{scales_mul_out}'")
    consts = [i for i in mul.input if i in g.inits]
    if len(consts) != 1:
        raise GraphRewriteError(f"expected exactly one constant scale in '{mul.name}'")
    return g.array(consts[0])


def _float_input(g: _Graph, quantized: str) -> str:
    dql = g.producer(quantized)
    if dql is None or dql.op_type != "DynamicQuantizeLinear":
        raise GraphRewriteError(f"expected '{quantized}' to come from DynamicQuantizeLinear")
    return dql.input[0]


def _dequantize_matmul(g: _Graph, n: onnx.NodeProto) -> None:
    cast = g.only_consumer(n.output[0], "Cast")
    mul = g.only_consumer(cast.output[0], "Mul")
    w = _dequant(g.array(n.input[1]), g.array(n.input[3]), _weight_scale(g, mul.input[1]))
    w_name = g.add_init(n.input[1].removesuffix("_quantized"), w)
    new = helper.make_node("MatMul", [_float_input(g, n.input[0]), w_name], [mul.output[0]], name=n.name + "_float")
    g.replace(mul, [new], [n, cast])


def _dequantize_conv(g: _Graph, n: onnx.NodeProto) -> None:
    nxt = [g.nodes[i] for i in g.cons[n.output[0]]]
    bias_name = None
    removed = [n]
    if len(nxt) == 1 and nxt[0].op_type == "Add":
        # the float bias is quantized in-graph: Reshape(Cast(Floor(Div(bias, scale)))); take `bias` itself
        add = nxt[0]
        node = g.producer(add.input[1])
        while node is not None and node.op_type != "Div":
            node = g.producer(node.input[0])
        if node is None or node.input[0] not in g.inits:
            raise GraphRewriteError(f"could not find the float bias of {n.name}")
        bias_name = node.input[0]
        removed.append(add)
        cast = g.only_consumer(add.output[0], "Cast")
    else:
        cast = g.only_consumer(n.output[0], "Cast")
    mul = g.only_consumer(cast.output[0], "Mul")
    removed.append(cast)
    scale = _weight_scale(g, mul.input[1])
    q = g.array(n.input[1])
    zp = g.array(n.input[3]) if len(n.input) > 3 and n.input[3] else np.zeros((), q.dtype)
    if scale.ndim == 1 and scale.size > 1:  # per-output-channel weights: broadcast over [O, I, k...]
        shape = (-1,) + (1,) * (q.ndim - 1)
        scale, zp = scale.reshape(shape), zp.reshape(shape) if zp.ndim else zp
    w_name = g.add_init(n.input[1].removesuffix("_quantized"), _dequant(q, zp, scale))
    inputs = [_float_input(g, n.input[0]), w_name] + ([bias_name] if bias_name else [])
    new = helper.make_node("Conv", inputs, [mul.output[0]], name=n.name + "_float")
    new.attribute.extend(n.attribute)  # ConvInteger and Conv share kernel/pads/strides/dilations/group
    g.replace(mul, [new], removed)


def _dequantize_lstm(g: _Graph, n: onnx.NodeProto) -> None:
    # contrib inputs: X, W, R, B, seq_lens, h0, c0, P, W_scale, W_zp, R_scale, R_zp
    # contrib W is [dirs, input, 4h] (transposed for the integer GEMM); ONNX LSTM wants [dirs, 4h, input]
    ins = list(n.input) + [""] * (12 - len(n.input))
    w = _dequant(g.array(ins[1]), g.array(ins[9])[:, None, None], g.array(ins[8])[:, None, None])
    r = _dequant(g.array(ins[2]), g.array(ins[11])[:, None, None], g.array(ins[10])[:, None, None])
    w_name = g.add_init(ins[1].removesuffix("_quantized"), w.transpose(0, 2, 1))
    r_name = g.add_init(ins[2].removesuffix("_quantized"), r.transpose(0, 2, 1))
    inputs = [ins[0], w_name, r_name] + ins[3:8]
    while inputs and not inputs[-1]:
        inputs.pop()
    new = helper.make_node("LSTM", inputs, list(n.output), name=n.name + "_float")
    new.attribute.extend(n.attribute)  # direction, hidden_size, input_forget, activations...
    g.replace(n, [new], [])


def _dequantize_gather(g: _Graph, n: onnx.NodeProto) -> None:
    gather = g.producer(n.input[0])
    if gather is None or gather.op_type != "Gather" or gather.input[0] not in g.inits:
        raise GraphRewriteError(f"DequantizeLinear {n.name}: expected Gather(constant table, indices) input")
    table = g.array(gather.input[0])
    zp = g.array(n.input[2]) if len(n.input) > 2 and n.input[2] else np.zeros((), table.dtype)
    scale = g.array(n.input[1])
    if scale.ndim:  # per-axis DequantizeLinear (not in Kokoro): only the scalar form is handled
        raise GraphRewriteError(f"DequantizeLinear {n.name}: per-axis scale not supported")
    t_name = g.add_init(gather.input[0].removesuffix("_quantized"), _dequant(table, zp, scale))
    new = helper.make_node("Gather", [t_name, gather.input[1]], [n.output[0]], name=gather.name + "_float")
    new.attribute.extend(gather.attribute)
    g.replace(n, [new], [gather])


def _const(g: _Graph, base: str, value: float) -> str:
    return g.add_init(base, np.array(value, dtype=np.float32))


def _rewrite_fast_gelu(g: _Graph, n: onnx.NodeProto, use_gelu_op: bool) -> None:
    x = n.input[0]
    nodes: list[onnx.NodeProto] = []
    if len(n.input) > 1 and n.input[1]:
        xb = g.fresh(n.name + "_biased")
        nodes.append(helper.make_node("Add", [x, n.input[1]], [xb]))
        x = xb
    y = n.output[0]
    if use_gelu_op:
        nodes.append(helper.make_node("Gelu", [x], [y], approximate="tanh"))
    else:
        # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))): TensorRT fuses this pattern into its GELU kernel
        t = [g.fresh(n.name + s) for s in ("_x2", "_x3", "_cx3", "_in", "_sin", "_th", "_1p", "_xh")]
        nodes += [
            helper.make_node("Mul", [x, x], [t[0]]),
            helper.make_node("Mul", [t[0], x], [t[1]]),
            helper.make_node("Mul", [t[1], _const(g, "gelu_c", 0.044715)], [t[2]]),
            helper.make_node("Add", [x, t[2]], [t[3]]),
            helper.make_node("Mul", [t[3], _const(g, "gelu_k", math.sqrt(2.0 / math.pi))], [t[4]]),
            helper.make_node("Tanh", [t[4]], [t[5]]),
            helper.make_node("Add", [t[5], _const(g, "gelu_one", 1.0)], [t[6]]),
            helper.make_node("Mul", [x, t[6]], [t[7]]),
            helper.make_node("Mul", [t[7], _const(g, "gelu_half", 0.5)], [y]),
        ]
    for k, node in enumerate(nodes):
        node.name = f"{n.name}_std{k}"
    g.replace(n, nodes, [])


def _rewrite_skip_layer_norm(g: _Graph, n: onnx.NodeProto) -> None:
    extra = [o for o in n.output[1:] if o and g.cons.get(o)]
    if extra:  # mean / inv_std / sum outputs: Kokoro does not use them
        raise GraphRewriteError(f"{n.name}: optional outputs {extra} are used; rewrite not implemented")
    eps = next((helper.get_attribute_value(a) for a in n.attribute if a.name == "epsilon"), 1e-12)
    ins = list(n.input) + [""] * (5 - len(n.input))
    s = g.fresh(n.name + "_sum")
    nodes = [helper.make_node("Add", [ins[0], ins[1]], [s])]
    if ins[4]:
        s2 = g.fresh(n.name + "_sumb")
        nodes.append(helper.make_node("Add", [s, ins[4]], [s2]))
        s = s2
    ln_in = [s, ins[2]] + ([ins[3]] if ins[3] else [])
    nodes.append(helper.make_node("LayerNormalization", ln_in, [n.output[0]], axis=-1, epsilon=float(eps)))
    for k, node in enumerate(nodes):
        node.name = f"{n.name}_std{k}"
    g.replace(n, nodes, [])


def _rewrite_fused_matmul(g: _Graph, n: onnx.NodeProto, ranks: dict[str, int]) -> None:
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    if attrs.get("transBatchA", 0) or attrs.get("transBatchB", 0):
        raise GraphRewriteError(f"{n.name}: FusedMatMul with transBatch* is not handled")
    nodes: list[onnx.NodeProto] = []
    ins = []
    for name, flag in ((n.input[0], attrs.get("transA", 0)), (n.input[1], attrs.get("transB", 0))):
        if flag:
            rank = ranks.get(name)
            if rank is None or rank < 2:
                raise GraphRewriteError(f"{n.name}: rank of '{name}' unknown; cannot express the transpose")
            t = g.fresh(name + "_T")
            perm = list(range(rank - 2)) + [rank - 1, rank - 2]
            nodes.append(helper.make_node("Transpose", [name], [t], perm=perm))
            name = t
        ins.append(name)
    alpha = float(attrs.get("alpha", 1.0))
    if alpha != 1.0:
        mm = g.fresh(n.name + "_mm")
        nodes.append(helper.make_node("MatMul", ins, [mm]))
        nodes.append(helper.make_node("Mul", [mm, _const(g, "fmm_alpha", alpha)], [n.output[0]]))
    else:
        nodes.append(helper.make_node("MatMul", ins, [n.output[0]]))
    for k, node in enumerate(nodes):
        node.name = f"{n.name}_std{k}"
    g.replace(n, nodes, [])


def _rewrite_stft(g: _Graph, n: onnx.NodeProto, ranks: dict[str, int]) -> None:
    """ONNX STFT (real signal [B, L, 1] or [B, L], onesided) as Conv1d over [B, 1, L] with a windowed DFT basis."""
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    ins = list(n.input) + [""] * (4 - len(n.input))
    if not attrs.get("onesided", 1) or not ins[2] or not ins[1]:
        raise GraphRewriteError(f"{n.name}: only onesided STFT with constant window and step is handled")
    step = int(g.array(ins[1]))
    window = g.array(ins[2]).astype(np.float64)
    n_fft = int(g.array(ins[3])) if ins[3] else window.size
    if window.size != n_fft:
        raise GraphRewriteError(f"{n.name}: window length {window.size} != frame length {n_fft}")
    bins = n_fft // 2 + 1
    k = np.arange(bins)[:, None]
    t = np.arange(n_fft)[None, :]
    ang = 2.0 * np.pi * k * t / n_fft
    basis = np.concatenate([np.cos(ang) * window, -np.sin(ang) * window])  # real rows, then imag rows
    # The imaginary part of the DC and Nyquist bins of a real signal is exactly 0 in torch.stft, where
    # Kokoro was trained, so its phase there is atan2(+0, re) = +pi whenever re < 0. The exported
    # graph computes atan2 as Where(re < 0, Where(im > 0, atan + pi, atan - pi), atan): fed an exact 0
    # it gives -pi, and ONNX Runtime's own STFT leaves +-1e-7 round-off there, i.e. a random +-pi per
    # frame (44 % of the generator's phase input differed by 2*pi between two exact-to-1e-6 STFTs).
    # Zero the round-off in the basis and add a tiny positive imaginary bias on those two bins so the
    # graph reproduces the training-time +pi; 1e-5 survives FP16 and is far below the signal's scale.
    basis[np.abs(basis) < 1e-9] = 0.0
    bias = np.zeros(2 * bins, dtype=np.float32)
    bias[bins] = 1e-5  # imag, DC
    if n_fft % 2 == 0:
        bias[2 * bins - 1] = 1e-5  # imag, Nyquist
    w_name = g.add_init(n.name + "_dft", basis[:, None, :].astype(np.float32))  # [2*bins, 1, n_fft]
    b_name = g.add_init(n.name + "_dft_bias", bias)
    x_t, conv, re = (g.fresh(n.name + s) for s in ("_x", "_conv", "_re"))
    shape = g.add_init(n.name + "_shape", np.array([0, 2, bins, -1], dtype=np.int64))
    rank = ranks.get(ins[0])
    if rank == 3:
        to_ncl = helper.make_node("Transpose", [ins[0]], [x_t], perm=[0, 2, 1])
    elif rank == 2:  # ONNX Runtime also accepts a real signal without the trailing 1 (Kokoro's export)
        to_ncl = helper.make_node("Unsqueeze", [ins[0], g.add_init(n.name + "_ax", np.array([1], np.int64))], [x_t])
    else:
        raise GraphRewriteError(f"{n.name}: signal rank {rank} unknown or unsupported")
    nodes = [
        to_ncl,
        helper.make_node("Conv", [x_t, w_name, b_name], [conv], strides=[step], kernel_shape=[n_fft]),
        helper.make_node("Reshape", [conv, shape], [re]),
        helper.make_node("Transpose", [re], [n.output[0]], perm=[0, 3, 2, 1]),  # -> [B, frames, bins, 2]
    ]
    for i, node in enumerate(nodes):
        node.name = f"{n.name}_std{i}"
    g.replace(n, nodes, [])


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model)
    out = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if v.type.tensor_type.HasField("shape"):
            out[v.name] = len(v.type.tensor_type.shape.dim)
    for t in model.graph.initializer:
        out[t.name] = len(t.dims)
    return out


def dequantize(model: onnx.ModelProto) -> collections.Counter:
    """Replace every integer op in place; returns how many of each kind were rewritten."""
    g = _Graph(model)
    done: collections.Counter = collections.Counter()
    handlers = {
        "MatMulInteger": _dequantize_matmul,
        "ConvInteger": _dequantize_conv,
        "DynamicQuantizeLSTM": _dequantize_lstm,
        "DequantizeLinear": _dequantize_gather,
    }
    for op, fn in handlers.items():
        for n in [n for n in g.nodes if n.op_type == op]:
            fn(g, n)
            done[op] += 1
    g.prune()
    left = {n.op_type for n in g.nodes} & {"DynamicQuantizeLinear", "QuantizeLinear", *handlers}
    if left:
        raise GraphRewriteError(f"integer ops left after dequantization: {sorted(left)}")
    return done


def replace_contrib_ops(model: onnx.ModelProto, use_gelu_op: bool = False, stft_as_conv: bool = True) -> collections.Counter:
    """Rewrite ONNX Runtime contrib ops (and optionally STFT) to default-domain ONNX ops, in place."""
    # shape inference cannot see through contrib ops, so rewrite the shape-preserving ones first and
    # infer ranks afterwards for the ops whose rewrite needs them (FusedMatMul transposes, STFT layout)
    done: collections.Counter = collections.Counter()
    g = _Graph(model)
    for n in list(g.nodes):
        if n.domain != CONTRIB_DOMAIN:
            continue
        if n.op_type == "FastGelu":
            _rewrite_fast_gelu(g, n, use_gelu_op)
        elif n.op_type == "SkipLayerNormalization":
            _rewrite_skip_layer_norm(g, n)
        else:
            continue
        done[n.op_type] += 1
    g.prune()
    ranks = _ranks(model)
    g = _Graph(model)
    for n in list(g.nodes):
        if n.op_type == "FusedMatMul" and n.domain == CONTRIB_DOMAIN:
            _rewrite_fused_matmul(g, n, ranks)
        elif n.op_type == "STFT" and n.domain in ("", "ai.onnx") and stft_as_conv:
            _rewrite_stft(g, n, ranks)
        else:
            continue
        done[n.op_type] += 1
    g.prune()
    foreign = sorted({f"{n.domain}::{n.op_type}" for n in g.nodes if n.domain not in ("", "ai.onnx")})
    if foreign:
        raise GraphRewriteError(f"non-standard ops left that no rewrite handles: {foreign}")
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("", TARGET_OPSET))
    return done


def to_float_model(int8_model: onnx.ModelProto, use_gelu_op: bool = False, stft_as_conv: bool = True) -> tuple[onnx.ModelProto, dict]:
    """A float32, default-domain-only copy of the int8 graph plus a report of what was rewritten."""
    model = onnx.ModelProto()
    model.CopyFrom(int8_model)
    deq = dequantize(model)
    std = replace_contrib_ops(model, use_gelu_op=use_gelu_op, stft_as_conv=stft_as_conv)
    model.producer_name, model.producer_version = "digital_human.kokoro.graph_rewrite", REWRITE_VERSION
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node), "rewrite left a non-default-domain op"
    onnx.checker.check_model(model, full_check=False)
    return model, {"dequantized": dict(deq), "contrib_rewritten": dict(std)}


def _key_path(out: Path) -> Path:
    return out.with_suffix(out.suffix + ".source")


def build_float_graph(int8_path: Path, out_path: Path, source_sha256: str) -> Path:
    """Write the float graph once per (source hash, rewrite version); atomic like the int8 assembly."""
    key = f"{source_sha256} rewrite-v{REWRITE_VERSION}"
    if out_path.is_file() and _key_path(out_path).is_file() and _key_path(out_path).read_text().strip() == key:
        return out_path
    from .controls import add_controls

    model, _ = to_float_model(onnx.load(str(int8_path)))
    add_controls(model)
    with atomic_path(out_path) as tmp:
        onnx.save(model, str(tmp))  # ~330 MB of float32 weights: still under protobuf's 2 GB limit
    _key_path(out_path).write_text(key + "\n")
    return out_path


def float_graph() -> Path:
    """Path of the cached float32 Kokoro graph (`<models>/kokoro/kokoro-v1.0.fp32.onnx`), built on first use."""
    from .assets import kokoro_assets

    a = kokoro_assets()
    return build_float_graph(a.int8_onnx, a.float_onnx, a.sha256)


def op_histogram(model: onnx.ModelProto) -> dict[str, int]:
    """`domain::op` -> count, for reports and tests."""
    c = collections.Counter(f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in model.graph.node)
    return dict(sorted(c.items()))


__all__ = [
    "GraphRewriteError",
    "dequantize",
    "replace_contrib_ops",
    "to_float_model",
    "build_float_graph",
    "float_graph",
    "op_histogram",
]
