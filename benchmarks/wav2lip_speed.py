"""Wav2Lip speed: the generator's batched frames/s per setting, and speech + a talking video -> MP4 (headless path).

1. Network (`--network`): frames/s of the generator at batch sizes `--batches`, per setting, against the eager FP32
   module with its BatchNorms (the reference's computation, same weights) measured in the same run:
   fp32 (BatchNorms folded, channels-last), fp16 / bf16 (the same, half precision), fp16:graphs (one CUDA graph
   per batch size, replayed), fp16:compile (torch.compile, its compile time reported). Max difference of each
   setting's outputs from eager FP32's (x 255, uint8 levels).
2. Video (`--face V --speech S`): what `digital-human animate --model wav2lip` (headless render) does after its
   input checks, with the same functions (decode_audio, cli._faces_from_file, generate_crops(streaming=True),
   render_talking_video): cold = first request in this process (model load, face models, first calls), then
   warm runs with the models loaded: "first request" (the video's face track forgotten) and "repeat request"
   (the same video again: its track kept, as MuseTalk's figure). Wall time from the speech file to the MP4.

  python benchmarks/wav2lip_speed.py --checkpoint W.pth --network --face talk_512.mp4 --speech speech_10s.wav \\
      --out benchmarks/results/wav2lip_speed_cpu.json
Inputs as RESULTS.md's MuseTalk runs: ffmpeg -t 11 -i video/talk_en_male_01a.mp4 -vf fps=25,scale=512:512:flags=
bicubic -an -c:v libx264 -crf 18 -pix_fmt yuv420p talk_512.mp4; ffmpeg -i audio/spk_en_male_01.wav -t 10.21 -ac 1
-ar 16000 speech_10s.wav. Without --checkpoint a seeded random-weight checkpoint is written (speed does not
depend on the weights).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

T_PROCESS = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402

import_pack()


def _sync(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def network(ckpt: Path, device: str, settings: list[str], batches: list[int], seconds: float) -> dict:
    import torch

    from digital_human.engines.wav2lip.networks import inference_generator, load_generator

    out: dict = {}
    gen = torch.Generator().manual_seed(0)
    base = load_generator(ckpt).to(device)
    for b in batches:
        mel = (torch.randn(b, 1, 80, 16, generator=gen) * 2).to(device)
        faces = torch.rand(b, 6, 96, 96, generator=gen).to(device)
        with torch.inference_mode():
            ref = base(mel, faces).float()
        row = {}
        for setting in ["eager_fp32"] + settings:
            prec, _, mode = setting.partition(":")
            t_setup = time.perf_counter()
            if setting == "eager_fp32":
                net, dtype = base, torch.float32
            else:
                dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[prec]
                net = inference_generator(ckpt, device, prec)
            x = faces.to(dtype).contiguous(memory_format=torch.channels_last) if setting != "eager_fp32" else faces
            m = mel.to(dtype)
            call = lambda: net(m, x)  # noqa: E731
            if mode == "compile":
                net = torch.compile(net)
                call = lambda: net(m, x)  # noqa: E731
            with torch.inference_mode():
                y = call()
                if mode == "graphs":
                    graph = torch.cuda.CUDAGraph()
                    s = torch.cuda.Stream()
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        for _ in range(2):
                            net(m, x)
                    torch.cuda.current_stream().wait_stream(s)
                    with torch.cuda.graph(graph):
                        y = net(m, x)
                    call = lambda: (graph.replay(), y)[1]  # noqa: E731
                y = call()
                _sync(torch, device)
                setup = time.perf_counter() - t_setup
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < seconds or n < 2:
                    y = call()
                    n += 1
                    if device == "cuda" and n % 10 == 0:
                        _sync(torch, device)
                _sync(torch, device)
                dt = time.perf_counter() - t0
            diff = float(((y.float() - ref).abs().max() * 255).item())
            row[setting] = {"frames_per_s": b * n / dt, "setup_s": setup, "max_diff_uint8_levels": diff}
            print(f"batch {b} {setting}: {b * n / dt:,.0f} frames/s (setup {setup:.1f} s, diff {diff:.3f})",
                  flush=True)
        for setting, r in row.items():
            r["vs_eager_fp32"] = r["frames_per_s"] / row["eager_fp32"]["frames_per_s"]
        out[f"batch_{b}"] = row
    return out


def video_once(face: Path, speech: Path, out: Path, precision: str, preset: str | None = None) -> dict:
    from digital_human.audio import decode_audio
    from digital_human.cli import HEADLESS_MAX_SPEECH_SECONDS, StageTimer, _faces_from_file, _seconds
    from digital_human.talking_head.registry import generate_crops
    from digital_human.talking_head.render_video import render_talking_video

    import resource

    import torch

    from digital_human.media import frame_source

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    timer = StageTimer()
    ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    c0 = time.process_time()  # CPU seconds of every thread of this process: what the run needed of the cores
    t0 = time.perf_counter()
    wave, rate = timer.run("decode_audio", decode_audio, speech)
    faces, fps, _ = _faces_from_file(timer, face, None, "auto", 60.0, None, _seconds(wave, rate), 0,
                                     model="wav2lip")
    gen = timer.run("talking_head_setup", generate_crops, faces, wave, rate, "wav2lip", fps, backend="auto",
                    precision=precision, streaming=True, max_audio_seconds=HEADLESS_MAX_SPEECH_SECONDS)
    result = timer.run("video", render_talking_video, gen, wave, rate, out, smooth_strength=0.5,
                       **({"preset": preset} if preset else {}))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    faces.frames.close() if hasattr(faces.frames, "close") else None  # its decoders end: their CPU time counts
    ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = (ch1.ru_utime + ch1.ru_stime) - (ch0.ru_utime + ch0.ru_stime)
    return {"wall_s": wall, "process_cpu_s": cpu, "children_cpu_s": children, "total_cpu_s": cpu + children,
            "frames": result.mux.frames_written, "audio_s": np.asarray(wave).shape[-1] / rate,
            "peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None,
            # what stays allocated after the request: growth across repeat requests is a leak, not a peak
            "allocated_after_mb": round(torch.cuda.memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None,
            "kept_frames_mb": round(getattr(frame_source, "kept_frames_bytes", lambda: 0)() / 2**20, 1),
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "stages": {k: round(v, 4) for k, v in timer.seconds.items()},
            "model_timings": {k: round(v, 4) for k, v in gen.timings.items()}, "backend": gen.backend}


def x264_presets(face: Path, speech: Path, presets: list[str], frames: int = 256) -> dict:
    """The encoder alone: `frames` frames of `face` (decoded once, converted to yuv420p as the GPU path does)
    and the speech -> MP4 through mux_video (FrameStream, chunks of 32, as render_talking_video) per x264
    preset, 3 runs each: wall time, the encoder's CPU seconds, file size, and PSNR (Y) of the MP4's frames
    against the frames given (decoded with the pack's reader)."""
    import resource

    import torch

    from digital_human.audio import decode_audio
    from digital_human.media.ffmpeg_tools import base_args
    from digital_human.media.frame_source import VideoFrames
    from digital_human.media.mux import FrameStream, mux_video
    from digital_human.media.yuv import rgb_to_yuv420p

    src = VideoFrames(face, max_frames=frames)
    rgb = np.asarray(src[:])
    src.close()
    n, h, w = rgb.shape[:3]
    yuv = rgb_to_yuv420p(torch.from_numpy(rgb)).numpy()
    wave, rate = decode_audio(speech)
    out: dict = {"frames": n, "size": [w, h]}
    with tempfile.TemporaryDirectory() as tmp:
        for setting in presets:  # "preset" or "preset@crf"
            preset, _, crf = setting.partition("@")
            runs = []
            for _ in range(3):
                path = Path(tmp) / f"{preset}_{crf or 18}.mp4"
                ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                rep = mux_video(FrameStream(count=n, width=w, height=h, pix_fmt="yuv420p",
                                            chunks=(yuv[i:i + 32] for i in range(0, n, 32))),
                                wave, rate, 25.0, path, preset=preset, crf=int(crf) if crf else None)
                wall = time.perf_counter() - t0
                ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                runs.append({"wall_s": round(wall, 4), "encode_s": round(rep.encode_seconds, 4),
                             "children_cpu_s": round((ch1.ru_utime + ch1.ru_stime) - (ch0.ru_utime + ch0.ru_stime), 3)})
            # the MP4's own yuv420p planes against the ones given (the encoder's loss alone)
            raw = subprocess.run([*base_args(), "-loglevel", "error", "-i", str(path), "-f", "rawvideo",
                                  "-pix_fmt", "yuv420p", "pipe:1"], capture_output=True, check=True).stdout
            dec = np.frombuffer(raw, np.uint8).reshape(yuv.shape).astype(np.float32)
            y = h * w
            mse_y = float(np.mean((dec[:, :y] - yuv[:, :y]) ** 2))
            mse_all = float(np.mean((dec - yuv) ** 2))
            out[setting] = {"runs": runs, "median_wall_s": statistics.median(r["wall_s"] for r in runs),
                           "median_encoder_cpu_s": statistics.median(r["children_cpu_s"] for r in runs),
                           "bytes": path.stat().st_size, "psnr_y_db": round(10 * np.log10(255.0 ** 2 / mse_y), 3),
                           "psnr_yuv_db": round(10 * np.log10(255.0 ** 2 / mse_all), 3)}
            print("x264", setting, json.dumps(out[setting]), flush=True)
    return out


def _forget() -> None:
    """A first request: the video's track, kept 96x96 inputs and paste masks, paste region and smoothing masks
    forgotten (the models stay loaded)."""
    from digital_human.talking_head.wav2lip.crops import clear_avatar_caches

    clear_avatar_caches()


def video(face: Path, speech: Path, precision: str, repeats: int,
          kinds: tuple[str, ...] = ("first_request", "repeat_request"), first_label: str = "cold",
          profile: bool = False, preset: str | None = None) -> dict:
    """first_label: "cold" for the process's first request; a later precision's first call (its model loaded
    then, the face models and the video's kept data already there) is "first_call"."""
    res: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "v.mp4"
        t = time.perf_counter()
        res[first_label] = video_once(face, speech, out, precision, (preset or "").split(",")[0] or None)
        res[first_label]["process_s"] = time.perf_counter() - T_PROCESS
        print(first_label, precision, json.dumps(res[first_label]), flush=True)
        presets = (preset or "").split(",")
        for kind in kinds:
            # kind[:preset] rows: the first preset's under the kind's name, each other's under kind_<preset>
            for p_i, p_name in enumerate(presets if kind == "repeat_request" else presets[:1]):
                runs, label = [], kind if p_i == 0 else f"{kind}_{p_name}"
                for _ in range(repeats):
                    if kind == "first_request":
                        _forget()
                    runs.append(video_once(face, speech, out, precision, p_name or None))
                    print(label, precision, p_name or "default", json.dumps(runs[-1]), flush=True)
                if profile and kind == "repeat_request":  # one more repeat request, sampled (not in the median)
                    from _stack_sampler import StackSampler

                    with StackSampler() as sampler:
                        sampled = video_once(face, speech, out, precision, p_name or None)
                    res[f"profile_{label}"] = {"run": sampled, **sampler.report()}
                    print("profile", label, json.dumps(res[f"profile_{label}"]), flush=True)
                walls = [r["wall_s"] for r in runs]
                res[label] = {"preset": p_name or "default (render_talking_video's)",
                              "median_wall_s": statistics.median(walls),
                              "walls_s": walls, "cpu_s": [round(r["total_cpu_s"], 3) for r in runs],
                              "last": runs[-1], "realtime_factor": runs[-1]["audio_s"] / statistics.median(walls)}
        del t
    return res


def _sample_load(report: dict) -> None:
    """The 1-minute load average every 5 s while the run lasts (other jobs may share the machine)."""
    import threading

    samples = report.setdefault("load_average_1min_samples", [])

    def work() -> None:
        while True:
            samples.append(round(os.getloadavg()[0], 2))
            time.sleep(5.0)

    threading.Thread(target=work, daemon=True).start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=None)
    ap.add_argument("--device", default=None, help="cuda | cpu (default: cuda when there is one)")
    ap.add_argument("--network", action="store_true")
    ap.add_argument("--settings", default=None, help="comma list (default: CPU fp32,bf16; CUDA fp32,fp16,bf16,"
                                                      "fp16:graphs)")
    ap.add_argument("--batches", default=None, help="comma list (default: CPU 16; CUDA 128,512)")
    ap.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    ap.add_argument("--face", type=Path)
    ap.add_argument("--speech", type=Path)
    ap.add_argument("--precision", default="auto",
                    help="comma list, each a video row (e.g. auto,fp32); fp32 on CUDA runs without CUDA graphs "
                         "(the FP32 row: BatchNorms folded, eager calls; cuDNN's TF32 for convolutions left at torch's "
                         "default, on)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--kinds", default="first_request,repeat_request", help="warm runs after the cold one")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--preset", default=None,
                    help="x264 preset of the MP4 (default: render_talking_video's); a comma list: the repeat "
                         "requests once per preset (an empty item: the default)")
    ap.add_argument("--x264", default=None,
                    help="comma list of x264 presets (preset or preset@crf): encode the first 256 frames of --face "
                         "(decoded once, YUV) + the speech with mux_video per preset, 3 times each (the encoder "
                         "alone: wall, ffmpeg CPU, PSNR)")
    ap.add_argument("--profile", action="store_true", help="after the repeat requests, one more, with every thread's "
                                                            "stack sampled (benchmarks/_stack_sampler.py)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    report: dict = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "device": device, "machine": platform.node(), "cpu_count": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None}
    if hasattr(os, "getloadavg"):
        report["load_average_at_start"] = os.getloadavg()
        _sample_load(report)
    if hasattr(os, "sched_getaffinity"):
        report["cpu_affinity"] = sorted(os.sched_getaffinity(0))
    ckpt = args.checkpoint
    if ckpt is None and (args.network or any(args.precision.split(","))):
        from digital_human.engines.wav2lip.random_release import write_checkpoint
        from digital_human.paths import models_root

        # a models root of its own: the random checkpoint beside links to the real root's folders (face models)
        real, root = Path(models_root()), Path(tempfile.mkdtemp())
        for entry in (real.iterdir() if real.is_dir() else ()):
            if entry.name != "wav2lip":
                (root / entry.name).symlink_to(entry.resolve())
        ckpt = write_checkpoint(root / "wav2lip" / "wav2lip.pth", 0)
        os.environ["DIGITAL_HUMAN_MODELS"] = str(root)
    try:
        if args.x264 and args.face and args.speech:
            report["x264"] = x264_presets(args.face, args.speech, args.x264.split(","))
        if args.network:
            settings = (args.settings or ("fp32,fp16,bf16,fp16:graphs" if device == "cuda" else "fp32,bf16")).split(",")
            batches = [int(b) for b in (args.batches or ("128,512" if device == "cuda" else "16")).split(",")]
            report["network"] = network(ckpt, device, settings, batches, args.seconds)
        if args.face and args.speech:
            kinds = tuple(k for k in args.kinds.split(",") if k)
            for i, prec in enumerate(p for p in args.precision.split(",") if p):
                if prec == "fp32" and device == "cuda":
                    os.environ["DIGITAL_HUMAN_WAV2LIP_GRAPHS"] = "0"
                row = video(args.face, args.speech, prec, args.repeats, kinds, "cold" if i == 0 else "first_call",
                            args.profile, args.preset)
                report["video" if i == 0 else f"video_{prec}"] = row
                report.setdefault("video_precisions", []).append(prec)
                os.environ.pop("DIGITAL_HUMAN_WAV2LIP_GRAPHS", None)
    finally:
        if hasattr(os, "getloadavg"):
            report["load_average_at_end"] = os.getloadavg()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
