"""Sample inputs and the bundled templates: every template names files the pack ships after `setup`."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from digital_human import samples

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "comfyui"))
from harness import TEMPLATE_TITLES, UI_TEMPLATES, WORKFLOWS, api_workflow, ui_template  # noqa: E402

API = sorted((WORKFLOWS / "api").glob("*.json"))
FILE_INPUTS = ("audio_file", "image", "video_file", "file")


@pytest.mark.parametrize("path", API, ids=[p.stem for p in API])
def test_api_workflow_names_only_sample_inputs(path: Path) -> None:
    prompt = json.loads(path.read_text())
    names = [node["inputs"][key] for node in prompt.values() for key in FILE_INPUTS
             if isinstance(node["inputs"].get(key), str)]
    assert names and set(names) <= set(samples.SAMPLE_FILES), names


@pytest.mark.parametrize("path", API, ids=[p.stem for p in API])
def test_ui_template_explains_itself(path: Path) -> None:
    ui = ui_template(path.stem)
    assert path.stem in TEMPLATE_TITLES and ui.is_file(), f"no UI export {ui.name} for {path.name}"
    assert api_workflow(ui) == path
    assert ui.with_suffix(".jpg").read_bytes()[:3] == b"\xff\xd8\xff", f"{ui.stem}.jpg: no JPEG thumbnail"
    graph = json.loads(ui.read_text())
    notes = [n for n in graph["nodes"] if n["type"] == "MarkdownNote"]
    assert len(notes) == 1 and "setup" in notes[0]["widgets_values"][0]
    # Every working node sits inside one of the titled groups.
    boxes = [g["bounding"] for g in graph["groups"]]
    assert len(boxes) >= 2 and all(g["title"] for g in graph["groups"])
    for node in graph["nodes"]:
        if node["type"] == "MarkdownNote":
            continue
        x, y = node["pos"][0], node["pos"][1]
        assert any(bx <= x <= bx + bw and by <= y <= by + bh for bx, by, bw, bh in boxes), node["type"]
    widgets = json.dumps([n.get("widgets_values") for n in graph["nodes"]])
    prompt = json.loads(path.read_text())
    for node in prompt.values():
        for key in FILE_INPUTS:
            if isinstance(node["inputs"].get(key), str):
                assert node["inputs"][key] in widgets, f"{ui.name} does not name {node['inputs'][key]}"


def test_only_templates_in_example_workflows() -> None:
    """ComfyUI lists every .json there as a template: no stray files, and one per API workflow."""
    assert sorted(p.stem for p in UI_TEMPLATES.glob("*.json")) == sorted(TEMPLATE_TITLES[p.stem] for p in API)


def test_copy_samples_never_overwrites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    models = tmp_path / "models"
    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(models))
    source = models / "samples"
    source.mkdir(parents=True)
    for name in samples.SAMPLE_FILES:
        (source / name).write_bytes(b"sample " + name.encode())
    inbox = tmp_path / "input"
    inbox.mkdir()
    (inbox / samples.VOICE).write_bytes(b"the user's own clip")
    copied = samples.copy_samples_to(inbox)
    assert sorted(copied) == sorted(set(samples.SAMPLE_FILES) - {samples.VOICE})
    assert (inbox / samples.VOICE).read_bytes() == b"the user's own clip"
    assert (inbox / samples.PORTRAIT).read_bytes() == b"sample " + samples.PORTRAIT.encode()
    assert samples.copy_samples_to(inbox) == []  # nothing left to do
    assert not list(inbox.glob(".*partial"))


def test_copy_samples_without_setup_copies_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(tmp_path / "models"))
    (tmp_path / "input").mkdir()
    assert samples.copy_samples_to(tmp_path / "input") == []
    assert samples.install_into_comfy_input() == []  # outside ComfyUI: a no-op, never an error


def test_installed_samples_are_real_media() -> None:
    """After `setup`: the portrait has a face-sized image, the voice >= 20 s of sound, the video >= 20 s."""
    from digital_human.paths import models_root

    folder = models_root() / "samples"
    if not all((folder / n).is_file() for n in samples.SAMPLE_FILES):
        pytest.skip("run `python -m digital_human setup` (it makes the samples)")
    from PIL import Image

    from digital_human.assets.pypi_fetch import sha256_file
    from digital_human.audio import decode_audio
    from digital_human.media.probe import probe_media

    assert sha256_file(folder / samples.PORTRAIT) == samples.PORTRAIT_SHA256
    with Image.open(folder / samples.PORTRAIT) as img:
        assert img.size == (512, 512)
    wave, rate = decode_audio(folder / samples.VOICE)
    assert wave.shape[-1] / rate >= 20.0 and float(abs(wave).max()) > 0.1
    info = probe_media(folder / samples.TALKING)
    assert info.has_video and info.has_audio and info.video_duration >= 20.0
