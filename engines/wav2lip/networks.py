"""The Wav2Lip generator with the release's state-dict names, its strict loader and its inference form.

The release checkpoints (wav2lip.pth, wav2lip_gan.pth) are torch.save'd dicts {"state_dict": ..., "optimizer":
..., "global_step": ..., "global_epoch": ...} whose state-dict keys carry DataParallel's "module." prefix
(the reference's load_model strips it). Every layer is conv -> BatchNorm -> ReLU (a residual block adds its
input before the ReLU), so the names below (`conv_block.0` conv, `conv_block.1` BatchNorm) are the release's.
For inference the BatchNorms are folded into their convolutions (eval statistics; FP32 differences ~1e-6) and
the network runs channels-last, in FP16 on CUDA.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .files import Wav2LipWeightsError

# (in, out, kernel, stride, padding, residual) per layer; one inner list per encoder/decoder stage.
_FACE_ENCODER = [
    [(6, 16, 7, 1, 3, False)],                                                               # 96 x 96
    [(16, 32, 3, 2, 1, False), (32, 32, 3, 1, 1, True), (32, 32, 3, 1, 1, True)],          # 48
    [(32, 64, 3, 2, 1, False)] + [(64, 64, 3, 1, 1, True)] * 3,                             # 24
    [(64, 128, 3, 2, 1, False)] + [(128, 128, 3, 1, 1, True)] * 2,                          # 12
    [(128, 256, 3, 2, 1, False)] + [(256, 256, 3, 1, 1, True)] * 2,                         # 6
    [(256, 512, 3, 2, 1, False), (512, 512, 3, 1, 1, True)],                                # 3
    [(512, 512, 3, 1, 0, False), (512, 512, 1, 1, 0, False)],                               # 1
]
_AUDIO_ENCODER = [  # mel [1, 80, 16] -> [512, 1, 1]
    (1, 32, 3, 1, 1, False), (32, 32, 3, 1, 1, True), (32, 32, 3, 1, 1, True),
    (32, 64, 3, (3, 1), 1, False), (64, 64, 3, 1, 1, True), (64, 64, 3, 1, 1, True),
    (64, 128, 3, 3, 1, False), (128, 128, 3, 1, 1, True), (128, 128, 3, 1, 1, True),
    (128, 256, 3, (3, 2), 1, False), (256, 256, 3, 1, 1, True),
    (256, 512, 3, 1, 0, False), (512, 512, 1, 1, 0, False),
]
# decoder stages: the first is a 1x1 conv on the audio embedding; each later one starts with a transposed conv
# (in, out, kernel, stride, padding, output_padding) on [previous output ++ the encoder's skip], then residuals
_DECODER_UP = [None, (1024, 512, 3, 1, 0, 0), (1024, 512, 3, 2, 1, 1), (768, 384, 3, 2, 1, 1),
               (512, 256, 3, 2, 1, 1), (320, 128, 3, 2, 1, 1), (160, 64, 3, 2, 1, 1)]
_DECODER_RES = [0, 1, 2, 2, 2, 2, 2]
MEL_STEPS = 16
FACE_SIZE = 96


class ConvBNReLU(nn.Module):
    """conv -> BatchNorm (-> + input when residual) -> ReLU; `conv_block` holds the conv and the norm (a folded
    block holds the conv alone, with the norm in its weights)."""

    def __init__(self, cin: int, cout: int, kernel, stride, padding, residual: bool = False,
                 transpose: bool = False, output_padding: int = 0) -> None:
        super().__init__()
        conv = (nn.ConvTranspose2d(cin, cout, kernel, stride, padding, output_padding) if transpose
                else nn.Conv2d(cin, cout, kernel, stride, padding))
        self.conv_block = nn.Sequential(conv, nn.BatchNorm2d(cout))
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv_block(x)
        if torch.is_grad_enabled():  # autograd: out-of-place, as written in the reference
            return torch.relu(out + x if self.residual else out)
        # inference: the same sum and ReLU in the conv's own output (no temporaries: ~10% of a CPU forward was
        # these two passes' allocations and copies); equal values, out is a fresh tensor nobody else holds
        if self.residual:
            out.add_(x)
        return out.relu_()


def _stage(layers) -> nn.Sequential:
    return nn.Sequential(*[ConvBNReLU(*layer) for layer in layers])


class Wav2LipGenerator(nn.Module):
    """forward(mel [B, 1, 80, 16], faces [B, 6, 96, 96] in 0..1: masked ++ reference) -> [B, 3, 96, 96] in 0..1
    (channels in the order the faces came: the release was trained on BGR)."""

    def __init__(self) -> None:
        super().__init__()
        self.face_encoder_blocks = nn.ModuleList([_stage(s) for s in _FACE_ENCODER])
        self.audio_encoder = _stage(_AUDIO_ENCODER)
        blocks = []
        for up, n_res in zip(_DECODER_UP, _DECODER_RES):
            if up is None:
                blocks.append(nn.Sequential(ConvBNReLU(512, 512, 1, 1, 0)))
                continue
            cin, cout, k, s, p, op = up
            blocks.append(nn.Sequential(ConvBNReLU(cin, cout, k, s, p, transpose=True, output_padding=op),
                                        *[ConvBNReLU(cout, cout, 3, 1, 1, True) for _ in range(n_res)]))
        self.face_decoder_blocks = nn.ModuleList(blocks)
        self.output_block = nn.Sequential(ConvBNReLU(80, 32, 3, 1, 1), nn.Conv2d(32, 3, 1, 1, 0), nn.Sigmoid())

    def forward(self, mel: torch.Tensor, faces: torch.Tensor) -> torch.Tensor:
        x = self.audio_encoder(mel)
        skips = []
        y = faces
        for stage in self.face_encoder_blocks:
            y = stage(y)
            skips.append(y)
        for stage in self.face_decoder_blocks:
            x = torch.cat((stage(x), skips.pop()), dim=1)
        return self.output_block(x)


def expected_shapes() -> dict[str, tuple[int, ...]]:
    """Every state-dict key of the release (without "module.") and its shape; num_batches_tracked excluded
    (present in the release, not needed to run)."""
    return {k: tuple(v.shape) for k, v in Wav2LipGenerator().state_dict().items()
            if not k.endswith("num_batches_tracked")}


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The generator's weights from a release checkpoint, checked key by key and shape by shape (one error
    naming every missing, unexpected and mis-shaped key). torch.load(weights_only=True): no code runs."""
    path = Path(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # not a torch zip / pickle of plain tensors: say what the file should be
        raise Wav2LipWeightsError(f"{path} is not a readable Wav2Lip checkpoint ({type(exc).__name__}: "
                                  f"{str(exc)[:300]}); use the release's wav2lip.pth / wav2lip_gan.pth") from exc
    state = ckpt.get("state_dict") if isinstance(ckpt, dict) else None
    if not isinstance(state, dict):
        raise Wav2LipWeightsError(f"{path} has no 'state_dict' entry (found {_keys_of(ckpt)}); the Wav2Lip release's "
                                  "checkpoints are dicts {'state_dict': ..., 'optimizer': ..., 'global_step': ...}")
    weights = {(k[len("module."):] if k.startswith("module.") else k): v for k, v in state.items()}
    expected = expected_shapes()
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected and not k.endswith("num_batches_tracked")]
    wrong = [f"{k} {tuple(weights[k].shape)} (expected {s})" for k, s in expected.items()
             if k in weights and tuple(weights[k].shape) != s]
    if missing or unexpected or wrong:
        parts = [f"{len(missing)} missing: {', '.join(missing[:20])}" if missing else "",
                 f"{len(unexpected)} unexpected: {', '.join(unexpected[:20])}" if unexpected else "",
                 f"{len(wrong)} with other shapes: {', '.join(wrong[:20])}" if wrong else ""]
        raise Wav2LipWeightsError(f"{path} is not a Wav2Lip generator checkpoint: " + "; ".join(p for p in parts if p)
                                  + " (a SyncNet or discriminator checkpoint, or another model, in its place?)")
    bad = [k for k in expected if not torch.is_floating_point(weights[k]) or not torch.isfinite(weights[k]).all()]
    if bad:
        raise Wav2LipWeightsError(f"{path}: non-finite or non-float weights in {', '.join(bad[:10])}")
    return {k: weights[k].float() for k in expected}


def _keys_of(obj: Any) -> str:
    return f"keys {sorted(obj)[:8]}" if isinstance(obj, dict) else type(obj).__name__


def load_generator(path: str | Path) -> Wav2LipGenerator:
    """The release's generator in eval mode, on the CPU, FP32 (BatchNorms as trained)."""
    net = Wav2LipGenerator()
    net.load_state_dict(read_state_dict(path), strict=False)  # strict checks done above; counters not needed
    return net.eval()


def _fold(block: ConvBNReLU) -> None:
    """Fold the block's BatchNorm (eval statistics) into its conv, in place."""
    conv, bn = block.conv_block[0], block.conv_block[1]
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    bias = bn.bias - bn.running_mean * scale
    with torch.no_grad():
        if isinstance(conv, nn.ConvTranspose2d):  # weight [in, out, k, k]: scale the output channels
            conv.weight.mul_(scale.view(1, -1, 1, 1))
        else:
            conv.weight.mul_(scale.view(-1, 1, 1, 1))
        conv.bias.copy_(conv.bias * scale + bias)
    block.conv_block = nn.Sequential(conv)


def fold_batchnorms(net: Wav2LipGenerator) -> Wav2LipGenerator:
    """The same function with every BatchNorm folded into its conv (inference only), in place."""
    for module in list(net.modules()):
        if isinstance(module, ConvBNReLU) and len(module.conv_block) == 2:
            _fold(module)
    return net


def inference_generator(path: str | Path, device: str = "cpu", precision: str = "fp32") -> Wav2LipGenerator:
    """The checkpoint's generator folded, channels-last, on `device` in `precision` (fp32 | fp16 | bf16)."""
    net = fold_batchnorms(load_generator(path))
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    return net.to(device=device, dtype=dtype, memory_format=torch.channels_last).eval()


_CACHE: dict[tuple, Wav2LipGenerator] = {}
_LOCK = threading.Lock()


def cached_generator(path: str | Path, device: str, precision: str) -> Wav2LipGenerator:
    """inference_generator kept for the process (one per file, its size and time, device and precision)."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, device, precision)
    with _LOCK:
        net = _CACHE.get(key)
        if net is None:
            for old in [k for k in _CACHE if k[0] == key[0] and k[3:] == key[3:]]:
                del _CACHE[old]  # the file changed: drop the old weights
            net = _CACHE[key] = inference_generator(p, device, precision)
        return net


def clear_cache() -> None:
    with _LOCK:
        _CACHE.clear()


class GraphedGenerator:
    """The generator replayed from one CUDA graph per batch size (FP16 batches of a few hundred frames are ~40
    small kernels each: launching them costs more than running them). Inputs are copied into static buffers;
    a batch smaller than the largest captured one is padded to it, so one graph serves a whole video.
    Falls back to eager calls, with a log line, when capture fails."""

    def __init__(self, net: Wav2LipGenerator, batch: int) -> None:
        self.net, self.batch = net, int(batch)
        self._graph = None
        self._failed = False
        self._replay = threading.Lock()  # one set of static buffers: one batch at a time

    def _capture(self, like_mel: torch.Tensor, like_faces: torch.Tensor) -> None:
        b = self.batch
        self._mel = torch.zeros((b,) + tuple(like_mel.shape[1:]), dtype=like_mel.dtype, device=like_mel.device)
        self._faces = torch.zeros((b,) + tuple(like_faces.shape[1:]), dtype=like_faces.dtype,
                                  device=like_faces.device).contiguous(memory_format=torch.channels_last)
        from ..cuda_streams import capture_stream

        stream = capture_stream(like_mel.device)  # this graph's own cuBLAS workspace (capture_stream)
        current = torch.cuda.current_stream(like_mel.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):
                self.net(self._mel, self._faces)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream), torch.inference_mode():
            self._out = self.net(self._mel, self._faces)
        current.wait_stream(stream)
        self._graph = graph

    def __call__(self, mel: torch.Tensor, faces: torch.Tensor) -> torch.Tensor:
        n = mel.shape[0]
        if self._failed or n > self.batch or mel.device.type != "cuda":
            return self.net(mel, faces)
        if self._graph is None:
            try:  # (two requests racing here capture twice; the second graph replaces the first)
                self._capture(mel, faces)
            except Exception as exc:  # announced fallback: eager calls give the same frames
                import logging

                logging.getLogger("digital_human.wav2lip").warning(
                    "[digital_human] Wav2Lip CUDA graph capture failed (%s); running eagerly", exc)
                self._failed = True
                return self.net(mel, faces)
        with self._replay:
            self._mel[:n].copy_(mel)
            self._faces[:n].copy_(faces)
            if n < self.batch:
                self._mel[n:].zero_()
                self._faces[n:].zero_()
            self._graph.replay()
            return self._out[:n].clone()


_GRAPHED: dict[tuple, GraphedGenerator] = {}


def graphed(net: Wav2LipGenerator, batch: int) -> GraphedGenerator:
    """The process's GraphedGenerator of `net` for `batch` (captured on first call)."""
    key = (id(net), int(batch))
    with _LOCK:
        hit = _GRAPHED.get(key)
        if hit is None:
            hit = _GRAPHED[key] = GraphedGenerator(net, batch)
        return hit
