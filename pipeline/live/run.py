"""`digital-human serve`: build the shared face and voice, warm them, serve until SIGTERM/SIGINT."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("digital_human.live")


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    from ..run_args import add_face_arguments

    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback; 0.0.0.0 exposes "
                                                       "the server to the network: put it behind TLS and a login)")
    p.add_argument("--port", type=int, default=8765)
    voice = p.add_mutually_exclusive_group(required=True)
    voice.add_argument("--voice", help="reference speech clip to clone (the voice fit runs once at start)")
    voice.add_argument("--speaker", help="saved speaker .npz from `embed`")
    voice.add_argument("--base-voice", help="a bundled Kokoro voice by name, no cloning (demos, tests)")
    p.add_argument("--voice-text", help="transcript of the clip (optional)")
    p.add_argument("--no-imitate", action="store_true")
    from ...voice.engines import ENGINES

    p.add_argument("--engine", default="kokoro", choices=list(ENGINES),
                   help="TTS engine (the CosyVoice ones need the user's folder: docs/cosyvoice3.md)")
    p.add_argument("--language", default="auto", choices=["auto", "en", "zh"])
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--backend", default="auto", choices=["auto", "tensorrt", "torch", "onnxruntime"])
    add_face_arguments(p, out=False)
    p.set_defaults(max_side=512, smooth=0.0, fps=25.0)
    p.add_argument("--no-fast-path", dest="fast_path", action="store_false", default=None,
                   help="serve: the compiled paths (CosyVoice 2's, MuseTalk's) are on by default on a CUDA GPU "
                        "(compiled once at start, before the server listens); this keeps them off")
    p.add_argument("--max-sessions", type=int, default=4, help="live sessions at once; more are refused (503)")
    p.add_argument("--tts-lanes", type=int, default=1,
                   help="CosyVoice 2: utterances voiced at the same time (each lane a KV cache and CUDA graphs of its "
                        "own over one copy of the weights; costs GPU memory and warm-up time). 1 = sessions' pieces "
                        "take turns on one lane. Above 1 is refused on a CUDA GPU (it hung there in the last test; "
                        "DIGITAL_HUMAN_TTS_LANES_CUDA=1 tries it)")
    p.add_argument("--tts-batch", type=int, default=1, metavar="ROWS",
                   help="CosyVoice 2 fast path, one lane: up to ROWS sessions decode their speech tokens in the same LM "
                        "steps and share flow solves (CUDA graphs per row count: more warm-up and GPU memory). 1 = off "
                        "(default: on an H200 both halves made the first frame later with 8 sessions)")
    p.add_argument("--ice-server", action="append", default=[], metavar="URL",
                   help="STUN/TURN server for WebRTC (stun:host:port, turn://user:password@host:port); none by default")
    p.add_argument("--udp-ports", metavar="LOW-HIGH", type=_port_range, help="WebRTC UDP ports (firewalls)")
    p.add_argument("--json", action="store_true")


def _port_range(value: str) -> tuple[int, int]:
    low, _, high = value.partition("-")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW-HIGH like 40000-40100, got '{value}'") from None
    if not 1024 <= lo <= hi <= 65535:
        raise argparse.ArgumentTypeError(f"ports must satisfy 1024 <= LOW <= HIGH <= 65535, got '{value}'")
    return lo, hi


def build_live(args: argparse.Namespace) -> Any:
    """args -> SessionManager with the shared face and voice, warmed (the first utterance pays no model load)."""
    from .face import LiveFace
    from .session import SessionManager
    from .voice import LiveVoice

    speaker, base_voice = None, getattr(args, "base_voice", None) or "auto"
    if getattr(args, "speaker", None):
        from ...voice.speaker import SpeakerProfile

        speaker = SpeakerProfile.load_npz(Path(args.speaker))
    elif getattr(args, "voice", None):
        from ..main_job import StageTimer, _speaker_from_clip

        speaker, _ = _speaker_from_clip(StageTimer(), args)
    from ...voice.engines import engine_options

    fast = live_fast_path(getattr(args, "fast_path", None))
    voice = LiveVoice(args.engine, speaker, base_voice, args.backend, args.language, args.speed,
                      engine_options=engine_options(args.engine, fast), lanes=getattr(args, "tts_lanes", 1),
                      batch_rows=getattr(args, "tts_batch", 1))
    face = LiveFace(Path(args.face), model=args.model, fps=args.fps or 25.0, backend=args.backend,
                    max_side=args.max_side, crop_size=args.crop_size, smooth=args.smooth,
                    idle_motion=not args.no_idle_motion, max_seconds=args.max_seconds, fast_path=fast)
    start = time.perf_counter()
    piece = voice.warm()
    face.warm(piece.wave, voice.rate)
    log.info("live: warmed in %.1f s (%s)", time.perf_counter() - start, face.report.splitlines()[0])
    return SessionManager(face, voice, args.max_sessions)


def live_fast_path(requested: bool | None) -> bool:
    """`serve`'s fast-path switch: on by default where CUDA is usable (a server compiles once at start, before it
    listens; then every utterance is faster: on an H200 a MuseTalk step of a piece's first 4 frames took 11 ms
    compiled vs 64 ms eager, text to the first frame at the client P50 242 vs 353 ms; benchmarks/RESULTS_live.md),
    off on the CPU; --fast-path / --no-fast-path choose, and the models' variables (1 or 0) win over both."""
    if requested is not None:
        return bool(requested)
    from ...engines.devices import torch_cuda_usable

    return torch_cuda_usable()


def check_serve_inputs(args: argparse.Namespace, command: str, extra: str, modules: tuple[str, ...]) -> None:
    """The extra `command` needs, the face, the voice/speaker files and the model's and engine's extras and
    files: named before any model is built (`serve`, and every replica's inputs for `serve-fleet`)."""
    from ...optional_parts import extra_problem
    from ...preflight import PreflightError, check_input_files

    from .voice import check_tts_lanes

    lanes = getattr(args, "tts_lanes", 1)
    if lanes != 1:  # where the voice would run decides whether lanes are allowed (check_tts_lanes)
        from ...voice.engines import fast_path_on_cuda

        check_tts_lanes(lanes, cuda=fast_path_on_cuda(args.engine, live_fast_path(getattr(args, "fast_path", None))))
    if getattr(args, "tts_batch", 1) < 1:
        raise ValueError(f"--tts-batch must be at least 1, got {args.tts_batch} (1: each session's piece solved alone)")
    from ...engines.cuda_streams import tts_priority

    tts_priority()  # DIGITAL_HUMAN_LIVE_TTS_PRIORITY: a bad value is named now, not after the models load
    if getattr(args, "engine", "") == "cosyvoice2":  # its DIGITAL_HUMAN_COSYVOICE_FLOW_KERNELS, likewise
        from ...engines.cosyvoice.engine import fast_path_from_env

        fast_path_from_env()
    problem = extra_problem(command, extra, modules)
    if problem:
        raise PreflightError(problem)
    if not Path(args.face).is_file():
        raise ValueError(f"--face '{args.face}' does not exist; give a photo or a talking video of the person")
    check_input_files(args)


def serve(args: argparse.Namespace) -> dict[str, Any]:
    check_serve_inputs(args, "serve", "live", ("aiohttp", "av", "aiortc"))

    from aiohttp import web

    from .server import LiveServer, ServerOptions

    manager = build_live(args)
    server = LiveServer(manager, ServerOptions(ice_servers=args.ice_server, udp_ports=args.udp_ports))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        if args.udp_ports:
            from .webrtc import limit_udp_ports

            limit_udp_ports(loop, *args.udp_ports)
        runner = web.AppRunner(server.app())
        await runner.setup()
        await web.TCPSite(runner, args.host, args.port).start()
        print(f"live: http://{args.host}:{args.port}/  (Ctrl-C or SIGTERM stops)", flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("live: stopping (%d sessions)", len(manager.sessions))
        await runner.cleanup()  # closes the websockets and, on shutdown, every session

    asyncio.run(main())
    return {"outputs": [], "backend": {"tts": args.engine, "talking_head": args.model},
            "timings": {}, "metrics": manager.metrics.snapshot()}
