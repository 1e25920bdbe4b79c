"""Fail fast: check every input of `run`, `animate` and `speak` before any heavy work.

A missing face file, an empty text or an unwritable output folder used to surface only after the
voice fit and synthesis (minutes). Each function here checks one input in well under a second
(the face check loads the two small face models, which the real run then reuses) and raises
`PreflightError` naming the command-line option and the fix; the CLI turns that into exit code 2
and its JSON error line. Nothing here writes anything except the output check's own probe file,
which it removes.
"""
from __future__ import annotations

import errno
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
# Video frames to look for a face in: key frames spread over the part of the clip the run reads (a clip
# may open on a title or another shot, as the shared sample with several shots does: its first face
# appears after 4 s). Only key frames are decoded (an HEVC phone video's frames in between cost
# seconds each), downscaled: the detector sees a 128-px letterbox and the mesh a 192-px crop anyway.
_VIDEO_PROBES = 8
_PROBE_SIDE = 960
_MIN_PRESENCE = 0.5  # align_faces' default: the mesh's face-presence score that separates faces from not-faces
_DECODE_SIDE = 1920  # JPEG draft size for the check: detection runs on a 128-px letterbox anyway


class PreflightError(ValueError):
    """An input that would make the run fail later; the message names the option and the fix."""


def _existing_file(path: str | os.PathLike[str], option: str) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise PreflightError(f"{option} '{path}' was not found. Check the path.")
    if not p.is_file():
        raise PreflightError(f"{option} '{path}' is not a file (a folder?). Give a file.")
    if p.stat().st_size == 0:
        raise PreflightError(f"{option} '{path}' is empty (0 bytes), probably an interrupted copy. Use another file.")
    return p


def check_voice_clip(path: str | os.PathLike[str], option: str = "--voice") -> float:
    """The reference clip decodes and holds enough speech to clone; returns its seconds of speech."""
    from .audio import load_reference
    from .audio.decode import AudioInputError

    p = _existing_file(path, option)
    try:
        prepared = load_reference(p)
    except AudioInputError as exc:  # not found / corrupt / silent / < 3 s of speech: the message says which
        raise PreflightError(f"{option}: {exc}") from exc
    return float(prepared.speech_seconds)


def check_audio(path: str | os.PathLike[str], option: str = "--audio") -> float:
    """Speech to animate decodes and is not empty; returns its length in seconds."""
    from .audio import decode_audio
    from .audio.decode import AudioInputError

    p = _existing_file(path, option)
    try:
        wave, rate = decode_audio(p)
    except AudioInputError as exc:
        raise PreflightError(f"{option}: {exc}") from exc
    return wave.shape[1] / float(rate)


def check_speaker_file(path: str | os.PathLike[str], option: str = "--speaker") -> None:
    """A saved speaker .npz loads (right format, this pack's speaker encoder)."""
    from .voice.speaker import SpeakerProfile

    p = _existing_file(path, option)
    try:
        SpeakerProfile.load_npz(p)
    except (ValueError, OSError, KeyError) as exc:
        raise PreflightError(f"{option}: {exc}") from exc


def check_text(text: str | None, text_file: str | None, language: str = "auto") -> str:
    """The text (or the text file's) is speakable after normalisation; returns the text.

    Runs the TTS text frontend itself, so what passes here is exactly what synthesis accepts (its
    dictionaries stay loaded for the real run)."""
    from .text.phonemize import phonemize

    option = "--text-file" if text_file else "--text"
    if text_file:
        p = _existing_file(text_file, option)
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise PreflightError(f"--text-file '{text_file}' is not UTF-8 text ({exc.reason}). "
                                 "Save it as UTF-8.") from exc
    if text is None:
        raise PreflightError("no text: give --text or --text-file")
    try:
        phonemize(text, language)
    except ValueError as exc:  # EmptyTextError, NothingSpeakableError, UnsupportedLanguageError
        raise PreflightError(f"{option}: {exc}") from exc
    return text


def check_model(model: str, option: str = "--model") -> None:
    """A talking-head model of the registry that can run now: its files are present (every missing
    one listed) or, for `clone:<name>`, the avatar exists."""
    from .talking_head.registry import model_problem

    problem = model_problem(model)
    if problem:
        raise PreflightError(f"{option} {model}: {problem}")


def check_positive(value: float | None, option: str) -> None:
    """Numbers that must be > 0 when given (fps, speed, seconds)."""
    if value is not None and not value > 0:
        raise PreflightError(f"{option} must be > 0, got {value}")


def _image_rgb(path: Path) -> np.ndarray | None:
    """The photo as RGB uint8, or None when PIL cannot read it (then it may be a video)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img.draft("RGB", (_DECODE_SIDE, _DECODE_SIDE))  # JPEG: decode at reduced size, much faster
            return np.asarray(img.convert("RGB"))
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        return None


def _ppm_frames(data: bytes) -> list[np.ndarray]:
    """Split ffmpeg's image2pipe PPM stream (P6 header, then RGB bytes) into frames."""
    frames, pos = [], 0
    while pos < len(data):
        match = re.match(rb"P6\s+(\d+)\s+(\d+)\s+255\s", data[pos:pos + 64])
        if not match:
            break
        width, height = int(match.group(1)), int(match.group(2))
        start = pos + match.end()
        end = start + width * height * 3
        if end > len(data):
            break
        frames.append(np.frombuffer(data[start:end], np.uint8).reshape(height, width, 3))
        pos = end
    return frames


def _video_frame_at(path: Path, at_seconds: float) -> np.ndarray | None:
    """The frame at `at_seconds` (an accurate seek: decodes from the key frame before it), downscaled."""
    from .media.ffmpeg_tools import base_args

    scale = f"scale='min({_PROBE_SIDE},iw)':'min({_PROBE_SIDE},ih)':force_original_aspect_ratio=decrease"
    cmd = [*base_args(), "-loglevel", "error", "-ss", f"{at_seconds:.3f}", "-i", str(path), "-map", "0:v:0",
           "-frames:v", "1", "-vf", scale, "-f", "image2pipe", "-c:v", "ppm", "pipe:1"]
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return None
    frames = _ppm_frames(proc.stdout)
    return frames[0] if frames else None


def video_probe_frames(path: Path, max_seconds: float, probes: int = _VIDEO_PROBES) -> list[np.ndarray]:
    """Up to `probes` key frames (rotation applied, longest side <= 960) from the first `max_seconds`,
    at least max_seconds/probes apart, the first frame first; one ffmpeg run that decodes nothing else.
    A clip whose only key frame is the first gives one frame."""
    from .media.ffmpeg_tools import base_args, passthrough_args

    gap = max_seconds / probes
    scale = f"scale='min({_PROBE_SIDE},iw)':'min({_PROBE_SIDE},ih)':force_original_aspect_ratio=decrease"
    select = f"select='isnan(prev_selected_t)+gte(t-prev_selected_t\\,{gap:.3f})'"
    cmd = [*base_args(), "-loglevel", "error", "-skip_frame", "nokey", "-t", f"{max_seconds:.3f}", "-i", str(path),
           "-map", "0:v:0", "-vf", f"{select},{scale}", *passthrough_args(), "-frames:v", str(probes),
           "-f", "image2pipe", "-c:v", "ppm", "pipe:1"]
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return []
    return _ppm_frames(proc.stdout)


def count_faces(image: np.ndarray, backend: str = "auto") -> int:
    """Faces the aligner would accept in one RGB frame: detector boxes the mesh confirms as faces."""
    from .engines.face.detect import default_runners, detect_faces, face_landmarks

    run_detector, run_mesh = default_runners(backend=backend)
    boxes = detect_faces(image, run_detector)
    return sum(1 for box in boxes if face_landmarks(image, box, run_mesh)[1] >= _MIN_PRESENCE)


def check_face(path: str | os.PathLike[str], face_index: int = 0, backend: str = "auto",
               option: str = "--face", max_seconds: float = 60.0) -> int:
    """The face file is a decodable photo or video showing at least `face_index + 1` faces; returns
    the number of faces seen. Video: a few single frames spread over its first `max_seconds` are
    checked, not the whole clip (the aligner interpolates frames without a face)."""
    if face_index < 0:
        raise PreflightError(f"--face-index must be >= 0 (0 = the largest face), got {face_index}")
    p = _existing_file(path, option)
    image = _image_rgb(p)
    if image is not None:
        if min(image.shape[:2]) < 32:
            raise PreflightError(f"{option} '{path}' is {image.shape[1]}x{image.shape[0]} px; a face needs a "
                                 "larger photo (at least 32x32 px)")
        found = count_faces(image, backend)
        if found == 0:
            raise PreflightError(f"{option}: no face found in the photo '{path}'. Use a photo with a visible, "
                                 "roughly frontal face.")
        if face_index >= found:
            raise PreflightError(f"--face-index {face_index} asks for face #{face_index + 1} by size, but the photo "
                                 f"'{path}' has {found} face(s); use --face-index 0..{found - 1}")
        return found
    frames = video_probe_frames(p, max_seconds)
    if not frames:
        raise PreflightError(f"{option} '{path}' is neither a decodable image nor a decodable video. "
                             "Use a PNG/JPEG photo or an MP4/MOV/WebM video.")
    seen = []
    for frame in frames:
        seen.append(count_faces(frame, backend))
        if seen[-1] > face_index:
            return seen[-1]
    if len(frames) < _VIDEO_PROBES // 2:  # few key frames (one at the start only): look between them too
        for k in (1, 2, 3):
            frame = _video_frame_at(p, max_seconds * k / 4)
            if frame is None:
                break  # past the end of the clip
            seen.append(count_faces(frame, backend))
            if seen[-1] > face_index:
                return seen[-1]
    if max(seen) == 0:
        raise PreflightError(f"{option}: no face found in the video '{path}' ({len(seen)} frames checked over its "
                             f"first {max_seconds:g} s). Use a video where the person's face is visible.")
    raise PreflightError(f"--face-index {face_index} asks for face #{face_index + 1} by size, but the video "
                         f"'{path}' shows at most {max(seen)} face(s) in the {len(seen)} frames checked; use "
                         f"--face-index 0..{max(seen) - 1}")


def check_output(path: str | os.PathLike[str], option: str = "--out") -> Path:
    """The output's folder exists (created if needed) and takes a file: a probe file is written,
    renamed (the atomic write at the end renames a temporary file too) and removed. Folders this
    check created are removed again when it fails, so a refused run leaves nothing behind."""
    out = Path(path).expanduser()
    if out.is_dir():
        raise PreflightError(f"{option} '{path}' is a folder; give a file name inside it")
    parent = out.parent
    created = []
    probe = None
    try:
        missing = [d for d in [parent, *parent.parents] if not d.exists()]
        for folder in reversed(missing):
            folder.mkdir()
            created.append(folder)
        fd, name = tempfile.mkstemp(dir=parent, prefix=".dh_preflight.", suffix=".partial")
        probe = Path(name)
        with os.fdopen(fd, "wb") as handle:
            handle.write(b"\0")
        renamed = probe.with_suffix(".done")
        os.replace(probe, renamed)
        probe = renamed
    except OSError as exc:
        for folder in reversed(created):
            try:
                folder.rmdir()
            except OSError:
                pass
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.ENOTDIR, errno.EEXIST):
            reason = "a file is in the way of the folder path"
        raise PreflightError(f"{option}: cannot write into the folder '{parent}' ({reason}). Pick a folder "
                             "you can write to.") from exc
    finally:
        if probe is not None:
            probe.unlink(missing_ok=True)
    return out


# --- one check list per command (the CLI calls these first) -------------------------------------------
def check_speak_args(args: Any) -> str:
    """`speak`: text, voice clip or saved speaker, output; returns the text."""
    check_positive(args.speed, "--speed")
    text = check_text(args.text, args.text_file, args.language)
    if args.speaker:
        check_speaker_file(args.speaker)
    elif args.voice:
        check_voice_clip(args.voice)
    check_output(args.out)  # last: it may create the folder, and a refused run must leave nothing
    return text


def _check_face_args(args: Any) -> None:
    check_positive(args.fps, "--fps")
    check_positive(args.max_seconds, "--max-seconds")
    if args.smooth < 0:
        raise PreflightError(f"--smooth must be >= 0 (0 = off), got {args.smooth}")
    check_model(args.model)
    check_face(args.face, face_index=args.face_index, backend=args.backend, max_seconds=args.max_seconds)


def check_animate_args(args: Any) -> None:
    """`animate`: speech audio, face, model, output."""
    check_audio(args.audio)
    _check_face_args(args)
    check_output(args.out)


def check_engine(engine: str, option: str = "--engine") -> None:
    """A TTS engine that can run now: its pip extra is installed and its files are in place (one
    message naming the `pip install` line and every missing file)."""
    from .voice.engines import engine_problem

    problem = engine_problem(engine)
    if problem:
        raise PreflightError(f"{option} {engine}: {problem}")


def check_optional_parts(args: Any) -> None:
    """The model (`--model`) and TTS engine (`--engine`) the command uses have their extra installed
    and their files in place. Milliseconds: modules are found, not imported; files are stat'ed."""
    problems = []
    for option, check in (("model", check_model), ("engine", check_engine)):
        value = getattr(args, option, None)
        if value:
            try:
                check(value)
            except PreflightError as exc:
                problems.append(str(exc))
    engine, instruction = getattr(args, "engine", None), getattr(args, "instruction", None)
    if engine and instruction:  # an instruction for an engine without instruct mode: refused before any work
        from .voice.engines import instruction_problem

        problem = instruction_problem(engine, instruction)
        if problem:
            problems.append(f"--{problem}")
    if problems:
        raise PreflightError("\n".join(problems))


def check_input_files(args: Any) -> None:
    """The input files of `run`/`animate`/`speak` exist and are not empty, and the optional parts they
    pick are installed: the checks the CLI makes before its warm-up thread starts (a run refused here
    exits at once, with no session build to wait for and nothing written)."""
    for option in ("voice", "speaker", "audio", "face"):
        path = getattr(args, option, None)
        if path:
            _existing_file(path, f"--{option}")
    check_optional_parts(args)


def check_run_args(args: Any) -> str:
    """`run`: text, voice clip, face, model, output; returns the text."""
    check_positive(args.speed, "--speed")
    text = check_text(args.text, args.text_file, args.language)
    if getattr(args, "speaker", None):  # `run --speaker` (a saved speaker, e.g. a batch's shared voice fit)
        check_speaker_file(args.speaker)
    else:
        check_voice_clip(args.voice)
    _check_face_args(args)
    check_output(args.out)
    return text
