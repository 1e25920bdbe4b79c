"""Install MediaPipe's face detector + face mesh once, as ONNX, under `model_dir("face")`.

The two .tflite files (Apache-2.0) ship in the `mediapipe==0.10.21` wheel, byte-identical on every
platform, so we fetch one fixed wheel whatever the user's Python or OS, keep the two files plus the
licence, and convert them to ONNX with torch (tflite_reader). The `mediapipe` package itself is
never installed or imported (it pins numpy<2 and has no wheels for some platforms).
"""
from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from ...assets.pypi_fetch import (AssetFetchError, download_wheel, extract_members, fetch_from_wheel, find_wheel,
                                  sha256_file)
from ...paths import model_dir

log = logging.getLogger(__name__)

REQUIREMENT = "mediapipe==0.10.21"
# One fixed wheel: the .tflite members are the same in all of them, and pinning the platform lets
# `pip download` succeed on Windows/macOS/any Python too.
WHEEL_PLATFORM_ARGS = ["--python-version", "3.11", "--platform", "manylinux_2_28_x86_64"]
DETECTOR_MEMBER = "mediapipe/modules/face_detection/face_detection_short_range.tflite"
MESH_MEMBER = "mediapipe/modules/face_landmark/face_landmark.tflite"
LICENSE_MEMBER = "mediapipe-0.10.21.dist-info/LICENSE"
SHA256 = {
    "face_detection_short_range.tflite": "bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8",
    "face_landmark.tflite": "1055cb9d4a9ca8b8c688902a3a5194311138ba256bcc94e336d8373a5f30c814",
}
# Bump when the conversion changes, so `setup` regenerates ONNX files made by an older converter.
CONVERTER_VERSION = 1
MANIFEST = "face_models.json"
SETUP_HINT = "run `python -m digital_human setup` (it downloads mediapipe==0.10.21 from PyPI once)"


def _face_dir() -> Path:
    return model_dir("face")


def _sources_ok(folder: Path) -> bool:
    return all((folder / name).is_file() and sha256_file(folder / name) == digest
               for name, digest in SHA256.items())


def _fetch_sources(folder: Path, wheel_dir: Path | None) -> None:
    members = {DETECTOR_MEMBER: "face_detection_short_range.tflite", MESH_MEMBER: "face_landmark.tflite",
               LICENSE_MEMBER: "LICENSE.mediapipe.txt"}
    if wheel_dir is not None and find_wheel(Path(wheel_dir), "mediapipe") is not None:
        fetch_from_wheel(REQUIREMENT, members, folder, wheel_dir=Path(wheel_dir))
    else:
        # fetch_from_wheel would ask pip for *this* platform's wheel (none exists for some); pin the
        # fixed manylinux one instead, its .tflite members are the same everywhere
        with tempfile.TemporaryDirectory(prefix="dh-mediapipe-") as tmp:
            wheel = download_wheel(REQUIREMENT, Path(tmp), WHEEL_PLATFORM_ARGS)
            extract_members(wheel, members, folder)
    for name, digest in SHA256.items():
        got = sha256_file(folder / name)
        if got != digest:
            (folder / name).unlink(missing_ok=True)
            raise AssetFetchError(f"{name} from {REQUIREMENT} has sha256 {got}, expected {digest}; "
                                  "the wheel is not the expected release. Delete it and run setup again.")


def _manifest_ok(folder: Path) -> bool:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return (manifest.get("converter_version") == CONVERTER_VERSION and manifest.get("sources") == SHA256
            and (folder / "face_detector.onnx").is_file() and (folder / "face_mesh.onnx").is_file())


def install_face_models(wheel_dir: Path | None = None, force: bool = False) -> dict[str, Path]:
    """Fetch (if needed) and convert the face models; returns face_model_paths().

    `wheel_dir`: a folder already holding the mediapipe 0.10.21 wheel (offline installs); without it
    the wheel is downloaded from the configured PyPI index. Safe to call again: it only redoes what
    is missing or stale.
    """
    folder = _face_dir()
    if force or not _sources_ok(folder):
        _fetch_sources(folder, wheel_dir)
    if force or not _manifest_ok(folder):
        from .blazeface import export_face_detector
        from .facemesh import export_face_mesh

        det_diff = export_face_detector(folder / "face_detection_short_range.tflite", folder / "face_detector.onnx")
        mesh_diff = export_face_mesh(folder / "face_landmark.tflite", folder / "face_mesh.onnx")
        log.info("face models converted to ONNX (max |onnx-torch|: detector %.2e, mesh %.2e)", det_diff, mesh_diff)
        (folder / MANIFEST).write_text(json.dumps({
            "converter_version": CONVERTER_VERSION, "sources": SHA256, "requirement": REQUIREMENT,
            "licence": "Apache-2.0 (LICENSE.mediapipe.txt)",
            "onnx_vs_torch_max_abs_diff": {"detector": det_diff, "mesh": mesh_diff}}, indent=2))
    return face_model_paths()


def face_model_paths() -> dict[str, Path]:
    """Paths of the installed face models: detector/mesh (ONNX), *_tflite originals, licence."""
    folder = _face_dir()
    paths = {
        "detector": folder / "face_detector.onnx",
        "mesh": folder / "face_mesh.onnx",
        "detector_tflite": folder / "face_detection_short_range.tflite",
        "mesh_tflite": folder / "face_landmark.tflite",
        "licence": folder / "LICENSE.mediapipe.txt",
    }
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"face models are not installed (missing: {', '.join(missing)}); {SETUP_HINT}")
    return paths
