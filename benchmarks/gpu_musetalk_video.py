"""MuseTalk 1.5 on the headless path: a speech WAV lip-synced onto a talking video -> MP4, wall time per run.

Times what `digital-human animate --model musetalk` (headless render) does after its input checks, with the
same functions: the speech file decoded (audio.decode_audio), the face video decoded and aligned
(cli._faces_from_file: frames on demand, FaceAlign's tracker on the face models), MuseTalk's crops set up
(generate_crops(model="musetalk", streaming=True): networks from the cache, whisper windows) and made chunk by
chunk while they are pasted back, smoothed (strength 0.5, the CLI's default) and encoded into the MP4
(render_talking_video: paste-back, smoothing and YUV on the GPU, encoding overlapped). Wall time from the
speech file to the closed MP4, per stage too.

A setting is precision[:compile][:graphs|:nographs][:serial][:facepercall] (precision: fp16, the CUDA default,
bf16 or fp32, the baseline; compile: the DIGITAL_HUMAN_MUSETALK_COMPILE=1 path, torch.compile of the generation
step and the VAE encoder; graphs / nographs: DIGITAL_HUMAN_MUSETALK_GRAPHS=1 / 0, the step and encoder replayed
from CUDA graphs on the pipeline's own stream - unset, the code's default: on when compiling; serial: the
renderer reads each batch before queueing the next (launch_ahead off, as before a64896d); facepercall: the
face tracker calls the face models per call with the region uploaded each time (vision.track.FaceOps, as before
a64896d) instead of the frame kept on the GPU and one graph per call). Each setting
runs in a fresh process: its first run is the cold run (CUDA context, the face models' and MuseTalk's first
load; with compile, the compilation: compile_s is the pipeline's own compile_seconds + encode_compile_seconds),
then one warm-up and --repeats warm runs (models loaded; median and spread).

First request vs repeat request: the face track, the reference latents and the paste masks of a reference
video are kept between requests under its content key (vision.content_key; "avatar preparation"). The cold run
and the warm "first request" runs start with those caches cleared (talking_head.musetalk.crops
.clear_avatar_caches: the reference video is new to the process); the warm "repeat request" runs follow them
with the caches kept (the same video again, new speech or not: the speech is decoded and encoded each time).
Code without these caches (--no-avatar, or an older checkout) gives first-request runs only.
Peak GPU memory per run: torch.cuda.max_memory_allocated (reset before each run). cold_process_s adds this
process's imports (interpreter start not included). The CLI itself is not run (it gives one wall time per
process; this separates cold, warm and the stages). Each run also records a timeline (seconds from its
start): every render call of the model (start, end), every chunk handed to the encoder, the paste region's
set-up and the encoder's return - where the video stage waits. --sample-dir: each setting saves the generated crops of
the first 32 output frames (uint8) and the report gives their max difference from the fp32 setting's.

  python benchmarks/gpu_musetalk_video.py --face talk_512.mp4 --speech speech_10s.wav --out $OUT/v.json
The inputs of RESULTS.md's runs, made with the pack's ffmpeg (imageio-ffmpeg) from ../shared/data:
  ffmpeg -t 11 -i video/talk_en_male_01a.mp4 -vf fps=25,scale=512:512:flags=bicubic -an -c:v libx264 -crf 18
         -pix_fmt yuv420p talk_512.mp4
  ffmpeg -i audio/spk_en_male_01.wav -t 10.21 -ac 1 -ar 16000 speech_10s.wav
  python benchmarks/gpu_musetalk_video.py ... --settings fp32,fp16,bf16,fp16:compile --repeats 3
Needs a MuseTalk release under DIGITAL_HUMAN_MODELS (on a machine without one:
random_release.write_release(root, "full"); speed does not depend on the weights) and the face models.
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

T_PROCESS = time.perf_counter()  # as early as this process can read the clock (imports below count in cold_process_s)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402

COMPILE_ENV = "DIGITAL_HUMAN_MUSETALK_COMPILE"
GRAPHS_ENV = "DIGITAL_HUMAN_MUSETALK_GRAPHS"


class Timeline:
    """Events of one run in seconds from its start, recorded by wrapping render_video's own functions (the
    code under test is unchanged): render calls, encoder chunks, the paste region, the encoder's return."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.events: dict[str, list] = {"render": [], "encoder_chunk": [], "paste_region": [], "paste_chunk": []}
        self._undo: list = []

    def now(self) -> float:
        return round(time.perf_counter() - self.t0, 4)

    def _wrap(self, module, name: str, key: str) -> None:
        orig = getattr(module, name)

        def timed(*a, **k):
            t = self.now()
            try:
                return orig(*a, **k)
            finally:
                self.events[key].append((t, self.now()))

        setattr(module, name, timed)
        self._undo.append((module, name, orig))

    def install(self) -> Timeline:
        from digital_human.talking_head import render_video as rv

        self._wrap(rv, "paste_region", "paste_region")
        self._wrap(rv, "paste_boxes", "paste_chunk")
        orig_stream = rv.FrameStream

        def stream(*a, chunks, **k):
            def timed():
                for item in chunks:
                    self.events["encoder_chunk"].append(self.now())
                    yield item
            return orig_stream(*a, chunks=timed(), **k)

        rv.FrameStream = stream
        self._undo.append((rv, "FrameStream", orig_stream))
        return self

    def wrap_render(self, gen) -> None:
        orig = gen.render
        if orig is None:
            return

        def render(start, stop):
            t = self.now()
            try:
                return orig(start, stop)
            finally:
                self.events["render"].append((t, self.now()))

        render.__self__ = getattr(orig, "__self__", None)  # the benchmark finds the pipeline through it
        gen.render = render

    def remove(self) -> None:
        for module, name, orig in reversed(self._undo):
            setattr(module, name, orig)
        self._undo.clear()


def run_once(face: Path, speech: Path, out: Path, precision: str, torch, serial: bool = False) -> dict:
    """One speech file + face video -> MP4 on the headless path; seconds per stage, peak GPU MiB.
    serial: the MuseTalk renderer's launch_ahead off."""
    from digital_human.audio import decode_audio
    from digital_human.cli import HEADLESS_MAX_SPEECH_SECONDS, StageTimer, _faces_from_file, _seconds
    from digital_human.talking_head.registry import generate_crops
    from digital_human.talking_head.render_video import render_talking_video

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    timer = StageTimer()
    timeline = Timeline().install()
    try:
        t0 = timeline.t0 = time.perf_counter()
        wave, rate = timer.run("decode_audio", decode_audio, speech)
        faces, fps, _ = _faces_from_file(timer, face, None, "auto", 60.0, None, _seconds(wave, rate), 0,
                                         model="musetalk")  # the crop size the CLI picks for this model
        gen = timer.run("talking_head_setup", generate_crops, faces, wave, rate, "musetalk", fps, backend="auto",
                        precision=precision, streaming=True, max_audio_seconds=HEADLESS_MAX_SPEECH_SECONDS)
        renderer = getattr(gen.render, "__self__", None)
        if serial and hasattr(renderer, "launch_ahead"):
            renderer.launch_ahead = False
        timeline.wrap_render(gen)
        t_video = timeline.now()
        result = timer.run("video", render_talking_video, gen, wave, rate, out, smooth_strength=0.5)
        t_video_end = timeline.now()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    finally:
        timeline.remove()
    pipe = getattr(getattr(gen.render, "__self__", None), "pipe", None)  # the streaming renderer's pipeline
    ev = timeline.events
    tl = {"video_start": t_video, "video_end": t_video_end, **ev}
    if ev["render"] and ev["encoder_chunk"]:  # where the video stage went, in seconds
        tl["summary"] = {"setup_to_first_render": round(ev["render"][0][0] - t_video, 4),
                         "render_busy": round(sum(b - a for a, b in ev["render"]), 4),
                         "render_span": round(ev["render"][-1][1] - ev["render"][0][0], 4),
                         "first_chunk_to_encoder": round(ev["encoder_chunk"][0] - t_video, 4),
                         "last_render_to_last_chunk": round(ev["encoder_chunk"][-1] - ev["render"][-1][1], 4),
                         "last_chunk_to_mp4": round(t_video_end - ev["encoder_chunk"][-1], 4)}
    row = {"wall_s": round(wall, 3), "stages_s": {k: round(v, 3) for k, v in timer.seconds.items()},
           "musetalk_timings_s": {k: round(v, 3) for k, v in gen.timings.items()},
           "frames": result.mux.frames_written, "fps": fps, "speech_s": round(_seconds(wave, rate), 3),
           "video_s": round(result.mux.video_seconds, 3), "backend": gen.backend,
           "frame_size": list(faces.frames.shape[1:3]), "mp4_bytes": out.stat().st_size,
           "peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None,
           "timeline": tl}
    if pipe is not None and (pipe._compiled is not None or pipe.compile_note):
        row["compile_s"] = None if pipe.compile_seconds is None else round(pipe.compile_seconds, 2)
        enc = getattr(pipe, "encode_compile_seconds", None)
        row["encode_compile_s"] = None if enc is None else round(enc, 2)
        row["compile_note"] = pipe.compile_note
    if pipe is not None and (getattr(pipe, "graphs", False) or getattr(pipe, "graphs_note", None)):
        row["graphs"] = bool(pipe.graphs)
        row["graph_capture_s"] = dict(pipe.graph_capture_seconds)
        row["graphs_captured"] = sorted(pipe._graph)
        row["graphs_note"] = pipe.graphs_note
    return row


def clear_avatar() -> bool:
    """Clear what the code keeps between requests for a reference video; False where it keeps nothing."""
    try:
        from digital_human.talking_head.musetalk.crops import clear_avatar_caches
    except ImportError:  # a checkout from before the caches
        return False
    clear_avatar_caches()
    return True


def save_sample(face: Path, speech: Path, precision: str, dest: Path) -> None:
    """The generated crops (uint8) of the first 32 output frames, as this setting makes them."""
    import numpy as np

    from digital_human.audio import decode_audio
    from digital_human.cli import HEADLESS_MAX_SPEECH_SECONDS, StageTimer, _faces_from_file, _seconds
    from digital_human.talking_head.registry import generate_crops

    wave, rate = decode_audio(speech)
    faces, fps, _ = _faces_from_file(StageTimer(), face, None, "auto", 60.0, None, _seconds(wave, rate), 0,
                                     model="musetalk")
    gen = generate_crops(faces, wave, rate, "musetalk", fps, backend="auto", precision=precision, streaming=True,
                         max_audio_seconds=HEADLESS_MAX_SPEECH_SECONDS)
    crops, _ = gen.chunk(0, min(32, len(gen)))
    np.save(dest, np.asarray(crops, np.uint8))


def one_setting(args: argparse.Namespace) -> dict:
    """The cold run, a warm-up and --repeats warm runs of one setting, in this (fresh) process."""
    import_pack()
    import torch

    precision, *mode = args.one.split(":")
    unknown = set(mode) - {"compile", "graphs", "nographs", "serial", "facepercall"}
    if unknown:
        raise SystemExit(f"unknown setting parts {sorted(unknown)} in {args.one!r}")
    compiled = "compile" in mode
    os.environ[COMPILE_ENV] = "1" if compiled else "0"
    # the pipelined GPU paths on (the default), so serial / facepercall A/B against them
    os.environ["DIGITAL_HUMAN_GPU_PIPELINING"] = "1"
    os.environ.pop(GRAPHS_ENV, None)
    if "graphs" in mode or "nographs" in mode:
        os.environ[GRAPHS_ENV] = "1" if "graphs" in mode else "0"
    if "facepercall" in mode:
        from digital_human.vision import track

        track.face_ops = lambda frames, runners, detector=None: track.FaceOps(*runners, detector)
    t_imported = time.perf_counter()
    runs = []
    avatar = not args.no_avatar and clear_avatar()
    # cold, warm-up, first requests (caches cleared before each), then repeat requests (caches kept)
    plan = ["cold", "warmup"] + ["first"] * args.repeats + (["repeat"] * args.repeats if avatar else [])
    with tempfile.TemporaryDirectory() as tmp:
        for i, kind in enumerate(plan):
            if kind != "repeat":
                clear_avatar() if avatar else None
            runs.append({"kind": kind, **run_once(args.face, args.speech, Path(tmp) / f"out_{i}.mp4", precision,
                                                  torch, serial="serial" in mode)})
            print(json.dumps({"setting": args.one, "run": i, **runs[-1]}), flush=True)
    if args.sample:
        save_sample(args.face, args.speech, precision, Path(args.sample))
    cold = runs[0]
    first = [r for r in runs if r["kind"] == "first"]
    repeat = [r for r in runs if r["kind"] == "repeat"]
    walls = [r["wall_s"] for r in first]
    res = {"setting": args.one, "precision": precision, "compile": compiled, "avatar_cache": avatar,
           "graphs": cold.get("graphs", False), "graph_capture_s": cold.get("graph_capture_s"),
           "graphs_note": cold.get("graphs_note"),
           "cold_s": cold["wall_s"], "cold_process_s": round(t_imported - T_PROCESS + cold["wall_s"], 3),
           "import_s": round(t_imported - T_PROCESS, 3),
           "warmup_s": runs[1]["wall_s"], "warm_median_s": round(statistics.median(walls), 3),
           "warm_min_s": min(walls), "warm_max_s": max(walls),
           "peak_gpu_mb": max(r["peak_gpu_mb"] or 0 for r in runs),
           "warm_peak_gpu_mb": max(r["peak_gpu_mb"] or 0 for r in first + repeat), "runs": runs}
    if repeat:
        rw = [r["wall_s"] for r in repeat]
        res.update(repeat_median_s=round(statistics.median(rw), 3), repeat_min_s=min(rw), repeat_max_s=max(rw))
    if compiled:
        res["compile_s"] = cold.get("compile_s")
        res["encode_compile_s"] = cold.get("encode_compile_s")
        res["compile_note"] = cold.get("compile_note")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--face", type=Path, required=True, help="talking video (or photo) of the person")
    ap.add_argument("--speech", type=Path, required=True, help="speech WAV (the clip's length sets the video's)")
    ap.add_argument("--out", type=Path, help="JSON report (also printed)")
    ap.add_argument("--settings", default="fp16,fp32,fp16:compile",
                    help="precision[:compile][:graphs|:nographs], comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="warm runs after the cold run and one warm-up")
    ap.add_argument("--no-avatar", action="store_true", help="never keep anything between requests (first "
                    "requests only)")
    ap.add_argument("--sample-dir", type=Path, help="save each setting's first 32 generated crops here and report "
                    "their max difference from fp32's")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one setting in this process
    ap.add_argument("--sample", help=argparse.SUPPRESS)  # internal: where this setting saves its crops
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one_setting(args)), flush=True)
        return

    import_pack()
    import torch

    report = {"what": "speech WAV + talking video -> MP4, headless path, model musetalk",
              "face": args.face.name, "speech": args.speech.name,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
              "torch": torch.__version__, "python": platform.python_version(), "settings": [], "errors": []}

    def save() -> None:
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1))

    for setting in args.settings.split(","):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", setting, "--face", str(args.face),
               "--speech", str(args.speech), "--repeats", str(args.repeats)]
        cmd += ["--no-avatar"] if args.no_avatar else []
        if args.sample_dir:
            args.sample_dir.mkdir(parents=True, exist_ok=True)
            cmd += ["--sample", str(args.sample_dir / f"{setting.replace(':', '_')}.npy")]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)  # stderr (logs) passes through
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode or not lines:
            report["errors"].append({"setting": setting, "rc": p.returncode, "stdout_tail": p.stdout[-2000:]})
        else:
            report["settings"].append(json.loads(lines[-1][len("RESULT "):]))
        save()
    base = next((s for s in report["settings"] if s["precision"] == "fp32" and not s["compile"]
                 and not s.get("graphs")), None)
    for s in report["settings"]:
        s["warm_x_vs_fp32"] = round(base["warm_median_s"] / s["warm_median_s"], 2) if base else None
        if base and s.get("repeat_median_s"):
            s["repeat_x_vs_fp32"] = round(base["warm_median_s"] / s["repeat_median_s"], 2)
    if args.sample_dir and (args.sample_dir / "fp32.npy").exists():
        import numpy as np

        ref = np.load(args.sample_dir / "fp32.npy").astype(int)
        for s in report["settings"]:
            path = args.sample_dir / f"{s['setting'].replace(':', '_')}.npy"
            if path.exists() and s["setting"] != "fp32":
                d = np.abs(np.load(path).astype(int) - ref)
                s["crops_vs_fp32_max_levels"] = int(d.max())
                s["crops_vs_fp32_mean_levels"] = round(float(d.mean()), 4)
    save()
    summary = [{k: s.get(k) for k in ("setting", "warm_median_s", "warm_min_s", "warm_max_s", "repeat_median_s",
                                      "repeat_min_s", "repeat_max_s", "cold_s", "cold_process_s", "compile_s",
                                      "encode_compile_s", "graphs", "graph_capture_s", "graphs_note",
                                      "peak_gpu_mb", "warm_x_vs_fp32", "repeat_x_vs_fp32",
                                      "crops_vs_fp32_max_levels")}
               for s in report["settings"]]
    print(json.dumps({"summary": summary, "errors": report["errors"]}, indent=1))


if __name__ == "__main__":
    main()
