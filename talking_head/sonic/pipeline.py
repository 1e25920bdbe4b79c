"""Sonic's pipeline from a framed photo and 16 kHz speech to 25 fps frames (the reference's steps, in order):
whisper encoder states -> audio token windows and motion buckets -> SVD latents of the photo -> time-shifted
windows of 25 frames denoised with three guidance branches (no image, no audio, all) on an Euler v-prediction
schedule -> temporal VAE decode in chunks of 8 -> RIFE middle frames (12.5 -> 25 fps).
The work the reference repeats is done once (whisper runs once per 30 s, not twice; the unconditional audio
tokens are one call). Progress is reported per UNet call; should_stop() is honoured between them.
speed="fast" and speed="fastest" are separately named, approximate modes: fewer steps (SPEED_PRESETS), and on every
second step the UNet reuses the deep features of the step before (DeepCache: only its full-resolution level runs);
their measured difference from the reference's settings is in benchmarks/RESULTS_sonic.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ...engines.sonic.accelerate import decode

STEP = 2                  # a video frame every 2 whisper-feature hops of 640 samples: 12.5 fps
WINDOW_FRAMES = 25        # frames per denoised window (n_sample_frames)
SHIFT_OFFSET = 7          # the windows move 7 frames a step so their seams never stay in place
MODEL_FPS = 12.5
DECODE_CHUNK = 8          # the temporal VAE mixes the frames of a chunk: its size is part of the result
RIFE_BATCH = 16           # frame pairs per RIFE call (batched: the same middles, one launch sequence)
# speed -> (at most this many steps, the deep UNet features computed on every k-th step only). On the H200
# (RESULTS_sonic.md, 2026-12-03): 10 s of speech in 10.4 s (fast) and 7.6 s (fastest) with the compiled path.
SPEED_PRESETS = {"fast": (8, 2), "fastest": (5, 2)}
SPEEDS = ("reference", *SPEED_PRESETS)
FAST_STEPS, FAST_DEEP_CACHE = SPEED_PRESETS["fast"]


@dataclass(frozen=True)
class SonicSettings:
    steps: int = 25
    appearance_guidance: float = 2.0
    audio_guidance: float = 7.5
    dynamic_scale: float = 1.0        # motion_bucket_scale
    seed: int = 72589
    resolution: int = 512             # short side of the model's frames
    interpolate: bool = True          # RIFE to 25 fps
    vram: str = "auto"                # auto / high (branches batched) / low (branches one by one, offloading)
    window_batch: int = 1             # a step's windows per UNet call (they are independent); 0 = as memory allows
    speed: str = "reference"          # "fast" / "fastest": SPEED_PRESETS' steps, deep features reused (approximate)
    deep_cache_interval: int = 1      # the full UNet every k-th step, the shallow path between (1 = always full)
    decode_batch: int = 1             # 8-frame VAE chunks per decode call (same result); 0 = as memory allows
    cudnn_benchmark: bool = True      # cuDNN picks its fastest convolution per shape (same math, other sums)


def resolve_speed(settings: SonicSettings) -> SonicSettings:
    """The settings a speed names: "reference" as given; "fast" / "fastest" at most their SPEED_PRESETS steps with
    the deep UNet features computed every k-th step."""
    from dataclasses import replace

    if settings.speed not in SPEEDS:
        raise ValueError(f"speed must be one of {', '.join(SPEEDS)}, got {settings.speed!r}")
    if settings.speed in SPEED_PRESETS:
        steps, interval = SPEED_PRESETS[settings.speed]
        return replace(settings, steps=min(int(settings.steps), steps), deep_cache_interval=interval)
    return settings


def _gpu_flags(settings: SonicSettings):
    """cuDNN autotuning for this pipeline's calls only (a process-wide flag would change other nodes' runs)."""
    import torch.backends.cudnn as cudnn

    return cudnn.flags(enabled=cudnn.enabled, benchmark=bool(settings.cudnn_benchmark),
                       deterministic=cudnn.deterministic, allow_tf32=cudnn.allow_tf32)


def whisper_states(nets, wave16k: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, int]:
    """([1, T, blocks, D] every encoder state, [1, T, 1, D] the last, audio_len in 25 fps units).
    30 s feature chunks as the reference cuts them; the encoder runs once per chunk (the reference runs it
    twice: its last_hidden_state is the last of the hidden states)."""
    fe = nets.whisper_features
    window = 750 * 640
    feats = [fe(wave16k[i:i + window], sampling_rate=16000, return_tensors="pt").input_features
             for i in range(0, len(wave16k), window)]
    feats = torch.cat(feats, dim=-1).to(nets.device)
    every, last = [], []
    for i in range(0, feats.shape[-1], 3000):
        out = nets.whisper_encoder(feats[:, :, i:i + 3000], output_hidden_states=True)
        every.append(torch.stack(out.hidden_states, dim=2))
        last.append(out.last_hidden_state.unsqueeze(-2))
    return torch.cat(every, 1), torch.cat(last, 1), len(wave16k) // 640


def audio_windows(every: torch.Tensor, last: torch.Tensor, audio_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([N, 10, blocks, D] token windows, [N, 50, 1, D] bucket windows), N = audio_len // 2 video frames."""
    every = every[:, :audio_len * 2]
    every = torch.cat([torch.zeros_like(every[:, :4]), every, torch.zeros_like(every[:, :6])], 1)
    last = last[:, :audio_len * 2]
    last = torch.cat([torch.zeros_like(last[:, :24]), last, torch.zeros_like(last[:, :26])], 1)
    n = audio_len // STEP
    tok = torch.stack([every[0, i * 2 * STEP:i * 2 * STEP + 10] for i in range(n)])
    buck = torch.stack([last[0, i * 2 * STEP:i * 2 * STEP + 50] for i in range(n)])
    return tok, buck


def clip_embedding(nets, clip_image: np.ndarray) -> torch.Tensor:
    pixels = nets.clip_processor(images=clip_image, return_tensors="pt").pixel_values
    return nets.clip(pixels.to(nets.device, nets.dtype)).image_embeds  # [1, D]


def _euler_tables(scheduler_config: dict, steps: int):
    from diffusers import EulerDiscreteScheduler

    sched = EulerDiscreteScheduler.from_config(scheduler_config)
    sched.set_timesteps(steps)
    return sched.timesteps.float(), sched.sigmas.float()


class SonicLatents:
    """The denoised latents of a clip, made by run(); decode(i) the i-th 12.5 fps frame (chunks of 8 cached)."""

    def __init__(self, nets, framing, wave16k: np.ndarray, settings: SonicSettings,
                 progress: Callable[[int, int], None] | None = None, should_stop: Callable[[], bool] | None = None):
        self.nets, self.framing, self.settings = nets, framing, resolve_speed(settings)
        self.wave16k, self.progress, self.should_stop = wave16k, progress, should_stop
        self.latents: torch.Tensor | None = None
        self.count = (len(wave16k) // 640) // STEP
        self._decoded: dict[int, torch.Tensor] = {}
        self.stage_outputs: dict[str, torch.Tensor] = {}  # parity checks read these

    @torch.no_grad()
    def run(self) -> torch.Tensor:
        if self.latents is not None:
            return self.latents
        with _gpu_flags(self.settings):
            return self._run()

    def _run(self) -> torch.Tensor:
        nets, s = self.nets, self.settings
        dev, dt = nets.device, nets.dtype
        every, last, audio_len = whisper_states(nets, self.wave16k)
        tok_win, buck_win = audio_windows(every, last, audio_len)
        n = tok_win.shape[0]
        if n < 1:
            raise ValueError("the speech is shorter than one Sonic frame (0.08 s)")
        image_embeds = clip_embedding(nets, self.framing.clip_image)
        cond = nets.audio2token(tok_win[None]).squeeze(0)                    # [N, 32, D]
        uncond = nets.audio2token(torch.zeros_like(tok_win[:1])[None]).squeeze(0)  # one call for every frame
        buckets = nets.audio2bucket(buck_win[None], image_embeds.float().expand(n, -1).reshape(1, n, -1))
        buckets = buckets[0] * 16 + 16                                        # [N, 2, 1]
        self.stage_outputs.update(whisper=every, tokens=cond, uncond=uncond, buckets=buckets, clip=image_embeds)

        ref = torch.from_numpy(self.framing.image.copy()).permute(2, 0, 1)[None].float().div(255).sub(0.5).div(0.5)
        gen = torch.Generator().manual_seed(int(s.seed))
        ref_noise = torch.randn(ref.shape, generator=gen)  # drawn as the reference draws it (noise_aug 0)
        ref = ref.to(dev, dt)
        # noise_aug_strength is 0 in the reference's settings: its two encodes of the photo are one here
        image_lat = nets.vae.encode(ref).latent_dist.mode()
        ref_lat = image_lat * 0.18215
        h, w = ref_lat.shape[-2:]
        noise = torch.randn((1, n, 4, h, w), generator=gen).to(dev, dt)
        timesteps, sigmas = _euler_tables(nets.scheduler_config, s.steps)
        latents_all = (ref_lat.unsqueeze(1) + noise * sigmas[0].to(dev, dt))
        self.stage_outputs.update(ref_latents=ref_lat, image_latents=image_lat)

        mask = torch.from_numpy(self.framing.mask.copy())[None, None].to(dev, dt)
        zero_ctx = torch.zeros_like(image_embeds)
        windows = list(range(0, n, WINDOW_FRAMES))
        per_call = 1 if s.vram == "low" else self._windows_per_call(len(windows), h, w)
        total, done = s.steps * len(windows), 0
        interval = max(1, int(s.deep_cache_interval))
        deep: dict = {}  # DeepCache: (call, branch) -> the deep features of the last full step
        for i in range(s.steps):
            t, sigma, sigma_next = timesteps[i], sigmas[i], sigmas[i + 1]
            # with reuse, the windows move at each full step only, so a reused call sees the frames it was made on
            shift = (i // interval) * SHIFT_OFFSET
            cache = None if interval == 1 else ("keep" if i % interval == 0 else "reuse")
            pred = torch.zeros_like(latents_all)
            counter = torch.zeros((1, n, 1, 1, 1), dtype=latents_all.dtype, device=dev)
            # a step's windows all read the same latents_all: several go through the UNet in one batch
            for g0 in range(0, len(windows), per_call):
                if self.should_stop is not None and self.should_stop():
                    raise InterruptedError(f"Sonic interrupted at step {i + 1} of {s.steps}")
                idxs = [[(start - shift + k) % n for k in range(WINDOW_FRAMES)]
                        for start in windows[g0:g0 + per_call]]
                lat = torch.cat([latents_all[:, idx] for idx in idxs])
                v = self._guided(lat, t, sigma, image_lat, image_embeds, zero_ctx, [cond[idx] for idx in idxs],
                                 uncond, [buckets[idx] for idx in idxs], mask, cache, deep, g0)
                lat = self._euler(lat, v, sigma, sigma_next)
                for g, idx in enumerate(idxs):
                    for k, p in enumerate(idx):
                        pred[:, p] += lat[g:g + 1, k]
                        counter[:, p] += 1
                done += len(idxs)
                if self.progress is not None:
                    self.progress(done, total)
            latents_all = pred / counter
        self.latents = latents_all
        return latents_all

    def _windows_per_call(self, count: int, h: int, w: int) -> int:  # h, w: latent size
        """window_batch, or for 0: every window of a step when the GPU has room (about 6 GiB per window of 25
        frames with its three branches at 512x512 FP16, scaled by the latent area), at least one."""
        want = int(self.settings.window_batch)
        if want > 0:
            return min(want, count)
        if self.nets.device.type != "cuda":
            return 1
        free, _total = torch.cuda.mem_get_info(self.nets.device)
        per_window = 6 * 2**30 * (h * w) / (64 * 64) * (2 if self.nets.dtype == torch.float32 else 1)
        return max(1, min(count, int((free - 2 * 2**30) // per_window)))

    def _guided(self, lat, t, sigma, image_lat, image_embeds, zero_ctx, conds, uncond, buckets, mask,
                cache: str | None = None, deep: dict | None = None, call_id: int = 0):
        """The guided v-prediction of G windows [G, F, 4, h, w] (conds / buckets: one per window).
        cache "keep": store each UNet call's deep features in `deep`; "reuse": run the shallow path on them."""
        nets, s = self.nets, self.settings
        dev, dt = nets.device, nets.dtype
        g, f = lat.shape[:2]
        scaled = lat / ((sigma.to(lat.device) ** 2 + 1) ** 0.5)
        rows = []
        for bk in buckets:
            bucket = bk.mean(dim=0).reshape(-1)  # the window's mean motion, two values
            rows.append([MODEL_FPS, float(bucket[0]) * s.dynamic_scale, float(bucket[1]) * s.dynamic_scale])
        time_ids = torch.tensor(rows, dtype=dt, device=dev)                     # [G, 3]
        img = image_lat.unsqueeze(1).expand(g, f, *image_lat.shape[1:])
        no_audio = uncond.expand(g * f, -1, -1)
        branches = [  # (image latents, image context, audio tokens): no image, no audio, everything
            (torch.zeros_like(img), zero_ctx, no_audio),
            (img, image_embeds, no_audio),
            (img, image_embeds, torch.cat(conds)),
        ]
        tt = t.to(dev, dt)

        def call(parts, key):
            b = len(parts)
            sample = torch.cat([torch.cat([scaled, p[0]], dim=2) for p in parts])
            ctx = torch.cat([p[1].reshape(1, 1, -1).expand(g * f, 1, -1) for p in parts]).to(dt)
            audio = torch.cat([p[2] for p in parts]).to(dt)
            args = (sample.to(dt), tt, ctx, audio, time_ids.repeat(b, 1), mask)
            if cache == "keep":
                out, kept = nets.unet(*args, keep_deep=True)
                # vram low keeps them in host memory (about 33 MB a window and branch at 512 px): the GPU's stays flat
                deep[key] = kept.to("cpu") if s.vram == "low" else kept
                return out
            if cache == "reuse":
                return nets.unet(*args, deep=deep[key].to(dev))
            return nets.unet(*args)

        if s.vram == "low":
            out = torch.cat([call([p], (call_id, k)) for k, p in enumerate(branches)])
        else:
            out = call(branches, (call_id, "all"))
        u, d, c = out.chunk(3)
        return u + s.appearance_guidance * (d - u) + s.audio_guidance * (c - d)

    @staticmethod
    def _euler(lat, v, sigma: torch.Tensor, sigma_next: torch.Tensor):
        """EulerDiscreteScheduler.step for v-prediction without churn, in float32 as diffusers computes it."""
        x = lat.float()
        sigma, sigma_next = sigma.to(x.device), sigma_next.to(x.device)
        denoised = v.float() * (-sigma / (sigma ** 2 + 1) ** 0.5) + x / (sigma ** 2 + 1)
        return (x + (x - denoised) / sigma * (sigma_next - sigma)).to(v.dtype)

    def _decode_batch(self) -> int:
        """decode_batch, or for 0: as many 8-frame chunks per call as the GPU has room for (about 4 GiB per chunk
        at 512x512 FP16, scaled by the frame area), at most 4; vram low and the CPU: 1."""
        want = int(self.settings.decode_batch)
        if want > 0:
            return want
        if self.nets.device.type != "cuda" or self.settings.vram == "low":
            return 1
        free, _total = torch.cuda.mem_get_info(self.nets.device)
        h, w = self.framing.image.shape[:2]
        per_chunk = 4 * 2**30 * (h * w) / (512 * 512) * (2 if self.nets.dtype == torch.float32 else 1)
        return max(1, min(4, int((free - 2 * 2**30) // per_chunk)))

    @torch.no_grad()
    def frame(self, i: int) -> torch.Tensor:
        """The i-th 12.5 fps frame, float [3, H, W] in 0..1 on the device (decoded in chunks of 8, several chunks
        in one call when decode_batch allows: the decoder mixes frames within a chunk only, so the frames are the
        same; the last two calls' chunks are cached)."""
        chunk = i // DECODE_CHUNK
        if chunk not in self._decoded:
            lat_all = self.run()[0]
            full = lat_all.shape[0] // DECODE_CHUNK  # chunks of 8 (a shorter last one is decoded alone)
            batch = self._decode_batch()
            take = max(1, min(batch, full - chunk)) if chunk < full else 1
            lat = lat_all[chunk * DECODE_CHUNK:(chunk + take) * DECODE_CHUNK]
            vae = self.nets.vae
            with _gpu_flags(self.settings):
                # a compiled decoder (accelerate.fast_path) sees one shape: full calls padded to `batch` chunks
                out = decode(vae, lat / vae.config.scaling_factor, min(DECODE_CHUNK, lat.shape[0]),
                             frames_per_call=batch * DECODE_CHUNK if chunk < full else 0)
            out = (out.float() * 0.5 + 0.5).clamp(0, 1)
            for old in [k for k in self._decoded if k < chunk - take]:
                del self._decoded[old]  # frames are asked for in order: keep the last call's chunks and this one's
            for k in range(take):
                self._decoded[chunk + k] = out[k * DECODE_CHUNK:(k + 1) * DECODE_CHUNK]
        return self._decoded[chunk][i % DECODE_CHUNK]


class SonicFrames:
    """uint8 frames at 25 fps (RIFE middles between the 12.5 fps frames: 2N - 1 of them)."""

    def __init__(self, latents: SonicLatents):
        self.latents = latents
        n = latents.count
        self.count = 2 * n - 1 if latents.settings.interpolate else n
        self._middle: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def frame(self, j: int) -> torch.Tensor:
        lat = self.latents
        if not lat.settings.interpolate:
            return lat.frame(j)
        if j % 2 == 0:
            return lat.frame(j // 2)
        a, b = lat.frame(j // 2), lat.frame(j // 2 + 1)
        return lat.nets.ifnet(a[None], b[None])[0].clamp(0, 1)

    @torch.no_grad()
    def block(self, start: int, stop: int) -> torch.Tensor:
        """Frames start..stop-1, float [k, 3, H, W] on the device: the RIFE middles of the range in batches of
        RIFE_BATCH pairs (the same network on the same pairs as frame(j) one at a time)."""
        lat = self.latents
        if not lat.settings.interpolate:
            return torch.stack([lat.frame(j) for j in range(start, stop)])
        first, last = start // 2, (stop - 1 + 1) // 2  # model frames the range reads
        model = [lat.frame(k) for k in range(first, last + 1)]
        odd = [j for j in range(start, stop) if j % 2]
        middles: dict[int, torch.Tensor] = {}
        with _gpu_flags(lat.settings):
            for b0 in range(0, len(odd), RIFE_BATCH):
                js = odd[b0:b0 + RIFE_BATCH]
                a = torch.stack([model[j // 2 - first] for j in js])
                b = torch.stack([model[j // 2 + 1 - first] for j in js])
                for j, m in zip(js, lat.nets.ifnet(a, b).clamp(0, 1)):
                    middles[j] = m
        return torch.stack([middles[j] if j % 2 else model[j // 2 - first] for j in range(start, stop)])

    def uint8(self, start: int, stop: int) -> np.ndarray:
        """Frames start..stop-1 as uint8 [k, H, W, 3] (x 255, truncated, as the reference writes them)."""
        return (self.block(start, stop) * 255).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


def resample_to_16k(wave: np.ndarray, rate: int) -> np.ndarray:
    if rate == 16000:
        return np.asarray(wave, np.float32)
    import soxr  # librosa's default resampler (the reference loads with librosa at 16 kHz)

    return soxr.resample(np.asarray(wave, np.float32), rate, 16000, quality="HQ").astype(np.float32)


def frame_count(seconds: float, fps: float) -> int:
    return int(math.ceil(seconds * fps - 1e-6))
