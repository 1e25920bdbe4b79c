"""LatentSync 1.6 (full size, 512x512) on one GPU: the pack's denoising vs the reference's, same random weights.

Both sides get the same UNet weights (the pack's LatentSyncUNet built from stage2_512.yaml's model section with
seeded random weights, loaded strictly into the reference's own UNet3DConditionModel too), the same
sd-vae-ft-mse-shaped VAE, DDIM scheduler, 16-frame windows of 512x512 faces and audio windows, FP16:
- reference: its LipsyncPipeline's per-window work transcribed from __call__ (prepare_mask_latents,
  prepare_image_latents, 20 steps of [latents]*2 -> scale_model_input -> cat(mask, masked, ref) -> UNet ->
  guidance -> DDIM step, decode_latents, paste_surrounding_pixels_back) with the reference's UNet class;
- pack eager: engines/latentsync/pipeline.LatentSyncPipeline.window;
- pack fast path: the same with compile=True (torch.compile of the UNet step and the VAE, channels-last,
  cuDNN autotuner; pipeline.py's module doc).
Face detection/alignment, whisper and video I/O are outside these timings (the reference's insightface detector
cannot run here). Each side runs `--windows` windows in a row from the same seed (one video's draws); per-window
seconds give the frames/s (median of the windows, and of `--repeats` such runs for the fast path).

Sections, each written to the JSON as it finishes (a later failure keeps the earlier figures):
- levers: one UNet step (the CFG batch of 2 x 16 frames) eager FP16 as is / with cudnn.benchmark / with
  channels-last weights / with each SDPA backend tried first / BF16, and the eager step's CUDA kernels
  (torch.profiler) grouped by kind (conv, gemm, attention, norm, elementwise, copies);
- attn: every attention call of one step (spatial self, audio cross, motion-module temporal), in the modules'
  own q/k/v layout, timed alone under torch's default SDPA choice and each backend forced;
- profile (after fast): the compiled UNet step, encoder moments and decoder timed alone and their kernels
  grouped by kind;
- reference, pack eager, pack fast path: frames/s, peak GPU memory, the largest difference of the outputs on
  the same draws; FP16 noise: the pack's eager FP32 window (TF32 off) against its FP16 one, the yardstick for
  "equal within FP16 noise";
- short_eager (after eager and fp32): the eager FP16 windows again with the short-sequence temporal attention
  kernel on (engines/latentsync/short_attention.py), their largest difference from the SDPA windows and from FP32,
  and one UNet step timed each way (no compile);
- DeepCache-style mode (cache interval 3 and 2; after the memory section) on the fast path: frames/s and its difference from the exact
  frames in 8-bit levels;
- memory (--memory-steps DDIM steps; peak memory does not depend on the step count: each step allocates and
  frees the same buffers): talking_head.latentsync.crops.latentsync_crops(streaming=True) on a FaceTrack of
  32 frames of a real talking video (--track, FaceAlign output saved by FaceTrack.save_npz) looped to the speech
  (--speech, 16 kHz .npy, looped) of 10 s and 60 s at 25 fps (250 and 1500 output frames), every crop pulled
  through GeneratedCrops.chunk in 64-frame chunks as the video renderer does; the paste-back and the encoder are
  not run (no PyAV on the device). The networks are this script's (full-size random weights) with a full-size
  random whisper tiny; a reduced release on disk only satisfies the file check;
- graph (after memory: a failed capture can leave the CUDA context unusable): the fast path's UNet step called
  vs replayed from a CUDA graph (does launching still cost anything at this size?);
- variants (last: it resets dynamo's caches): the compiled UNet step recompiled with another SDPA backend tried
  first (--variants), timed alone, and its largest difference from the fast path's step.

  python benchmarks/latentsync_gpu.py --ref <copy of bytedance/LatentSync> --out results.json
  python benchmarks/latentsync_gpu.py --smoke --ref <ref> --out /tmp/x.json   (CPU, reduced, checks the script)
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import os
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
T0 = time.perf_counter()


def _this_checkout() -> None:
    """`digital_human` = this checkout (not an installed copy of another): the code these figures are of."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("digital_human", ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["digital_human"] = module
    spec.loader.exec_module(module)


def _transformers5_shim() -> None:
    """diffusers 0.32's pipeline loaders import transformers.utils.FLAX_WEIGHTS_NAME, gone in transformers 5 (the GPU
    machine's): set that one constant where it is missing (never read on this path)."""
    try:
        import transformers.utils as tu
    except ImportError:
        return
    if not hasattr(tu, "FLAX_WEIGHTS_NAME"):
        tu.FLAX_WEIGHTS_NAME = "flax_model.msgpack"


def _seeded_init(module: torch.nn.Module, seed: int) -> None:
    dev = next(module.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim == 1:
                p.copy_((1.0 if "norm" in name and name.endswith("weight") else 0.0)
                        + 0.02 * torch.randn(p.shape, generator=g, device=dev))
            else:
                fan_in = math.prod(p.shape[1:])
                p.copy_(torch.randn(p.shape, generator=g, device=dev) / math.sqrt(fan_in))


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _peak_reset() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def median_run(runs: list[dict]) -> dict:
    """The run of median wall time (the lower middle one of an even count), with the spread of all runs."""
    ordered = sorted(runs, key=lambda r: r["wall_s"])
    walls = [r["wall_s"] for r in ordered]
    return dict(ordered[(len(ordered) - 1) // 2], wall_s_min=walls[0], wall_s_max=walls[-1], n_runs=len(runs))


def _peak_gib() -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0


def _diff(a: list, b: list) -> dict:
    """Largest and mean |a - b| over paired windows, in [-1, 1] units and in 8-bit levels (x 127.5)."""
    d = [(x.float() - y.float()).abs() for x, y in zip(a, b)]
    mx = max(float(t.max()) for t in d)
    mean = sum(float(t.mean()) for t in d) / len(d)
    return {"max_abs": mx, "mean_abs": mean, "max_levels": mx * 127.5, "mean_levels": mean * 127.5}


KERNEL_GROUPS = ("attention", "conv", "gemm", "norm (fused reductions)", "elementwise (fused)", "copies/layout",
                 "elementwise (aten)", "other")


def kernel_group(name: str) -> str:
    """A CUDA kernel's group by its name (cuDNN/cuBLAS/flash/inductor Triton naming)."""
    n = name.lower()
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa", "attn")):
        return "attention"
    if any(k in n for k in ("fprop", "conv", "implicit_gemm", "dgrad", "wgrad", "winograd")):
        return "conv"
    if any(k in n for k in ("gemm", "nvjet", "cutlass", "cublas", "sm90_xmma", "triton_tem", "mm_")):
        return "gemm"
    if n.startswith("triton_red") or n.startswith("triton_per"):
        return "norm (fused reductions)" if any(k in n for k in ("norm", "var_mean", "mean")) else "other"
    if n.startswith("triton_poi"):
        rest = n.split("fused_", 1)[-1]
        layout = {"clone", "copy", "permute", "cat", "view", "reshape", "transpose", "expand", "0", "1", "2", "3",
                  "4", "5", "6", "7", "8", "9", "convolution", "unsqueeze"}
        parts = [x for x in rest.split("_") if x]
        return "copies/layout" if parts and all(x in layout for x in parts) else "elementwise (fused)"
    if any(k in n for k in ("copy", "memcpy", "memset", "cat_", "catarray")):
        return "copies/layout"
    if any(k in n for k in ("group_norm", "layer_norm", "groupnorm", "layernorm", "welford", "rowwisemoments")):
        return "norm (fused reductions)"
    if any(k in n for k in ("elementwise", "vectorized", "unrolled", "reduce_kernel", "softmax")):
        return "elementwise (aten)"
    return "other"


def profile_table(fn, steps: int = 1) -> dict:
    """torch.profiler CUDA kernel times of `steps` calls of fn: per group, and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        _sync()
    groups: dict = {g: {"ms": 0.0, "kernels": 0} for g in KERNEL_GROUPS}
    top = []
    for e in prof.key_averages():
        if e.device_time_total <= 0 or e.key.startswith("aten::") or e.key.startswith("cuda"):
            continue
        g = kernel_group(e.key)
        groups[g]["ms"] += e.device_time_total / 1000 / steps
        groups[g]["kernels"] += e.count // steps
        top.append({"kernel": e.key[:100], "group": g, "ms": e.device_time_total / 1000 / steps,
                    "calls": e.count // steps})
    total = sum(v["ms"] for v in groups.values())
    for v in groups.values():
        v["share"] = v["ms"] / total if total else 0.0
    top.sort(key=lambda r: r["ms"], reverse=True)
    return {"total_kernel_ms": total, "groups": groups, "top": top[:25]}


def record_attention_calls(unet, call) -> list[dict]:
    """Every scaled_dot_product_attention call of one UNet step: kind (spatial self / audio cross / temporal, from
    the calling module), level, q/k/v shapes and strides (the layout the modules hand to SDPA)."""
    from digital_human.engines.latentsync import unet as U

    kinds: dict = {}
    for name, mod in unet.named_modules():
        if isinstance(mod, U.TemporalAttention):
            kinds[id(mod)] = "temporal (motion module)"
        elif name.endswith("attn2"):
            kinds[id(mod)] = "audio cross"
        elif name.endswith("attn1"):
            kinds[id(mod)] = "spatial self"
    current: list = []
    calls: list = []
    real = U.F.scaled_dot_product_attention

    def rec(q, k, v, *a, **kw):
        calls.append({"kind": current[-1] if current else "?", "q": list(q.shape), "k": list(k.shape),
                      "q_stride": list(q.stride()), "k_stride": list(k.stride()), "v_stride": list(v.stride())})
        return real(q, k, v, *a, **kw)

    hooks = []
    for mod in unet.modules():
        if id(mod) in kinds:
            hooks.append(mod.register_forward_pre_hook(lambda m, a, k=kinds[id(mod)]: current.append(k)))
            hooks.append(mod.register_forward_hook(lambda m, a, o: current.pop() and None))
    U.F.scaled_dot_product_attention = rec
    try:
        with torch.no_grad():
            call()
    finally:
        U.F.scaled_dot_product_attention = real
        for h in hooks:
            h.remove()
    return calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", type=Path, required=True)
    ap.add_argument("--windows", type=int, default=3, help="windows per timed run")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of the fast path")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sections", default="levers,attn,reference,eager,fp32,short_eager,fast,profile,whole,memory,graph,"
                                          "deepcache,variants")
    ap.add_argument("--deepcache", default="3,2", help="cache intervals of the DeepCache-style section")
    ap.add_argument("--variants", default="cudnn", help="SDPA backends tried first by the variants section, and "
                    "'short' (the short-sequence temporal attention kernel)")
    ap.add_argument("--variant-repeats", type=int, default=0, help="timed runs of whole windows per variant")
    ap.add_argument("--graph-repeats", type=int, default=0, help="timed runs of --windows windows with graphs")
    ap.add_argument("--memory-steps", type=int, default=1)
    ap.add_argument("--whole-seconds", type=float, default=5.12, help="speech of the whole-pipeline section")
    ap.add_argument("--whole-repeats", type=int, default=1, help="timed runs of each side in the whole section "
                    "(the median run is the figure)")
    ap.add_argument("--whole-pack-only", action="store_true", help="the whole section times the pack only (an A/B of "
                    "the pack's own settings in separate processes; the ratio needs the reference in the same run)")
    ap.add_argument("--whole-reference-only", action="store_true", help="the whole section times the reference "
                    "only (its other half, when a long compile of the pack's side used up one device call)")
    ap.add_argument("--whole-warm-seconds", type=float, default=1.0, help="an untimed run of each side on this much "
                    "of the speech first (0: none)")
    ap.add_argument("--memory-seconds", default="10,60")
    ap.add_argument("--memory-path", default="fast", choices=["fast", "eager"])
    ap.add_argument("--track", type=Path)
    ap.add_argument("--speech", type=Path)
    ap.add_argument("--budget", type=float, default=1e9, help="seconds: later sections are skipped past it")
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="reduced size on the CPU in FP32 (checks the script runs)")
    args = ap.parse_args()
    if args.whole_pack_only and args.whole_reference_only:
        ap.error("--whole-pack-only and --whole-reference-only: give one (neither times both sides)")
    _this_checkout()
    _transformers5_shim()
    from diffusers import AutoencoderKL

    from digital_human.engines.latentsync.pipeline import LatentSyncPipeline, Networks
    from digital_human.engines.latentsync.random_release import (DATA, UNET_MODEL_FULL, UNET_MODEL_REDUCED,
                                                                 VAE_CONFIG_FULL, VAE_CONFIG_REDUCED, stand_in_mask)
    from digital_human.engines.latentsync.unet import LatentSyncUNet

    sections = set(args.sections.split(","))
    model_cfg, vae_cfg, res = (UNET_MODEL_REDUCED, VAE_CONFIG_REDUCED, 64) if args.smoke else \
        (UNET_MODEL_FULL, VAE_CONFIG_FULL, 512)
    dt, dev = (torch.float32, torch.device("cpu")) if args.smoke else (torch.float16, torch.device("cuda"))
    rep: dict = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": args.commit,
                 "gpu": "cpu (smoke)" if args.smoke else torch.cuda.get_device_name(), "torch": torch.__version__,
                 "steps": args.steps, "guidance": 1.5, "resolution": res, "window": 16, "precision": str(dt),
                 "windows_per_run": args.windows, "errors": {}}

    def save() -> None:
        rep["elapsed_s"] = time.perf_counter() - T0
        args.out.write_text(json.dumps(rep, indent=2) + "\n")
        print(json.dumps({k: v for k, v in rep.items() if not k.startswith("profile") and k != "attention_calls"}),
              flush=True)

    def section(name: str):
        """Decorator: run the section if asked for and within the budget; record its error and go on."""
        def wrap(fn):
            if name not in sections:
                return None
            if time.perf_counter() - T0 > args.budget:
                rep["errors"][name] = "skipped: past the time budget"
                save()
                return None
            t = time.perf_counter()
            try:
                fn()
            except Exception as exc:
                rep["errors"][name] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
            rep[f"{name}_section_s"] = time.perf_counter() - t
            save()
            return None
        return wrap

    unet = LatentSyncUNet(model_cfg).to(dev)
    _seeded_init(unet, 0)
    unet = unet.to(dt).eval()
    vae = AutoencoderKL(**{k: v for k, v in vae_cfg.items() if not k.startswith("_")}).to(dev, dt).eval()
    import cv2

    mask = torch.from_numpy(cv2.resize(stand_in_mask(), (res, res), interpolation=cv2.INTER_LANCZOS4) / 255.0)
    config = {"model": model_cfg, "data": dict(DATA, resolution=res)}
    net = Networks(files=None, config=config, unet=unet, vae=vae, whisper=None,
                   mask_image=mask.permute(2, 0, 1).contiguous(), device=dev, dtype=dt)
    rep["unet_params"] = sum(p.numel() for p in unet.parameters())
    rng = np.random.default_rng(0)
    faces = rng.integers(0, 256, (16, res, res, 3), dtype=np.uint8)
    audio = torch.from_numpy(rng.standard_normal((16, 50, 384)).astype(np.float32))
    outs: dict[str, list] = {}

    def run_pack(pipe, n: int, seed: int = 5) -> tuple[list[float], list[torch.Tensor]]:
        g = torch.Generator().manual_seed(seed)
        noise = pipe.initial_noise(g)
        times, outputs = [], []
        for _ in range(n):
            _sync()
            t = time.perf_counter()
            outputs.append(pipe.window(faces, audio, noise, g))
            _sync()
            times.append(time.perf_counter() - t)
        return times, outputs

    def fps(times: list[float]) -> float:
        return 16 / statistics.median(times)

    # one UNet step's inputs (the CFG batch)
    lat = res // 8
    x_step = torch.randn(1, 13, 16, lat, lat, device=dev, dtype=dt).expand(2, -1, -1, -1, -1).contiguous()  # CFG rows: equal
    a_step = torch.cat([torch.zeros(16, 50, 384), audio]).to(dev, dt)
    t_step = torch.tensor(501, device=dev)
    emb_step = unet.time_embed(t_step, 2, dt)

    def time_step(module, n: int = 5, warm: int = 2, x=x_step, a=a_step, e=emb_step, shared: bool = False) -> float:
        with torch.no_grad():
            for _ in range(warm):
                module(x, t_step, a, uncond_rows=1, emb=e, shared_rows=shared)
            _sync()
            t = time.perf_counter()
            for _ in range(n):
                module(x, t_step, a, uncond_rows=1, emb=e, shared_rows=shared)
            _sync()
        return (time.perf_counter() - t) / n * 1000

    from torch.nn.attention import SDPBackend, sdpa_kernel

    SDPA = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}

    def prefer(first: str):
        """SDPA's backends with `first` tried first (the others after it, in torch's order)."""
        order = [SDPA[first]] + [b for k, b in SDPA.items() if k != first]
        return sdpa_kernel(order, set_priority=True)

    @section("levers")
    def _levers():
        """One eager UNet step (the CFG batch of 2 x 16 frames) under each lever, and its kernel profile."""
        lv = {}
        torch.backends.cudnn.benchmark = False
        lv["eager_fp16_ms"] = time_step(unet)
        torch.backends.cudnn.benchmark = True
        lv["eager_fp16_cudnn_benchmark_ms"] = time_step(unet, warm=3)
        unet.to(memory_format=torch.channels_last)
        lv["eager_fp16_channels_last_cudnn_benchmark_ms"] = time_step(unet, warm=3)
        # the guidance rows' shared prefix (conv_in, first ResNet block, first self-attention) run once
        lv["eager_fp16_channels_last_cudnn_benchmark_shared_rows_ms"] = time_step(unet, warm=2, shared=True)
        for first in ("cudnn", "efficient", "flash"):
            try:
                with prefer(first):
                    lv[f"eager_fp16_channels_last_cudnn_benchmark_sdpa_{first}_first_ms"] = time_step(unet, warm=2)
            except Exception as exc:  # a backend that cannot run these shapes
                lv[f"eager_fp16_channels_last_cudnn_benchmark_sdpa_{first}_first_ms"] = f"{type(exc).__name__}: {exc}"[:200]
        unet.to(memory_format=torch.contiguous_format)
        rep["levers"] = lv
        save()
        ub = copy.deepcopy(unet).to(torch.bfloat16)
        lv["eager_bf16_cudnn_benchmark_ms"] = time_step(ub, warm=3, x=x_step.bfloat16(), a=a_step.bfloat16(),
                                                        e=emb_step.bfloat16())
        del ub
        torch.backends.cudnn.benchmark = False
        if not args.smoke:
            rep["profile_eager_step"] = profile_table(lambda: unet(x_step, t_step, a_step, uncond_rows=1, emb=emb_step))
        torch.cuda.empty_cache() if torch.cuda.is_available() else None

    @section("attn")
    def _attn():
        """Each attention call of one step, grouped by kind and shape, in the modules' own q/k/v layout, timed
        alone under torch's default SDPA choice and with each backend forced (the compiled step calls the same
        aten kernels: inductor does not generate attention)."""
        calls = record_attention_calls(unet, lambda: unet(x_step, t_step, a_step, uncond_rows=1, emb=emb_step))
        groups: dict = {}
        for c in calls:
            key = json.dumps([c["kind"], c["q"], c["k"], c["q_stride"], c["k_stride"], c["v_stride"]])
            groups.setdefault(key, dict(c, count=0))["count"] += 1
        rows = []
        for g in groups.values():
            def make(shape, stride):
                return torch.empty_strided(shape, stride, device=dev, dtype=dt).normal_()

            q, k, v = make(g["q"], g["q_stride"]), make(g["k"], g["k_stride"]), make(g["k"], g["v_stride"])
            row = dict(g)
            for name in ("default", "flash", "efficient", "cudnn", "math"):
                if name == "math" and g["q"][0] * g["q"][1] * g["q"][2] * g["k"][2] * 2 > 2**31:
                    row[f"{name}_ms"] = "skipped (score matrix > 2 GiB)"
                    continue
                try:
                    ctx = sdpa_kernel([SDPA[name]]) if name != "default" else torch.no_grad()
                    with ctx, torch.no_grad():
                        for _ in range(2):
                            torch.nn.functional.scaled_dot_product_attention(q, k, v)
                        _sync()
                        t = time.perf_counter()
                        for _ in range(5):
                            torch.nn.functional.scaled_dot_product_attention(q, k, v)
                        _sync()
                    row[f"{name}_ms"] = (time.perf_counter() - t) / 5 * 1000
                except Exception as exc:
                    row[f"{name}_ms"] = f"{type(exc).__name__}: {str(exc)[:120]}"
            rows.append(row)
            del q, k, v
        per_kind: dict = {}
        for r in rows:
            d = per_kind.setdefault(r["kind"], {"calls": 0})
            d["calls"] += r["count"]
            for name in ("default", "flash", "efficient", "cudnn", "math"):
                val = r[f"{name}_ms"]
                if isinstance(val, float) and d.get(f"{name}_ms_per_step", 0.0) is not None:
                    d[f"{name}_ms_per_step"] = d.get(f"{name}_ms_per_step", 0.0) + val * r["count"]
                else:
                    d[f"{name}_ms_per_step"] = None  # not every shape of this kind ran on this backend
            ok = [(r[f"{n}_ms"], n) for n in ("flash", "efficient", "cudnn", "math") if isinstance(r[f"{n}_ms"], float)]
            best = min(ok) if ok else (None, None)
            r["best"] = best[1]
            d["best_ms_per_step"] = d.get("best_ms_per_step", 0.0) + (best[0] or 0.0) * r["count"]
        rep["attention_calls"] = rows
        rep["attention_per_kind"] = per_kind
        torch.cuda.empty_cache() if torch.cuda.is_available() else None

    crops_work: list = []

    def crops_networks() -> Path:
        """A release folder for latentsync_crops' file check (reduced: module doc) whose networks are this
        script's (cached_networks patched), with a random whisper tiny of the release's size; memoised."""
        if crops_work:
            return crops_work[0]
        from digital_human.engines.latentsync import pipeline as pl
        from digital_human.engines.latentsync.audio import load_whisper
        from digital_human.engines.latentsync.random_release import (WHISPER_DIMS_FULL, WHISPER_DIMS_REDUCED,
                                                                     whisper_checkpoint, write_release)

        work = Path(tempfile.mkdtemp(prefix="ls_mem_"))
        write_release(work, "reduced", seed=0)
        torch.save(whisper_checkpoint(WHISPER_DIMS_REDUCED if args.smoke else WHISPER_DIMS_FULL, 2),
                   str(work / "whisper_full.pt"))
        net.whisper = load_whisper(work / "whisper_full.pt", str(dev), dt)
        pl.cached_networks = lambda device, precision, models_root=None: net
        crops_work.append(work)
        return work

    def reference_modules(extra: tuple = ()) -> None:
        """The reference checkout on sys.path, with empty stand-ins for the packages its modules import at module
        level but this benchmark never calls (decord readers, insightface's detector, ffmpeg-python's decoder,
        and in the CPU smoke run the plotting/IO packages its venv lacks)."""
        if str(args.ref) not in sys.path:
            sys.path.insert(0, str(args.ref))
        unused = ["decord", "insightface", "insightface.app", "ffmpeg", "soundfile", *extra]
        for name in unused:
            try:
                __import__(name)
            except ImportError:
                stub = types.ModuleType(name)
                stub.AudioReader = stub.VideoReader = stub.FaceAnalysis = None
                stub.pyplot = None
                sys.modules[name] = stub
        import transformers

        # whisper/tokenizer.py imports GPT2TokenizerFast at module level (transformers 5 may lack the name); the
        # encoder-only transcribe() never builds a tokenizer
        if not hasattr(transformers, "GPT2TokenizerFast"):
            transformers.GPT2TokenizerFast = getattr(transformers, "GPT2Tokenizer", None)

    # --- the reference -----------------------------------------------------------------------------------
    @section("reference")
    def _reference():
        reference_modules(("matplotlib", "matplotlib.pyplot", "imageio"))
        from diffusers import DDIMScheduler
        from einops import rearrange

        from latentsync.models.unet import UNet3DConditionModel

        torch.backends.cudnn.benchmark = False  # the reference does not set it
        ref_unet = UNet3DConditionModel.from_config(model_cfg)
        missing = ref_unet.load_state_dict({k: v.float() for k, v in unet.state_dict().items()}, strict=True)
        rep["reference_strict_load"] = str(missing)
        ref_unet = ref_unet.to(dev, dt).eval()
        sched = DDIMScheduler.from_pretrained(str(args.ref / "configs"))
        mask_img = net.mask_image

        @torch.no_grad()
        def reference(n: int, seed: int = 5) -> tuple[list[float], list[torch.Tensor]]:
            g = torch.Generator().manual_seed(seed)
            sched.set_timesteps(args.steps, device=dev)
            shape = (1, 4, 1, res // 8, res // 8)
            all_latents = torch.randn(shape, generator=g, dtype=dt).to(dev).repeat(1, 1, 16, 1, 1) \
                * sched.init_noise_sigma
            times, outputs = [], []
            for _ in range(n):
                _sync()
                t0 = time.perf_counter()
                a = audio.to(dev, dt)
                a = torch.cat([torch.zeros_like(a), a])
                x = rearrange(torch.from_numpy(faces), "f h w c -> f c h w")
                pixel_values = (x / 255.0 - 0.5) / 0.5
                masked = pixel_values * mask_img
                masks = torch.stack([mask_img[0:1]] * 16)
                m = torch.nn.functional.interpolate(masks, size=(res // 8, res // 8)).to(dev, dt)
                dist = vae.encode(masked.to(dev, dt)).latent_dist
                mlat = (dist.mean + dist.std * torch.randn(dist.mean.shape, generator=g, dtype=dt).to(dev)) * 0.18215
                dist = vae.encode(pixel_values.to(dev, dt)).latent_dist
                rlat = (dist.mean + dist.std * torch.randn(dist.mean.shape, generator=g, dtype=dt).to(dev)) * 0.18215
                m = torch.cat([rearrange(m, "f c h w -> 1 c f h w")] * 2)
                mlat = torch.cat([rearrange(mlat, "f c h w -> 1 c f h w")] * 2)
                rlat = torch.cat([rearrange(rlat, "f c h w -> 1 c f h w")] * 2)
                latents = all_latents
                for t in sched.timesteps:
                    u = sched.scale_model_input(torch.cat([latents] * 2), t)
                    u = torch.cat([u, m, mlat, rlat], dim=1)
                    pred = ref_unet(u, t, encoder_hidden_states=a).sample
                    un, au = pred.chunk(2)
                    pred = un + 1.5 * (au - un)
                    latents = sched.step(pred, t, latents).prev_sample
                dec = vae.decode(rearrange(latents / 0.18215, "b c f h w -> (b f) c h w")).sample
                keep = masks.to(dev, dt)
                outputs.append(dec * (1 - keep) + pixel_values.to(dev, dt) * keep)
                _sync()
                times.append(time.perf_counter() - t0)
            return times, outputs

        reference(1)  # warm-up (cuDNN/cuBLAS choices)
        _peak_reset()
        times, outs["reference"] = reference(args.windows)
        rep["reference_window_s"] = times
        rep["reference_fps"] = fps(times)
        rep["reference_peak_gib"] = _peak_gib()
        del ref_unet
        torch.cuda.empty_cache() if torch.cuda.is_available() else None

    @section("eager")
    def _eager():
        torch.backends.cudnn.benchmark = False
        pipe = LatentSyncPipeline(net, steps=args.steps)
        run_pack(pipe, 1)
        _peak_reset()
        times, outs["eager"] = run_pack(pipe, args.windows)
        rep["eager_window_s"] = times
        rep["eager_fps"] = fps(times)
        rep["eager_peak_gib"] = _peak_gib()
        if "reference" in outs:
            rep["eager_vs_reference"] = _diff(outs["eager"], outs["reference"])
            rep["eager_speedup"] = rep["eager_fps"] / rep["reference_fps"]

    @section("fp32")
    def _fp32():
        """FP16 noise: the same window in FP32 (TF32 off) against the FP16 eager one (the pack's, else the
        reference's transcription: the same arithmetic, identical outputs on the H200 before)."""
        base = "eager" if "eager" in outs else "reference"
        if base not in outs:
            raise RuntimeError("needs the eager or the reference section")
        tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        net32 = Networks(files=None, config=config, unet=copy.deepcopy(unet).float(), vae=copy.deepcopy(vae).float(),
                         whisper=None, mask_image=net.mask_image, device=dev, dtype=torch.float32)
        _, out32 = run_pack(LatentSyncPipeline(net32, steps=args.steps), 1)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        outs["fp32"] = out32
        rep["fp32_compared_with"] = base
        rep["fp16_eager_vs_fp32_first_window"] = _diff(outs[base][:1], out32)
        del net32
        torch.cuda.empty_cache() if torch.cuda.is_available() else None

    @section("short_eager")
    def _short_eager():
        """The short-sequence temporal attention kernel in the eager FP16 pipeline (no compile: seconds, not
        minutes): the same windows and draws as the eager section with the kernel on, their largest difference
        from the SDPA windows and (with the fp32 section) from FP32, and one UNet step timed each way."""
        if "eager" not in outs:
            raise RuntimeError("needs the eager section (the SDPA windows to compare with)")
        out: dict = {"sdpa_step_ms": time_step(unet)}
        rep["short_eager"] = out
        out["modules"] = unet.set_short_attention(True)
        try:
            out["short_step_ms"] = time_step(unet)
            pipe = LatentSyncPipeline(net, steps=args.steps)
            times, short = run_pack(pipe, args.windows)
            out["window_s"] = times
            out["vs_eager_sdpa"] = _diff(short, outs["eager"])
            if "fp32" in outs:
                out["vs_fp32_first_window"] = _diff(short[:1], outs["fp32"])
                out["eager_sdpa_vs_fp32_first_window"] = rep.get("fp16_eager_vs_fp32_first_window")
        finally:
            unet.set_short_attention(False)

    fast_pipe: dict = {}

    @section("fast")
    def _fast():
        pipe = LatentSyncPipeline(net, steps=args.steps, compile=True)
        if args.smoke:  # the CPU check of this script: the fast path's code with its functions left eager
            from digital_human.engines.latentsync.pipeline import FastPath

            pipe.fast = FastPath(net, 1)
            pipe.fast.compiled = dict(pipe.fast.eager)
        if pipe.fast is None:
            raise RuntimeError(pipe.compile_note or "no fast path")
        fast_pipe["exact"] = pipe
        t = time.perf_counter()
        _peak_reset()
        run_pack(pipe, 1)  # compiles the step, the encoder and the decoder
        rep["fast_first_window_s"] = time.perf_counter() - t
        rep["fast_compile_s"] = dict(pipe.fast.seconds)
        rep["fast_first_window_peak_gib"] = _peak_gib()
        if pipe.fast.failed:
            rep["errors"]["fast_compile"] = pipe.fast.failed
        runs = []
        for r in range(args.repeats):
            _peak_reset()
            times, o = run_pack(pipe, args.windows)
            runs.append(times)
            if r == 0:
                outs["fast"] = o
        rep["fast_window_s"] = runs
        rep["fast_fps_per_run"] = [fps(t) for t in runs]
        rep["fast_fps"] = statistics.median(rep["fast_fps_per_run"])
        rep["fast_peak_gib"] = _peak_gib()
        if "reference_fps" in rep:
            rep["fast_speedup"] = rep["fast_fps"] / rep["reference_fps"]
            rep["fast_speedup_per_run"] = [f / rep["reference_fps"] for f in rep["fast_fps_per_run"]]
        if "eager" in outs:
            rep["fast_vs_eager"] = _diff(outs["fast"], outs["eager"])
            rep["fast_vs_eager_first_window"] = _diff(outs["fast"][:1], outs["eager"][:1])
        if "reference" in outs:
            rep["fast_vs_reference"] = _diff(outs["fast"], outs["reference"])
            rep["fast_vs_reference_first_window"] = _diff(outs["fast"][:1], outs["reference"][:1])
        if "fp32" in outs:
            rep["fast_vs_fp32_first_window"] = _diff(outs["fast"][:1], outs["fp32"])

    def timed_ms(fn, n: int = 5, warm: int = 1) -> float:
        with torch.no_grad():
            for _ in range(warm):
                fn()
            _sync()
            t = time.perf_counter()
            for _ in range(n):
                fn()
            _sync()
        return (time.perf_counter() - t) / n * 1000

    @section("profile")
    def _profile():
        """Where a fast-path window's time goes: the compiled UNet step, encoder moments and decoder, each timed
        alone and profiled (CUDA kernels grouped by kind)."""
        fast = fast_pipe["exact"].fast
        px = torch.randn(16, 3, res, res, device=dev, dtype=dt)
        z = torch.randn(16, 4, lat, lat, device=dev, dtype=dt)
        fns = {"step": lambda: fast("step", x_step, t_step, a_step, emb_step),
               "moments": lambda: fast("moments", px), "decode": lambda: fast("decode", z)}
        rep["fast_parts_ms"] = {k: timed_ms(f) for k, f in fns.items()}
        save()
        if not args.smoke:
            for k, f in fns.items():
                rep[f"profile_fast_{k}"] = profile_table(f)

    @section("whole")
    def _whole():
        """The whole pipeline each side runs for a video, on the GPU, minus face detection and file I/O: the
        reference's LipsyncPipeline.__call__ itself (whisper features of the speech, its affine warp of every
        source frame, every window's denoising, its restore_video paste into the frames; the insightface
        detector answers with FaceAlign's three points, read_video/read_audio return arrays, write_video keeps
        the frames, the ffmpeg mux is skipped) vs the pack's latentsync_crops (fast path) + paste_generated (the
        node path's CPU paste) on the same FaceTrack (FaceAlign's output: its detector is not timed either), the
        same speech (--whole-seconds), the same weights. Frames/s = each side's own output frames / its wall
        time. Each side first runs once, untimed, on --whole-warm-seconds of the speech (models loaded and their
        first-call costs paid, as a server's second request), then --whole-repeats timed runs: the median run's
        frames/s is the figure, all runs are listed."""
        from digital_human.engines.latentsync.random_release import stand_in_mask
        from digital_human.talking_head.driver import paste_generated
        from digital_human.talking_head.latentsync.crops import latentsync_crops
        from digital_human.talking_head.latentsync.geometry import three_points
        from digital_human.vision.faces import FaceTrack

        work = crops_networks()
        track = FaceTrack.load_npz(args.track)
        speech = np.load(args.speech).astype(np.float32)
        n = int(args.whole_seconds * 16000)
        wave = np.tile(speech, -(-n // len(speech)))[:n]
        out: dict = {"seconds": args.whole_seconds, "source_frames": len(track),
                     "frame_size": list(track.frames.shape[1:3]),
                     "graphs": os.environ.get("DIGITAL_HUMAN_LATENTSYNC_GRAPHS", "") == "1",
                     "fused_qkv": os.environ.get("DIGITAL_HUMAN_LATENTSYNC_FUSED_QKV", "") == "1",
                     "max_autotune_gemm": os.environ.get("TORCHINDUCTOR_MAX_AUTOTUNE_GEMM", "") == "1",
                     "autotune_gemm": os.environ.get("DIGITAL_HUMAN_LATENTSYNC_AUTOTUNE_GEMM", "") == "1"}
        rep["whole"] = out
        # --- the pack: a warm-up on a short clip (the first call's one-off costs: the transformers import of the
        # mel filters, whisper's first kernels), then --whole-repeats timed runs; the median is the figure
        def pack_run(speech: np.ndarray) -> dict:
            _sync()
            _peak_reset()
            t = time.perf_counter()
            gen = latentsync_crops(track, speech, 16000, 25.0, loop_mode="ping-pong", streaming=True,
                                   models_root=work, steps=args.steps, compile=True)
            result = paste_generated(gen)
            _sync()
            wall = time.perf_counter() - t
            return {"frames": len(result.frames), "wall_s": wall, "fps": len(result.frames) / wall,
                    "peak_gib": _peak_gib(), "timings": {k: round(v, 3) for k, v in result.timings.items()}}

        warm = wave[:int(args.whole_warm_seconds * 16000)]
        if not args.whole_reference_only:
            if len(warm):
                out["pack_warm_s"] = pack_run(warm)["wall_s"]
            runs = [pack_run(wave) for _ in range(max(1, args.whole_repeats))]
            out["pack"] = dict(median_run(runs), runs=[{k: r[k] for k in ("wall_s", "fps")} for r in runs])
            save()
        if args.whole_pack_only:
            return
        # --- the reference
        reference_modules(("matplotlib", "matplotlib.pyplot", "imageio"))
        import cv2
        from types import SimpleNamespace

        from diffusers import DDIMScheduler

        import latentsync.pipelines.lipsync_pipeline as lp
        from latentsync.models.unet import UNet3DConditionModel
        from latentsync.utils.affine_transform import AlignRestore
        from latentsync.utils.image_processor import ImageProcessor
        from latentsync.whisper.audio2feature import Audio2Feature

        ref_unet = UNet3DConditionModel.from_config(model_cfg)
        ref_unet.load_state_dict({k: v.float() for k, v in unet.state_dict().items()}, strict=True)
        ref_unet = ref_unet.to(dev, dt).eval()
        vae.config.scaling_factor, vae.config.shift_factor = 0.18215, 0  # scripts/inference.py sets these
        encoder = Audio2Feature(model_path=str(work / "whisper_full.pt"), device=str(dev), num_frames=16,
                                audio_feat_length=[2, 2])
        # transcribe() takes the array as a file: audio2feat is answered with the run's speech (reference_run)
        sched = DDIMScheduler.from_pretrained(str(args.ref / "configs"))
        pipe = lp.LipsyncPipeline(vae=vae, audio_encoder=encoder, unet=ref_unet, scheduler=sched).to(dev)
        points = np.stack([three_points(track.landmarks[r]) for r in range(len(track))])
        idx_left, idx_right, idx_nose = [43, 48, 49, 51, 50], [101, 102, 103, 104, 105], [74, 77, 83, 86]

        class Detector:  # insightface's stand-in: FaceAlign's three points at the 2d106 indices it averages
            def __init__(self):
                self.i = 0

            def __call__(self, image):
                lmk = np.zeros((106, 2))
                p = points[self.i % len(points)]
                lmk[idx_left], lmk[idx_right], lmk[idx_nose] = p[0], p[1], p[2]
                self.i += 1
                return (0, 0, image.shape[1], image.shape[0]), lmk

        class Processor(ImageProcessor):  # the reference's own, with the detector above
            def __init__(self, resolution, device="cpu", mask_image=None):
                super().__init__(resolution, "cpu", mask_image)
                # __call__ asks for "cuda" (FP16, AlignRestore's default); the CPU smoke run keeps FP32 on the CPU
                self.restorer = AlignRestore(resolution=resolution, device=str(dev),
                                             dtype=torch.float32 if args.smoke else torch.float16)
                self.face_detector = Detector()

        mask_png = work / "mask_ref.png"
        cv2.imwrite(str(mask_png), cv2.cvtColor(stand_in_mask(), cv2.COLOR_RGB2BGR))
        captured: dict = {}
        lp.ImageProcessor = Processor
        lp.check_ffmpeg_installed = lambda: None
        lp.read_video = lambda path, use_decord=False: track.frames.copy()
        lp.write_video = lambda path, video, fps: captured.__setitem__("frames", len(video))
        lp.sf = SimpleNamespace(write=lambda *a, **k: None)
        lp.subprocess = SimpleNamespace(run=lambda *a, **k: None)
        tmp = Path(tempfile.mkdtemp(prefix="ls_ref_"))

        def reference_run(speech: np.ndarray) -> dict:
            lp.read_audio = lambda path: torch.from_numpy(speech)
            encoder.audio2feat = lambda path: encoder._audio2feat(speech)
            _sync()
            _peak_reset()
            t = time.perf_counter()
            pipe(video_path="video.mp4", audio_path="audio.wav", video_out_path=str(tmp / "out.mp4"), num_frames=16,
                 video_fps=25, audio_sample_rate=16000, height=res, width=res, num_inference_steps=args.steps,
                 guidance_scale=1.5, weight_dtype=dt, mask_image_path=str(mask_png), temp_dir=str(tmp / "temp"),
                 generator=torch.Generator(device=dev).manual_seed(1247))
            _sync()
            wall = time.perf_counter() - t
            return {"frames": captured["frames"], "wall_s": wall, "fps": captured["frames"] / wall,
                    "peak_gib": _peak_gib()}

        if len(warm):
            out["reference_warm_s"] = reference_run(warm)["wall_s"]
        runs = [reference_run(wave) for _ in range(max(1, args.whole_repeats))]
        out["reference"] = dict(median_run(runs), runs=[{k: r[k] for k in ("wall_s", "fps")} for r in runs])
        if "pack" in out:  # same process: the ratio is this run's
            out["pack_speedup"] = out["pack"]["fps"] / out["reference"]["fps"]
            out["pack_speedup_runs"] = sorted(p["fps"] / r["fps"] for p, r in zip(out["pack"]["runs"],
                                                                                   out["reference"]["runs"]))
        del pipe, ref_unet
        torch.cuda.empty_cache() if torch.cuda.is_available() else None

    @section("memory")
    def _memory():
        from digital_human.talking_head.latentsync.crops import latentsync_crops
        from digital_human.vision.faces import FaceTrack

        work = crops_networks()
        track = FaceTrack.load_npz(args.track)
        speech = np.load(args.speech).astype(np.float32)
        fast = args.memory_path == "fast"
        rows = {}
        for seconds in (float(s) for s in args.memory_seconds.split(",")):
            n = int(seconds * 16000)
            wave = np.tile(speech, -(-n // len(speech)))[:n]
            _sync()
            _peak_reset()
            t = time.perf_counter()
            gen = latentsync_crops(track, wave, 16000, 25.0, loop_mode="ping-pong", streaming=True,
                                   models_root=work, steps=args.memory_steps, compile=fast)
            frames = 0
            for start in range(0, len(gen), 64):
                crops, _ = gen.chunk(start, min(start + 64, len(gen)))
                frames += len(crops)
            _sync()
            import resource

            rows[f"{seconds:g}s"] = {"frames": frames, "peak_gib": _peak_gib(), "wall_s": time.perf_counter() - t,
                                     # the process's peak resident memory so far (Linux: KiB); run one length per
                                     # process to read it per length
                                     "host_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                                     "timings": {k: round(v, 2) for k, v in gen.timings.items()}}
            rep["memory"] = dict(rows, steps=args.memory_steps, fast_path=fast)
            save()

    @section("graph")
    def _graph():
        """The fast path's UNet step alone, called vs replayed from a CUDA graph by FastPath itself (graphs=True:
        captured at the next call), and a whole window with the graphs vs the fast path's first window (same
        draws)."""
        pipe = fast_pipe["exact"]
        fast = pipe.fast

        def step():
            return fast("step", x_step, t_step, a_step, emb_step)

        rep["fast_step_ms"] = timed_ms(step, warm=2)
        with torch.no_grad():
            plain = step()[0].clone()
        fast.graphs = True  # (no effect on the CPU smoke run: graphs are CUDA's)
        try:
            rep["fast_step_graph_ms"] = timed_ms(step, warm=2)
            with torch.no_grad():
                rep["fast_step_graph_max_abs_vs_compiled"] = float((step()[0].float() - plain.float()).abs().max())
            rep["fast_step_graph_note"] = fast.graph_note
            runs, first_out = [], None
            for r in range(max(1, args.graph_repeats)):
                times, o = run_pack(pipe, args.windows if args.graph_repeats else 1)
                runs.append(times)
                first_out = o if r == 0 else first_out
            rep["fast_graph_window_s"] = runs
            rep["fast_graph_fps_per_run"] = [fps(t) for t in runs]
            rep["fast_graph_fps"] = statistics.median(rep["fast_graph_fps_per_run"])
            if "reference_fps" in rep:
                rep["fast_graph_speedup"] = rep["fast_graph_fps"] / rep["reference_fps"]
            if "fast" in outs:
                rep["fast_graph_vs_fast"] = _diff(first_out, outs["fast"][:len(first_out)])
            if "reference" in outs:
                rep["fast_graph_vs_reference"] = _diff(first_out, outs["reference"][:len(first_out)])
        finally:
            fast.graphs = False
            fast.replays.clear()

    @section("deepcache")
    def _deepcache():
        for interval in (int(i) for i in args.deepcache.split(",")):
            pipe = LatentSyncPipeline(net, steps=args.steps, cache_interval=interval, compile=True)
            t = time.perf_counter()
            run_pack(pipe, 1)
            rep[f"deepcache_{interval}_first_window_s"] = time.perf_counter() - t
            times, o = run_pack(pipe, args.windows)
            rep[f"deepcache_{interval}_window_s"] = times
            rep[f"deepcache_{interval}_fps"] = fps(times)
            if "reference_fps" in rep:
                rep[f"deepcache_{interval}_speedup"] = rep[f"deepcache_{interval}_fps"] / rep["reference_fps"]
            if "fast" in outs:
                rep[f"deepcache_{interval}_vs_exact"] = _diff(o, outs["fast"])
            save()
        rep["fast_compile_s_all"] = dict(fast_pipe["exact"].fast.seconds)

    @section("variants")
    def _variants():
        """The compiled UNet step recompiled with another SDPA backend tried first (--variants), timed alone
        against the fast path's, and its output's largest difference (last: it resets dynamo's caches)."""
        from digital_human.engines.latentsync.pipeline import FastPath

        base = fast_pipe["exact"].fast

        def call(fp):
            return lambda: fp("step", x_step, t_step, a_step, emb_step)

        with torch.no_grad():
            base_out = call(base)()[0].float()
        out = {"fast_step_ms": timed_ms(call(base))}
        rep["variants"] = out
        for first in [v for v in args.variants.split(",") if v]:
            torch._dynamo.reset()
            # "short": the motion modules' temporal attention through the short-sequence kernel (FastPath's
            # short_attention); any other name: that SDPA backend tried first
            fp = FastPath(net, 1, short_attention=True) if first == "short" else FastPath(net, 1, sdpa_first=first)
            if args.smoke:
                fp.compiled = dict(fp.eager)
            t = time.perf_counter()
            with torch.no_grad():
                o = call(fp)()[0].float()
            row = {"compile_s": time.perf_counter() - t, "step_ms": timed_ms(call(fp)),
                   "max_abs_vs_fast_step": float((o - base_out).abs().max()),
                   "scale": float(base_out.abs().max()), "failed": fp.failed}
            out["short_attention" if first == "short" else f"sdpa_{first}_first"] = row
            save()
            if args.variant_repeats:  # whole windows with this variant (its encoder/decoder compile first)
                pipe = fast_pipe["exact"]
                pipe.fast, kept = fp, pipe.fast
                try:
                    run_pack(pipe, 1)
                    runs, o = [], None
                    for r in range(args.variant_repeats):
                        times, got = run_pack(pipe, args.windows)
                        runs.append(times)
                        o = got if r == 0 else o
                    row["window_s"] = runs
                    row["fps_per_run"] = [fps(t) for t in runs]
                    row["fps"] = statistics.median(row["fps_per_run"])
                    if "reference_fps" in rep:
                        row["speedup"] = row["fps"] / rep["reference_fps"]
                    if "fast" in outs:
                        row["vs_fast"] = _diff(o, outs["fast"])
                    if "reference" in outs:
                        row["vs_reference"] = _diff(o, outs["reference"])
                finally:
                    pipe.fast = kept
            net.unet.set_short_attention(False)  # the switch is the UNet's: the next variant runs without it
            save()

    del _levers, _attn, _profile, _variants, _whole, _reference, _eager, _fp32, _fast, _graph, _deepcache, _memory
    rep["total_s"] = time.perf_counter() - T0
    save()


if __name__ == "__main__":
    main()
