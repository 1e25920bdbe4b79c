"""`clone`: the person-specific talking-head generator that TrainAvatar trains.

It repaints the lower face of an aligned face crop (DH_FACES) from three things:
  * `source`: the current frame's lower-face region; the model itself blanks everything below the
    nose line (a fixed "hole", so no jaw outline of the current frame leaks into the output - at
    inference the current frame's mouth is not the one we want);
  * `reference`: the same region of another frame of the same person (teeth, lips, beard, light);
  * `audio`: a log-mel window around the frame's time (audio_features.windows_for_frames);
  * `visemes` (avatars trained with `viseme_frames` > 0 only): the viseme track's targets, closure and
    confidence over a window of frames around this one (talking_head/visemes.feature_windows), from the
    TTS's phones or the aligner's; all zeros (confidence 0) where no phones are known. With
    `mouth_drive` each frame also carries portrait's four mouth parameters for the same speech
    (talking_head/clone/conditioning.py): the audio-only drive where no phones are known.
Output: the region with the hole filled, outside the hole bit-identical to `source`.

The region is a fixed box of the crop (crop coordinates from FaceAlign's template: nose tip at
the centre, chin ~0.8 S), so one model serves every frame without per-frame geometry.

Architecture: a 5-level U-Net (base 24 channels: ~4.6 M parameters) whose bottleneck
and first decoder level are modulated (FiLM) by a small conv audio encoder. Plain conv + LeakyReLU,
no normalisation layers: identical behaviour in training and inference, clean ONNX/TensorRT graph,
and FP16-safe.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..atomic_file import atomic_path
from .onnx_export import ParityReport, export_onnx, parity
from .spec import ModelSpec, TensorProfile

INPUT_NAMES = ("source", "reference", "audio")  # + "visemes" for a config with viseme_frames > 0
VISEME_INPUT = "visemes"
VISEME_CHANNELS = 6  # talking_head/visemes.FEATURE_NAMES
DRIVE_CHANNELS = 4   # portrait's MouthParams: jaw_open, lip_open, width, round (a mouth_drive config)
OUTPUT_NAMES = ("region",)
MAX_BATCH = 64


def _autocast_enabled(device_type: str) -> bool:
    """torch.is_autocast_enabled(device_type) exists from torch 2.4; the pack supports >= 2.1."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4: per-device query functions
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


@dataclass(frozen=True)
class GeneratorConfig:
    crop_size: int = 256
    base_channels: int = 24
    levels: int = 4          # downsamplings; region sides must divide by 2**levels
    n_mels: int = 80
    audio_columns: int = 40  # MelConfig.window_columns
    audio_dim: int = 256
    audio_channels: int = 32  # width of the audio encoder's first conv (doubles twice)
    # region box and hole, as fractions of the crop side (template geometry, see module doc)
    region_top: float = 0.4375
    region_height: float = 0.5
    region_width: float = 0.6875
    hole_top: float = 0.54   # just under the nose base (~0.56 S), so the nostrils stay real
    # frames of viseme features around each frame the generator also reads (odd; 0 = audio only, the
    # recipe of every avatar saved before visemes: their configs lack the key and load as 0)
    viseme_frames: int = 0
    # the viseme window also carries portrait's mouth drive per frame (False for every avatar saved
    # before it: their configs lack the key)
    mouth_drive: bool = False

    def input_names(self) -> tuple[str, ...]:
        return INPUT_NAMES + ((VISEME_INPUT,) if self.viseme_frames else ())

    def viseme_channels(self) -> int:
        """Features per frame of the viseme window."""
        return VISEME_CHANNELS + (DRIVE_CHANNELS if self.mouth_drive else 0)

    def viseme_width(self) -> int:
        return self.viseme_frames * self.viseme_channels()

    def region_box(self) -> tuple[int, int, int, int]:
        """(y0, y1, x0, x1) of the generator's region in crop pixels."""
        s, m = self.crop_size, 2 ** self.levels
        h = int(round(self.region_height * s / m)) * m
        w = int(round(self.region_width * s / m)) * m
        y0 = min(int(round(self.region_top * s)), s - h)
        x0 = (s - w) // 2
        return y0, y0 + h, x0, x0 + w

    def hole_row(self) -> int:
        """First row of the hole inside the region."""
        y0, y1, _, _ = self.region_box()
        return int(np.clip(round(self.hole_top * self.crop_size) - y0, 1, y1 - y0 - 1))

    def validate(self) -> None:
        if self.crop_size < 32 or self.levels < 1 or self.base_channels < 4:
            raise ValueError(f"generator config out of range: {self}")
        y0, y1, x0, x1 = self.region_box()
        if y1 - y0 < 2 ** self.levels or x1 - x0 < 2 ** self.levels:
            raise ValueError(f"crop_size {self.crop_size} is too small for {self.levels} levels")
        if self.viseme_frames < 0 or (self.viseme_frames and self.viseme_frames % 2 == 0):
            raise ValueError(f"viseme_frames must be 0 (off) or an odd number of frames, got {self.viseme_frames}")
        if self.mouth_drive and not self.viseme_frames:
            raise ValueError("mouth_drive rides on the viseme window: it needs viseme_frames > 0")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "GeneratorConfig":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def _conv(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.LeakyReLU(0.2, inplace=True))


class AudioEncoder(nn.Module):
    """[B, 1, n_mels, T] log-mel window -> [B, audio_dim]."""

    def __init__(self, dim: int, width: int = 32) -> None:
        super().__init__()
        w = width
        self.net = nn.Sequential(
            _conv(1, w), _conv(w, 2 * w, 2), _conv(2 * w, 2 * w), _conv(2 * w, 4 * w, 2),
            _conv(4 * w, 4 * w), _conv(4 * w, 8 * w, 2), _conv(8 * w, 8 * w, 2))
        self.out = nn.Linear(8 * w, dim)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        h = self.net(mel)
        return F.leaky_relu(self.out(h.mean(dim=(2, 3))), 0.2)


class FiLM(nn.Module):
    def __init__(self, audio_dim: int, channels: int) -> None:
        super().__init__()
        self.proj = nn.Linear(audio_dim, 2 * channels)
        nn.init.zeros_(self.proj.weight)  # start as identity: the image path trains first, audio takes over
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        gamma, beta = self.proj(a).chunk(2, dim=1)
        return x * (1.0 + gamma[:, :, None, None]) + beta[:, :, None, None]


class VisemeEncoder(nn.Module):
    """[B, config.viseme_width()] viseme window -> [B, audio_dim], added to the audio embedding. Its last
    layer starts at zero, so a new viseme model starts as the audio-only one and learns what the
    phones add; zeros in (no phones) give exactly the audio embedding at any point of training."""

    def __init__(self, width: int, dim: int, hidden: int = 128) -> None:
        super().__init__()
        self.inp = nn.Linear(width, hidden, bias=False)  # no bias: zeros in -> zeros out
        self.out = nn.Linear(hidden, dim, bias=False)
        nn.init.zeros_(self.out.weight)

    def forward(self, visemes: torch.Tensor) -> torch.Tensor:
        return self.out(F.leaky_relu(self.inp(visemes), 0.2))


class CloneGenerator(nn.Module):
    def __init__(self, config: GeneratorConfig = GeneratorConfig()) -> None:
        super().__init__()
        config.validate()
        self.config = config
        c = config.base_channels
        chans = [min(c * 2 ** i, 8 * c) for i in range(config.levels + 1)]
        self.stem = nn.Sequential(_conv(6, c), _conv(c, c))
        self.down = nn.ModuleList([nn.Sequential(_conv(chans[i], chans[i + 1], 2), _conv(chans[i + 1], chans[i + 1]))
                                   for i in range(config.levels)])
        bott = chans[-1]
        self.audio = AudioEncoder(config.audio_dim, config.audio_channels)
        self.visemes = VisemeEncoder(config.viseme_width(), config.audio_dim) if config.viseme_frames else None
        self.film_b = FiLM(config.audio_dim, bott)
        self.mid = nn.Sequential(_conv(bott + config.audio_dim, bott), _conv(bott, bott))
        self.film_d = FiLM(config.audio_dim, chans[-2])
        self.up = nn.ModuleList()
        for i in reversed(range(config.levels)):
            self.up.append(nn.Sequential(_conv(chans[i + 1] + chans[i], chans[i]), _conv(chans[i], chans[i])))
        self.head = nn.Conv2d(c, 3, 3, 1, 1)
        y0, y1, x0, x1 = config.region_box()
        hole = torch.zeros(1, 1, y1 - y0, x1 - x0)
        hole[:, :, config.hole_row():] = 1.0
        self.register_buffer("hole", hole, persistent=False)
        self.audio_dropout = 0.0  # set by fit_clone; not part of the weights or the exported graph
        self.audio_mute = 0.0     # likewise: share of training samples drawn from the viseme window alone

    def forward(self, source: torch.Tensor, reference: torch.Tensor, audio: torch.Tensor,
                visemes: torch.Tensor | None = None) -> torch.Tensor:
        return self.forward_parts(source, reference, audio, visemes)[0]

    def forward_parts(self, source: torch.Tensor, reference: torch.Tensor, audio: torch.Tensor,
                      visemes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(region, audio embedding): training supervises the embedding too (train_avatar's shape loss).
        visemes: read by a viseme model only (None there = no phones known: zeros)."""
        embedding = self.audio(audio)
        if self.visemes is not None and visemes is not None:  # None adds exactly 0 (VisemeEncoder)
            if self.training and self.audio_mute > 0:  # these samples must be drawn from the visemes alone
                keep = torch.rand(embedding.shape[0], 1, device=embedding.device) >= self.audio_mute
                embedding = embedding * keep.to(embedding.dtype)
            embedding = embedding + self.visemes(visemes.to(embedding.dtype))
        a = embedding
        if self.training and self.audio_dropout > 0:  # training-time regulariser; a no-op in eval/ONNX
            a = F.dropout(a, self.audio_dropout, training=True)
        return self.render(source, reference, a), embedding

    def render(self, source: torch.Tensor, reference: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """The region from an already computed audio embedding [B, audio_dim] (forward's image path;
        benchmarks edit embeddings, e.g. smooth them over time, before rendering)."""
        hole = self.hole.to(source.dtype)
        masked = source * (1.0 - hole)
        x = self.stem(torch.cat([masked, reference], dim=1) - 0.5)
        skips = [x]
        for block in self.down:
            x = block(x)
            skips.append(x)
        a = embedding
        x = self.film_b(skips.pop(), a)
        x = self.mid(torch.cat([x, a[:, :, None, None].expand(-1, -1, x.shape[2], x.shape[3])], dim=1))
        for i, block in enumerate(self.up):
            skip = skips.pop()
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
            x = block(torch.cat([x, skip], dim=1))
            if i == 0:
                x = self.film_d(x, a)
        out = self._head(x)
        return masked + hole * out.to(masked.dtype)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """Last conv + sigmoid, in FP32 under autocast. In bf16 sigmoid(x) rounds to exactly 1.0 for
        x > ~6, and its backward (y * (1 - y)) is then exactly 0: one large early update that pushes
        the head past that point leaves every hole pixel with zero gradient, Adam stops moving and the
        generator is frozen at a constant white mouth (the H200 run's identical metrics). In FP32 the
        gradient stays non-zero up to x ~ 17, so training can pull the output back. Outside autocast
        (FP32 training, ONNX export, the FP16 engine path) this is the plain conv + sigmoid."""
        if _autocast_enabled(x.device.type):
            with torch.autocast(device_type=x.device.type, enabled=False):
                return torch.sigmoid(self.head(x.float()))
        return torch.sigmoid(self.head(x))

    def example_inputs(self, batch: int = 1, seed: int = 0) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        y0, y1, x0, x1 = self.config.region_box()
        shape = (batch, 3, y1 - y0, x1 - x0)
        inputs = (torch.rand(shape, generator=g), torch.rand(shape, generator=g),
                  torch.randn(batch, 1, self.config.n_mels, self.config.audio_columns, generator=g))
        if self.config.viseme_frames:
            inputs += (torch.rand(batch, self.config.viseme_width(), generator=g),)
        return inputs


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- weights ---------------------------------------------------------------------------------
def save_generator(model: CloneGenerator, path: Path) -> Path:
    from safetensors.torch import save_file

    path = Path(path)
    state = {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata={"config": json.dumps(model.config.to_dict()), "model": "clone"})
    return path


def load_generator(path: Path, config: GeneratorConfig | None = None) -> CloneGenerator:
    """Build the generator from a safetensors file; keys and shapes must match exactly."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"clone generator weights not found: {path}")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        state = {k: f.get_tensor(k) for k in f.keys()}
    if config is None:
        if "config" not in meta:
            raise ValueError(f"{path} has no generator config in its metadata; it is not a clone generator file")
        config = GeneratorConfig.from_dict(json.loads(meta["config"]))
    model = CloneGenerator(config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(k for k in set(expected) & set(state) if tuple(expected[k].shape) != tuple(state[k].shape))
    if missing or unexpected or wrong:
        raise ValueError(f"{path} does not fit the clone generator ({config}): missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}, wrong shape {wrong[:5]}; retrain the avatar with TrainAvatar")
    model.load_state_dict(state, strict=True)
    return model.eval()


# --- ONNX and the engine layer -------------------------------------------------------------------
def export_generator_onnx(model: CloneGenerator, path: Path, check: bool = True) -> ParityReport | None:
    """Export with a dynamic batch axis; returns the ONNX-vs-torch parity report when `check`."""
    model = model.float().cpu().eval()
    example = model.example_inputs(2)
    names = model.config.input_names()
    dynamic = {name: {0: "batch"} for name in (*names, *OUTPUT_NAMES)}
    export_onnx(model, example, Path(path), list(names), OUTPUT_NAMES, dynamic_axes=dynamic)
    if not check:
        return None
    return parity(model, Path(path), [t.numpy() for t in model.example_inputs(3, seed=1)], name="clone")


def generator_spec(onnx_path: Path, weights_path: Path | None = None, name: str = "clone") -> ModelSpec:
    """The avatar's generator for `engines.loader.get`: batch 1..64 profiles; the torch backend builds
    the native module from the safetensors next to the graph (FP16 by weight conversion)."""
    onnx_path = Path(onnx_path)
    weights = Path(weights_path) if weights_path else onnx_path.with_name("generator.safetensors")
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False)
    dims = {i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim) for i in graph.graph.input}
    profiles = {}
    names = INPUT_NAMES + ((VISEME_INPUT,) if VISEME_INPUT in dims else ())  # a viseme avatar's graph
    for n in names:
        if n not in dims:
            raise ValueError(f"{onnx_path} is not a clone generator graph (inputs {sorted(dims)})")
        rest = dims[n][1:]
        profiles[n] = TensorProfile((1, *rest), (16, *rest), (MAX_BATCH, *rest))
    return ModelSpec(name=name, onnx_path=onnx_path, profiles=profiles,
                     torch_factory=lambda: load_generator(weights), fp16_mode="half",
                     input_names=names, output_names=OUTPUT_NAMES)


# --- batch size from free GPU memory -----------------------------------------------------------------
def inference_bytes_per_frame(config: GeneratorConfig, bytes_per_value: int = 2) -> int:
    """Upper estimate of the device memory one frame of a batch needs at inference: every U-Net
    level's activation held twice (its skip plus the tensor being convolved), the decoder's concat,
    the inputs and the output. The default 256-px config: ~8 MB in FP16."""
    y0, y1, x0, x1 = config.region_box()
    h, w = y1 - y0, x1 - x0
    c = config.base_channels
    values = 6 * h * w + 3 * h * w  # source + reference in, region out
    for i in range(config.levels + 1):
        chans = min(c * 2 ** i, 8 * c)
        area = (h >> i) * (w >> i)
        values += 4 * chans * area  # skip + working tensor + the decoder's concat of both
    return int(values * bytes_per_value)


def batch_for_free_memory(free_bytes: int, config: GeneratorConfig, bytes_per_value: int = 2,
                          share: float = 0.5, max_batch: int = MAX_BATCH) -> int:
    """Largest batch (1..max_batch) whose activations fit in `share` of the free memory (the rest is
    left for cuDNN workspaces, CUDA graphs and other stages)."""
    per_frame = inference_bytes_per_frame(config, bytes_per_value)
    return int(max(1, min(max_batch, (free_bytes * share) // max(per_frame, 1))))


# --- region helpers (numpy, shared by training, inference and the benchmarks) ---------------------
def crops_to_regions(crops: np.ndarray, config: GeneratorConfig) -> np.ndarray:
    """uint8 [N, S, S, 3] crops -> uint8 [N, 3, h, w] generator regions (NCHW)."""
    y0, y1, x0, x1 = config.region_box()
    return np.ascontiguousarray(np.asarray(crops)[:, y0:y1, x0:x1].transpose(0, 3, 1, 2))


def regions_into_crops(crops: np.ndarray, regions: np.ndarray, config: GeneratorConfig) -> np.ndarray:
    """Write float [N, 3, h, w] (0..1) or uint8 regions back into copies of uint8 crops."""
    y0, y1, x0, x1 = config.region_box()
    out = np.array(crops, copy=True)
    r = np.asarray(regions)
    if r.dtype != np.uint8:
        r = np.clip(np.rint(r * 255.0), 0, 255).astype(np.uint8)
    out[:, y0:y1, x0:x1] = r.transpose(0, 2, 3, 1)
    return out
