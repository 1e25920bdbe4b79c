"""MuseTalk 1.5's generation step on 256x256 face crops: one UNet pass at timestep 0, no sampling loop.

Reference crop (RGB uint8 [256, 256, 3]) -> two VAE encodings: the crop with its lower half blanked
(pixels 0 before normalising, so -1 after) and the whole crop; each latent is drawn from the VAE's
posterior (mean + std x noise) and scaled by the VAE's scaling factor; concatenated they are the
UNet's 8-channel input. The UNet, conditioned on the frame's whisper window (+ position code),
predicts the lower face's latent; the VAE decodes it to the generated crop.

The posterior noise comes from a generator seeded per reference frame (masked draw first, then the
reference), the same numbers the reference code draws after torch.manual_seed(seed): results are
reproducible, and each reference frame's latents are computed once and cached.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from .audio import position_table

CROP = 256  # MuseTalk's face crop size (latent 32x32)


class MuseTalkPipeline:
    """The networks on one device and precision, with a cache of reference-frame latents."""

    def __init__(self, networks: Any, seed: int = 0, cache_size: int = 512) -> None:
        import torch

        self.net = networks
        param = next(networks.unet.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.seed = int(seed)
        self.scaling = networks.scaling_factor
        self.positions = position_table().to(self.device)
        self.timestep = torch.tensor([0], device=self.device)
        self._latents: OrderedDict[Any, Any] = OrderedDict()
        self._cache_size = cache_size

    # --- reference latents ------------------------------------------------------------------------
    def _pixels(self, crops: np.ndarray, half_mask: bool) -> Any:
        import torch

        # contiguous NCHW: a permuted (channels-last) view sends the convolutions down another
        # kernel path whose results differ by ~1e-3 after the VAE encoder
        x = torch.from_numpy(np.asarray(crops, np.float64) / 255.0).float().permute(0, 3, 1, 2).contiguous()
        if half_mask:
            x[:, :, CROP // 2:, :] = 0.0
        return x.sub(0.5).div(0.5)

    def encode_references(self, crops: np.ndarray) -> Any:
        """[B, 8, 32, 32] UNet input latents (masked ++ reference) for RGB uint8 crops [B, 256, 256, 3]."""
        import torch

        crops = np.asarray(crops)
        if crops.ndim != 4 or crops.shape[1:] != (CROP, CROP, 3):
            raise ValueError(f"MuseTalk crops must be [B, {CROP}, {CROP}, 3] RGB, got {crops.shape}")
        with torch.inference_mode():
            out = []
            for half in (True, False):
                dist = self.net.vae.encode(self._pixels(crops, half).to(self.device, self.dtype)).latent_dist
                out.append(dist)
            noise_m, noise_r = [], []
            for _ in range(len(crops)):
                g = torch.Generator().manual_seed(self.seed)
                noise_m.append(torch.randn(out[0].mean.shape[1:], generator=g, dtype=torch.float32))
                noise_r.append(torch.randn(out[1].mean.shape[1:], generator=g, dtype=torch.float32))
            lat = []
            for dist, noise in zip(out, (noise_m, noise_r)):
                sample = dist.mean + dist.std * torch.stack(noise).to(self.device, dist.mean.dtype)
                lat.append(self.scaling * sample)
            return torch.cat(lat, dim=1)

    def reference_latents(self, key: Any, crop: np.ndarray | Callable[[], np.ndarray]) -> Any:
        """encode_references of one crop [256, 256, 3] (or a function making it, called only on a cache
        miss), cached under `key` (e.g. the reference frame's index)."""
        hit = self._latents.get(key)
        if hit is None:
            image = crop() if callable(crop) else crop
            hit = self._latents[key] = self.encode_references(np.asarray(image)[None])
            while len(self._latents) > self._cache_size:
                self._latents.popitem(last=False)
        self._latents.move_to_end(key)
        return hit

    # --- generation ---------------------------------------------------------------------------------
    def unet_step(self, latents: Any, windows: Any) -> Any:
        """Predicted latents [B, 4, 32, 32] from input latents [B, 8, 32, 32] and windows [B, L, 384]."""
        import torch

        with torch.inference_mode():
            audio = windows.to(self.device, self.dtype)
            audio = audio + self.positions[:, :audio.shape[1], :].to(audio.dtype)
            return self.net.unet(latents.to(self.device, self.dtype), self.timestep,
                                 encoder_hidden_states=audio).sample

    def decode(self, latents: Any) -> Any:
        """float [B, 3, 256, 256] in 0..1 (before quantisation)."""
        import torch

        with torch.inference_mode():
            image = self.net.vae.decode((1 / self.scaling) * latents.to(self.dtype)).sample
            return (image / 2 + 0.5).clamp(0, 1)

    @staticmethod
    def to_uint8(image: Any) -> np.ndarray:
        """RGB uint8 [B, 256, 256, 3] from decode()'s output (round half to even, as the reference)."""
        return (image.detach().cpu().permute(0, 2, 3, 1).float().numpy() * 255).round().astype(np.uint8)

    def generate(self, latents: Any, windows: Any) -> np.ndarray:
        """Generated RGB uint8 crops [B, 256, 256, 3]."""
        return self.to_uint8(self.decode(self.unet_step(latents, windows)))
