"""Sonic in a real ComfyUI: the bundled `talking_photo_sonic` workflow. Without the user's files it is refused
when queued, naming each missing file and where it goes. With a release laid out exactly like Sonic's (seeded
random weights of a reduced configuration, DESIGN 5b) a second server runs it to an MP4 (2 steps at 128 px here
to bound the CPU time; the head is noise, the plumbing real: files located and strictly loaded, whisper windows,
the windowed three-branch denoising, temporal VAE, RIFE, encoding)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import (ARTIFACTS, WORKFLOWS, ComfyClient, ComfyError, ComfyServer, load_api_workflow,
                     node_errors_text, server_with_user_files)
from media_probe import check_media

WORKFLOW = WORKFLOWS / "api" / "talking_photo_sonic.json"
RUN_TIMEOUT_S = 1800.0  # a bound, not a speed check (the shared 2-core CPU)
MISSING_FILE_NAMES = ("Sonic/unet.pth", "Sonic/audio2token.pth", "RIFE/flownet.pkl",
                      "stable-video-diffusion-img2vid-xt/unet/config.json", "whisper-tiny/config.json")


def test_without_the_files_the_workflow_is_refused_when_queued(client: ComfyClient, models_root: Path,
                                                                samples: dict[str, str]) -> None:
    if (models_root / "sonic").exists():
        pytest.skip(f"{models_root}/sonic exists: this test needs a models folder without Sonic files")
    with pytest.raises(ComfyError) as caught:
        client.queue(load_api_workflow(WORKFLOW))
    body = json.dumps(caught.value.body)
    assert caught.value.status == 400, body
    for name in MISSING_FILE_NAMES:
        assert name in body, f"{name} not named in the refusal: {body[:2000]}"
    assert "nothing is downloaded" in body and "CC BY-NC-SA 4.0" in body
    assert "models/digital_human/sonic" in body and str(models_root) not in body  # no server path


@pytest.fixture(scope="module")
def sonic_server(comfy_dir: Path, models_root: Path, tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("diffusers", reason="the sonic extra (diffusers, transformers) is not installed")
    pytest.importorskip("transformers", reason="the sonic extra (diffusers, transformers) is not installed")
    from digital_human.engines.sonic.random_release import write_random_release

    with server_with_user_files(comfy_dir, models_root, tmp_path_factory.mktemp, "sonic",
                                lambda root: write_random_release(root, seed=0, reduced=True)) as server:
        yield server


def test_with_a_release_laid_out_checkpoint_the_workflow_makes_an_mp4(sonic_server: ComfyServer,
                                                                       samples: dict[str, str]) -> None:
    client = ComfyClient(sonic_server.url, timeout=60)
    client.connect_ws()
    try:
        prompt = load_api_workflow(WORKFLOW)
        head = next(nid for nid, n in prompt.items() if n["class_type"] == "TalkingHeadVideo")
        prompt[head]["inputs"].update(steps=2, resolution=128)
        prompt_id, entry = client.run(prompt, RUN_TIMEOUT_S)
        assert entry["status"]["status_str"] == "success", node_errors_text(entry)
        ui = entry["outputs"][head]
        assert ui.get("animated") == [True] and ui["images"][0]["filename"].endswith(".mp4"), ui
        assert "sonic" in json.dumps(ui.get("text", [])).lower(), ui.get("text")
        out = ARTIFACTS / WORKFLOW.stem
        out.mkdir(parents=True, exist_ok=True)
        path = out / ui["images"][0]["filename"]
        path.write_bytes(client.view(ui["images"][0]))
        probed = check_media(path)  # H.264 + AAC, yuv420p, even size, A/V lengths within a frame
        assert abs(probed.fps - 25.0) < 0.01 and probed.video_seconds > 1.0, probed
    finally:
        client.close()
