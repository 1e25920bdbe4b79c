"""User + sys CPU of `digital-human animate` on a photo with and without idle motion, single-threaded.

Runs the CLI as child processes, interleaved (on, off, on, off, ...), each with one thread everywhere
(OMP / OpenBLAS / MKL, OpenCV via OPENCV_FOR_THREADS_NUM, the pack's frame threads), and reads the
children's user and sys CPU from resource.getrusage: in all, and split into the Python process's own
(the pack's work) and its children's (ffmpeg: decoding and the H.264 encoder, which works harder on a
moving head). CPU time, not wall time: the machine may be shared.

    python benchmarks/idle_motion_cpu.py --face ../shared/data/image/face_02_male.png \
        --audio /tmp/speech10.wav --rounds 3 --json benchmarks/results/idle_motion_cpu_X.json \
        [--variant before=/tmp/old --variant after=/tmp/new]   # copies of the pack, interleaved
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


# the CLI in this child, which reports its own CPU and its children's (ffmpeg: the encoder) when it exits
_WRAPPER = """
import atexit, json, resource, runpy, sys
def _report():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    sys.stderr.write("RUSAGE " + json.dumps({"self_user": me.ru_utime, "self_sys": me.ru_stime,
                                             "children_user": kids.ru_utime, "children_sys": kids.ru_stime}) + "\\n")
atexit.register(_report)
sys.argv = ["digital_human", *sys.argv[1:]]
runpy.run_module("digital_human", run_name="__main__", alter_sys=True)
"""


def run_once(args, idle: bool, out_dir: str, variant: str = "", path: str = "") -> dict:
    cli = ["animate", "--face", args.face, "--audio", args.audio,
           "--out", os.path.join(out_dir, f"{'on' if idle else 'off'}.mp4"), "--json", *args.extra]
    if not idle:
        cli.append("--no-idle-motion")
    cmd = [sys.executable, "-c", _WRAPPER, *cli]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    env = {**os.environ, **ONE_THREAD}
    if path:  # another copy of the pack (a folder holding digital_human/) instead of the installed one
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=out_dir)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    own = json.loads(proc.stderr.rsplit("RUSAGE ", 1)[1].splitlines()[0])
    return {"variant": variant, "idle_motion": idle, "user_s": after.ru_utime - before.ru_utime, "sys_s": after.ru_stime - before.ru_stime,
            "python_user_s": own["self_user"], "python_sys_s": own["self_sys"],
            "encoder_user_s": own["children_user"], "encoder_sys_s": own["children_sys"],
            "wall_s": wall, "load": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--face", required=True)
    ap.add_argument("--audio", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the runs and medians here")
    ap.add_argument("--label", default="")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL=PATH",
                    help="compare copies of the pack, interleaved: PATH holds digital_human/ (repeatable)")
    ap.add_argument("extra", nargs="*", help="more animate arguments (after --)")
    args = ap.parse_args()
    args.face, args.audio = os.path.abspath(args.face), os.path.abspath(args.audio)
    variants = [tuple(v.split("=", 1)) for v in args.variant] or [("", "")]
    runs = []
    with tempfile.TemporaryDirectory() as out_dir:
        for r in range(args.rounds):
            order = [(v, idle) for v in variants for idle in (True, False)]
            for (label, path), idle in (order if r % 2 == 0 else order[::-1]):
                runs.append(run_once(args, idle, out_dir, label, os.path.abspath(path) if path else ""))
                print(json.dumps(runs[-1]), flush=True)
    result = {label or "installed": _summary([x for x in runs if x["variant"] == label]) for label, _ in variants}
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"label": args.label, "face": args.face, "audio": args.audio, "threads": ONE_THREAD,
                       "variants": dict(variants), "extra": args.extra, "runs": runs, "summary": result}, f, indent=1)


def _summary(runs: list[dict]) -> dict:
    summary = {}
    parts = {"user": ("user_s",), "user_sys": ("user_s", "sys_s"), "python_user": ("python_user_s",),
             "python_user_sys": ("python_user_s", "python_sys_s"), "encoder_user": ("encoder_user_s",)}
    for idle in (True, False):
        sel = [x for x in runs if x["idle_motion"] == idle]
        summary["on" if idle else "off"] = {f"{name}_median_s": statistics.median(sum(x[k] for k in keys) for x in sel)
                                            for name, keys in parts.items()}
    for name in parts:
        summary[f"{name}_ratio"] = summary["on"][f"{name}_median_s"] / summary["off"][f"{name}_median_s"]
    return summary


if __name__ == "__main__":
    main()
