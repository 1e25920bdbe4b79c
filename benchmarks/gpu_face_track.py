"""FaceAlign's face track on a GPU: the per-call path against the device path (engines/face/device_track.py).

Per call (vision.track.FaceOps, the path before a64896d): each model call cuts its input region on the host,
uploads it, samples it op by op and reads the outputs back one by one. Device path (vision.track.DeviceOps, the
default for torch CUDA runners): each frame uploaded once, each call one CUDA graph of sampling + network, one
read-back. Both run in this process on the same frames, alternating, with the track cache cleared before each
run; the report gives wall seconds per align (median, min-max) for a video file (frames decoded on demand, as the
CLI reads them) and for the same frames in memory (no decoding: the tracker alone), the decode of the file alone,
per-call milliseconds, the device time of one replay, and the parity of the two tracks (landmarks, crop
transforms, the crops' pixel levels). On a machine without CUDA both rows are the per-call path.

  python benchmarks/gpu_face_track.py --face talk_512.mp4 --out $OUT/face_track.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402


def _timed(fn, repeats: int, sync) -> dict:
    walls = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        walls.append(time.perf_counter() - t0)
    return {"median_s": round(statistics.median(walls), 4), "min_s": round(min(walls), 4),
            "max_s": round(max(walls), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--face", type=Path, required=True, help="talking video")
    ap.add_argument("--seconds", type=float, default=10.71, help="read this much of it (the CLI: speech + 0.5 s)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import_pack()
    import numpy as np
    import torch

    from digital_human.engines.face.detect import default_runners, detect_faces, face_landmarks
    from digital_human.media.frame_source import load_face_frames
    from digital_human.vision import track as T
    from digital_human.vision.align import align_faces

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    runners = default_runners()
    per_call, device_path = (lambda f, r, d=None: T.FaceOps(*r, d)), T.face_ops
    paths = {"per_call": per_call, "device": device_path}

    def frames_from_file():
        return load_face_frames(args.face, args.seconds)[0]

    memory = np.asarray(frames_from_file()[:])
    fps = load_face_frames(args.face, args.seconds)[1]
    report = {"face": args.face.name, "frames": len(memory), "size": list(memory.shape[1:3]),
              "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "runners": [r.info.summary() for r in runners]}
    report["decode_s"] = _timed(lambda: [f.frame(t) for f in [frames_from_file()] for t in range(len(f))],
                                args.repeats, sync)
    tracks = {}

    def align(name: str, source: str):
        T.face_ops = paths[name]
        T.clear_track_cache()
        frames = frames_from_file() if source == "file" else memory.copy()
        tracks[name] = align_faces(frames, fps, crop_size=256, runners=runners)

    for name in paths:  # warm-up: model loads, graph captures
        align(name, "memory")
    for source in ("file", "memory"):
        for name in paths:
            report[f"align_{name}_{source}"] = _timed(lambda: align(name, source), args.repeats, sync)
    T.face_ops = device_path
    a, b = tracks["per_call"], tracks["device"]
    report["parity"] = {
        "found_equal": bool(np.array_equal(a.found, b.found)),
        "landmarks_max_px": float(np.nanmax(np.abs(np.asarray(a.landmarks[:]) - np.asarray(b.landmarks[:])))),
        "affines_max": float(np.abs(a.affines - b.affines).max()),
        "crops_max_levels": int(np.abs(np.asarray(a.crops[:64]).astype(int) - np.asarray(b.crops[:64])).max())}
    frame, box = memory[len(memory) // 2], T.roi_from_landmarks(np.asarray(b.landmarks[len(memory) // 2 - 1]))
    ops = T.face_ops(memory, runners)
    calls = {"landmarks_per_call": lambda: face_landmarks(frame, box, runners[1]),
             "landmarks_device": lambda: ops.landmarks(frame, box),
             "detect_per_call": lambda: detect_faces(frame, runners[0]),
             "detect_device": lambda: ops.detect(frame)}
    for name, call in calls.items():
        for _ in range(5):
            call()
        report[f"call_{name}_ms"] = round(_timed(lambda c=call: [c() for _ in range(100)], 1, sync)["median_s"] * 10, 4)
    models = getattr(ops, "models", None)
    if models is not None and cuda:
        report["graphs_note"] = models.graphs_note
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.inference_mode():
            for name in ("mesh", "detect"):
                start.record()
                for _ in range(100):
                    models._calls[name]()
                end.record()
                sync()
                report[f"{name}_replay_device_ms"] = round(start.elapsed_time(end) / 100, 4)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
