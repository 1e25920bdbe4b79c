"""CPU per frame of HeadMotion.apply (a photo's idle-motion warp), one thread, interleaved against another
copy of talking_head/head_warp.py (e.g. an older commit's, `git show REV:talking_head/head_warp.py > f`).

    python research/head_warp_apply.py --face ../shared/data/image/face_02_male.png --audio speech.wav \
        [--other /tmp/old_head_warp.py] [--rounds 9] [--json out.json]

Runs the installed pack's face alignment once, then warps `--frames` copies of the photo (the whole
track: blinks included) per round with each version, alternating the order; time.process_time per frame.
"""
from __future__ import annotations

import os

for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPENCV_FOR_THREADS_NUM",
           "DIGITAL_HUMAN_FRAME_THREADS"):
    os.environ[_k] = "1"

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--face", required=True)
    ap.add_argument("--audio", required=True)
    ap.add_argument("--other", help="another head_warp.py to compare (loaded inside the installed package)")
    ap.add_argument("--frames", type=int, default=250)
    ap.add_argument("--fps", type=float, default=25.0)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args()

    from digital_human.audio.decode import decode_audio
    from digital_human.engines.face import detect
    from digital_human.engines.face.blazeface import face_detector_spec
    from digital_human.engines.face.facemesh import face_mesh_spec
    from digital_human.media.probe import read_video_frames
    from digital_human.talking_head import head_warp
    from digital_human.talking_head.idle_motion import idle_motion
    from digital_human.vision import align_faces

    runners = (detect.engine_runner(face_detector_spec(), backend="onnxruntime"),
               detect.engine_runner(face_mesh_spec(), backend="onnxruntime"))
    photo, _ = read_video_frames(args.face)
    track = align_faces(photo, 0, runners=runners)
    wave, sr = decode_audio(args.audio)
    motion = idle_motion(wave.mean(0), sr, args.fps, args.frames, 0)
    versions = {"this": head_warp}
    if args.other:
        spec = importlib.util.spec_from_file_location("digital_human.talking_head._other_head_warp", args.other)
        other = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = other
        spec.loader.exec_module(other)
        versions["other"] = other
    heads = {k: m.HeadMotion(track.landmarks[0], track.frames[0], motion) for k, m in versions.items()}
    frames = np.repeat(track.frames[:1], args.frames, axis=0)
    moving = sum(not motion.still(i) for i in range(args.frames))
    res: dict[str, list[float]] = {k: [] for k in heads}
    for r in range(args.rounds):
        for k in (list(heads) if r % 2 == 0 else list(heads)[::-1]):
            f = frames.copy()
            t0 = time.process_time()
            heads[k].apply(f, 0)
            res[k].append((time.process_time() - t0) / moving * 1e3)
    out = {"face": args.face, "audio": args.audio, "frames": args.frames, "moving_frames": moving,
           "region": [[s.start, s.stop] for s in heads["this"].region], "ms_per_frame": res,
           "median_ms": {k: float(np.median(v)) for k, v in res.items()},
           "min_ms": {k: float(np.min(v)) for k, v in res.items()}, "load": os.getloadavg()}
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
