"""Sample inputs the bundled templates name, so every template runs as shipped after `setup`.

Three files, all redistributable, made or fetched by `digital-human setup` into `<models>/samples/`
and copied into ComfyUI's input folder (never over a file the user already has there):

- `digital_human_sample_portrait.png`: NASA's portrait of astronaut Eileen Collins, public domain
  ("no known copyright restrictions"), taken from the scikit-image wheel (skimage/data/astronaut.png)
  by sha256, the way the face models come out of the mediapipe wheel.
- `digital_human_sample_voice.wav`: ~24 s of English the pack speaks itself with the bundled Kokoro
  voice `jm_kumo` (Kokoro-82M weights and voices: Apache-2.0), no imitation.
- `digital_human_sample_talking.mp4`: the portrait animated by the pack's own `portrait` model on
  that voice clip (H.264 + AAC, 25 fps): >= 20 s of "talking footage with a face", enough for
  TrainAvatar's minimum. It is synthetic: a clone trained on it learns the portrait model's mouth.
"""
from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

from .assets.pypi_fetch import AssetFetchError, download_wheel, extract_members, find_wheel, sha256_file
from .paths import comfyui_home, model_dir

log = logging.getLogger(__name__)

PORTRAIT = "digital_human_sample_portrait.png"
VOICE = "digital_human_sample_voice.wav"
TALKING = "digital_human_sample_talking.mp4"
SAMPLE_FILES = (VOICE, PORTRAIT, TALKING)

SKIMAGE_REQUIREMENT = "scikit-image==0.26.0"
SKIMAGE_WHEEL_ARGS = ["--python-version", "3.11", "--platform", "manylinux_2_28_x86_64"]  # one fixed wheel
PORTRAIT_MEMBER = "skimage/data/astronaut.png"
PORTRAIT_SHA256 = "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5"
VOICE_NAME = "jm_kumo"  # of the five bundled Kokoro voices, the one that speaks English best
VOICE_TEXT = ("Hello, I am the sample voice of the digital human pack. I was spoken by a bundled Kokoro voice, "
              "so you can try every template right away. Replace me with a clip of your own voice: ten to "
              "thirty seconds of clear speech works best. Then type any text, and your digital twin will say "
              "it with your face and your voice.")
LICENCES = {
    PORTRAIT: "NASA photograph of astronaut Eileen Collins, public domain (no known copyright restrictions); "
              f"from {SKIMAGE_REQUIREMENT} ({PORTRAIT_MEMBER})",
    VOICE: f"spoken by this pack with the Kokoro-82M voice {VOICE_NAME} (Apache-2.0)",
    TALKING: f"{PORTRAIT} animated by this pack's portrait model on {VOICE}",
}


def samples_dir() -> Path:
    return model_dir("samples")


def _portrait(folder: Path, wheel_dir: Path | None) -> Path:
    target = folder / PORTRAIT
    if target.is_file() and sha256_file(target) == PORTRAIT_SHA256:
        return target
    members = {PORTRAIT_MEMBER: PORTRAIT}
    wheel = find_wheel(Path(wheel_dir), "scikit_image") if wheel_dir else None
    if wheel is not None:
        extract_members(wheel, members, folder)
    else:
        with tempfile.TemporaryDirectory(prefix="dh-skimage-") as tmp:
            extract_members(download_wheel(SKIMAGE_REQUIREMENT, Path(tmp), SKIMAGE_WHEEL_ARGS), members, folder)
    got = sha256_file(target)
    if got != PORTRAIT_SHA256:
        target.unlink(missing_ok=True)
        raise AssetFetchError(f"{PORTRAIT_MEMBER} from {SKIMAGE_REQUIREMENT} has sha256 {got}, expected "
                              f"{PORTRAIT_SHA256}; the wheel is not the expected release.")
    return target


def _voice(folder: Path) -> Path:
    target = folder / VOICE
    if not target.is_file():
        from .nodes.voice_nodes import TRT_TTS

        # No speaker: the bundled voice as it is (synthesize_to_file writes atomically).
        TRT_TTS().synthesize_to_file(VOICE_TEXT, None, target, language="en", voice=VOICE_NAME)
    return target


def _talking(folder: Path, portrait: Path, voice: Path) -> Path:
    target = folder / TALKING
    if target.is_file():
        return target
    import numpy as np
    from PIL import Image

    from .audio import decode_audio
    from .talking_head.registry import generate_crops
    from .talking_head.render_video import render_talking_video
    from .nodes.image_convert import uint8_to_image
    from .nodes.video_nodes import FaceAlign

    fps = 25.0
    wave, rate = decode_audio(voice)
    with Image.open(portrait) as img:
        frames = np.asarray(img.convert("RGB"))[None]
    faces, _, _ = FaceAlign().align(uint8_to_image(frames), fps)
    gen = generate_crops(faces, wave, rate, "portrait", fps)
    render_talking_video(gen, wave, rate, target)  # the mux writes through a temporary name
    return target


def install_samples(wheel_dir: Path | None = None) -> dict[str, Path]:
    """Make (or keep) the three sample files under `<models>/samples/`; copy them into ComfyUI's input
    folder when this pack sits in `<ComfyUI>/custom_nodes/`. Returns the sample paths."""
    folder = samples_dir()
    portrait = _portrait(folder, wheel_dir)
    voice = _voice(folder)
    talking = _talking(folder, portrait, voice)
    (folder / "LICENCES.json").write_text(json.dumps(LICENCES, indent=2) + "\n", encoding="utf-8")
    paths = {"portrait": portrait, "voice": voice, "talking_video": talking}
    comfy_input = guess_comfy_input_dir()
    if comfy_input is not None:
        for name in copy_samples_to(comfy_input):
            log.info("sample %s copied into %s", name, comfy_input)
    return paths


def guess_comfy_input_dir() -> Path | None:
    """`<ComfyUI>/input` when this pack is installed as `<ComfyUI>/custom_nodes/<pack>` (setup runs
    outside ComfyUI, so folder_paths is not there to ask)."""
    home = comfyui_home()
    candidate = home / "input" if home is not None else None
    return candidate if candidate is not None and candidate.is_dir() else None


def copy_samples_to(input_dir: Path) -> list[str]:
    """Copy the samples that `setup` made into `input_dir`, skipping names that already exist there
    (a user's file of the same name is never overwritten). Returns the names copied."""
    source = model_dir("samples")
    copied = []
    for name in SAMPLE_FILES:
        src, dst = source / name, Path(input_dir) / name
        if not src.is_file() or dst.exists() or dst.is_symlink():
            continue
        tmp = dst.with_name(f".{name}.partial")
        shutil.copyfile(src, tmp)
        tmp.replace(dst)  # nobody lists a half-copied sample
        copied.append(name)
    return copied


def install_into_comfy_input() -> list[str]:
    """On ComfyUI start-up: put the samples into its input folder (if `setup` made them and the user
    has no file of that name). Never raises: a missing sample only means the user uploads a file."""
    try:
        import folder_paths  # type: ignore[import-not-found]
    except ImportError:
        return []  # not inside ComfyUI (CLI, tests)
    try:
        copied = copy_samples_to(Path(folder_paths.get_input_directory()))
    except Exception as exc:  # start-up must not fail over sample files
        log.warning("digital_human: sample inputs not copied into ComfyUI's input folder: %s", exc)
        return []
    if copied:
        log.info("digital_human: sample inputs for the bundled templates copied: %s", ", ".join(copied))
    return copied
