"""Wav2Lip in a real ComfyUI: the bundled `lipsync_video_wav2lip` workflow posted as shipped.

Without the user's checkpoint it is refused when queued, naming both checkpoint files and where they go. With a
checkpoint in the release's format (seeded random weights of the real architecture, DESIGN 5b) a second server
runs it to an MP4: the pixels of the mouth are noise, every step of the plumbing is real (checkpoint located and
strictly loaded, mel windows, box geometry, generator, paste-back, smoothing, encoding).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import (ARTIFACTS, WORKFLOWS, ComfyClient, ComfyError, ComfyServer, load_api_workflow,
                     node_errors_text, server_with_user_files)
from media_probe import check_media, probe

WORKFLOW = WORKFLOWS / "api" / "lipsync_video_wav2lip.json"
RUN_TIMEOUT_S = 1800.0  # a bound, not a speed check (the shared 2-core CPU)


def test_without_the_checkpoint_the_workflow_is_refused_when_queued(client: ComfyClient, models_root: Path,
                                                                     samples: dict[str, str]) -> None:
    if (models_root / "wav2lip").exists():
        pytest.skip(f"{models_root}/wav2lip exists: this test needs a models folder without a Wav2Lip checkpoint")
    with pytest.raises(ComfyError) as caught:
        client.queue(load_api_workflow(WORKFLOW))
    body = json.dumps(caught.value.body)
    assert caught.value.status == 400, body
    for name in ("wav2lip/wav2lip.pth", "wav2lip/wav2lip_gan.pth", "nothing is downloaded", "non-commercial"):
        assert name in body, f"{name} not named in the refusal: {body[:2000]}"
    assert str(models_root) not in body  # no server path


@pytest.fixture(scope="module")
def wav2lip_server(comfy_dir: Path, models_root: Path, tmp_path_factory: pytest.TempPathFactory):
    from digital_human.engines.wav2lip.random_release import write_release

    with server_with_user_files(comfy_dir, models_root, tmp_path_factory.mktemp, "wav2lip",
                                lambda root: write_release(root, ("wav2lip",), seed=0)) as server:
        yield server


def test_with_a_release_format_checkpoint_the_workflow_makes_an_mp4(wav2lip_server: ComfyServer,
                                                                     samples: dict[str, str]) -> None:
    client = ComfyClient(wav2lip_server.url, timeout=60)
    client.connect_ws()
    try:
        prompt = load_api_workflow(WORKFLOW)
        prompt_id, entry = client.run(prompt, RUN_TIMEOUT_S)
        assert entry["status"]["status_str"] == "success", node_errors_text(entry)
        head = next(nid for nid, n in prompt.items() if n["class_type"] == "TalkingHeadVideo")
        ui = entry["outputs"][head]
        assert ui.get("animated") == [True] and ui["images"][0]["filename"].endswith(".mp4"), ui
        assert "wav2lip" in json.dumps(ui.get("text", [])).lower(), ui.get("text")  # the report says what ran
        out = ARTIFACTS / WORKFLOW.stem
        out.mkdir(parents=True, exist_ok=True)
        path = out / ui["images"][0]["filename"]
        path.write_bytes(client.view(ui["images"][0]))
        probed = check_media(path)  # H.264 + AAC, yuv420p, even size, A/V lengths within a frame
        source = probe(Path(wav2lip_server.base_dir) / "input" / samples["video"])
        assert abs(probed.fps - source.fps) < 0.01, f"{probed.fps} fps, the video's clock is {source.fps}"
        assert probed.video_seconds > 1.0, f"only {probed.video_seconds:.2f} s"
        progressed = {m["data"]["node"] for m in client.events.of(prompt_id, "progress")}
        assert head in progressed, "no progress from the Wav2Lip node"
    finally:
        client.close()
