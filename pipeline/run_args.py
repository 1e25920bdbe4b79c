"""`run`'s options, defined once: the command line, the batch job files and the live server read them here."""
from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path
from typing import Any


def add_max_side(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-side", type=int, default=1920,
                   help="scale the photo/video down to at most this many px on its longest side (0 = source size)")


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON report as the last line")
    p.add_argument("--backend", default="auto", choices=["auto", "tensorrt", "torch", "onnxruntime"])


def mouth_bank_arg(value: str) -> str:
    """--mouth-bank: auto, off, or an existing video file (checked when the command line is read)."""
    if value in ("auto", "off") or Path(value).is_file():
        return value
    raise argparse.ArgumentTypeError(f"must be auto, off or a talking video file of the person; '{value}' is neither")


def setting_arg(value: str) -> tuple[str, Any]:
    """--set KEY=VALUE: a model setting (numbers and true/false parsed; checked against the model later)."""
    key, sep, raw = value.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE (e.g. steps=25), got '{value}'")
    low = raw.strip().lower()
    if low in ("true", "false"):
        return key.strip(), low == "true"
    for kind in (int, float):
        try:
            return key.strip(), kind(raw)
        except ValueError:
            pass
    return key.strip(), raw.strip()


def add_face_arguments(p: argparse.ArgumentParser, *, out: bool = True) -> None:
    """The face side of `animate` and `run` (out=False: the live server writes no file)."""
    from ..fast_path import LATENTSYNC_COST, MUSETALK_COST, SONIC_COST
    from ..talking_head.registry import choice_patterns

    p.add_argument("--face", required=True, help="photo or talking video of the person")
    p.add_argument("--model", default="portrait", help=" | ".join(choice_patterns()).replace("'", ""))
    p.add_argument("--fps", type=float, help="output fps (default: the video's, 25 for a photo)")
    p.add_argument("--smooth", type=float, default=0.5, help="TemporalSmooth strength (0 = off)")
    p.add_argument("--max-seconds", type=float, default=60.0, help="reference video seconds to read")
    p.add_argument("--face-index", type=int, default=0, help="which face when there are several: 0 = the "
                   "largest, 1 = the next largest, ...")
    if out:
        p.add_argument("--out", required=True, help="output .mp4")
    p.add_argument("--crop-size", default="auto", choices=["auto", "256", "512"],
                   help="aligned face crop in px; auto: 512 where a 256 px crop of the face would be enlarged "
                        "over 2x when pasted back (a large face keeps its detail) and the model's crops "
                        "follow the face (portrait), else 256")
    p.add_argument("--mouth-bank", default="auto", metavar="auto|off|VIDEO", type=mouth_bank_arg,
                   help="portrait on a video reference: auto takes the lips and teeth from the reference's own "
                        "frames (the frame whose mouth shape matches, warped into place; a photo keeps the drawn "
                        "mouth); VIDEO: another talking video of the same person to take them from; off: the "
                        "drawn mouth (the JSON report's reports.mouth_bank says whether it ran, on how many frames)")
    p.add_argument("--no-idle-motion", action="store_true", help="a photo keeps still eyes and head (default: "
                   "it blinks, sways and nods with the speech; a video keeps its own motion)")
    p.add_argument("--set", action="append", type=setting_arg, metavar="KEY=VALUE",
                   help="a model setting, repeatable (sonic: steps, appearance_guidance, audio_guidance, "
                        "dynamic_scale, seed, vram=auto|high|low, paste_back=true|false, resolution, "
                        "speed=reference|fast|fastest; latentsync: steps (20), guidance (1.5), deepcache (0 = exact, "
                        "2-10 = faster, changes the frames))")
    add_max_side(p)
    p.add_argument("--fast-path", action="store_true", default=None,
                   help=f"the model's compiled path where it has one (musetalk, sonic, latentsync). "
                        f"{MUSETALK_COST} {SONIC_COST} {LATENTSYNC_COST}")
    if out:
        p.add_argument("--render", default="headless", choices=["headless", "nodes"],
                       help="headless: paste-back and smoothing in torch (on the GPU when there is one), frames "
                            "streamed to the encoder; nodes: the ComfyUI node chain (same frames to rounding)")


def add_run_arguments(run: argparse.ArgumentParser) -> None:
    add_common(run)
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
    add_face_arguments(run)


def run_parser() -> argparse.ArgumentParser:
    """`run`'s parser on its own (the same options as `digital-human run`)."""
    parser = argparse.ArgumentParser(prog="digital-human run")
    add_run_arguments(parser)
    return parser


def parse_run_args(argv: list[str]) -> argparse.Namespace:
    """`run`'s own parser, defaults and checks for arguments given in code; bad ones raise ValueError
    (argparse's message) instead of exiting."""
    message = io.StringIO()
    try:
        with contextlib.redirect_stderr(message):
            return run_parser().parse_args(argv)
    except SystemExit:
        lines = message.getvalue().strip().splitlines()
        raise ValueError(lines[-1].split("error: ", 1)[-1] if lines else "invalid run arguments") from None
