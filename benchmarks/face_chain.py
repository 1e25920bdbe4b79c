"""Face chain on this CPU: per-frame cost of detect, mesh and crop; TemporalSmooth on a real generated clip
(mouth-landmark jitter before/after and the mouth-opening lag it adds); mux seconds per minute of video.

  python benchmarks/face_chain.py [--frames 150] [--json benchmarks/out/face_chain.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402

DATA = Path(os.environ.get("DIGITAL_HUMAN_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))


def per_frame_stages(frames: np.ndarray, repeats: int = 3) -> dict[str, float]:
    """Median ms per frame for detect (letterbox + network + decode), mesh (crop + network + unmap), crop warp."""
    from digital_human.engines.face.detect import default_runners, detect_faces, face_landmarks
    from digital_human.vision.align import crop_frames

    run_det, run_mesh = default_runners()
    boxes = [detect_faces(f, run_det)[0] for f in frames[:2]]  # warm-up
    face_landmarks(frames[0], boxes[0], run_mesh)
    out: dict[str, list[float]] = {"detect_ms": [], "mesh_ms": [], "crop_ms": []}
    for _ in range(repeats):
        start = time.perf_counter()
        boxes = [detect_faces(f, run_det)[0] for f in frames]
        out["detect_ms"].append((time.perf_counter() - start) * 1000 / len(frames))
        start = time.perf_counter()
        for f, b in zip(frames, boxes):
            face_landmarks(f, b, run_mesh)
        out["mesh_ms"].append((time.perf_counter() - start) * 1000 / len(frames))
        affines = np.repeat(np.array([[[0.5, 0, 10], [0, 0.5, 10]]], np.float64), len(frames), axis=0)
        start = time.perf_counter()
        crop_frames(frames, affines, 256)
        out["crop_ms"].append((time.perf_counter() - start) * 1000 / len(frames))
    return {k: round(statistics.median(v), 3) for k, v in out.items()}


def smoothing_on_real_clip(path: Path, seconds: float) -> dict[str, float]:
    """Portrait-animate a real talking clip, then TemporalSmooth it; re-measure mouths with the mesh."""
    from digital_human.audio import to_comfy_audio
    from digital_human.media.probe import read_video_audio, read_video_frames
    from digital_human.nodes.image_convert import image_to_uint8, uint8_to_image
    from digital_human.nodes.talking_head_nodes import TRT_TalkingHead
    from digital_human.nodes.video_nodes import FaceAlign, TemporalSmooth
    from digital_human.vision.lipsync_metrics import av_lag, mouth_opening, remeasure_landmarks, speech_envelope

    frames, fps = read_video_frames(path, max_frames=int(seconds * 30))
    wave, rate = read_video_audio(path)
    wave = wave[:, : int(len(frames) / fps * rate)]
    faces, _, _ = FaceAlign().align(uint8_to_image(frames), fps)
    out = TRT_TalkingHead().animate(faces, to_comfy_audio(wave, rate), model="portrait", fps=fps)
    generated, track, _ = out["result"]
    start = time.perf_counter()
    smoothed, _ = TemporalSmooth().smooth(generated, strength=0.5, fps=fps, faces=track)
    smooth_s = time.perf_counter() - start
    mono = wave.mean(axis=0)
    result = {"frames": len(frames), "smooth_ms_per_frame": round(smooth_s * 1000 / len(frames), 2)}
    for name, images in (("before", generated), ("after", smoothed)):
        lms = remeasure_landmarks(image_to_uint8(images), track.landmarks)
        mouth = lms[:, [13, 14, 61, 291, 0, 17], :2]
        result[f"mouth_jitter_{name}_px"] = round(float(np.abs(np.diff(mouth, n=2, axis=0)).mean()), 4)
        lag_ms, corr = av_lag(mouth_opening(lms), speech_envelope(mono, rate, fps, len(lms)), fps)
        result[f"lag_{name}_ms"], result[f"corr_{name}"] = round(lag_ms, 1), round(corr, 3)
    result["smoothing_added_lag_ms"] = round(result["lag_after_ms"] - result["lag_before_ms"], 1)
    return result


def mux_seconds_per_minute(frames: np.ndarray, fps: float = 25.0) -> float:
    from digital_human.media.mux import mux_video

    audio = np.zeros(int(len(frames) / fps * 16000), np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        mux_video(frames, audio, 16000, fps, Path(tmp) / "m.mp4")
        seconds = time.perf_counter() - start
    return round(seconds * 60.0 / (len(frames) / fps), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import_pack()
    from digital_human.media.probe import read_video_frames

    report: dict = {"machine": "cpu", "cpus": os.cpu_count(), "load_avg": os.getloadavg()}
    for name in ("talk_en_male_01a.mp4", "talk_xx_female_05_1080x1920_hevc.mp4"):
        frames, _ = read_video_frames(DATA / "video" / name, max_frames=args.frames)
        report[f"stages_{name}"] = per_frame_stages(frames)
        print(name, frames.shape[1:3], report[f"stages_{name}"], flush=True)
    report["temporal_smooth_01b"] = smoothing_on_real_clip(DATA / "video" / "talk_en_male_01b.mp4", 8.0)
    print("TemporalSmooth on 01b (portrait output):", report["temporal_smooth_01b"], flush=True)
    frames, _ = read_video_frames(DATA / "video" / "talk_en_male_01a.mp4", max_frames=250)
    report["mux_s_per_min_256"] = mux_seconds_per_minute(frames)
    print("mux s per minute of 256x256@25:", report["mux_s_per_min_256"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
