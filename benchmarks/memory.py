"""Peak memory of `align`, `animate` and `run` on large and long inputs (issue: bounded memory).

Every row runs the CLI in a fresh child process (model load included) and reports that child's peak
resident memory (ru_maxrss of the largest process it waited for: the pack's Python process; the
ffmpeg encoder and decoders are separate processes and are reported as their own maximum when they
are larger) and, on a CUDA machine, the child's peak GPU memory (torch's allocator peak, the JSON
report's `gpu_peak_mb`).

Inputs are made locally from the shared sample media (never committed): a 4000x3000 photo upscaled
from a shared portrait; 1080x1920 talking videos of 10 s, 60 s and 300 s (a shared talking clip
upscaled and looped); speech of 10 s, 60 s and 10 min (a shared speech clip looped).

  python benchmarks/memory.py [--rows align_photo512 animate_speech60 ...] [--json benchmarks/out/memory.json]
  python benchmarks/memory.py --list
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402

DATA = Path(os.environ.get("DIGITAL_HUMAN_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
INPUTS = Path(os.environ.get("DIGITAL_HUMAN_MEMORY_INPUTS", Path(__file__).resolve().parent / "out" / "memory_inputs"))
SPEECH_CLIP = DATA / "audio" / "spk_en_male_01.wav"
TALK_CLIP = DATA / "video" / "talk_en_male_01a.mp4"
PORTRAIT = DATA / "image" / "face_02_male.png"
TEXT_10S = ("Good morning everyone. Today I want to show you how a digital twin can read any text aloud, "
            "in my own voice, with my own face.")


def _ffmpeg() -> str:
    import_pack()
    from digital_human.media.ffmpeg_tools import ffmpeg_exe

    return ffmpeg_exe()


def make_photo(path: Path, size: tuple[int, int] = (4000, 3000)) -> Path:
    """A large photo: the shared portrait centred on a blurred, upscaled copy of itself."""
    if path.is_file():
        return path
    from PIL import Image, ImageFilter

    with Image.open(PORTRAIT) as img:
        face = img.convert("RGB")
    side = min(size)
    canvas = face.resize(size, Image.Resampling.BICUBIC).filter(ImageFilter.GaussianBlur(40))
    canvas.paste(face.resize((side, side), Image.Resampling.LANCZOS), ((size[0] - side) // 2, (size[1] - side) // 2))
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(path, quality=92)
    return path


def _looped(source: Path, path: Path, seconds: float, output_args: list[str]) -> Path:
    """`source` looped to `seconds` and re-encoded with `output_args` (kept if already made)."""
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([_ffmpeg(), "-hide_banner", "-loglevel", "error", "-y", "-stream_loop", "-1", "-i", str(source),
                    "-t", f"{seconds}", *output_args, str(path)], check=True)
    return path


def make_video(path: Path, seconds: float) -> Path:
    """A 1080x1920 H.264 talking video of `seconds` (the shared clip upscaled and looped)."""
    return _looped(TALK_CLIP, path, seconds, ["-vf", "scale=1080:1080:flags=bicubic,pad=1080:1920:0:420,setsar=1",
                                              "-c:v", "libx264", "-preset", "ultrafast", "-crf", "23", "-c:a", "aac"])


def make_speech(path: Path, seconds: float) -> Path:
    return _looped(SPEECH_CLIP, path, seconds, ["-ac", "1"])


def rows() -> dict[str, callable]:
    """Row name -> function returning the CLI arguments (after `python -m digital_human`)."""
    i = INPUTS
    photo4k = lambda: make_photo(i / "photo_4000x3000.jpg")  # noqa: E731
    video = lambda s: make_video(i / f"talk_1080x1920_{s}s.mp4", s)  # noqa: E731
    speech = lambda s: make_speech(i / f"speech_{s}s.wav", s)  # noqa: E731
    out = lambda name, ext: str(i / "outputs" / f"{name}.{ext}")  # noqa: E731

    def align(face, name, seconds=600):
        return lambda: ["align", "--face", str(face()), "--out", out(name, "npz"), "--max-seconds", str(seconds)]

    def animate(face, audio, name, seconds=600):
        return lambda: ["animate", "--face", str(face()), "--audio", str(audio()), "--out", out(name, "mp4"),
                        "--max-seconds", str(seconds)]

    def run(face, repeats, name):
        def args():
            text = i / f"text_{repeats}.txt"
            text.parent.mkdir(parents=True, exist_ok=True)
            text.write_text(" ".join([TEXT_10S] * repeats), encoding="utf-8")
            return ["run", "--voice", str(SPEECH_CLIP), "--face", str(face()), "--text-file", str(text),
                    "--out", out(name, "mp4")]
        return args

    return {
        "align_photo512": align(lambda: PORTRAIT, "align_photo512"),
        "align_photo4000": align(photo4k, "align_photo4000"),
        "align_video10": align(lambda: video(10), "align_video10"),
        "align_video60": align(lambda: video(60), "align_video60"),
        "align_video300": align(lambda: video(300), "align_video300"),
        "animate_photo512_speech10": animate(lambda: PORTRAIT, lambda: speech(10), "animate_photo512_speech10"),
        "animate_photo4000_speech10": animate(photo4k, lambda: speech(10), "animate_photo4000_speech10"),
        "animate_photo512_speech60": animate(lambda: PORTRAIT, lambda: speech(60), "animate_photo512_speech60"),
        "animate_photo512_speech600": animate(lambda: PORTRAIT, lambda: speech(600), "animate_photo512_speech600"),
        "animate_video10_speech10": animate(lambda: video(10), lambda: speech(10), "animate_video10_speech10"),
        "animate_video60_speech60": animate(lambda: video(60), lambda: speech(60), "animate_video60_speech60"),
        "animate_video300_speech60": animate(lambda: video(300), lambda: speech(60), "animate_video300_speech60"),
        "animate_video300_speech300": animate(lambda: video(300), lambda: speech(300), "animate_video300_speech300"),
        "run_photo512_text10": run(lambda: PORTRAIT, 1, "run_photo512_text10"),
        "run_photo512_text60": run(lambda: PORTRAIT, 6, "run_photo512_text60"),
        "run_photo512_text600": run(lambda: PORTRAIT, 60, "run_photo512_text600"),
    }


# the child: runs the CLI as a grandchild and reports the largest peak RSS among its descendants
_PROBE = ("import json, resource, subprocess, sys, time\n"
          "t = time.perf_counter()\n"
          "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
          "print(json.dumps({'rc': p.returncode, 'seconds': time.perf_counter() - t,\n"
          "  'peak_rss_mb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0,\n"
          "  'last_line': (p.stdout.strip().splitlines() or [''])[-1], 'stderr': p.stderr[-2000:]}))\n")


def measure(cli_args: list[str]) -> dict:
    """Run `python -m digital_human ARGS --json` in a fresh process; its peak RSS and its JSON report."""
    cmd = [sys.executable, "-c", _PROBE, sys.executable, "-m", "digital_human", *cli_args, "--json"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    try:
        out["report"] = json.loads(out.pop("last_line"))
    except ValueError:
        out["report"] = None
    if out["rc"] == 0:
        out.pop("stderr")
    return out


def main() -> int:
    table = rows()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", default=[r for r in table if not r.endswith(("300", "600"))])
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.list:
        print("\n".join(table))
        return 0
    results = {"machine": platform.platform(), "cpus": os.cpu_count(), "rows": {}}
    try:
        results["load_average"] = os.getloadavg()
    except OSError:
        pass
    for name in args.rows:
        cli_args = table[name]()
        t0 = time.perf_counter()
        row = measure(cli_args)
        report = row.get("report") or {}
        summary = {"peak_rss_mb": round(row["peak_rss_mb"]), "seconds": round(time.perf_counter() - t0, 1),
                   "ok": row["rc"] == 0, "gpu_peak_mb": report.get("gpu_peak_mb"),
                   "frames": report.get("frames"), "output_size": report.get("output_size")
                   or (report.get("reports") or {}).get("output_size")}
        if row["rc"] != 0:
            summary["error"] = row.get("stderr", "")[-600:]
        results["rows"][name] = summary
        print(f"{name:32s} peak RSS {summary['peak_rss_mb']:6d} MB  {summary['seconds']:7.1f} s  "
              f"{'ok' if summary['ok'] else 'FAILED'}  gpu {summary['gpu_peak_mb']}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["ok"] for r in results["rows"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
