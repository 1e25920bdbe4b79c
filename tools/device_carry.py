"""Make the folder that `benchmarks/gpu_live.py` and `benchmarks/gpu_tts_pieces.py` need on a GPU machine without
network (the `device` tool's H200): the CosyVoice 2 speaker state (its prompt mel needs librosa, which that machine
lacks), the face photo, the pack's face models, and wheels of the packages its image lacks (cp312, manylinux).

  python tools/device_carry.py .carry/live          # here, once per checkout (.carry/ is ignored by git)

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--python", default="312", help="the device's Python (wheel tag), default 312")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _bootstrap import import_pack

    import_pack()  # installed, on PYTHONPATH, or this checkout
    from digital_human.paths import models_root

    out = args.folder
    (out / "whl").mkdir(parents=True, exist_ok=True)
    face_models = models_root() / "face"
    if not face_models.is_dir():
        raise SystemExit(f"{face_models} is missing: run `python -m digital_human setup` first")
    shutil.copytree(face_models, out / "face", dirs_exist_ok=True)
    shutil.copy2(DATA / "image" / FACE, out / FACE)
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_live.py"), "--save-state", str(out / "state.npz"),
                    "--work", str(out / "release"), "--out", "-"], check=True)
    shutil.rmtree(out / "release", ignore_errors=True)  # the random release is rebuilt there from its seed
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", args.python, "--platform", "manylinux2014_x86_64",
                    "--platform", "manylinux_2_28_x86_64", "-d", str(out / "whl"), *WHEELS], check=True)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 2 ** 20:.1f} MiB (the device call carries at most 64 MiB)")


if __name__ == "__main__":
    main()
