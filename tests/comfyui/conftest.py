"""Fixtures for the real-ComfyUI tests: one server per session on a free loopback port.

Environment:
  COMFYUI_DIR          ComfyUI checkout (main.py). Unset -> every test here is skipped.
  COMFYUI_PYTHON       interpreter with ComfyUI's requirements + this pack's (default: this one).
  DIGITAL_HUMAN_MODELS models root holding the setup step's output (default: $COMFYUI_DIR/models/digital_human).
  DIGITAL_HUMAN_DATA   sample media (default ../shared/data, see tests/conftest.py).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (ARTIFACTS, WORKFLOWS, ComfyClient, ComfyServer, load_api_workflow,  # noqa: E402
                     node_errors_text, prepare_base_dir)

VOICE_MODEL_FILES = ("speaker_encoder/ge2e.onnx", "kokoro/kokoro-v1.0.int8.onnx", "kokoro/data/vocab.json")
# `setup` makes these (samples.py); the pack copies them into the server's input folder at start-up and
# the bundled workflows name them, so the tests post the workflows as shipped.
SAMPLE_FILES = ("digital_human_sample_voice.wav", "digital_human_sample_portrait.png",
                "digital_human_sample_talking.mp4")
# A cold voice search (24 syntheses before the v6 fit; 14 now) took 5-9 minutes on a 2-core CPU, and was measured at 14 and 30 minutes
# on one shared by other heavy jobs; it runs once per voice in the `samples` fixture under this bound, so no
# test's own timeout has to cover it.
VOICE_FIT_TIMEOUT_S = 3600.0


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
    missing = [f for f in (*VOICE_MODEL_FILES, *(f"samples/{n}" for n in SAMPLE_FILES))
               if not (root / f).is_file()]
    if missing:
        pytest.skip(f"models or sample inputs missing in {root} ({', '.join(missing)}): run "
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


def _voice_fit_prompts() -> dict[str, dict]:
    """One small prompt per distinct reference voice of the bundled API workflows: the nodes that feed
    ExtractSpeakerEmbedding, a TRT_TTS of one word and SaveAudio (an output node, so it runs)."""
    prompts: dict[str, dict] = {}
    for path in sorted((WORKFLOWS / "api").glob("*.json")):
        prompt = load_api_workflow(path)
        for nid, node in prompt.items():
            if node["class_type"] != "ExtractSpeakerEmbedding" or node["inputs"].get("engine", "kokoro") != "kokoro":
                continue  # only Kokoro fits a voice; user-file engines (cosyvoice2) need their own test's files
            keep, todo = set(), [nid]
            while todo:  # the extractor and everything upstream of it
                current = todo.pop()
                if current not in keep:
                    keep.add(current)
                    todo += [v[0] for v in prompt[current]["inputs"].values() if isinstance(v, list)]
            sub = {k: prompt[k] for k in keep}
            key = json.dumps(sub, sort_keys=True)
            tts = next(n for n in prompt.values() if n["class_type"] == "TRT_TTS")
            sub["900"] = {"class_type": "TRT_TTS",
                             "inputs": {**tts["inputs"], "text": "Ready.", "speaker": [nid, 0]}}
            sub["901"] = {"class_type": "SaveAudio",
                              "inputs": {"audio": ["900", 0], "filename_prefix": "digital_human/voice_fit"}}
            prompts.setdefault(key, sub)
    return prompts


@pytest.fixture(scope="session")
def samples(client: ComfyClient, comfy_server: ComfyServer) -> dict[str, str]:
    """The sample inputs the bundled workflows name, by role -> file name in the server's input folder.

    First fits each reference voice of the bundled workflows (the pack keeps the result on disk), so a
    cold cache costs time here, under VOICE_FIT_TIMEOUT_S, and never inside a test's own timeout."""
    input_dir = Path(comfy_server.base_dir) / "input"
    missing = [name for name in SAMPLE_FILES if not (input_dir / name).is_file()]
    assert not missing, f"the pack did not copy {missing} into {input_dir} at start-up (see the server log)"
    for prompt in _voice_fit_prompts().values():
        start = time.monotonic()
        _, entry = client.run(prompt, VOICE_FIT_TIMEOUT_S)
        assert entry["status"]["status_str"] == "success", node_errors_text(entry)
        print(f"voice fit ({', '.join(sorted(n['class_type'] for n in prompt.values()))}): {time.monotonic() - start:.0f} s")
    voice, portrait, video = SAMPLE_FILES
    return {"voice": voice, "portrait": portrait, "video": video}
