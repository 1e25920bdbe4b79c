"""CosyVoice 3 in a real ComfyUI: the bundled `voice_clone_cosyvoice3` workflow posted as shipped.

Without the user's Fun-CosyVoice3-0.5B folder it is refused when queued, with the message that lists each
missing file and where it goes. With a folder laid out exactly like the release (seeded random weights of
a reduced configuration of the same architecture, made from the CI parity fixture; DESIGN 5b) a second
server runs it to a saved audio file: the speech is noise, every step of the plumbing is real (files
checked and strictly loaded, prompt features, the speaker state in DH_SPEAKER, LM sampling, flow, HiFT).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness import (ARTIFACTS, PACK_ROOT, WORKFLOWS, ComfyClient, ComfyError, ComfyServer, load_api_workflow,
                     node_errors_text, server_with_user_files)

WORKFLOW = WORKFLOWS / "api" / "voice_clone_cosyvoice3.json"
FIXTURE = PACK_ROOT / "tests" / "fixtures" / "cosyvoice" / "reduced_v3.npz"
RUN_TIMEOUT_S = 1200.0  # a bound, not a speed check (the shared 2-core CPU)
MISSING_FILE_NAMES = ("cosyvoice3.yaml", "llm.pt", "flow.pt", "hift.pt", "campplus.onnx", "speech_tokenizer_v3.onnx")


def test_without_the_files_the_workflow_is_refused_when_queued(client: ComfyClient, models_root: Path,
                                                                samples: dict[str, str]) -> None:
    if (models_root / "cosyvoice" / "Fun-CosyVoice3-0.5B").exists():
        pytest.skip(f"{models_root}/cosyvoice/Fun-CosyVoice3-0.5B exists: this test needs a models folder without it")
    with pytest.raises(ComfyError) as caught:
        client.queue(load_api_workflow(WORKFLOW))
    body = json.dumps(caught.value.body)
    assert caught.value.status == 400, body
    for name in MISSING_FILE_NAMES:  # every missing file is named, with where it goes
        assert name in body, f"{name} not named in the refusal: {body[:2000]}"
    assert "nothing is downloaded" in body
    assert "models/digital_human/cosyvoice/Fun-CosyVoice3-0.5B" in body and str(models_root) not in body


def speaking_head(llm_pt: Path) -> None:
    """Random weights that speak: the reduced table has 100 speech rows and CosyVoice 3's 200 stop rows, so
    seeded random logits end the utterance at once (2/3 of the draws stop). Zero the stop rows of the head and
    widen the speech rows' logits, still random weights in the release's format and shapes."""
    import torch

    state = torch.load(llm_pt, map_location="cpu", weights_only=True)
    head = state["llm_decoder.weight"]
    speech = head.shape[0] - 200
    head[:speech] *= 4.0
    head[speech:] = 0.0
    torch.save(state, llm_pt)


@pytest.fixture(scope="module")
def cosyvoice3_server(comfy_dir: Path, models_root: Path, tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("transformers", reason="the cosyvoice extra (transformers, pyyaml) is not installed")
    from digital_human.engines.cosyvoice.parity3 import write_release_from_fixture

    fixture = dict(np.load(FIXTURE, allow_pickle=False))

    def write(root: Path) -> None:
        folder = write_release_from_fixture(fixture, root / "cosyvoice" / "Fun-CosyVoice3-0.5B")
        speaking_head(folder / "llm.pt")

    with server_with_user_files(comfy_dir, models_root, tmp_path_factory.mktemp, "cosyvoice", write) as server:
        yield server


def test_with_a_release_laid_out_folder_the_workflow_saves_speech(cosyvoice3_server: ComfyServer,
                                                                  samples: dict[str, str]) -> None:
    import soundfile as sf

    client = ComfyClient(cosyvoice3_server.url, timeout=60)
    client.connect_ws()
    try:
        prompt = load_api_workflow(WORKFLOW)  # as shipped
        prompt_id, entry = client.run(prompt, RUN_TIMEOUT_S)
        assert entry["status"]["status_str"] == "success", node_errors_text(entry)
        save = next(nid for nid, n in prompt.items() if n["class_type"] == "SaveAudio")
        item = entry["outputs"][save]["audio"][0]
        out = ARTIFACTS / WORKFLOW.stem
        out.mkdir(parents=True, exist_ok=True)
        path = out / item["filename"]
        path.write_bytes(client.view(item))
        wave, rate = sf.read(path, dtype="float32")
        assert rate == 24000, rate  # CosyVoice 3's rate, not Kokoro's resampled one
        assert len(wave) >= rate * 0.2 and np.isfinite(wave).all() and np.abs(wave).max() > 0
        # the TTS node's report says which engine spoke (not the Kokoro default)
        tts = next(nid for nid, n in prompt.items() if n["class_type"] == "TRT_TTS")
        report = json.dumps(entry["outputs"][tts].get("text", []))
        assert "cosyvoice" in report.lower(), report[:2000]
    finally:
        client.close()


def _with_tts_inputs(prompt: dict, **inputs) -> dict:
    for node in prompt.values():
        if node["class_type"] == "TRT_TTS":
            node["inputs"].update(inputs)
    return prompt


def test_an_instruction_for_kokoro_is_refused_when_queued(client: ComfyClient) -> None:
    prompt = _with_tts_inputs(load_api_workflow(WORKFLOW), engine="kokoro", instruction="Speak slowly.")
    with pytest.raises(ComfyError) as caught:
        client.queue(prompt)
    body = json.dumps(caught.value.body)
    assert caught.value.status == 400 and "the TTS engine 'kokoro' does not take" in body, body[:2000]


def test_cosyvoice_auto_picks_the_v3_folder_and_takes_an_instruction(cosyvoice3_server: ComfyServer,
                                                                     samples: dict[str, str]) -> None:
    client = ComfyClient(cosyvoice3_server.url, timeout=60)
    client.connect_ws()
    try:
        prompt = _with_tts_inputs(load_api_workflow(WORKFLOW), engine="cosyvoice-auto", instruction="Speak slowly.")
        for node in prompt.values():
            if node["class_type"] == "ExtractSpeakerEmbedding":
                node["inputs"]["engine"] = "cosyvoice-auto"
        prompt_id, entry = client.run(prompt, RUN_TIMEOUT_S)
        assert entry["status"]["status_str"] == "success", node_errors_text(entry)
        tts = next(nid for nid, n in prompt.items() if n["class_type"] == "TRT_TTS")
        report = json.dumps(entry["outputs"][tts].get("text", []), ensure_ascii=False)
        assert "engine cosyvoice3 (picked by cosyvoice-auto" in report and "CosyVoice 3 instruct" in report, report
    finally:
        client.close()
