"""Make the repository importable as `digital_human` without installing it.

The repository root *is* the package (ComfyUI loads it from custom_nodes/<pack>/), so the
checkout directory's own name cannot be relied on; register it under the pip name instead.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("DIGITAL_HUMAN_DATA", ROOT.parent / "shared" / "data"))

# Tests write only into temporary folders. Outside ComfyUI the nodes' output folder (and its temp/, where
# TRT_TTS leaves dh_tts_*.wav) defaults to ./output - the repository when pytest runs from its root. Set
# at import, before any test runs, so CLI subprocesses inherit it too; tests that need their own folder
# still monkeypatch it.
_TEST_OUTPUT = Path(tempfile.mkdtemp(prefix="dh_test_output_"))
os.environ["DIGITAL_HUMAN_OUTPUT_DIR"] = str(_TEST_OUTPUT)
atexit.register(shutil.rmtree, _TEST_OUTPUT, True)

if "digital_human" not in sys.modules:
    spec = importlib.util.spec_from_file_location(
        "digital_human", ROOT / "__init__.py", submodule_search_locations=[str(ROOT)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["digital_human"] = module
    spec.loader.exec_module(module)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        pytest.skip(f"sample media not found at {DATA_DIR}")
    return DATA_DIR


def _models_ready() -> str | None:
    """None when the setup step's files exist, else the reason they don't."""
    from digital_human.paths import models_root

    root = models_root()
    needed = [root / "speaker_encoder" / "ge2e.onnx", root / "kokoro" / "kokoro-v1.0.int8.onnx",
              root / "face" / "face_detector.onnx", root / "face" / "face_mesh.onnx"]
    missing = [str(p) for p in needed if not p.is_file()]
    return f"models missing ({', '.join(missing)}); run `python -m digital_human setup`" if missing else None


@pytest.fixture(scope="session")
def setup_models() -> None:
    """Skip (or, in CI with DIGITAL_HUMAN_REQUIRE_MODELS=1, fail) when `digital-human setup` has not run."""
    reason = _models_ready()
    if reason:
        if os.environ.get("DIGITAL_HUMAN_REQUIRE_MODELS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def face_runners(setup_models):
    """(detector, mesh) runners on ONNX Runtime from the installed face models."""
    from digital_human.engines.face import detect
    from digital_human.engines.face.blazeface import face_detector_spec
    from digital_human.engines.face.facemesh import face_mesh_spec

    return (detect.engine_runner(face_detector_spec(), backend="onnxruntime"),
            detect.engine_runner(face_mesh_spec(), backend="onnxruntime"))



@pytest.fixture(scope="session")
def talking_video_track(data_dir, face_runners):
    """FaceAlign's track of the first 0.4 s of talk_en_male_01a.mp4 (a new reference frame per output frame);
    shared read-only by the renderer tests."""
    from digital_human.media.frame_source import load_face_frames
    from digital_human.vision.align import align_faces

    frames, fps, _ = load_face_frames(data_dir / "video" / "talk_en_male_01a.mp4", 0.4)
    return align_faces(frames, fps, runners=face_runners)

WHEEL_DIRS = [os.environ.get("DIGITAL_HUMAN_WHEELS", ""), "/tmp/mpwheel", "/tmp/dl"]


@contextlib.contextmanager
def _fresh_face_models(folder: Path) -> Iterator[dict[str, Path]]:
    """Install the face models into `folder` (as DIGITAL_HUMAN_MODELS while the block runs; restored
    after), from a mediapipe 0.10.21 wheel on disk or PyPI; skip the test when neither is reachable."""
    from digital_human.engines.face.mediapipe_assets import install_face_models

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DIGITAL_HUMAN_MODELS", str(folder))
        wheel_dir = next((Path(d) for d in WHEEL_DIRS if d and any(Path(d).glob("mediapipe-0.10.21-*.whl"))), None)
        try:
            paths = install_face_models(wheel_dir=wheel_dir)
        except Exception as exc:  # offline and no wheel on disk
            pytest.skip(f"face models unavailable (no mediapipe 0.10.21 wheel, PyPI failed: {exc})")
        yield paths


@pytest.fixture(scope="session")
def fresh_face_models():
    """`with fresh_face_models(folder) as paths:` - face models installed into a folder of the test's own."""
    return _fresh_face_models
