"""Make the folder that `benchmarks/gpu_live.py` and `benchmarks/gpu_tts_pieces.py` need on a GPU machine without
network (the `device` tool's H200): the CosyVoice 2 speaker state (its prompt mel needs librosa, which that machine
lacks), the face photo, the pack's face models, and wheels of the packages its image lacks (cp312, manylinux).
With --latentsync, the folder `benchmarks/latentsync_gpu.py` needs instead: the reference's code (a `fetch`ed
bytedance/LatentSync snapshot's latentsync/ and configs/, exported, not copied into the project), the wheels its
imports need, and the whole section's inputs (in/track.npz: FaceAlign on 32 frames of talk_de_male_04.mp4 at
512 px; in/speech.npy: that video's audio at 16 kHz), as the 2026-12-04 runs had them.

  python tools/device_carry.py .carry/live          # here, once per checkout (.carry/ is ignored by git)
  python tools/device_carry.py .carry/ls --latentsync [--mirror /work/.mirror/bytedance+LatentSync/repo]

Then on the device (carry [".carry/live"]):

  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .carry/live/whl/*.whl
  PYTHONPATH=/tmp/site python3 benchmarks/gpu_live.py --state .carry/live/state.npz \\
      --face .carry/live/face_01_female.jpg --face-models .carry/live/face --work /tmp/gl --out $OUT/gl.json
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("DIGITAL_HUMAN_DATA", ROOT.parent / "shared" / "data"))
FACE = "face_01_female.jpg"
# what the H200 image (torch 2.11, Python 3.12, transformers 5.x) lacked on 2026-12-03; versions as the CI's
WHEELS = ("av==18.1.0", "diffusers==0.32.2", "importlib_metadata", "soxr")
LATENTSYNC_WHEELS = ("diffusers==0.32.2", "einops", "importlib_metadata", "kornia", "kornia_rs", "zipp")
LATENTSYNC_VIDEO, LATENTSYNC_FRAMES = "talk_de_male_04.mp4", 32


def _wheels(folder: Path, python: str, names: tuple[str, ...]) -> None:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python, "--platform", "manylinux2014_x86_64",
                    "--platform", "manylinux_2_28_x86_64", "-d", str(folder), *names], check=True)


def latentsync_carry(out: Path, mirror: Path, python: str) -> None:
    """out/ref (the reference's latentsync/ and configs/ from a bare git mirror), out/whl, out/in (module doc)."""
    import numpy as np

    from digital_human.media.probe import read_video_audio, read_video_frames
    from digital_human.vision.align import align_faces

    if not (mirror / "HEAD").is_file():
        raise SystemExit(f"{mirror} is not a git directory: `fetch` github:bytedance/LatentSync first")
    (out / "ref").mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "--git-dir", str(mirror), "archive", "HEAD", "latentsync", "configs"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out / "ref")], input=archive, check=True)
    _wheels(out / "whl", python, LATENTSYNC_WHEELS)
    (out / "in").mkdir(parents=True, exist_ok=True)
    video = DATA / "video" / LATENTSYNC_VIDEO
    frames, fps = read_video_frames(video, max_frames=LATENTSYNC_FRAMES)
    align_faces(frames, fps, crop_size=512).save_npz(out / "in" / "track.npz")
    audio, _ = read_video_audio(video, sample_rate=16000)
    np.save(out / "in" / "speech.npy", audio.mean(axis=0).astype(np.float32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--python", default="312", help="the device's Python (wheel tag), default 312")
    parser.add_argument("--latentsync", action="store_true", help="the LatentSync benchmark's folder (module doc)")
    parser.add_argument("--mirror", type=Path, default=Path("/work/.mirror/bytedance+LatentSync/repo"),
                        help="--latentsync: the reference's git directory (from `fetch`)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _bootstrap import import_pack

    import_pack()  # installed, on PYTHONPATH, or this checkout
    from digital_human.paths import models_root

    out = args.folder
    if args.latentsync:
        latentsync_carry(out, args.mirror, args.python)
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        print(f"{out}: {size / 2 ** 20:.1f} MiB (the device call carries at most 64 MiB)")
        return
    (out / "whl").mkdir(parents=True, exist_ok=True)
    face_models = models_root() / "face"
    if not face_models.is_dir():
        raise SystemExit(f"{face_models} is missing: run `python -m digital_human setup` first")
    shutil.copytree(face_models, out / "face", dirs_exist_ok=True)
    shutil.copy2(DATA / "image" / FACE, out / FACE)
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_live.py"), "--save-state", str(out / "state.npz"),
                    "--work", str(out / "release"), "--out", "-"], check=True)
    shutil.rmtree(out / "release", ignore_errors=True)  # the random release is rebuilt there from its seed
    _wheels(out / "whl", args.python, WHEELS)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 2 ** 20:.1f} MiB (the device call carries at most 64 MiB)")


if __name__ == "__main__":
    main()
