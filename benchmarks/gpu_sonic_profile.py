"""Where a Sonic UNet call's time goes on an NVIDIA GPU, and what the levers give (one process, the seeded
random SVD-XT-shaped networks of gpu_sonic_e2e.py, one window's call: 3 guidance branches x 25 frames at 64x64
latents). Rows, each written to --out when measured (a row that fails is recorded and the next one runs; rows
whose estimated cost exceeds the time left of --budget are skipped and say so):
  micro        the call's building blocks alone: SDPA per backend at the UNet's attention shapes, the temporal
               (3,1,1) convolution as Conv3d (NCDHW / channels_last_3d) and as a (3,1) Conv2d on the same memory,
               3x3 convolutions and GroupNorm NCHW vs channels_last
  eager        one eager FP16 call: time and a torch.profiler kernel table (top kernels, CUDA time by group:
               conv, gemm, attention, norm, elementwise, copies, other; GPU busy vs wall)
  eager_cl     the same call with the UNet channels_last (engines/sonic/accelerate.channels_last)
  compiled     compile_regions (the product's fast path) in the layout given: time, kernel table, difference
  compiled_cl  compile_regions on the channels_last UNet
  region_*     one full-resolution region alone (a resnet, a transformer), default compile vs
               coordinate-descent tuning vs max-autotune (compile seconds recorded)
  vae          the temporal VAE decoder, 4 chunks of 8 frames a call: eager, channels_last, compiled
    python benchmarks/gpu_sonic_profile.py --out $OUT/sonic_profile.json [--size reduced --device cpu]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402

GROUPS = [  # first match wins; names as cuDNN / cuBLAS / CUTLASS / flash / inductor's Triton kernels spell them
    ("copies", r"^triton_poi_fused_(?:(?:clone|cat|copy|_to|permute|transpose|view|unsqueeze|expand|reshape)_?)+\d+$"),
    ("gemm", r"^triton_tem"),
    ("elementwise", r"^triton_poi"),
    ("norm", r"^triton_(red|per)"),
    ("copies", r"nchwToNhwc|nhwcToNchw|transpose|Memcpy|Memset|copy_|CatArray|_to_copy|permute"),
    ("attention", r"flash|fmha|attention|sdpa|softmax"),
    ("conv", r"conv|fprop|dgrad|implicit|wgrad|cudnn"),
    ("gemm", r"gemm|cublas|cutlass|matmul|_mm_|sm90_xmma|nvjet|addmm|bmm"),
    ("norm", r"norm|Moments|FusedParams|welford|reduce"),
    ("elementwise", r"elementwise|vectorized|unrolled|gelu|silu|add|mul"),
]


def group_of(name: str) -> str:
    for group, pattern in GROUPS:
        if re.search(pattern, name, re.IGNORECASE):
            return group
    return "other"


def sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev, repeat: int = 5) -> float:
    """Median of `repeat` calls after one warm-up call, seconds."""
    fn()
    sync(dev)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        times.append(time.perf_counter() - t0)
    times.sort()
    return round(times[len(times) // 2], 5)


def kernel_table(fn, dev, top: int = 25) -> dict:
    """One profiled call of fn (after a warm-up): the top kernels by device time and the device time by group.
    On the CPU (smoke runs) the CPU ops stand in for kernels."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync(dev)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        fn()
        sync(dev)
        wall = time.perf_counter() - t0
    want = torch.autograd.DeviceType.CUDA if dev.type == "cuda" else torch.autograd.DeviceType.CPU
    per_name: dict[str, list] = defaultdict(lambda: [0.0, 0])
    spans = []
    for e in prof.events():
        if e.device_type != want:
            continue
        if dev.type == "cpu" and e.cpu_parent is not None:  # top-level CPU ops only
            continue
        us = float(e.time_range.elapsed_us() if dev.type == "cuda" else e.cpu_time)  # a kernel: its own span
        per_name[e.name][0] += us
        per_name[e.name][1] += 1
        spans.append((e.time_range.start, e.time_range.end))
    groups: dict[str, float] = defaultdict(float)
    for name, (us, _n) in per_name.items():
        groups[group_of(name)] += us
    busy = sum(us for us, _n in per_name.values())
    rows = sorted(per_name.items(), key=lambda kv: -kv[1][0])[:top]
    span = (max(e for _s, e in spans) - min(s for s, _e in spans)) if spans else 0.0
    # kernel_ms (the kernels' summed time) near kernel_span_ms (first start to last end): the GPU never waits
    # for launches, so CUDA graphs cannot pay; a gap between them is launch-bound time
    return {"wall_ms": round(wall * 1e3, 2), "kernel_ms": round(busy / 1e3, 2), "kernel_span_ms": round(span / 1e3, 2),
            "kernels": int(sum(n for _us, n in per_name.values())),
            "groups_ms": {g: round(us / 1e3, 2) for g, us in sorted(groups.items(), key=lambda kv: -kv[1])},
            "top": [{"name": name[:160], "ms": round(us / 1e3, 3), "count": n, "group": group_of(name)}
                    for name, (us, n) in rows]}


def micro(dev, dt, reduced: bool) -> dict:
    """Each building block alone at the full-resolution level's shapes (and the deeper levels' for convs)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out: dict = {"sdpa": {}, "temporal_conv": {}, "conv3x3": {}, "group_norm": {}}
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dev, dt)

    s = 8 if reduced else 1
    shapes = {  # name: (batch, heads, queries, keys, head_dim)
        "spatial_self_64x64": (75, 5, 4096 // s, 4096 // s, 64),
        "spatial_self_32x32": (75, 10, 1024 // s, 1024 // s, 64),
        "temporal_self_64x64": (3 * 4096 // s, 5, 25, 25, 64),
        "spatial_cross_audio_64x64": (75, 5, 4096 // s, 32, 64),
        "temporal_cross_audio_64x64": (3, 5, 4096 * 25 // s, 32, 64),
    }
    backends = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    for name, (b, h, nq, nk, d) in shapes.items():
        q, k, v = rnd(b, h, nq, d), rnd(b, h, nk, d), rnd(b, h, nk, d)
        r = {}
        for bname, backend in backends.items():
            if bname == "math" and b * h * nq * nk > 2**31:
                continue  # the math backend's score matrix would not fit
            try:
                if backend is None:
                    r[bname] = timed(lambda: F.scaled_dot_product_attention(q, k, v), dev)
                else:
                    with sdpa_kernel([backend]):
                        r[bname] = timed(lambda: F.scaled_dot_product_attention(q, k, v), dev)
            except Exception as exc:  # a backend that does not take the shape
                r[bname] = f"unavailable: {type(exc).__name__}"
        if dev.type == "cuda":
            t = kernel_table(lambda: F.scaled_dot_product_attention(q, k, v), dev, top=3)
            r["default_kernel"] = t["top"][0]["name"] if t["top"] else ""
        out["sdpa"][name] = r
    levels = [(320, 64), (640, 32), (1280, 16)] if not reduced else [(32, 16), (64, 8)]
    for c, hw in levels:
        conv3 = torch.nn.Conv3d(c, c, (3, 1, 1), padding=(1, 0, 0)).to(dev, dt)
        frames = rnd(3 * 25, c, hw, hw)  # the UNet's (B*F, C, H, W)
        view = frames.reshape(3, 25, c, hw, hw).permute(0, 2, 1, 3, 4)  # as SpatioTemporalResBlock views it
        cl = frames.contiguous(memory_format=torch.channels_last).reshape(3, 25, c, hw, hw).permute(0, 2, 1, 3, 4)
        w2 = conv3.weight[..., 0].contiguous(memory_format=torch.channels_last)  # [C, C, 3, 1]
        r = {"conv3d_from_view": timed(lambda: conv3(view), dev),
             "conv3d_ncdhw_contiguous": timed(lambda: conv3(view.contiguous()), dev)}
        w3 = conv3.weight.data
        conv3.weight.data = w3.contiguous(memory_format=torch.channels_last_3d)
        r["conv3d_channels_last_3d"] = timed(lambda: conv3(cl), dev)
        conv3.weight.data = w3
        flat = cl.flatten(3)  # [B, C, F, H*W], channels_last memory
        r["conv2d_3x1_channels_last"] = timed(lambda: F.conv2d(flat, w2, conv3.bias, padding=(1, 0)), dev)
        ref = conv3(view).float()
        r["conv2d_3x1_max_abs"] = float((F.conv2d(flat, w2, conv3.bias, padding=(1, 0)).reshape(ref.shape).float()
                                         - ref).abs().max())
        out["temporal_conv"][f"{c}ch_{hw}"] = r
        conv = torch.nn.Conv2d(c, c, 3, padding=1).to(dev, dt)
        rc = {"nchw": timed(lambda: conv(frames), dev)}
        fcl = frames.contiguous(memory_format=torch.channels_last)
        conv.weight.data = conv.weight.data.contiguous(memory_format=torch.channels_last)
        rc["channels_last"] = timed(lambda: conv(fcl), dev)
        out["conv3x3"][f"{c}ch_{hw}"] = rc
        gn = torch.nn.GroupNorm(32, c).to(dev, dt)
        out["group_norm"][f"{c}ch_{hw}"] = {"nchw": timed(lambda: gn(frames), dev),
                                            "channels_last": timed(lambda: gn(fcl), dev),
                                            "5d_view": timed(lambda: gn(view), dev)}
    n = 2048 if reduced else 8192  # the matrix rate this GPU gives FP16 (the floor's yardstick)
    a, b = rnd(n, n), rnd(n, n)
    sec = timed(lambda: a @ b, dev)
    out["gemm"] = {f"square_{n}_tflops": round(2 * n**3 / sec / 1e12, 1)}
    rows_ = 307200 // (64 if reduced else 1)  # the full-resolution level's tokens (75 frames x 4096)
    for k, nn_ in ((320, 2560), (1280, 320), (320, 320)):
        x, w = rnd(rows_, k), rnd(nn_, k)
        sec = timed(lambda: F.linear(x, w), dev)
        out["gemm"][f"{rows_}x{k}x{nn_}_tflops"] = round(2 * rows_ * k * nn_ / sec / 1e12, 1)
    return out


def capture_inputs(unet, args, names):
    """The (args, kwargs) each named region receives in one call: a resnet's forward, or a transformer's
    sonic_transformer_forward (its arguments after the module)."""
    from digital_human.engines.sonic.networks import _transformer

    seen: dict = {}
    hooks, swapped = [], []
    for name in names:
        mod = unet.get_submodule(name)
        if hasattr(mod, "temporal_transformer_blocks"):
            prev = _transformer(mod)
            had = "sonic_forward" in mod.__dict__

            def spy(module, *a, _prev=prev, _name=name, **k):
                seen.setdefault(_name, (a, k))
                return _prev(module, *a, **k)
            mod.__dict__["sonic_forward"] = spy
            swapped.append((mod, prev, had))
        else:
            hooks.append(mod.register_forward_pre_hook(
                lambda m, a, k, name=name: seen.setdefault(name, (a, k)), with_kwargs=True))
    try:
        unet(*args)
    finally:
        for h in hooks:
            h.remove()
        for mod, prev, had in swapped:
            if had:
                mod.__dict__["sonic_forward"] = prev
            else:
                del mod.__dict__["sonic_forward"]
    return seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", default="full", choices=["full", "reduced"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--budget", type=float, default=400.0, help="seconds: rows that would overrun are skipped")
    parser.add_argument("--only", default="", help="rows to run, comma separated (default: all)")
    args = parser.parse_args()
    import_pack()
    from gpu_sonic_e2e import build, inputs, unet_inputs

    from digital_human.engines.sonic import accelerate

    t_start = time.perf_counter()
    dev = torch.device(args.device)
    reduced = args.size == "reduced"
    only = set(filter(None, args.only.split(",")))
    report: dict = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
                    "torch": torch.__version__, "rows": {}}
    rows = report["rows"]

    def save(note: str) -> None:
        report["wall_s"] = round(time.perf_counter() - t_start, 1)
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=2)
        brief = {k: v for k, v in rows.get(note, {}).items() if k not in ("top",)} if isinstance(rows.get(note), dict) else ""
        print(f"[{report['wall_s']:7.1f} s] {note}: {json.dumps(brief)[:1500]}", flush=True)

    def attempt(name: str, cost_s: float, fn) -> None:
        if only and name not in only:
            return
        left = args.budget - (time.perf_counter() - t_start)
        if cost_s > left:
            rows[name] = {"skipped": f"estimated {cost_s:.0f} s, {left:.0f} s of the budget left"}
            save(name)
            return
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as exc:  # recorded; the later rows still run
            import traceback

            traceback.print_exc()
            rows[name] = {"error": repr(exc)[:600]}
        if isinstance(rows.get(name), dict):
            rows[name]["row_s"] = round(time.perf_counter() - t0, 1)
        save(name)

    with torch.no_grad():
        nets = build(dev, reduced)
        unet = nets.unet
        framing, _wave = inputs(1.0, 64 if reduced else 512)
        x16 = unet_inputs(nets, framing, nets.dtype)
        report["build_s"] = round(time.perf_counter() - t_start, 1)
        cudnn = torch.backends.cudnn.flags(enabled=True, benchmark=True)  # as the product's fast path runs
        cudnn.__enter__()
        state: dict = {}

        attempt("micro", 30, lambda: rows.__setitem__("micro", micro(dev, nets.dtype, reduced)))

        def eager_row():
            state["ref"] = unet(*x16).float()
            rows["eager"] = {"call_s": timed(lambda: unet(*x16), dev), **kernel_table(lambda: unet(*x16), dev)}
        attempt("eager", 10, eager_row)

        def eager_cl_row():
            accelerate.channels_last(unet)
            try:
                out = unet(*x16).float()
                rows["eager_cl"] = {"call_s": timed(lambda: unet(*x16), dev),
                                    "max_abs_vs_eager": float((out - state["ref"]).abs().max()),
                                    **kernel_table(lambda: unet(*x16), dev)}
            finally:
                accelerate.channels_last(unet, False)
        attempt("eager_cl", 10, eager_cl_row)

        def compiled_row(name: str, layout: bool):
            def fn():
                accelerate.channels_last(unet, layout)
                if getattr(unet, "_sonic_compiled", False):  # a fresh compile for the other layout
                    torch._dynamo.reset()
                    unet._sonic_compiled = False
                t0 = time.perf_counter()
                accelerate.compile_regions(unet)
                out = unet(*x16).float()
                sync(dev)
                compile_s = time.perf_counter() - t0
                rows[name] = {"compile_s": round(compile_s, 1), "call_s": timed(lambda: unet(*x16), dev),
                              "max_abs_vs_eager": float((out - state["ref"]).abs().max()),
                              "scale": float(state["ref"].abs().max()), **kernel_table(lambda: unet(*x16), dev)}
                _, deep = unet(*x16, keep_deep=True)
                rows[name]["shallow_call_s"] = timed(lambda: unet(*x16, deep=deep), dev)
            return fn
        attempt("compiled_cl", 150, compiled_row("compiled_cl", True))
        attempt("compiled", 110, compiled_row("compiled", False))
        accelerate.channels_last(unet, False)

        def vae_row():
            vae = nets.vae
            g = torch.Generator().manual_seed(1)
            side = 64 if reduced else 512
            lat = torch.randn(32, 4, side // 8, side // 8, generator=g).to(dev, nets.dtype) / vae.config.scaling_factor
            ref = vae.decode(lat, num_frames=8).sample.float()
            r = {"eager_s": timed(lambda: vae.decode(lat, num_frames=8).sample, dev, repeat=3),
                 "eager_table": kernel_table(lambda: vae.decode(lat, num_frames=8).sample, dev, top=12)}
            accelerate.channels_last(vae)
            r["channels_last_s"] = timed(lambda: vae.decode(lat, num_frames=8).sample, dev, repeat=3)
            r["channels_last_max_abs"] = float((vae.decode(lat, num_frames=8).sample.float() - ref).abs().max())
            layout = r["channels_last_s"] < r["eager_s"]  # compile the faster layout only (one compile)
            accelerate.channels_last(vae, layout)
            t0 = time.perf_counter()
            accelerate.compile_decoder(vae)
            out = vae.decode(lat, num_frames=8).sample.float()
            sync(dev)
            r["compiled"] = {"channels_last": layout, "compile_s": round(time.perf_counter() - t0, 1),
                             "call_s": timed(lambda: vae.decode(lat, num_frames=8).sample, dev, repeat=3),
                             "max_abs": float((out - ref).abs().max()), "scale": float(ref.abs().max())}
            rows["vae"] = r
        attempt("vae", 80, vae_row)

        def region_row():
            import torch._inductor.config as ic

            names = ["down_blocks.0.resnets.0", "down_blocks.0.attentions.0"]
            accelerate.channels_last(unet, True)
            seen = capture_inputs(unet, x16, names)
            r = {}
            for name in names:
                mod = unet.get_submodule(name)
                a, k = seen[name]
                if name.endswith("resnets.0"):
                    fn = mod.forward  # the module's own forward (its compiled wrapper is _compiled_call_impl)
                else:
                    fn = lambda *a, mod=mod, **k: accelerate.sonic_transformer_forward(mod, *a, **k)  # noqa: E731
                rr = {"eager_s": timed(lambda: fn(*a, **k), dev)}
                for label, opts in (("default", {}), ("coordinate_descent", {"coordinate_descent_tuning": True}),
                                    ("max_autotune", {"max_autotune": True})):
                    left = args.budget - (time.perf_counter() - t_start)
                    if left < 60:
                        rr[label] = f"skipped: {left:.0f} s left"
                        continue
                    torch._dynamo.reset()
                    with ic.patch(opts):
                        compiled = torch.compile(fn, dynamic=False)
                        t0 = time.perf_counter()
                        compiled(*a, **k)
                        sync(dev)
                        rr[label] = {"compile_s": round(time.perf_counter() - t0, 1),
                                     "call_s": timed(lambda: compiled(*a, **k), dev)}
                r[name] = rr
            rows["region"] = r
        attempt("region", 80, region_row)
        accelerate.channels_last(unet, False)
        cudnn.__exit__(None, None, None)
    report["finished"] = True
    save("done")


if __name__ == "__main__":
    main()
