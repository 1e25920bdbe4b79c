"""Template thumbnails that show the result, not the graph: example_workflows/<card title>.jpg.

ComfyUI's template browser shows `<template>.jpg` next to each `example_workflows/<template>.json`. This
renders what each template makes with the pack's own CLI on the sample inputs that `setup` installs
(models/digital_human/samples/), and saves one frame of it:

- the talking-photo templates: `digital-human animate` of the sample portrait speaking the sample voice
  clip, the frame where the mouth is most open;
- clone_from_video: a frame of the sample talking video (the portrait model's output the clone trains on);
- lipsync_video_musetalk: the same frame with a caption saying the template needs the user's MuseTalk files
- lipsync_video_wav2lip: the same frame, its caption saying the template needs the user's Wav2Lip checkpoint
  (the pack ships none, so it cannot show MuseTalk's own output);
- lipsync_video_latentsync: the same frame, its caption saying the template needs the user's LatentSync files
  (the pack ships none either);
- talking_photo_sonic: the sample portrait with a caption saying the template needs the user's Sonic files
  (non-commercial licences; the pack ships none, so it cannot show Sonic's own output);
- voice_only: the waveform of `digital-human speak` of the template's text in the sample voice;
- voice_clone_cosyvoice: the waveform of the sample voice clip (its reference), captioned that the template
  needs the user's CosyVoice files (the pack ships none, so it cannot show CosyVoice's own output);
  voice_clone_cosyvoice3 likewise, for the Fun-CosyVoice3 files.

    DIGITAL_HUMAN_MODELS=~/.cache/digital_human/models python tools/make_thumbnails.py [--only NAME ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "comfyui"))
from harness import WORKFLOWS, ui_template  # noqa: E402

SIZE = 512


# The checkout is the package whatever its folder is called: import it (here and in the CLI runs) as
# digital_human through a symlink.
_IMPORT_DIR = Path(tempfile.mkdtemp(prefix="dh-thumb-pp-"))
(_IMPORT_DIR / "digital_human").symlink_to(ROOT, target_is_directory=True)


def _pack(*args: str) -> dict:
    """Run `python -m digital_human <args> --json` (the pack this checkout holds); its JSON report."""
    env = {**os.environ, "PYTHONPATH": str(_IMPORT_DIR)}
    done = subprocess.run([sys.executable, "-m", "digital_human", *args, "--json"], capture_output=True, text=True,
                          env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"digital_human {args[0]} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _frames(video: Path) -> np.ndarray:
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(video))
    meta = next(reader)
    width, height = meta["size"]
    return np.stack([np.frombuffer(f, np.uint8).reshape(height, width, 3) for f in reader])


def _most_open_mouth(frames: np.ndarray) -> np.ndarray:
    """The frame that differs most from the first one (the still portrait): the mouth is open there."""
    diffs = np.abs(frames.astype(np.int16) - frames[:1].astype(np.int16)).mean(axis=(1, 2, 3))
    return frames[int(np.argmax(diffs))]


def _save(image: Image.Image, name: str) -> Path:
    target = ui_template(name).with_suffix(".jpg")
    image.convert("RGB").resize((SIZE, SIZE), Image.LANCZOS).save(target, format="JPEG", quality=85)
    print(f"{name}: {target.relative_to(ROOT)}")
    return target


def _waveform(wav: Path) -> Image.Image:
    import soundfile as sf

    wave, _ = sf.read(str(wav), dtype="float32", always_2d=True)
    wave = wave.mean(axis=1)
    columns = np.array_split(wave, SIZE)
    peaks = np.array([np.abs(c).max() if len(c) else 0.0 for c in columns])
    peaks = peaks / max(float(peaks.max()), 1e-6)
    image = Image.new("RGB", (SIZE, SIZE), (24, 32, 40))
    draw = ImageDraw.Draw(image)
    mid = SIZE // 2
    for x, peak in enumerate(peaks):
        half = int(peak * SIZE * 0.35)
        draw.line([(x, mid - half), (x, mid + half)], fill=(96, 196, 255))
    return image


def _captioned(image: Image.Image, caption: str) -> Image.Image:
    """`image` at the thumbnail size with `caption` on a dark band at the bottom."""
    image = image.convert("RGB").resize((SIZE, SIZE), Image.LANCZOS)
    draw = ImageDraw.Draw(image)
    band = SIZE // 8
    draw.rectangle([(0, SIZE - band), (SIZE, SIZE)], fill=(24, 32, 40))
    draw.text((12, SIZE - band + band // 3), caption, fill=(255, 255, 255))
    return image


def _tts_text(name: str) -> str:
    prompt = json.loads((WORKFLOWS / "api" / f"{name}.json").read_text())
    return next(n["inputs"]["text"] for n in prompt.values() if n["class_type"] == "TRT_TTS")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", help="API workflow names (default: every template)")
    args = parser.parse_args()
    sys.path.insert(0, str(_IMPORT_DIR))
    from digital_human.paths import models_root
    from digital_human.samples import PORTRAIT, TALKING, VOICE

    samples = models_root() / "samples"
    missing = [n for n in (PORTRAIT, VOICE, TALKING) if not (samples / n).is_file()]
    if missing:
        raise SystemExit(f"sample inputs missing in {samples}: run `python -m digital_human setup` first")
    wanted = set(args.only or [p.stem for p in (WORKFLOWS / "api").glob("*.json")])
    with tempfile.TemporaryDirectory(prefix="dh-thumbs-") as tmp:
        if wanted & {"clone_from_photo", "clone_from_photo_fast"}:
            video = Path(tmp) / "photo.mp4"
            _pack("animate", "--audio", str(samples / VOICE), "--face", str(samples / PORTRAIT), "--out", str(video))
            photo_frame = Image.fromarray(_most_open_mouth(_frames(video)))
            for name in wanted & {"clone_from_photo", "clone_from_photo_fast"}:
                _save(photo_frame, name)
        if wanted & {"clone_from_video", "lipsync_video_musetalk", "lipsync_video_wav2lip",
                     "lipsync_video_latentsync"}:
            talking_frame = Image.fromarray(_most_open_mouth(_frames(samples / TALKING)))
            if "clone_from_video" in wanted:
                _save(talking_frame, "clone_from_video")
            if "lipsync_video_musetalk" in wanted:
                _save(_captioned(talking_frame, "MuseTalk 1.5 lip-sync - needs your MuseTalk files"),
                      "lipsync_video_musetalk")
            if "lipsync_video_wav2lip" in wanted:
                _save(_captioned(talking_frame, "Wav2Lip lip-sync - needs your Wav2Lip checkpoint"),
                      "lipsync_video_wav2lip")
            if "lipsync_video_latentsync" in wanted:
                _save(_captioned(talking_frame, "LatentSync lip-sync - needs your LatentSync files"),
                      "lipsync_video_latentsync")
        if "voice_only" in wanted:
            speech = Path(tmp) / "speech.wav"
            _pack("speak", "--voice", str(samples / VOICE), "--no-imitate", "--text", _tts_text("voice_only"),
                  "--out", str(speech))
            _save(_waveform(speech), "voice_only")
        if "talking_photo_sonic" in wanted:  # the pack ships no Sonic weights: the input photo, captioned
            portrait = Image.open(samples / PORTRAIT).convert("RGB")
            _save(_captioned(portrait, "Sonic talking photo - needs your Sonic files (non-commercial)"),
                  "talking_photo_sonic")
        if "voice_clone_cosyvoice" in wanted:
            _save(_captioned(_waveform(samples / VOICE), "CosyVoice 2 voice clone - needs your CosyVoice files"),
                  "voice_clone_cosyvoice")
        if "voice_clone_cosyvoice3" in wanted:
            _save(_captioned(_waveform(samples / VOICE), "CosyVoice 3 voice clone - needs your Fun-CosyVoice3 files"),
                  "voice_clone_cosyvoice3")


if __name__ == "__main__":
    main()
