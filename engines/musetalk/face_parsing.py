"""BiSeNet face parsing as MuseTalk 1.5 uses it for its blending mask (optional: the user's
`musetalk/face-parse-bisent/79999_iter.pth`).

MuseTalk pastes the generated face through a mask made by a BiSeNet trained on CelebAMask-HQ (19
labels; the checkpoint of zllrunning/face-parsing.PyTorch). The network here is written for this pack
with the same module names, so the release's state dict loads key for key:

- backbone `cp.resnet`: a ResNet-18 trunk (7x7/2 stem, 3x3/2 max pool, four stages of two basic blocks,
  64-128-256-512 channels, a 1x1 strided projection where the shape changes), giving the 1/8, 1/16
  and 1/32 feature maps;
- context path `cp`: global average of the 1/32 map (1x1 conv) added to an attention-refined 1/32 map,
  nearest-upsampled to 1/16 and convolved; the same with the refined 1/16 map up to 1/8;
- `ffm`: the 1/8 backbone map concatenated with the context map, a 1x1 conv, and a squeeze-excitation
  style channel gate added back (x + x * gate);
- `conv_out`: 3x3 conv + 1x1 to 19 logits, bilinearly upsampled (align_corners=True) to the input.
  The release also holds two auxiliary heads (`conv_out16`, `conv_out32`) used only in training: they
  are loaded and checked (strict loading) but never run (MuseTalk reads only the main head).

The mask (FaceParsing.__call__ in the reference, mode "jaw", which v1.5's scripts select, with cheek
widths 90): the RGB image is resized to 512x512 (PIL bilinear), scaled to [0, 1] and normalised with
ImageNet's mean/std; per pixel argmax of the logits. Skin (label 1) is grown by one dilation whose
element (a bar over a downward-pointing triangle, anchored at its centre) reaches 16 px up, 10 px to
each side and tapers to 6 px down, so the mask passes the jaw line a little (where a generated chin
may move); then, on the outer sides of the 512 grid (90 px or more left or right of its centre), it is
thinned by two erosions with a flat 35x3 ellipse (the cheeks are not swapped wholesale);
the nose (label 10) is left out; lips and mouth (labels 11, 12, 13) are always in. Modes "raw" (skin +
mouth labels) and "neck" (plus label 14) are there too. The result, 0/255, is resized back to the
image's size with PIL's default filter for that call (bicubic).

The backbone file `resnet18-5c106cde.pth` (torchvision's ImageNet ResNet-18) is read by the reference
only to initialise the trunk before `79999_iter.pth` overwrites every one of those tensors, so the
result does not depend on it; it is optional here and checked (keys, shapes) when present.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from .files import MuseTalkFilesError, MuseTalkWeightsError, check_state_dict, musetalk_root, read_state_dict

N_CLASSES = 19
INPUT_SIZE = 512
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
SKIN, NOSE, NECK = 1, 10, 14
MOUTH = (11, 12, 13)  # mouth interior, upper lip, lower lip (the checkpoint's CelebAMask-HQ label order)
CHEEK_WIDTH = 90  # v1.5's --left_cheek_width / --right_cheek_width defaults (scripts/inference.py)
MODES = ("jaw", "raw", "neck")
V15_MODE = "jaw"  # v1.5's --parsing_mode default

PARSING_FILE = "face-parse-bisent/79999_iter.pth"
BACKBONE_FILE = "face-parse-bisent/resnet18-5c106cde.pth"


def _nn() -> Any:
    import torch.nn as nn

    return nn


def build_bisenet() -> Any:
    """The untrained module (torch imported lazily: the pack runs without the MuseTalk extra)."""
    import torch
    import torch.nn.functional as F

    nn = _nn()

    class ConvBNReLU(nn.Module):
        def __init__(self, cin: int, cout: int, k: int = 3, stride: int = 1) -> None:
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, k, stride, k // 2, bias=False)
            self.bn = nn.BatchNorm2d(cout)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.relu(self.bn(self.conv(x)))

    class Block(nn.Module):  # ResNet basic block; its projection is `downsample` (0: conv, 1: BN)
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                               if cin != cout or stride != 1 else None)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            return F.relu(y + (x if self.downsample is None else self.downsample(x)))

    class Trunk(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            widths = (64, 64, 128, 256, 512)
            for i in range(1, 5):
                stride = 1 if i == 1 else 2
                setattr(self, f"layer{i}", nn.Sequential(Block(widths[i - 1], widths[i], stride),
                                                         Block(widths[i], widths[i], 1)))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            x = self.layer1(self.maxpool(F.relu(self.bn1(self.conv1(x)))))
            f8 = self.layer2(x)
            f16 = self.layer3(f8)
            return f8, f16, self.layer4(f16)

    def global_mean(x: torch.Tensor) -> torch.Tensor:
        # avg_pool2d over the whole map (not mean()): the same reduction the checkpoint's authors ran,
        # so the logits stay bit-close to theirs and the argmax does not flip on near-ties
        return F.avg_pool2d(x, x.shape[2:])

    class Refine(nn.Module):  # attention refinement: conv, then a per-channel sigmoid gate from the global mean
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.conv = ConvBNReLU(cin, cout)
            self.conv_atten = nn.Conv2d(cout, cout, 1, bias=False)
            self.bn_atten = nn.BatchNorm2d(cout)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            f = self.conv(x)
            return f * torch.sigmoid(self.bn_atten(self.conv_atten(global_mean(f))))

    class Context(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.resnet = Trunk()
            self.arm16 = Refine(256, 128)
            self.arm32 = Refine(512, 128)
            self.conv_head32 = ConvBNReLU(128, 128)
            self.conv_head16 = ConvBNReLU(128, 128)
            self.conv_avg = ConvBNReLU(512, 128, k=1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            f8, f16, f32 = self.resnet(x)
            g = self.conv_avg(global_mean(f32))
            up32 = F.interpolate(self.arm32(f32) + F.interpolate(g, f32.shape[2:], mode="nearest"),
                                 f16.shape[2:], mode="nearest")
            up32 = self.conv_head32(up32)
            up16 = F.interpolate(self.arm16(f16) + up32, f8.shape[2:], mode="nearest")
            return f8, self.conv_head16(up16)

    class Fuse(nn.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.convblk = ConvBNReLU(cin, cout, k=1)
            self.conv1 = nn.Conv2d(cout, cout // 4, 1, bias=False)
            self.conv2 = nn.Conv2d(cout // 4, cout, 1, bias=False)

        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            f = self.convblk(torch.cat([a, b], dim=1))
            gate = torch.sigmoid(self.conv2(F.relu(self.conv1(global_mean(f)))))
            return f * gate + f

    class Head(nn.Module):
        def __init__(self, cin: int, mid: int) -> None:
            super().__init__()
            self.conv = ConvBNReLU(cin, mid)
            self.conv_out = nn.Conv2d(mid, N_CLASSES, 1, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv_out(self.conv(x))

    class BiSeNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cp = Context()
            self.ffm = Fuse(256, 256)
            self.conv_out = Head(256, 256)
            self.conv_out16 = Head(128, 64)  # training-only heads: in the file, never run
            self.conv_out32 = Head(128, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            """float32 [B, 3, H, W] normalised RGB -> logits [B, 19, H, W] (the main head only)."""
            f8, c8 = self.cp(x)
            logits = self.conv_out(self.ffm(f8, c8))
            return F.interpolate(logits, x.shape[2:], mode="bilinear", align_corners=True)

    return BiSeNet()


def expected_shapes(module: Any) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def _optional_counter(key: str) -> bool:
    # BatchNorm's num_batches_tracked counters: a training statistic no eval forward reads; checkpoints
    # saved before torch 0.4.1 lack them, later ones have them
    return key.endswith("num_batches_tracked")


def load_bisenet(path: Path) -> Any:
    """BiSeNet with the weights of `path` (79999_iter.pth), every key and shape checked (weights only,
    no pickled code runs). MuseTalkWeightsError names the file and every mismatch."""
    import torch

    with torch.device("meta"):
        module = build_bisenet()
    expected = {k: s for k, s in expected_shapes(module).items() if not _optional_counter(k)}
    state = read_state_dict(Path(path))
    state = {k[len("module."):] if k.startswith("module.") else k: v for k, v in state.items()}  # DataParallel saves
    check_state_dict({k: v for k, v in state.items() if not _optional_counter(k)}, expected, Path(path),
                     "BiSeNet face-parsing (79999_iter.pth)")
    counters = {k: state[k] if k in state else torch.zeros((), dtype=torch.long)
                for k in module.state_dict() if _optional_counter(k)}
    full = {k: state[k].float() for k in expected}
    full.update(counters)
    module.load_state_dict(full, strict=True, assign=True)
    return module.float().eval().requires_grad_(False)


def check_backbone(path: Path) -> None:
    """torchvision's ResNet-18 file: the trunk's keys and shapes (its `fc` classifier is allowed and
    unused). Only a consistency check: 79999_iter.pth holds the trunk weights that are used."""
    import torch

    with torch.device("meta"):
        trunk = build_bisenet().cp.resnet
    expected = {k: s for k, s in expected_shapes(trunk).items() if not _optional_counter(k)}
    state = {k: v for k, v in read_state_dict(Path(path)).items() if not _optional_counter(k)}
    check_state_dict(state, expected, Path(path), "ResNet-18 backbone (resnet18-5c106cde.pth)",
                     ignore_prefixes=("fc.",))


# --- the mask ------------------------------------------------------------------------------------------
def jaw_kernel() -> np.ndarray:
    """uint8 33x33 structuring element: nothing in the top 10 rows, a triangle widening by 2 px per
    row (1 px at row 10 to 21 px at row 20), then a 21 px bar to the bottom; centred anchor. With
    cv2.dilate (no reflection) a pixel turns on when skin lies within the element placed on it, so
    skin spreads 16 px up and tapers 6 px down."""
    size, cone = 33, 21
    k = np.zeros((size, size), np.uint8)
    c = size // 2
    for row in range(cone // 2, size):
        half = min(row - cone // 2, cone // 2)
        k[row, c - half:c + half + 1] = 1
    return k


def cheek_mask(left: int = CHEEK_WIDTH, right: int = CHEEK_WIDTH) -> np.ndarray:
    """uint8 [512, 512]: 255 on the outer sides (x <= 256 - left, x >= 256 + right), where the grown
    skin is eroded; cv2.rectangle's inclusive corners, hence the +1."""
    m = np.zeros((INPUT_SIZE, INPUT_SIZE), np.uint8)
    c = INPUT_SIZE // 2
    m[:, :c - left + 1] = 255
    m[:, c + right:] = 255
    return m


def labels_to_mask(labels: np.ndarray, mode: str = V15_MODE, left: int = CHEEK_WIDTH,
                   right: int = CHEEK_WIDTH) -> np.ndarray:
    """uint8 0/255 [512, 512] blending mask from the per-pixel labels (argmax) of a 512x512 parsing."""
    import cv2

    if mode not in MODES:
        raise ValueError(f"face-parsing mode must be one of {MODES}, got {mode!r}")
    labels = np.asarray(labels)
    if labels.shape != (INPUT_SIZE, INPUT_SIZE):  # the cheek split is defined on the 512 grid
        raise ValueError(f"labels must be {INPUT_SIZE}x{INPUT_SIZE} (the parsing grid), got {labels.shape}")
    if mode == "raw":
        return (np.isin(labels, (SKIN,) + MOUTH) * 255).astype(np.uint8)
    if mode == "neck":
        return (np.isin(labels, (SKIN,) + MOUTH + (NECK,)) * 255).astype(np.uint8)
    skin = ((labels == SKIN) * 255).astype(np.uint8)
    grown = cv2.dilate(skin, jaw_kernel(), iterations=1)
    thinned = cv2.erode(grown, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (35, 3)), iterations=2)
    sides = cheek_mask(left, right)
    region = (thinned & sides) | (grown & ~sides)
    keep = ((region == 255) & (labels != NOSE)) | np.isin(labels, MOUTH)
    return (keep * 255).astype(np.uint8)


class FaceParser:
    """The user's BiSeNet on one device; `mask(rgb)` is MuseTalk's face_seg on an RGB uint8 image."""

    def __init__(self, net: Any, device: str = "cpu", source: Path | None = None) -> None:
        self.net = net.to(device)
        self.device = device
        self.source = source

    def preprocess(self, rgb: np.ndarray) -> Any:
        """uint8 [H, W, 3] RGB -> float32 [1, 3, 512, 512]: PIL bilinear resize (antialiased when
        shrinking, as the reference's Image.resize), /255, ImageNet normalisation."""
        import torch
        from PIL import Image

        img = np.asarray(Image.fromarray(np.ascontiguousarray(rgb, dtype=np.uint8)).resize(
            (INPUT_SIZE, INPUT_SIZE), Image.BILINEAR))
        x = torch.from_numpy(img.copy()).permute(2, 0, 1).contiguous().float().div(255)
        mean = torch.tensor(MEAN, dtype=x.dtype).view(-1, 1, 1)
        std = torch.tensor(STD, dtype=x.dtype).view(-1, 1, 1)
        return x.sub(mean).div(std)[None]

    def logits(self, rgb: np.ndarray) -> np.ndarray:
        """float32 [19, 512, 512]."""
        import torch

        with torch.no_grad():
            return self.net(self.preprocess(rgb).to(self.device))[0].float().cpu().numpy()

    def labels(self, rgb: np.ndarray) -> np.ndarray:
        return self.logits(rgb).argmax(0)

    def mask(self, rgb: np.ndarray, mode: str = V15_MODE) -> np.ndarray:
        """uint8 0..255 [H, W]: the mode's mask on the parsing grid, resized back to the image with
        bicubic (what the reference's Image.resize defaults to; its overshoot is clipped to 0..255)."""
        from PIL import Image

        h, w = np.asarray(rgb).shape[:2]
        m = labels_to_mask(self.labels(rgb), mode)
        return np.asarray(Image.fromarray(m).resize((w, h), Image.BICUBIC))


def parsing_files(models_root: str | Path | None = None) -> tuple[Path | None, Path | None]:
    """(79999_iter.pth, resnet18-5c106cde.pth), each None when absent."""
    root = musetalk_root(models_root)
    parsing, backbone = (root / PARSING_FILE), (root / BACKBONE_FILE)
    return (parsing if parsing.is_file() else None), (backbone if backbone.is_file() else None)


def require_parsing_file(models_root: str | Path | None = None) -> Path:
    path, _ = parsing_files(models_root)
    if path is None:
        root = musetalk_root(models_root)
        raise MuseTalkFilesError(
            f"the face-parsing mask needs {root / PARSING_FILE}  <- the MuseTalk README's 'face-parse-bisent' link "
            "(zllrunning/face-parsing.PyTorch's 79999_iter.pth); place it there, or use the face-mesh mask")
    return path


_CACHE: dict[tuple, FaceParser] = {}
_LOCK = threading.Lock()


def cached_parser(device: str = "cpu", models_root: str | Path | None = None) -> FaceParser:
    """The user's BiSeNet, loaded once per process for (file, mtime, device); the backbone file, when
    present, is checked once too (a wrong file there is an error, not silently ignored)."""
    path = require_parsing_file(models_root)
    _, backbone = parsing_files(models_root)
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size, device, str(backbone))
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is None:
            if backbone is not None:
                check_backbone(backbone)
            _CACHE.clear()
            hit = _CACHE[key] = FaceParser(load_bisenet(path), device, path)
        return hit


__all__ = ["FaceParser", "MuseTalkWeightsError", "build_bisenet", "load_bisenet", "check_backbone",
           "labels_to_mask", "jaw_kernel", "cheek_mask", "parsing_files", "require_parsing_file", "cached_parser",
           "MODES", "V15_MODE", "PARSING_FILE", "BACKBONE_FILE"]
