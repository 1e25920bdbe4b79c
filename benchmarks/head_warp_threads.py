"""A photo's head motion (talking_head/head_warp.HeadMotion.apply) warped by several threads at once, as a live
server's session clocks do, with and without one more thread running pure Python (a stand-in for the TTS loop
and the server: what holds the interpreter lock while a warp's numpy/OpenCV call wants it back).

Frames/s of all threads together, at Python's default switch interval (5 ms) and at the live server's
(session.live_switch_interval, 0.5 ms); single-thread ms a frame. Each figure: the median of --repeats runs, with
min and max. The face: face_01_female.jpg at 512 px through the live server's own LiveFace (FaceAlign models
from DIGITAL_HUMAN_MODELS).

  python benchmarks/head_warp_threads.py --out benchmarks/results/head_warp_threads_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import ROOT, import_pack  # noqa: E402


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--face", default=str(ROOT.parent / "shared" / "data" / "image" / "face_01_female.jpg"))
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--frames", type=int, default=60, help="frames per thread per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import_pack()
    from digital_human.pipeline.live.face import LiveFace
    from digital_human.pipeline.live.session import live_opencv_threads

    live_opencv_threads()  # as a live server: OpenCV one thread a call
    face = LiveFace(Path(args.face), model="portrait", idle_motion=True)
    motion = face.motion

    def warp(n: int, start: int) -> None:
        frame = np.empty((1, *face._first.shape), np.uint8)
        for k in range(n):
            frame[0] = face._first
            motion.apply(frame, start + k)

    def spin(stop: threading.Event) -> None:
        x = 0
        while not stop.is_set():
            x += 1

    def threaded(busy: bool) -> float:
        stop = threading.Event()
        spinner = threading.Thread(target=spin, args=(stop,))
        if busy:
            spinner.start()
        workers = [threading.Thread(target=warp, args=(args.frames, 100 + 700 * i)) for i in range(args.threads)]
        t = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        wall = time.perf_counter() - t
        stop.set()
        if busy:
            spinner.join()
        return args.threads * args.frames / wall

    warp(10, 0)  # first calls: buffers, OpenCV's tables
    report: dict = {"benchmark": "head_warp_threads", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                             capture_output=True, text=True).stdout.strip(),
                    "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "python": platform.python_version(),
                    "region": [motion.region[0].stop - motion.region[0].start,
                               motion.region[1].stop - motion.region[1].start],
                    "threads": args.threads, "frames_per_thread": args.frames}
    single = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        warp(args.frames, 100)
        single.append((time.perf_counter() - t) / args.frames * 1e3)
    report["one_thread_ms_per_frame"] = spread(single)
    for interval_ms in (5.0, 0.5):
        sys.setswitchinterval(interval_ms / 1e3)
        for busy in (False, True):
            key = f"fps_switch_{interval_ms}ms_{'busy' if busy else 'alone'}"
            report[key] = spread([threaded(busy) for _ in range(args.repeats)])
    print(json.dumps(report, indent=1))
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
