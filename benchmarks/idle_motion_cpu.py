"""User + sys CPU of `digital-human animate` on a photo with and without idle motion, single-threaded.

Runs the CLI as child processes, interleaved (on, off, on, off, ...), each with one thread everywhere
(OMP / OpenBLAS / MKL, OpenCV via OPENCV_FOR_THREADS_NUM, the pack's frame threads), and reads the
children's user and sys CPU from resource.getrusage. CPU time, not wall time: the machine may be shared.

    python benchmarks/idle_motion_cpu.py --face ../shared/data/image/face_02_male.png \
        --audio /tmp/speech10.wav --rounds 3 --json benchmarks/results/idle_motion_cpu_X.json
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "OPENCV_FOR_THREADS_NUM": "1", "DIGITAL_HUMAN_FRAME_THREADS": "1", "NUMEXPR_NUM_THREADS": "1"}


def run_once(args, idle: bool, out_dir: str) -> dict:
    cmd = [sys.executable, "-m", "digital_human", "animate", "--face", args.face, "--audio", args.audio,
           "--out", os.path.join(out_dir, f"{'on' if idle else 'off'}.mp4"), "--json", *args.extra]
    if not idle:
        cmd.append("--no-idle-motion")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env={**os.environ, **ONE_THREAD}, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return {"idle_motion": idle, "user_s": after.ru_utime - before.ru_utime, "sys_s": after.ru_stime - before.ru_stime,
            "wall_s": wall, "load": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--face", required=True)
    ap.add_argument("--audio", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the runs and medians here")
    ap.add_argument("--label", default="")
    ap.add_argument("extra", nargs="*", help="more animate arguments (after --)")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as out_dir:
        for r in range(args.rounds):
            for idle in ((True, False) if r % 2 == 0 else (False, True)):
                runs.append(run_once(args, idle, out_dir))
                print(json.dumps(runs[-1]), flush=True)
    summary = {}
    for idle in (True, False):
        sel = [x for x in runs if x["idle_motion"] == idle]
        summary["on" if idle else "off"] = {
            "user_median_s": statistics.median(x["user_s"] for x in sel),
            "user_sys_median_s": statistics.median(x["user_s"] + x["sys_s"] for x in sel)}
    summary["user_ratio"] = summary["on"]["user_median_s"] / summary["off"]["user_median_s"]
    summary["user_sys_ratio"] = summary["on"]["user_sys_median_s"] / summary["off"]["user_sys_median_s"]
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"label": args.label, "face": args.face, "audio": args.audio, "threads": ONE_THREAD,
                       "extra": args.extra, "runs": runs, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
