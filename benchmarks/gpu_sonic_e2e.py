"""Sonic end to end on an NVIDIA GPU, every mode in ONE process on the same seeded random weights: our pipeline
(talking_head/sonic/pipeline.py: whisper, audio MLPs, CLIP, VAE encode, the denoising loop of time-shifted
25-frame windows with three guidance branches, temporal VAE decode in chunks of 8, RIFE middle frames) from a
framed 512x512 photo and 10 s of 16 kHz sound to 249 uint8 frames at 25 fps; and, with --reference, the
reference pipeline's own code (jixiaozhong/Sonic: its sonic.test() and its RIFE loop) on the same networks.
Networks are SVD-XT / ViT-H / whisper-tiny / RIFE shaped with seeded random weights built on the device (no
files); not timed: building them, face detection, mp4 encoding. Rows, each written to --out when measured:
  eager_fp16          25 steps as the code ran before (cuDNN heuristics, one VAE chunk and one RIFE pair a call)
  unet_call_*         one UNet call (a window's three branches): eager FP16 (cuDNN heuristics / autotuned),
                      eager FP32, compiled regions, the compiled shallow (DeepCache) call
  vram_low            1 step, branches one by one: its peak GPU memory (the 12 GB bar)
  reference           the reference's code at 1 and 3 steps, extrapolated per step to 25
  optimized           25 steps as the product's compiled path runs them (engines/sonic/accelerate.fast_path:
                      UNet and VAE channels_last, UNet regions and VAE decoder compiled; cuDNN autotuning,
                      decode 4 chunks a call, RIFE 16 pairs a call), --opt-repeat runs; frames compared with
                      eager_fp16 (same weights, seed, inputs; --window-batch the same for both)
  fast_*              speed="fast" (fewer steps, deep features reused), frames compared with eager_fp16
  profile             (--probe profile[,micro]) the optimized call's kernel table (gpu_sonic_profile.py)
    python benchmarks/gpu_sonic_e2e.py --out $OUT/sonic_e2e.json [--reference DIR] [--size reduced --device cpu]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402


def build(dev: torch.device, reduced: bool):
    from diffusers import AutoencoderKLTemporalDecoder
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection, WhisperConfig,
                              WhisperFeatureExtractor, WhisperModel)

    from digital_human.engines.sonic.load import SonicNetworks
    from digital_human.engines.sonic.networks import AudioBucket, AudioTokens, IFNet, add_audio_processors, make_sonic_unet_class
    from digital_human.engines.sonic.random_release import SCHEDULER_CONFIG, clip_config, unet_config, vae_config, whisper_config

    torch.manual_seed(0)
    ccfg = clip_config(reduced)
    with dev:
        unet = make_sonic_unet_class().from_config(unet_config(reduced))
        add_audio_processors(unet)
        vae = AutoencoderKLTemporalDecoder.from_config(vae_config(reduced))
        clip = CLIPVisionModelWithProjection(CLIPVisionConfig(**ccfg))
        wcfg = whisper_config(reduced)
        whisper = WhisperModel(WhisperConfig(**wcfg)).encoder
        dim = unet.config.cross_attention_dim
        inter = 64 if reduced else 1024
        a2t = AudioTokens(10 * (wcfg["encoder_layers"] + 1) * wcfg["d_model"], inter, 32, dim)
        a2b = AudioBucket(50 * wcfg["d_model"] + ccfg["projection_dim"], inter, 2, 1)
        ifnet = IFNet(16 if reduced else 90)
    half = torch.float16 if dev.type == "cuda" else torch.float32
    for m in (unet, vae, clip):
        m.to(dev, half).eval().requires_grad_(False)
    for m in (whisper, a2t, a2b, ifnet):
        m.to(dev, torch.float32).eval().requires_grad_(False)
    features = WhisperFeatureExtractor(feature_size=80, sampling_rate=16000, hop_length=160, chunk_length=30,
                                       n_fft=400, padding_value=0.0)
    return SonicNetworks(unet=unet, vae=vae, clip=clip, whisper_encoder=whisper, audio2token=a2t, audio2bucket=a2b,
                         ifnet=ifnet, scheduler_config=dict(SCHEDULER_CONFIG), clip_processor=CLIPImageProcessor(),
                         whisper_features=features, dtype=half, device=dev)


def inputs(seconds: float, side: int):
    from digital_human.talking_head.sonic.crop import frame_photo

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:640, 0:640] / 640.0
    photo = np.stack([200 * xx + 30, 180 * yy + 40, 120 + 60 * np.sin(6 * xx * yy)], -1)
    photo = np.clip(photo + rng.normal(0, 8, photo.shape), 0, 255).astype(np.uint8)
    framing = frame_photo(photo, (220.0, 200.0, 420.0, 430.0), short_side=side)
    t = np.arange(int(seconds * 16000)) / 16000.0
    wave = (0.3 * np.sin(2 * np.pi * 180 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
            + 0.05 * rng.normal(size=t.shape)).astype(np.float32)
    return framing, wave


def sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def reset_peak(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(dev) -> float:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if dev.type == "cuda" else 0.0


def run(nets, framing, wave, batched: bool = True, **settings):
    """(seconds, peak GiB, uint8 frames, latents, SonicLatents). batched=False renders as the code did before:
    one 12.5 fps frame and one RIFE pair at a time. RUN_STAGES keeps the last run's split: seconds to the
    denoised latents (whisper, CLIP, VAE encode, the UNet loop) and from them to the frames (decode, RIFE)."""
    from digital_human.talking_head.sonic.pipeline import SonicFrames, SonicLatents, SonicSettings

    dev = nets.device
    reset_peak(dev)
    t0 = time.perf_counter()
    lat = SonicLatents(nets, framing, wave, SonicSettings(**settings))
    made = SonicFrames(lat)
    lat.run()
    sync(dev)
    RUN_STAGES["latents_s"] = round(time.perf_counter() - t0, 2)
    if batched:
        frames = np.concatenate([made.uint8(j, min(j + 25, made.count)) for j in range(0, made.count, 25)])
    else:
        frames = np.stack([(made.frame(j) * 255).to(torch.uint8).permute(1, 2, 0).cpu().numpy()
                           for j in range(made.count)])
    sync(dev)
    RUN_STAGES["frames_s"] = round(time.perf_counter() - t0 - RUN_STAGES["latents_s"], 2)
    return time.perf_counter() - t0, peak_gib(dev), frames, lat.latents, lat


RUN_STAGES: dict[str, float] = {}


def conv_layout(module: torch.nn.Module, fmt) -> None:
    """The 2-D convolutions' weights in `fmt` (the temporal 3-D ones stay: channels_last is 4-D only)."""
    for m in module.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.weight.data = m.weight.data.contiguous(memory_format=fmt)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else round(10 * math.log10(255.0 ** 2 / mse), 2)


def compare(frames, ref_frames, lat=None, ref_lat=None) -> dict:
    d = np.abs(frames.astype(np.int16) - ref_frames.astype(np.int16))
    out = {"psnr_db": psnr(frames, ref_frames), "max_abs_levels": int(d.max()), "mean_abs_levels": round(float(d.mean()), 4),
           "equal_fraction": round(float((d == 0).mean()), 4), "within_1_level": round(float((d <= 1).mean()), 4)}
    if lat is not None:
        out["latents_max_abs"] = float((lat.float() - ref_lat.float()).abs().max())
        out["latents_scale"] = float(ref_lat.float().abs().max())
    return out


def timed_call(fn, dev, repeat: int = 3) -> float:
    fn()
    sync(dev)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        best = min(best, time.perf_counter() - t0)
    return round(best, 4)


def unet_inputs(nets, framing, dtype):
    """One window's UNet call: 3 branches x 25 frames at the framing's latent size."""
    dev = nets.device
    g = torch.Generator(device="cpu").manual_seed(0)
    h, w = framing.image.shape[0] // 8, framing.image.shape[1] // 8
    d = nets.unet.config.cross_attention_dim
    mk = lambda *s: torch.randn(*s, generator=g).to(dev, dtype)  # noqa: E731
    return (mk(3, 25, 8, h, w), torch.tensor(700.0, device=dev), mk(75, 1, d), mk(75, 32, d),
            torch.tensor([[12.5, 20.0, 18.0]] * 3, device=dev, dtype=dtype),
            torch.from_numpy(framing.mask.copy())[None, None].to(dev, dtype))


# --- the reference's code ---------------------------------------------------------------------------
def _shim_modules() -> list[str]:
    """Modules the reference imports but the timed path never calls, where they are missing: librosa (its audio
    loading; the features are given), omegaconf (its YAML config: read with PyYAML into attributes), and, on a
    machine without them, imageio / torchvision (imported by its utilities only)."""
    import importlib.util

    made = []
    import transformers.utils as tu

    if not hasattr(tu, "FLAX_WEIGHTS_NAME"):  # transformers 5 dropped it; diffusers 0.32's pipeline module imports it
        tu.FLAX_WEIGHTS_NAME = "flax_model.msgpack"
        made.append("transformers.utils.FLAX_WEIGHTS_NAME")
    if importlib.util.find_spec("omegaconf") is None:
        import yaml

        class Config(dict):
            __getattr__ = dict.__getitem__
            __setattr__ = dict.__setitem__

        mod = types.ModuleType("omegaconf")
        mod.OmegaConf = types.SimpleNamespace(load=lambda path: Config(yaml.safe_load(Path(path).read_text())))
        sys.modules["omegaconf"] = mod
        made.append("omegaconf")
    for name in ("librosa", "imageio", "torchvision"):
        if importlib.util.find_spec(name) is None:
            mod = types.ModuleType(name)
            mod.__getattr__ = lambda attr, _n=name: (_ for _ in ()).throw(AttributeError(f"{_n}.{attr}: shim, not run"))
            sys.modules[name] = mod
            if name == "torchvision":
                mod.__dict__["transforms"] = mod
                sys.modules["torchvision.transforms"] = mod
            made.append(name)
    return made


def reference_seconds(ref_dir: Path, nets, framing, wave, steps_list=(1, 3)) -> dict:
    """The reference's own pipeline (its sonic.test() and process()'s RIFE loop, its UNet class and attention
    processors, its audio MLPs and IFNet) with our networks' weights, timed at each step count."""
    shims = _shim_modules()
    sys.path.insert(0, str(ref_dir))
    from diffusers.schedulers import EulerDiscreteScheduler

    import sonic as ref_sonic
    from src.models.audio_adapter.audio_proj import AudioProjModel
    from src.models.audio_adapter.audio_to_bucket import Audio2bucketModel
    from src.models.base.unet_spatio_temporal_condition import UNetSpatioTemporalConditionModel, add_ip_adapters
    from src.pipelines.pipeline_sonic import SonicPipeline
    import src.utils.RIFE.IFNet_HDv3 as ifnet_module

    from digital_human.engines.sonic.random_release import unet_config

    dev, dt = nets.device, nets.dtype
    reduced = nets.unet.config.block_out_channels[0] < 320
    unet = UNetSpatioTemporalConditionModel.from_config(unet_config(reduced))
    add_ip_adapters(unet, [32], [1.0])
    unet.load_state_dict(nets.unet.state_dict(), strict=True)
    unet.to(dev, dt).eval().requires_grad_(False)
    a2t, a2b = nets.audio2token, nets.audio2bucket
    d_model = nets.whisper_encoder.config.d_model
    blocks = nets.whisper_encoder.config.encoder_layers + 1
    ref_a2t = AudioProjModel(seq_len=10, blocks=blocks, channels=d_model, intermediate_dim=a2t.proj1.out_features,
                             output_dim=a2t.output_dim, context_tokens=32)
    ref_a2t.load_state_dict(a2t.state_dict(), strict=True)
    ref_a2b = Audio2bucketModel(seq_len=50, blocks=1, channels=d_model, clip_channels=nets.clip.config.projection_dim,
                                intermediate_dim=a2b.proj1.out_features, output_dim=1, context_tokens=2)
    ref_a2b.load_state_dict(a2b.state_dict(), strict=True)
    ref_a2t.to(dev).eval().requires_grad_(False)
    ref_a2b.to(dev).eval().requires_grad_(False)
    width = int(nets.ifnet.block0.conv0[1][0].out_channels)
    init = ifnet_module.IFBlock.__init__
    ifnet_module.IFBlock.__init__ = lambda self, in_planes, c=90: init(self, in_planes, c=width)
    from src.utils.RIFE.RIFE_HDv3 import RIFEModel

    rife = RIFEModel(device=dev)
    ifnet_module.IFBlock.__init__ = init
    rife.flownet.load_state_dict(nets.ifnet.state_dict(), strict=True)
    rife.flownet.to(dev).eval()
    scheduler = EulerDiscreteScheduler.from_config(nets.scheduler_config)
    pipe = SonicPipeline(unet=unet, image_encoder=nets.clip, vae=nets.vae, scheduler=scheduler).to(device=dev, dtype=dt)
    wav_enc = types.SimpleNamespace(encoder=nets.whisper_encoder)
    fe = nets.whisper_features
    window = 750 * 640
    feats = torch.cat([fe(wave[i:i + window], sampling_rate=16000, return_tensors="pt").input_features
                       for i in range(0, len(wave), window)], dim=-1)
    ref_img = torch.from_numpy(framing.image.copy()).permute(2, 0, 1).float().div(255).sub(0.5).div(0.5)
    mask = torch.from_numpy(framing.mask.copy())[None].expand(3, -1, -1).contiguous()
    clip_px = nets.clip_processor(images=framing.clip_image, return_tensors="pt").pixel_values[0]
    config = ref_sonic.Sonic.config
    out = {"shims": shims, "runs": {}}
    for steps in (0,) + tuple(steps_list):  # 0: a 1-step warm-up of its code paths, not kept
        config.num_inference_steps = max(1, steps)
        batch = dict(face_mask=mask, ref_img=ref_img, clip_images=clip_px, audio_feature=feats[0],
                     audio_len=min(int(config.frame_num), len(wave) // 640))
        reset_peak(dev)
        t0 = time.perf_counter()
        with torch.no_grad():
            video = ref_sonic.test(pipe, config, wav_enc=wav_enc, audio_pe=ref_a2t, audio2bucket=ref_a2b,
                                   image_encoder=nets.clip, width=ref_img.shape[-1], height=ref_img.shape[-2],
                                   batch=batch)
            # process()'s interpolation loop, as written there (the mp4 writing after it is not timed)
            vid = video.to(dev)
            results = []
            for idx in range(vid.shape[2] - 1):
                results.append(vid[:, :, idx])
                results.append(rife.inference(vid[:, :, idx], vid[:, :, idx + 1]).clamp(0, 1).detach())
            results.append(vid[:, :, vid.shape[2] - 1])
            frames = torch.stack(results, 2).cpu()
        sync(dev)
        out["runs"][str(steps) if steps else "warmup_1"] = {"seconds": round(time.perf_counter() - t0, 2),
                                                            "peak_gib": peak_gib(dev), "frames": int(frames.shape[2])}
        print(f"reference {steps or 'warm-up 1'} steps: {out['runs'][str(steps) if steps else 'warmup_1']}", flush=True)
    lo, hi = min(steps_list), max(steps_list)
    t_lo, t_hi = out["runs"][str(lo)]["seconds"], out["runs"][str(hi)]["seconds"]
    out["per_step_s"] = round((t_hi - t_lo) / (hi - lo), 3)
    out["fixed_s"] = round(t_lo - lo * out["per_step_s"], 2)
    out["extrapolated_25_steps_s"] = round(out["fixed_s"] + 25 * out["per_step_s"], 1)
    del pipe, unet, rife, video, vid, results
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--size", default="full", choices=["full", "reduced"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--reference", default="", help="the reference's checkout (jixiaozhong/Sonic) to time")
    parser.add_argument("--fast", default="8:2", help="fast-mode variants as steps:interval, comma separated")
    parser.add_argument("--fast-repeat", type=int, default=3)
    parser.add_argument("--opt-repeat", type=int, default=1, help="runs of the optimized row (median, spread)")
    parser.add_argument("--window-batch", type=int, default=0, help="windows a UNet call: 0 = a step's all (as "
                                                                     "memory allows), 1 = as the reference and the "
                                                                     "product's compiled path")
    parser.add_argument("--probe", default="", help="extra measurements: channels_last (UNet call, VAE decode), "
                                                    "profile (the optimized call's kernel table), micro")
    parser.add_argument("--skip", default="", help="rows to skip, comma separated (eager_fp16, fp32, ...)")
    parser.add_argument("--only", default="", help="run only these rows, comma separated (also: eager_steps, "
                                                    "stages, vram_low_fast: our eager at 1 and 3 steps, the decode "
                                                    "/ RIFE split, vram low with the faster mode's reuse)")
    args = parser.parse_args()
    import_pack()
    from digital_human.engines.sonic.accelerate import fast_path

    t_start = time.perf_counter()
    dev = torch.device(args.device)
    skip = set(filter(None, args.skip.split(",")))
    only = set(filter(None, args.only.split(",")))
    reduced = args.size == "reduced"
    side = 64 if reduced else 512
    report: dict = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
                    "torch": torch.__version__, "speech_seconds": args.seconds, "resolution": side,
                    "steps": args.steps, "rows": {}}
    rows = report["rows"]

    def save(note: str) -> None:
        report["wall_s"] = round(time.perf_counter() - t_start, 1)
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=2)
        print(f"[{report['wall_s']:7.1f} s] {note}: {json.dumps(rows.get(note, ''))}", flush=True)

    def attempt(name: str, fn) -> None:
        extra = ("eager_steps", "stages", "vram_low_fast")  # rows run only when --only names them
        if name in skip or (only and name not in only) or (not only and name in extra):
            return
        try:
            fn()
        except Exception as exc:  # reported in the JSON, the later rows still run
            import traceback

            traceback.print_exc()
            rows[name] = {"error": repr(exc)[:600]}
        save(name)

    base = dict(steps=args.steps, resolution=side, vram="high", window_batch=args.window_batch)
    eager = dict(base, cudnn_benchmark=False, decode_batch=1)
    # the product's compiled path (talking_head/sonic/model.py with compile_unet): one window a call when
    # --window-batch 1, four 8-frame VAE chunks a call (the compiled decoder's one shape)
    fast_opt = dict(base, cudnn_benchmark=True, decode_batch=4)
    state: dict = {}
    with torch.no_grad():
        nets = build(dev, reduced)
        report["unet_parameters"] = sum(p.numel() for p in nets.unet.parameters())
        report["build_s"] = round(time.perf_counter() - t_start, 1)
        framing, wave = inputs(args.seconds, side)
        run(nets, framing, wave, batched=False, **dict(eager, steps=1))  # warm-up (CUDA context, kernels)
        save("build")

        def eager_row():
            s, gib, frames, lat, obj = run(nets, framing, wave, batched=False, **eager)
            state["ref"] = (frames, lat)
            report["model_frames"], report["output_frames"] = obj.count, int(frames.shape[0])
            rows["eager_fp16"] = {"seconds": round(s, 2), "peak_gib": gib, "frame_std": round(float(frames.std()), 2),
                                  **RUN_STAGES}
        attempt("eager_fp16", eager_row)

        x16 = unet_inputs(nets, framing, nets.dtype)

        def calls_row():
            r = {}
            with torch.backends.cudnn.flags(enabled=True, benchmark=False):
                r["eager_fp16_s"] = timed_call(lambda: nets.unet(*x16), dev)
            with torch.backends.cudnn.flags(enabled=True, benchmark=True):
                r["eager_fp16_cudnn_autotuned_s"] = timed_call(lambda: nets.unet(*x16), dev)
                _, deep = nets.unet(*x16, keep_deep=True)
                r["eager_fp16_shallow_s"] = timed_call(lambda: nets.unet(*x16, deep=deep), dev)
                if "channels_last" in args.probe:  # the convolutions' weights NHWC (cuDNN's native layout)
                    ref = nets.unet(*x16)
                    conv_layout(nets.unet, torch.channels_last)
                    try:
                        r["eager_fp16_channels_last_s"] = timed_call(lambda: nets.unet(*x16), dev)
                        r["channels_last_max_abs"] = float((nets.unet(*x16) - ref).abs().max())
                    finally:
                        conv_layout(nets.unet, torch.contiguous_format)
            rows["unet_call"] = r
        attempt("unet_call", calls_row)

        def fp32_row():
            nets.unet.float()
            try:
                x32 = tuple(t.float() for t in x16)
                reset_peak(dev)
                s = timed_call(lambda: nets.unet(*x32), dev, repeat=1)
                rows["fp32"] = {"unet_call_s": s, "peak_gib": peak_gib(dev),
                                "estimated_25_steps_s": round(s * 125 * args.steps / 25, 1),
                                "note": "per-call x 125 calls (25 steps x 5 windows), UNet only: a full FP32 run "
                                        "does not fit the device time"}
            finally:
                nets.unet.to(nets.dtype)
        attempt("fp32", fp32_row)

        def low_row():
            s, gib, _f, _l, _o = run(nets, framing, wave, **dict(eager, steps=1, vram="low"))
            rows["vram_low"] = {"seconds_1_step": round(s, 2), "peak_gib": gib}
        attempt("vram_low", low_row)

        def low_fast_row():  # vram low with the faster mode's reuse: 2 steps (keep, reuse), eager
            s, gib, _f, _l, _o = run(nets, framing, wave, **dict(eager, steps=2, vram="low", deep_cache_interval=2))
            rows["vram_low_fast"] = {"seconds_2_steps": round(s, 2), "peak_gib": gib}
        attempt("vram_low_fast", low_fast_row)

        def steps_row():  # our eager pipeline timed like the reference's: 1 and 3 steps, per step extrapolated
            r = {}
            for steps in (1, 3):
                r[str(steps)] = round(run(nets, framing, wave, batched=False, **dict(eager, steps=steps))[0], 2)
            r["per_step_s"] = round((r["3"] - r["1"]) / 2, 3)
            r["fixed_s"] = round(r["1"] - r["per_step_s"], 2)
            r["extrapolated_25_steps_s"] = round(r["fixed_s"] + 25 * r["per_step_s"], 1)
            rows["eager_steps"] = r
        attempt("eager_steps", steps_row)

        def stages_row():  # the frames stage split: VAE decode (1 or 4 chunks a call) and RIFE (1 or 16 pairs)
            from digital_human.talking_head.sonic.pipeline import SonicSettings, _gpu_flags

            g = torch.Generator().manual_seed(1)
            lat = torch.randn(32, 4, side // 8, side // 8, generator=g).to(dev, nets.dtype)
            vae, r = nets.vae, {}
            with _gpu_flags(SonicSettings(cudnn_benchmark=True)):
                r["decode_8_frames_s"] = timed_call(lambda: vae.decode(lat[:8], num_frames=8).sample, dev)
                r["decode_32_frames_in_one_call_s"] = timed_call(lambda: vae.decode(lat, num_frames=8).sample, dev)
                if "channels_last" in args.probe:
                    ref = vae.decode(lat, num_frames=8).sample
                    conv_layout(vae, torch.channels_last)
                    try:
                        r["decode_32_frames_channels_last_s"] = timed_call(lambda: vae.decode(lat, num_frames=8).sample, dev)
                        r["decode_channels_last_max_abs"] = float((vae.decode(lat, num_frames=8).sample - ref).abs().max())
                    finally:
                        conv_layout(vae, torch.contiguous_format)
                a = torch.rand(16, 3, side, side, generator=g).to(dev)
                b = torch.rand(16, 3, side, side, generator=g).to(dev)
                r["rife_1_pair_s"] = timed_call(lambda: nets.ifnet(a[:1], b[:1]), dev)
                r["rife_16_pairs_s"] = timed_call(lambda: nets.ifnet(a, b), dev)
            rows["stages"] = r
        attempt("stages", stages_row)

        if args.reference:
            attempt("reference", lambda: rows.__setitem__("reference", reference_seconds(Path(args.reference), nets,
                                                                                        framing, wave)))

        def compile_row():
            t0 = time.perf_counter()
            done = fast_path(nets)
            run(nets, framing, wave, **dict(fast_opt, steps=1))  # compiles every region at the call's shape
            # the shallow path: the same regions, no new compile expected (recorded)
            run(nets, framing, wave, **dict(fast_opt, steps=2, deep_cache_interval=2))
            from torch._dynamo.utils import counters

            rows["compile"] = {"fast_path": done, "compile_and_warmup_s": round(time.perf_counter() - t0, 1),
                               "dynamo_unique_graphs": int(counters["stats"]["unique_graphs"]),
                               "graph_breaks": int(sum(counters["graph_break"].values()))}
        attempt("compile", compile_row)

        def graphs() -> int:
            from torch._dynamo.utils import counters

            return int(counters["stats"]["unique_graphs"])

        def optimized_row():
            before = graphs()
            times, stages = [], []
            for _ in range(max(1, args.opt_repeat)):
                s, gib, frames, lat, _ = run(nets, framing, wave, **fast_opt)
                times.append(round(s, 2))
                stages.append(dict(RUN_STAGES))
            rows["optimized"] = {"seconds_median": float(np.median(times)), "seconds_all": times, "peak_gib": gib,
                                 "stages_all": stages,
                                 "vs_eager_fp16": compare(frames, *state["ref"][:1], lat, state["ref"][1]),
                                 "graphs_compiled_during_runs": graphs() - before}
            with torch.backends.cudnn.flags(enabled=True, benchmark=True):
                rows["optimized"]["unet_call_compiled_s"] = timed_call(lambda: nets.unet(*x16), dev)
                _, deep = nets.unet(*x16, keep_deep=True)
                rows["optimized"]["unet_call_compiled_shallow_s"] = timed_call(lambda: nets.unet(*x16, deep=deep), dev)
        attempt("optimized", optimized_row)

        for spec in filter(None, args.fast.split(",")):
            steps, interval = (int(v) for v in spec.split(":"))

            def fast_row(steps=steps, interval=interval, name=f"fast_{steps}_steps_interval_{interval}"):
                times = []
                for _ in range(max(1, args.fast_repeat)):
                    s, gib, frames, lat, _ = run(nets, framing, wave, **dict(fast_opt, steps=steps,
                                                                             deep_cache_interval=interval))
                    times.append(round(s, 2))
                rows[name] = {"seconds_median": float(np.median(times)), "seconds_all": times, "peak_gib": gib,
                              **RUN_STAGES,
                              "vs_eager_fp16": compare(frames, state["ref"][0])}
            attempt(f"fast_{steps}_steps_interval_{interval}", fast_row)

        def profile_row():  # where the optimized call's time goes (benchmarks/gpu_sonic_profile.py's table)
            from gpu_sonic_profile import kernel_table, micro

            with torch.backends.cudnn.flags(enabled=True, benchmark=True):
                rows["profile"] = {"compiled_call": kernel_table(lambda: nets.unet(*x16), dev)}
                if "micro" in args.probe:
                    rows["profile"]["micro"] = micro(dev, nets.dtype, reduced)
        if "profile" in args.probe:
            attempt("profile", profile_row)
    report["finished"] = True
    save("done")


if __name__ == "__main__":
    main()
