"""The main job as one library function: text + voice (clip or saved speaker) + face -> lip-synced MP4.

`digital-human run`, the batch runner's workers and the live server all call into this module (DESIGN 5e);
it imports none of them, so the flow is one-way: cli -> batch -> pipeline, cli -> pipeline, serve -> pipeline.
The helpers here (face file -> aligned track, speech -> video) are the CLI's `animate`/`align` steps too.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable

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


def _speaker_from_clip(timer: StageTimer, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """--voice clip -> DH_SPEAKER (LoadReferenceAudio's cleaning -> ExtractSpeakerEmbedding), timed."""
    from ..audio import load_reference
    from ..nodes.voice_nodes import ExtractSpeakerEmbedding

    # the prepared clip itself, not LoadReferenceAudio's AUDIO dict: that needs torch, which the warm-up
    # thread imports meanwhile (warmup.py) - the speaker embedding and the TTS do not
    prepared = timer.run("load_audio", load_reference, Path(args.voice))
    for warning in prepared.warnings:
        log.warning("LoadReferenceAudio: %s", warning)
    audio = {"dh_prepared": prepared}  # what ExtractSpeakerEmbedding reads from LoadReferenceAudio's output
    return timer.run("embed", ExtractSpeakerEmbedding().extract, reference=audio, backend=args.backend,
                     reference_text=args.voice_text or "", imitate=not args.no_imitate,
                     name=Path(args.voice).stem, engine=getattr(args, "engine", "kokoro"))


def _read_frames(path: Path, max_seconds: float, max_side: int | None = None, *,
                 audio: bool = True) -> tuple[Any, float, Any]:
    """Frames, fps and (wave, rate) or None from a photo or a video file. A photo is one in-memory
    frame; a video's frames are decoded on demand (media.frame_source.VideoFrames), so nothing here
    holds a whole video. Both are scaled down to at most max_side px on the longest side. audio=False:
    the video's own sound is not decoded (callers that only track the face: its whole track in memory is
    64 KB a second at 16 kHz, 19 MB for 5 minutes, held for nothing)."""
    from ..media.frame_source import DEFAULT_MAX_SIDE, is_photo, load_face_frames
    from ..media.probe import probe_media, read_video_audio

    frames, fps, _ = load_face_frames(path, max_seconds, DEFAULT_MAX_SIDE if max_side is None else max_side)
    if is_photo(path) or not audio:
        return frames, fps, None
    sound = read_video_audio(path) if probe_media(path).has_audio else None
    return frames, fps, sound


def _align_frames(frames: Any, fps: float, *, crop_size: int = 256, expand: float = 0.35, face_index: int = 0,
                  backend: str = "auto") -> tuple[Any, str]:
    """FaceAlign's work on frames that may be decoded on demand (no IMAGE tensor of the whole video):
    (DH_FACES, report)."""
    from ..engines.face.detect import default_runners
    from ..vision.align import align_faces

    track = align_faces(frames, fps, crop_size=int(crop_size), expand=expand, face_index=face_index,
                        runners=default_runners(backend=backend), input_name="--face")
    for warning in track.warnings:
        log.warning("FaceAlign: %s", warning)
    return track, track.summary()


def _size_report(frames: Any, source: Any) -> dict[str, Any]:
    height, width = frames.shape[1:3]
    return {"output_size": [int(width), int(height)], "source_size": list(source) if source else None}


def _seconds(wave: Any, rate: int) -> float:
    import numpy as np

    return float(np.asarray(wave).shape[-1]) / float(rate)


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

    from ..talking_head.registry import resolve

    if speech_seconds is not None:
        max_seconds = min(max_seconds, speech_seconds + 0.5)
    frames, src_fps, _ = timer.run("decode_face", _read_frames, face, max_seconds, max_side, audio=False)
    fps = float(fps or (src_fps if len(frames) > 1 else 25.0))
    adaptive = crop_size == "auto" and resolve(model)[0].adaptive_crop
    size, why = (256, "") if crop_size == "auto" else (int(crop_size), "")
    if adaptive:
        from ..talking_head.crop_choice import choose_crop_size

        from ..vision.align import NoFaceError

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
                    crop_size: str = "auto", mouth_bank: str = "auto",
                    fast_path: bool | None = None) -> tuple[Any, float, dict[str, Any]]:
    """face file + speech -> smoothed uint8 frames and fps (FaceAlign -> TRT_TalkingHead -> TemporalSmooth).
    phones: the TTS's phone timings, carried on the AUDIO as TRT_TTS carries them. idle_motion: a photo
    blinks and moves its head (TRT_TalkingHead's idle_motion auto) or not (off)."""
    from ..audio import to_comfy_audio
    from ..audio.phone_channel import with_phones
    from ..nodes.image_convert import image_to_uint8
    from ..nodes.talking_head_nodes import TRT_TalkingHead
    from ..nodes.video_nodes import TemporalSmooth

    faces, fps, align_report = _faces_from_file(timer, face, fps, backend, max_seconds, max_side,
                                                _seconds(wave, rate), face_index, model, crop_size)
    bank = _mouth_bank_inputs(timer, mouth_bank, model, backend, max_seconds, max_side)
    # the phones were resolved by the command (TTS or aligner): tts-only keeps the node from aligning again
    out = timer.run("talking_head", TRT_TalkingHead().animate, faces, with_phones(to_comfy_audio(wave, rate), phones),
                    model=model, fps=fps, backend=backend, visemes="tts-only",
                    idle_motion="auto" if idle_motion else "off", mouth_bank=bank["mouth_bank"],
                    bank_faces=bank["bank_faces"], fast_path=bool(fast_path))
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
                      crop_size: str = "auto", mouth_bank: str = "auto",
                      fast_path: bool | None = None,
                      settings: dict[str, Any] | None = None) -> tuple[Any, float, dict[str, Any]]:
    """face file + speech -> MP4 on the headless path (TalkingHeadVideo's: paste-back, smoothing and
    YUV conversion on the GPU when there is one, encoding overlapped); the node chain's result to
    rounding. Returns (MuxReport, fps, reports)."""
    from ..talking_head.render_video import render_talking_video
    from ..talking_head.registry import generate_crops

    faces, fps, align_report = _faces_from_file(timer, face, fps, backend, max_seconds, max_side,
                                                _seconds(wave, rate), face_index, model, crop_size)
    # crops are generated chunk by chunk while the video is encoded: memory stays flat in the length
    gen = timer.run("talking_head_setup", generate_crops, faces, wave, rate, model, fps, backend=backend,
                    streaming=True, max_audio_seconds=HEADLESS_MAX_SPEECH_SECONDS, phones=phones,
                    idle_motion=idle_motion, fast_path=fast_path, settings=settings,
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
                                 getattr(args, "mouth_bank", "auto"), getattr(args, "fast_path", None),
                                 model_settings(args))
    frames, fps, reports = _animate_frames(timer, Path(args.face), wave, rate, args.model, args.fps, args.backend,
                                           args.max_seconds, args.smooth, args.max_side, args.face_index, phones,
                                           not getattr(args, "no_idle_motion", False), args.crop_size,
                                           getattr(args, "mouth_bank", "auto"), getattr(args, "fast_path", None))
    return _mux_to(timer, frames, wave, rate, fps, Path(args.out)), fps, reports


def model_settings(args: argparse.Namespace) -> dict[str, Any]:
    """--set values as a dict; a key the model does not read is refused (names what it reads)."""
    from ..talking_head.registry import model_options

    settings = dict(getattr(args, "set", None) or [])
    known = model_options(args.model) if settings else ()
    unknown = sorted(k for k in settings if k not in known)
    if unknown:
        raise ValueError(f"--set {', '.join(unknown)}: model {args.model} reads "
                         f"{', '.join(known) if known else 'no settings'}")
    return settings


def _mouth_bank_inputs(timer: StageTimer, mouth_bank: str, model: str, backend: str, max_seconds: float,
                       max_side: int | None) -> dict[str, Any]:
    """--mouth-bank as TRT_TalkingHead's inputs: {"mouth_bank": auto|off, "bank_faces": DH_FACES or None,
    "bank": what generate_crops takes}; a video file is aligned here (its frames decoded on demand), for a
    model that has a mouth bank only (portrait)."""
    from ..talking_head.registry import resolve

    if mouth_bank in ("auto", "off") or "mouth_bank" not in resolve(model)[0].options:
        return {"mouth_bank": mouth_bank, "bank_faces": None, "bank": mouth_bank}
    bank_faces, _, _ = _faces_from_file(timer, Path(mouth_bank), None, backend, max_seconds, max_side,
                                        crop_size="256")
    return {"mouth_bank": "auto", "bank_faces": bank_faces, "bank": bank_faces}


def _mux_to(timer: StageTimer, frames: Any, wave: Any, rate: int, fps: float, out: Path) -> Any:
    from ..media.mux import mux_video

    return timer.run("mux", mux_video, frames, wave, rate, fps, out, length_mode="pad_audio")


def run_main_job(args: argparse.Namespace) -> dict[str, Any]:
    """The main job: voice clip + face + text -> lip-synced MP4 in the cloned voice."""
    from ..nodes.voice_nodes import TRT_TTS
    from ..preflight import check_input_files, check_run_args
    from ..warmup import start_warmup

    timer = StageTimer()
    timer.run("preflight", check_input_files, args)  # a missing file: refused before any thread starts
    start_warmup(tts_backend=args.backend)  # torch and the TTS session load while the inputs are checked
    text = timer.run("preflight", check_run_args, args)  # every input checked before any heavy work
    if getattr(args, "speaker", None):  # a saved speaker (`embed`, or a batch's shared voice fit)
        from ..voice.speaker import SpeakerProfile

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
    from ..engines import loader

    found = [s for s in loader.loader().loaded() if s.startswith(prefix)]
    return "; ".join(found) or "unknown"


def run_job(argv: list[str]) -> dict[str, Any]:
    """One `run` from code (the batch runner's workers): same parser and path as the command line;
    returns `run --json`'s report."""
    from .run_args import parse_run_args

    return run_main_job(parse_run_args(argv))
