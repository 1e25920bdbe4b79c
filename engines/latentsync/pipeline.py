"""LatentSync inference on aligned faces: the release's networks (strict loaders) and the denoising of one
window of frames, step for step as the reference's LipsyncPipeline.__call__:

- one initial noise (1, 4, 1, h/8, w/8) for the whole video, repeated over its frames (prepare_latents);
- per window of `num_frames` (16) faces: pixel values (x / 255 - 0.5) / 0.5; the masked image = pixels x the fixed
  mask (mask.png, Lanczos-resized); mask latents = the mask's first channel, nearest-resized to the latent grid;
  masked-image and reference latents = VAE posterior *samples* (in that order, from the same generator) x 0.18215;
- DDIM (the repository's scheduler_config.json: scaled-linear betas 0.00085-0.012, 1000 steps, steps_offset 1,
  no clipping, set_alpha_to_one False), 20 steps, eta 0; classifier-free guidance 1.5 with the unconditional
  half on all-zero audio (its cross-attention is a constant: unet.py); UNet input = [latents, mask, masked, ref];
- decode latents / 0.18215; keep the reference pixels where the mask is 1 (paste_surrounding_pixels_back).

What the reference repeats and this does once: the timestep embedding per step (not per window); the
unconditional branch's audio cross-attention (a bias). GPU memory holds one window: callers stream windows.
Memory: the eager VAE (the CPU, and a video's shorter last window on the fast path) encodes and decodes
EAGER_VAE_FRAMES frames at a time (the image VAE treats frames as a batch: same result); decoding a 12-frame
last window at once peaked 1.25 GiB above a 10-frame one on an H200, so the peak followed the video's length
modulo 16 (benchmarks/results/latentsync_gpu_h200_2026-12-03.json).

Fast path (`compile=True`, CUDA only): the UNet step, the VAE encoder's moments and the decoder run through
torch.compile (static shapes: a full window of num_frames, the CFG batch of two rows; a shorter last window runs
eager, so nothing compiles twice) with the convolution weights channels-last and cuDNN's autotuner on; the
compiled functions are kept on the Networks, so a process compiles once. Inductor fuses the group norms, SiLUs,
residual adds and the 5-D <-> per-frame layout copies around cuDNN's convolutions, which dominate eager time
(benchmarks/RESULTS.md, LatentSync). A failure to compile is logged and the pipeline runs eager.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .files import (LatentSyncFiles, LatentSyncWeightsError, check_state_dict, read_checkpoint, read_json_file,
                    read_safetensors_or_bin, read_unet_config, tensors_of)

SCALING_FACTOR = 0.18215  # scripts/inference.py sets vae.config.scaling_factor / shift_factor (0)
SCHEDULER_CONFIG = {"beta_end": 0.012, "beta_schedule": "scaled_linear", "beta_start": 0.00085, "clip_sample": False,
                    "num_train_timesteps": 1000, "set_alpha_to_one": False, "steps_offset": 1,
                    "trained_betas": None}
STEPS, GUIDANCE = 20, 1.5
EAGER_VAE_FRAMES = 4  # module doc, Memory
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
log = logging.getLogger("digital_human.latentsync")


@dataclass
class Networks:
    files: LatentSyncFiles
    config: dict
    unet: Any
    vae: Any
    whisper: Any
    mask_image: torch.Tensor       # float64 (3, res, res), as load_fixed_mask
    device: torch.device
    dtype: torch.dtype
    compiled: dict = field(default_factory=dict)   # the fast path's compiled functions (FastPath), by mode

    @property
    def resolution(self) -> int:
        return int(self.config["data"]["resolution"])

    @property
    def num_frames(self) -> int:
        return int(self.config["data"]["num_frames"])

    @property
    def feat_length(self) -> tuple[int, int]:
        a, b = self.config["data"]["audio_feat_length"]
        return int(a), int(b)


def load_mask_image(path: Path, resolution: int) -> torch.Tensor:
    """load_fixed_mask: RGB, Lanczos-4 resize to resolution, / 255 (float64), (3, res, res)."""
    import cv2

    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        raise LatentSyncWeightsError(f"{path} is not a readable image; use the repository's latentsync/utils/mask.png")
    img = cv2.resize(cv2.cvtColor(img, cv2.COLOR_BGR2RGB), (resolution, resolution),
                     interpolation=cv2.INTER_LANCZOS4) / 255.0
    return torch.from_numpy(img).permute(2, 0, 1).contiguous()


def load_unet(files: LatentSyncFiles, config: dict) -> Any:
    from .unet import LatentSyncUNet, expected_shapes

    ckpt = read_checkpoint(files.unet_weights)
    state = tensors_of(ckpt, "state_dict", files.unet_weights)
    check_state_dict(state, expected_shapes(config["model"]), files.unet_weights, f"LatentSync UNet ({files.unet_config.name})")
    unet = LatentSyncUNet(config["model"])
    unet.load_state_dict(state, strict=True)
    return unet.eval()


def load_vae(files: LatentSyncFiles) -> Any:
    try:
        from diffusers import AutoencoderKL
    except ImportError as exc:
        raise ImportError("LatentSync needs diffusers for its VAE: pip install .[latentsync]") from exc
    cfg = read_json_file(files.vae_config)
    try:
        with torch.device("meta"):
            shape_net = AutoencoderKL.from_config(cfg)
    except Exception as exc:
        raise LatentSyncWeightsError(f"{files.vae_config} is not an AutoencoderKL config ({exc})") from exc
    state = read_safetensors_or_bin(files.vae_weights)
    check_state_dict(state, {k: tuple(v.shape) for k, v in shape_net.state_dict().items()}, files.vae_weights,
                     "sd-vae-ft-mse AutoencoderKL")
    vae = AutoencoderKL.from_config(cfg)
    vae.load_state_dict(state, strict=True)
    return vae.eval()


def load_networks(files: LatentSyncFiles, device: str = "cpu", precision: str = "fp32") -> Networks:
    from .audio import load_whisper

    config = read_unet_config(files.unet_config)
    dtype = DTYPES[precision]
    unet = load_unet(files, config).to(device=device, dtype=dtype)
    vae = load_vae(files).to(device=device, dtype=dtype)
    whisper = load_whisper(files.whisper, device, dtype)
    mask = load_mask_image(files.mask_image, int(config["data"]["resolution"]))
    return Networks(files, config, unet, vae, whisper, mask, torch.device(device), dtype)


_CACHE: dict[tuple, Networks] = {}
_CACHE_LOCK = threading.Lock()


def cached_networks(device: str, precision: str, models_root: Any = None) -> Networks:
    """The process's loaded networks for these files (reloaded when a file or the config choice changes)."""
    from .files import locate

    files = locate(models_root)
    key = (str(files.root), str(files.unet_config), device, precision,
           tuple(p.stat().st_mtime_ns for p in (files.unet_weights, files.vae_weights, files.whisper, files.unet_config)))
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is None:
            _CACHE.clear()  # one release in memory at a time (the 1.6 UNet is 5 GB in FP32)
            hit = _CACHE[key] = load_networks(files, device, precision)
        return hit


def upload(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`. A CPU tensor goes to a CUDA device through pinned memory, without a host sync: a copy
    from pageable memory first waits for all the work queued on the stream, which for a window is the previous
    window's 2 s of denoising. The device then idled while the host set up the next window, its launches
    contending for the interpreter with the threads restoring the previous window's faces. The same values."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def make_scheduler():
    from diffusers import DDIMScheduler

    return DDIMScheduler(**SCHEDULER_CONFIG)


class FastPath:
    """The compiled functions of one Networks (module doc), per classifier-free-guidance mode; compiled lazily
    on first use (a minute or more once per process on an H200), kept on Networks.compiled."""

    def __init__(self, net: Networks, uncond_rows: int, sdpa_first: str | None = None, graphs: bool = False,
                 short_attention: bool = False, fused_qkv: bool = False, autotune_gemm: bool = False):
        """sdpa_first: an SDPA backend ("cudnn", "flash", "efficient", "math") tried first by the compiled
        functions (baked in when they compile; None = torch's own order). graphs: replay the compiled UNet
        steps from CUDA graphs (captured at their second call). short_attention: the motion modules' temporal
        attention through the short-sequence Triton kernel (LatentSyncUNet.set_short_attention; the switch is the
        UNet's, so its eager calls use it too). fused_qkv: every self-attention's q/k/v as one projection
        (LatentSyncUNet.fuse_projections; also the UNet's, for its eager calls too). autotune_gemm: these functions
        compile with inductor's autotuned GEMMs (max_autotune_gemm for them alone, AUTOTUNE_GEMM_ENV)."""
        unet, vae = net.unet, net.vae
        self.short_attention = bool(short_attention)
        if short_attention:
            unet.set_short_attention(True)
        self.fused_qkv = unet.fuse_projections() if fused_qkv else 0  # self-attentions fused
        self.seconds: dict[str, float] = {}   # first call of each function (its compilation)
        self.failed: str | None = None
        self.sdpa_first = sdpa_first
        self.graphs = graphs
        self.graph_note: str | None = None
        self.replays: dict[str, _Replay] = {}
        # channels-last conv weights: cuDNN's NHWC kernels without a transpose per call (inductor keeps the
        # activations NHWC between them); only the 4-D weights change, the results are the same up to rounding
        unet.to(memory_format=torch.channels_last)
        vae.to(memory_format=torch.channels_last)
        # fixed shapes, one window after another: cuDNN's autotuner picks each convolution's fastest kernel
        torch.backends.cudnn.benchmark = True

        def step(x, t, audio, emb):
            # a full step also returns the DeepCache feature (the input of the last up block): one compiled graph
            # serves the exact mode and DeepCache's full steps (a second one would cost another minute or more)
            cache: dict = {}
            out = unet(x, t, audio, uncond_rows=uncond_rows, emb=emb, deep_cache=cache, shared_rows=True)
            return out, cache["x"]

        def step_reuse(x, t, audio, emb, feat):
            return unet(x, t, audio, uncond_rows=uncond_rows, emb=emb, deep_cache={"x": feat}, reuse=True,
                        shared_rows=True)

        def moments(x):
            dist = vae.encode(x).latent_dist
            return dist.mean, dist.std

        def decode(z):
            return vae.decode(z).sample

        self.eager = {"step": step, "step_reuse": step_reuse, "moments": moments, "decode": decode}
        self.autotune_gemm = bool(autotune_gemm)
        # inductor's option for these compiles only (TORCHINDUCTOR_MAX_AUTOTUNE_GEMM would set it process-wide)
        options = {"max_autotune_gemm": True} if autotune_gemm else None
        self.compiled = {k: torch.compile(fn, dynamic=False, options=options) for k, fn in self.eager.items()}

    def __call__(self, name: str, *args: Any) -> Any:
        if self.failed is None:
            replay = self.replays.get(name)
            if replay is not None:
                return replay(*args)
            first = name not in self.seconds
            t0 = time.perf_counter()
            try:
                with self._sdpa():
                    out = self.compiled[name](*args)
            except Exception as exc:  # a compiler failure must not cost the video: announced, then eager
                self.failed = f"LatentSync compile failed ({type(exc).__name__}: {exc}); running eager"
                log.warning("[digital_human] %s", self.failed)
            else:
                if first:
                    if torch.cuda.is_available():
                        torch.cuda.synchronize()
                    self.seconds[name] = time.perf_counter() - t0
                elif self.graphs and name in GRAPHED and args[0].is_cuda:
                    self._capture(name, args)
                return out
        return self.eager[name](*args)

    def _capture(self, name: str, args: tuple) -> None:
        """Record the compiled function `name` in a CUDA graph at its second call (the first compiled it)."""
        def run(*a: Any) -> Any:
            with self._sdpa():
                return self.compiled[name](*a)

        try:
            self.replays[name] = _Replay(run, args)
        except Exception as exc:  # announced; the compiled function keeps running without the graph
            self.graphs = False
            self.graph_note = f"LatentSync CUDA graph capture failed ({type(exc).__name__}: {exc}); not replaying"
            log.warning("[digital_human] %s", self.graph_note)

    def _sdpa(self):
        import contextlib

        if self.sdpa_first is None:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        names = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
        first = names[self.sdpa_first]
        return sdpa_kernel([first] + [b for b in names.values() if b != first], set_priority=True)


MOMENTS_KEPT = 512  # VAE posterior moments kept per pipeline: 256 reference frames x (masked, reference)
GRAPHS_ENV = "DIGITAL_HUMAN_LATENTSYNC_GRAPHS"  # "1": the compiled steps replayed from CUDA graphs. Off by default:
# with no host sync left in the loop for them to hide, they gain little and cost memory (benchmarks/RESULTS.md)
# The fast path's motion modules' temporal attention through engines/latentsync/short_attention.py's kernel: "1" on,
# "0" off, unset: on wherever the Triton kernel runs (CUDA with Triton). Measured on an H200 (2026-12-03,
# benchmarks/RESULTS.md): the eager step 175.7 -> 162.4 ms, 20-step windows within 1.12 of 255 levels of SDPA's
# (FP16 against FP32 differs by up to 350 there), and the compiled pipeline with graphs 1.87x the reference.
SHORT_ATTENTION_ENV = "DIGITAL_HUMAN_LATENTSYNC_SHORT_ATTENTION"
# "1": the fast path's self-attentions with q/k/v as one projection (LatentSyncUNet.fuse_projections). Off by default
# until an H200 measures it against the default (benchmarks/latentsync_gpu.py's whole section, run with it set).
FUSED_QKV_ENV = "DIGITAL_HUMAN_LATENTSYNC_FUSED_QKV"
# "1": the fast path's functions compile with inductor's autotuned GEMMs (each GEMM shape's Triton templates timed
# against cuBLAS while compiling: a longer first window). Only these functions: the process-wide
# TORCHINDUCTOR_MAX_AUTOTUNE_GEMM would switch it for every model a ComfyUI server compiles. Off: on an H100 the
# first window's compile was still timing GEMM shapes after 570 s, and cuBLAS won the shapes it finished
# (benchmarks/RESULTS.md, 2026-12-06).
AUTOTUNE_GEMM_ENV = "DIGITAL_HUMAN_LATENTSYNC_AUTOTUNE_GEMM"


def _switch_value(name: str, on: str, off: str, unset: str = "unset is 0") -> str:
    """Environment switch `name`: "1", "0" or "" (unset); another value is refused naming the variable."""
    raw = os.environ.get(name, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{name}={raw!r}: give 1 ({on}) or 0 ({off}); {unset}")
    return raw


def fused_qkv_wanted() -> bool:
    """FUSED_QKV_ENV: "1" on, "0" or unset off (_switch_value)."""
    return _switch_value(FUSED_QKV_ENV, "q/k/v as one projection", "three") == "1"


def autotune_gemm_wanted() -> bool:
    """AUTOTUNE_GEMM_ENV: "1" on, "0" or unset off (_switch_value)."""
    return _switch_value(AUTOTUNE_GEMM_ENV, "autotuned GEMMs in the fast path's compile",
                         "inductor's default GEMMs") == "1"


_SHORT_ATTENTION_WORDS = ("the short-attention kernel", "SDPA", "unset uses the kernel where Triton and CUDA are there")


def short_attention_wanted(device: torch.device | str) -> bool:
    """Whether the fast path sends the temporal attention to the short-sequence kernel (SHORT_ATTENTION_ENV, else
    whether the kernel can run on `device`). A value other than 1 or 0 is refused naming the variable."""
    from . import short_attention

    raw = _switch_value(SHORT_ATTENTION_ENV, *_SHORT_ATTENTION_WORDS)
    return raw == "1" or (raw == "" and short_attention.available(device))


def switches_problem() -> str | None:
    """The fast path's environment switches, checked before any model loads (the model's problem: the CLI's check and
    ComfyUI's queue-time refusal): the first bad one's error, or None."""
    try:
        fused_qkv_wanted()
        autotune_gemm_wanted()
        _switch_value(SHORT_ATTENTION_ENV, *_SHORT_ATTENTION_WORDS)
    except ValueError as exc:
        return str(exc)
    return None


GRAPHED = ("step", "step_reuse")   # called every DDIM step; the VAE's functions run once or twice a window


class _Replay:
    """A compiled function captured in a CUDA graph for its one set of input shapes: each call copies the
    inputs into the graph's own buffers and replays it. The outputs are the graph's buffers, overwritten by the
    next replay (the pipeline uses each step's output before the next step; it copies what it keeps)."""

    def __init__(self, fn: Any, args: tuple):
        from ..cuda_streams import capture_stream

        self.inputs = [a.clone() if torch.is_tensor(a) else a for a in args]
        device = next((a.device for a in self.inputs if torch.is_tensor(a)), torch.device("cuda"))
        side = capture_stream(device)  # this graph's own cuBLAS workspace (capture_stream)
        current = torch.cuda.current_stream(device)
        side.wait_stream(current)
        with torch.cuda.stream(side):  # warm-up off the capture (allocator, cuDNN/cuBLAS workspaces)
            fn(*self.inputs)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=side):
            self.outputs = fn(*self.inputs)
        current.wait_stream(side)

    def __call__(self, *args: Any) -> Any:
        for mine, given in zip(self.inputs, args):
            if torch.is_tensor(mine):
                mine.copy_(given)
        self.graph.replay()
        return self.outputs


def fast_path(net: Networks, cfg: bool) -> FastPath:
    """The Networks' compiled functions for this guidance mode (built once; compiled on first use)."""
    key = "cfg" if cfg else "plain"
    with _CACHE_LOCK:
        hit = net.compiled.get(key)
        if hit is None:
            short = short_attention_wanted(net.device)
            hit = net.compiled[key] = FastPath(net, 1 if cfg else 0,
                                               graphs=os.environ.get(GRAPHS_ENV, "").strip() == "1",
                                               short_attention=short, fused_qkv=fused_qkv_wanted(),
                                               autotune_gemm=autotune_gemm_wanted())
            log.info("LatentSync fast path: the motion modules' temporal attention through %s (%s)",
                     "the short-sequence Triton kernel" if short else "SDPA",
                     f"{SHORT_ATTENTION_ENV}=0 for SDPA" if short else f"{SHORT_ATTENTION_ENV}=1 needs Triton on CUDA")
        return hit


class LatentSyncPipeline:
    """Denoises windows of aligned faces (module doc). Draws from `generator` in the reference's order."""

    def __init__(self, net: Networks, steps: int = STEPS, guidance: float = GUIDANCE, cache_interval: int = 0,
                 compile: bool = False):
        """cache_interval: 0/1 = exact (the reference's pipeline as called by default); n > 1 = the optional
        DeepCache-style faster mode: a full UNet every n-th step, the steps between reuse the feature entering the
        last up block (the reference's inference.sh enables DeepCache with interval 3, branch 0; this is the same
        idea written for this UNet, not the DeepCache package). Changes the frames: see benchmarks/RESULTS.md.
        compile: the fast path (module doc; CUDA only: on the CPU a note and eager)."""
        self.net, self.steps, self.guidance = net, int(steps), float(guidance)
        self.cache_interval = int(cache_interval)
        self.scheduler = make_scheduler()
        self.scheduler.set_timesteps(self.steps, device=net.device)
        self.timesteps = self.scheduler.timesteps
        # the scheduler's own copy on the host: DDIMScheduler.step tests `prev_timestep >= 0` and indexes its host
        # alphas with the timestep, which for a device tensor is a host sync every step (the device idles while
        # the host launches the next step); with host timesteps the steps queue up and the values are the same
        self.host_timesteps = self.timesteps.cpu()
        self.latent_size = net.resolution // 8
        self._emb: dict[tuple[int, int], torch.Tensor] = {}
        self._mask_on: dict[torch.device, torch.Tensor] = {}  # the mask image on each device it was used on
        # the VAE posterior's (mean, std) per (kind, reference frame) of this pipeline's video: a face is encoded
        # once however often the loop shows it (the draws from the generator are made every window, as the
        # reference's); MOMENTS_KEPT entries at most (mean and std: 64 KiB an entry at 512 px in FP16, 32 MiB)
        self._moments: OrderedDict[tuple[str, Any], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self.compile_note: str | None = None
        self.fast: FastPath | None = None
        if compile and net.device.type != "cuda":
            self.compile_note = "LatentSync compile is for CUDA only; running eager on the CPU"
            log.warning("[digital_human] %s", self.compile_note)
        elif compile:
            self.fast = fast_path(net, self.guidance > 1.0)

    def initial_noise(self, generator: torch.Generator) -> torch.Tensor:
        """The video's one noise (1, 4, 1, h, w) x init_noise_sigma (prepare_latents), on the generator's device."""
        shape = (1, 4, 1, self.latent_size, self.latent_size)
        noise = torch.randn(shape, generator=generator, device=generator.device, dtype=self.net.dtype)
        return noise * self.scheduler.init_noise_sigma

    def _encode(self, pixels: Callable[[], torch.Tensor], generator: torch.Generator, fast: FastPath | None,
                kind: str = "", keys: list | None = None) -> torch.Tensor:
        """VAE posterior sample x scaling (latent_dist.sample(generator)), noise drawn on the generator's device.
        pixels: makes the window's input (on the device) when it has to be encoded. keys: the window's reference
        frames (their moments are kept under (kind, key); all kept = no encode)."""
        kept = [self._moments.get((kind, k)) for k in keys] if keys else [None]
        if all(hit is not None for hit in kept):
            for k in keys:
                self._moments.move_to_end((kind, k))
            mean, std = torch.stack([m for m, _ in kept]), torch.stack([s for _, s in kept])
        else:
            x = pixels()
            if fast is not None:
                mean, std = fast("moments", x)
            else:  # a few frames at a time (module doc, Memory); the noise below stays one draw, as the reference's
                dists = [self.net.vae.encode(chunk).latent_dist for chunk in x.split(EAGER_VAE_FRAMES)]
                mean, std = torch.cat([d.mean for d in dists]), torch.cat([d.std for d in dists])
            for i, k in enumerate(keys or []):
                self._moments[(kind, k)] = (mean[i].clone(), std[i].clone())
                self._moments.move_to_end((kind, k))
            while len(self._moments) > MOMENTS_KEPT:
                self._moments.popitem(last=False)
        eps = torch.randn(mean.shape, generator=generator, device=generator.device, dtype=mean.dtype)
        return (mean + std * upload(eps, mean.device)) * SCALING_FACTOR

    def _time_emb(self, step: int, t: torch.Tensor, rows: int) -> torch.Tensor:
        hit = self._emb.get((step, rows))
        if hit is None:
            hit = self._emb[(step, rows)] = self.net.unet.time_embed(t.to(self.net.device), rows, self.net.dtype)
        return hit

    @torch.no_grad()
    def prepare(self, faces: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(pixel values (f, 3, r, r) float32, masked pixel values (float64, as the reference), mask (f, 1, r, r))
        of uint8 faces (f, r, r, 3) at the model's resolution."""
        x = torch.as_tensor(np.asarray(faces)) if not torch.is_tensor(faces) else faces
        x = x.permute(0, 3, 1, 2)
        r = self.net.resolution
        if tuple(x.shape[-2:]) != (r, r):
            raise ValueError(f"faces must be {r}x{r} (the config's resolution), got {tuple(x.shape[-2:])}")
        pixels = (x / 255.0 - 0.5) / 0.5
        mask = self._mask_on.get(pixels.device)
        if mask is None:  # once per device: a 6-MB float64 copy every window would be one more host sync
            mask = self._mask_on[pixels.device] = self.net.mask_image.to(pixels.device)
        masked = pixels * mask
        masks = mask[0:1].expand(len(x), 1, r, r)
        return pixels, masked, masks

    def _unet(self, fast: FastPath | None, x: torch.Tensor, t: torch.Tensor, audio: torch.Tensor,
              emb: torch.Tensor, cache: dict | None, reuse: bool, cfg: bool) -> torch.Tensor:
        if fast is None:
            return self.net.unet(x, t, audio, uncond_rows=1 if cfg else 0, emb=emb, deep_cache=cache, reuse=reuse,
                                 shared_rows=True)
        if reuse:
            return fast("step_reuse", x, t, audio, emb, cache["x"])
        out, feat = fast("step", x, t, audio, emb)
        if cache is not None:  # a copy: a replayed graph's output buffer is overwritten by its next replay
            cache["x"] = feat.clone()
        return out

    @torch.no_grad()
    def window(self, faces: np.ndarray | torch.Tensor, audio: torch.Tensor, noise: torch.Tensor,
               generator: torch.Generator, keys: list | None = None) -> torch.Tensor:
        """Generated faces (f, 3, r, r) in [-1, 1]-ish (device, model dtype) of one window: uint8 faces (f, r, r, 3),
        audio windows (f, 50, 384), the video's noise from initial_noise(). keys: one per face, equal for equal
        faces (the renderer: the reference frame's index), so that a face shown again is not encoded again."""
        net, dev, dt = self.net, self.net.device, self.net.dtype
        f = len(faces)
        # the compiled functions have one static shape: a full window (a shorter last one runs eager)
        fast = self.fast if f == net.num_frames else None
        if dev.type == "cuda":  # the uint8 faces up (a quarter of float32's bytes), normalised there: the same
            # IEEE operations as on the CPU, so the same values, and no CPU pass while the device waits
            faces = upload(torch.as_tensor(np.asarray(faces)), dev)
        pixels, masked, masks = self.prepare(faces)
        lat = self.latent_size
        mask_lat = F.interpolate(masks, size=(lat, lat)).to(device=dev, dtype=dt)
        masked_lat = self._encode(lambda: masked.to(device=dev, dtype=dt), generator, fast, "masked", keys)
        ref_lat = self._encode(lambda: pixels.to(device=dev, dtype=dt), generator, fast, "reference", keys)
        cfg = self.guidance > 1.0
        rows = 2 if cfg else 1

        def video(t: torch.Tensor) -> torch.Tensor:  # (f, c, h, w) -> (rows, c, f, h, w)
            return t.permute(1, 0, 2, 3).unsqueeze(0).expand(rows, -1, -1, -1, -1)

        cond = torch.cat([video(mask_lat), video(masked_lat), video(ref_lat)], dim=1)
        audio = upload(audio, dev).to(dtype=dt)
        if cfg:
            audio = torch.cat([torch.zeros_like(audio), audio])
        latents = upload(noise, dev).to(dtype=dt).expand(-1, -1, f, -1, -1).contiguous()
        cache: dict | None = {} if self.cache_interval > 1 else None
        for k, (t, t_host) in enumerate(zip(self.timesteps, self.host_timesteps)):
            x = torch.cat([latents] * rows) if cfg else latents
            x = torch.cat([self.scheduler.scale_model_input(x, t), cond], dim=1)
            reuse = cache is not None and k % self.cache_interval != 0
            pred = self._unet(fast, x, t, audio, self._time_emb(k, t, rows), cache, reuse, cfg)
            if cfg:
                uncond, text = pred.chunk(2)
                pred = uncond + self.guidance * (text - uncond)
            latents = self.scheduler.step(pred, t_host, latents, eta=0.0, generator=generator).prev_sample
        z = latents[0].permute(1, 0, 2, 3) / SCALING_FACTOR
        decoded = fast("decode", z) if fast is not None else \
            torch.cat([net.vae.decode(chunk).sample for chunk in z.split(EAGER_VAE_FRAMES)])
        keep = masks.to(device=dev, dtype=dt)
        return decoded * (1 - keep) + pixels.to(device=dev, dtype=dt) * keep
