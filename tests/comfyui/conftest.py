"""Fixtures for the real-ComfyUI tests: one server per session on a free loopback port.

Environment:
  COMFYUI_DIR          ComfyUI checkout (main.py). Unset -> every test here is skipped.
  COMFYUI_PYTHON       interpreter with ComfyUI's requirements + this pack's (default: this one).
  DIGITAL_HUMAN_MODELS models root holding the setup step's output (default: $COMFYUI_DIR/models/digital_human).
  DIGITAL_HUMAN_DATA   sample media (default ../shared/data, see tests/conftest.py).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ARTIFACTS, ComfyClient, ComfyServer, prepare_base_dir  # noqa: E402

VOICE_MODEL_FILES = ("speaker_encoder/ge2e.onnx", "kokoro/kokoro-v1.0.int8.onnx", "kokoro/data/vocab.json")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("COMFYUI_DIR"):
        return
    skip = pytest.mark.skip(reason="COMFYUI_DIR is not set: point it at a ComfyUI checkout to run the "
                                   "real-server tests (see tests/comfyui/README.md)")
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def comfy_dir() -> Path:
    path = Path(os.environ["COMFYUI_DIR"]).expanduser().resolve()
    if not (path / "main.py").is_file():
        pytest.fail(f"COMFYUI_DIR={path} has no main.py")
    return path


@pytest.fixture(scope="session")
def models_root(comfy_dir: Path) -> Path:
    root = Path(os.environ.get("DIGITAL_HUMAN_MODELS") or comfy_dir / "models" / "digital_human").expanduser()
    missing = [f for f in VOICE_MODEL_FILES if not (root / f).is_file()]
    if missing:
        pytest.skip(f"voice models missing in {root} ({', '.join(missing)}): run "
                    f"`DIGITAL_HUMAN_MODELS={root} python -m digital_human setup`")
    return root


@pytest.fixture(scope="session")
def comfy_server(comfy_dir: Path, models_root: Path, tmp_path_factory: pytest.TempPathFactory):
    ARTIFACTS.mkdir(exist_ok=True)
    base = prepare_base_dir(tmp_path_factory.mktemp("comfy-base"), comfy_dir)
    server = ComfyServer(comfy_dir, base, python=os.environ.get("COMFYUI_PYTHON", sys.executable),
                         log_path=ARTIFACTS / "comfyui-server.log",
                         env={"DIGITAL_HUMAN_MODELS": str(models_root)})
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def client(comfy_server: ComfyServer):
    api = ComfyClient(comfy_server.url, timeout=60)
    api.connect_ws()
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def uploaded(client: ComfyClient, data_dir: Path) -> dict[str, str]:
    """Sample inputs uploaded through /upload/image, by role -> name the prompt uses."""
    files = {"voice": data_dir / "audio" / "spk_en_male_01.wav"}
    return {role: client.upload(path) for role, path in files.items()}
