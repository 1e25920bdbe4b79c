"""LatentSync in a real ComfyUI: the bundled `lipsync_video_latentsync` workflow posted as shipped.

Without the user's files it is refused when queued, naming every missing file relative to models/digital_human
(no server path). With a release laid out exactly like the real one (seeded random weights of a reduced
configuration of the same architecture, DESIGN 5b; engines/latentsync/random_release.py) a second server runs it
to an MP4: the pixels of the mouth are noise, every step of the plumbing is real (files located and strictly
loaded, whisper features, LatentSync's face geometry from the mesh, UNet over 16-frame windows with DDIM and
guidance, VAE, restore, paste-back, smoothing, encoding). Two DDIM steps (DIGITAL_HUMAN_LATENTSYNC_STEPS, the
model's documented setting) keep it to minutes on a CPU.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import (ARTIFACTS, WORKFLOWS, ComfyClient, ComfyError, ComfyServer, load_api_workflow,
                     node_errors_text, server_with_user_files)
from media_probe import check_media, probe

WORKFLOW = WORKFLOWS / "api" / "lipsync_video_latentsync.json"
RUN_TIMEOUT_S = 1800.0  # a bound, not a speed check (the shared 2-core CPU)
# Every file of the release (engines/latentsync/files.REQUIRED), as the refusal places it under models/digital_human,
# and the alternatives it names next to them (the 1.5 config, the VAE's .bin)
MISSING_FILE_PATHS = ("latentsync/latentsync_unet.pt", "latentsync/whisper/tiny.pt",
                      "latentsync/configs/unet/stage2_512.yaml", "latentsync/latentsync/utils/mask.png",
                      "latentsync/sd-vae-ft-mse/config.json",
                      "latentsync/sd-vae-ft-mse/diffusion_pytorch_model.safetensors")
ALTERNATIVES = ("configs/unet/stage2.yaml", "sd-vae-ft-mse/diffusion_pytorch_model.bin")


def test_without_the_files_the_workflow_is_refused_when_queued(client: ComfyClient, models_root: Path,
                                                                samples: dict[str, str]) -> None:
    if (models_root / "latentsync").exists():
        pytest.skip(f"{models_root}/latentsync exists: this test needs a models folder without LatentSync files")
    with pytest.raises(ComfyError) as caught:
        client.queue(load_api_workflow(WORKFLOW))
    body = json.dumps(caught.value.body)
    assert caught.value.status == 400, body
    for name in MISSING_FILE_PATHS:  # every missing file is named, with where it goes (relative)
        assert f"models/digital_human/{name}" in body, f"{name} not named in the refusal: {body[:3000]}"
    for name in ALTERNATIVES:
        assert name in body, f"{name} not named in the refusal: {body[:3000]}"
    assert "nothing is downloaded" in body
    assert str(models_root) not in body  # no server path


@pytest.fixture(scope="module")
def latentsync_server(comfy_dir: Path, models_root: Path, tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("diffusers", reason="the latentsync extra (diffusers, transformers, PyYAML) is not installed")
    pytest.importorskip("yaml", reason="the latentsync extra (diffusers, transformers, PyYAML) is not installed")
    from digital_human.engines.latentsync.random_release import write_release

    with server_with_user_files(comfy_dir, models_root, tmp_path_factory.mktemp, "latentsync",
                                lambda root: write_release(root, "reduced", seed=0),
                                env={"DIGITAL_HUMAN_LATENTSYNC_STEPS": "2"}) as server:
        yield server


def test_with_a_release_laid_out_checkpoint_the_workflow_makes_an_mp4(latentsync_server: ComfyServer,
                                                                       samples: dict[str, str]) -> None:
    client = ComfyClient(latentsync_server.url, timeout=60)
    client.connect_ws()
    try:
        # as shipped: the sample video (24 s) is also the voice the `samples` fixture fitted, so no second fit
        prompt = load_api_workflow(WORKFLOW)
        prompt_id, entry = client.run(prompt, RUN_TIMEOUT_S)
        assert entry["status"]["status_str"] == "success", node_errors_text(entry)
        head = next(nid for nid, n in prompt.items() if n["class_type"] == "TalkingHeadVideo")
        ui = entry["outputs"][head]
        assert ui.get("animated") == [True] and ui["images"][0]["filename"].endswith(".mp4"), ui
        assert "latentsync" in json.dumps(ui.get("text", [])).lower(), ui.get("text")  # the report says what ran
        out = ARTIFACTS / WORKFLOW.stem
        out.mkdir(parents=True, exist_ok=True)
        path = out / ui["images"][0]["filename"]
        path.write_bytes(client.view(ui["images"][0]))
        probed = check_media(path)  # H.264 + AAC, yuv420p, even size, A/V lengths within a frame
        source = probe(Path(latentsync_server.base_dir) / "input" / samples["video"])
        assert abs(probed.fps - source.fps) < 0.01, f"{probed.fps} fps, the video's clock is {source.fps}"
        assert probed.video_seconds > 1.0, f"only {probed.video_seconds:.2f} s"
        progressed = {m["data"]["node"] for m in client.events.of(prompt_id, "progress")}
        assert head in progressed, "no progress from the LatentSync node"
    finally:
        client.close()
