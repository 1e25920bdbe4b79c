"""Live mode on a GPU: CosyVoice 2 (fast path) + MuseTalk at full size, several concurrent 25-fps sessions, text to
the first decoded speaking frame at a client, per stage P50/P95/P99.

The server (this process): `digital-human serve`'s objects (LiveVoice, LiveFace, SessionManager, LiveServer) on
loopback, built as `serve` builds them except the model files: the device has no model hub, so
- CosyVoice 2: a release folder of the released architecture with seeded random weights (Qwen2 0.5 B LM, flow,
  HiFT; random_release.write_random_release, as benchmarks/gpu_cosyvoice.py), on CUDA with the fast path. Random
  weights never draw a sensible end of speech, so each text chunk's LM is held to exactly
  round(characters x 25 / 14) speech tokens (25 tokens a second, ~14 characters a second of English speech;
  clamped to 10..400): the speech lengths are those of real speech of the text, the sound is noise.
- MuseTalk 1.5: full-size UNet, VAE and whisper-tiny encoder with seeded random weights made on the device (as
  benchmarks/gpu_musetalk.py), FP16, eager, given to the pack's own network cache in place of loading a release
  (a reduced random release is written for the file checks; the networks used are the full-size ones). Speed does
  not depend on the weights' values.
- Face: face_01_female.jpg at 512 px (FaceAlign on the installed face models), idle motion on.
Concurrent sessions' MuseTalk steps run as one batched call (engines/call_batcher.py).

The clients (a separate process, so their decoding does not share this process's interpreter lock): one thread
per session opens it, connects the websocket (fragmented MP4: H.264 + AAC, the transport a browser uses through
Media Source Extensions) and decodes what arrives with PyAV; texts of varied length (1 word .. 3 sentences) are
said one after another, each after the last has finished. Per utterance: the server's stage times
(GET /sessions/{id}: request -> first TTS audio, first talking-head frame, first tick sent by the clock, first
encoded packet) and, at the client, request -> the first decoded video frame at or after the stream's speech start
(text to first decoded speaking frame; the request is timed by the client). Real time: each session's clock rate,
the frames decoded per second at each client, and the speech frames that came late (idle frames inside speech).

  python benchmarks/gpu_live.py --save-state state.npz --out -   # here (librosa): the speaker state, carried
  python benchmarks/gpu_live.py --state state.npz --out $OUT/gpu_live.json                # GPU, full size
  python benchmarks/gpu_live.py --size reduced --device cpu --phases 1:2,2:2 --out /tmp/gl.json   # CPU smoke test

On a GPU machine without network (the 2026-12-03 runs): carry the speaker state, the face photo, the face models
folder (`digital-human setup`'s models/face) and wheels of what the image lacks (av, diffusers, importlib_metadata,
soxr, for cp312), install the wheels with `pip install --no-index --no-deps --target /tmp/site`, and run
`--state S.npz --face F.jpg --face-models FACE_DIR --work /tmp/fresh_dir` (`--face-models` is the face folder
itself, linked as <work>/models/face; a reused --work keeps its old link). `tools/device_carry.py FOLDER` makes that
folder (41.7 MiB on 2026-12-04).

--tts-profile N / --face-profile N time the first TTS piece and a piece's first frame by part before the sessions
(report["tts_profile"], report["face_profile"]); --phases none measures no sessions. Each session's TTS and face
stages run on CUDA streams of their own (engines/cuda_streams.py); DIGITAL_HUMAN_LIVE_STREAMS=0 puts them all back
on the default stream (the face profile measures a piece's first frame under a concurrent TTS both ways).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import ROOT, import_pack  # noqa: E402
from _contention import GilProbe, GpuUtilSampler  # noqa: E402
from _stack_sampler import StackSampler  # noqa: E402

TOKENS_PER_CHAR = 25 / 14
PROMPT_TEXT = "This is the voice of the speaker."


def token_limits(text: str) -> dict:
    n = int(min(400, max(10, round(len(text) * TOKENS_PER_CHAR))))
    return {"min_tokens": n, "max_tokens": n}


def speaker_state(folder: Path) -> dict:
    """The speaker state of a synthetic 3-s clip on the release's front end (a CPU runtime; its prompt mel needs
    librosa, which the GPU machine lacks: --save-state makes it beforehand, --state carries it there)."""
    from digital_human.engines.cosyvoice.engine import CosyVoice2Runtime

    t = np.arange(3 * 24000) / 24000
    clip = (0.3 * np.sin(2 * np.pi * 140 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
            + 0.02 * np.random.default_rng(0).standard_normal(t.size)).astype(np.float32)
    return CosyVoice2Runtime(folder, "cpu").speaker_state(clip, 24000, PROMPT_TEXT)


def build_voice(size: str, device: str, folder: Path, state_file: str = "", first_hop: int = 0, lanes: int = 1,
                batch_rows: int = 1):
    import gc

    from digital_human.engines.cosyvoice.engine import CosyVoice2Engine
    from digital_human.engines.cosyvoice.random_release import write_random_release
    from digital_human.pipeline.live.voice import LiveVoice
    from digital_human.voice.engines import with_engine_state
    from digital_human.voice.speaker import SpeakerProfile
    from gpu_cosyvoice import release_yaml

    if not (folder / "hift.pt").is_file():
        yaml_text, qwen = release_yaml(size)
        write_random_release(folder, yaml_text, qwen, seed=1234)
    gc.collect()
    engine = CosyVoice2Engine(folder, device, fast=device.startswith("cuda"))
    state = dict(np.load(state_file)) if state_file else speaker_state(folder)
    base = SpeakerProfile(embedding=np.ones(256, np.float32) / 16, segment_embeddings=np.zeros((0, 256), np.float32),
                          content_hash="synthetic", speech_seconds=3.0, name="random")
    speaker = with_engine_state(base, "cosyvoice2", state)
    return LiveVoice(engine, speaker, token_limits=token_limits, first_hop_tokens=first_hop or None, lanes=lanes,
                     batch_rows=batch_rows)


def place_musetalk(size: str, device: str, root: Path) -> None:
    """A reduced random release under root (the file checks), and `size` networks with seeded random weights in
    the pack's network cache under that release's key (what cached_networks would load from full-size files)."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import WhisperConfig, WhisperFeatureExtractor
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    from digital_human.engines.musetalk import networks as mn
    from digital_human.engines.musetalk import random_release as rr
    from digital_human.engines.musetalk.files import locate

    rr.write_release(root, "reduced", seed=0)
    unet_cfg, vae_cfg, whisper_cfg, feature_size = rr.CONFIGS[size]
    files = locate(root)
    # the whisper folder's configs are the size's own (the log-mel extractor's bins must match the encoder)
    WhisperConfig(**whisper_cfg).to_json_file(str(files.whisper_dir / "config.json"))
    WhisperFeatureExtractor(feature_size=feature_size).to_json_file(str(files.whisper_dir / "preprocessor_config.json"))
    precision = "fp16" if device.startswith("cuda") else "fp32"
    dtype = torch.float16 if precision == "fp16" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        unet = UNet2DConditionModel(**{k: v for k, v in unet_cfg.items() if not k.startswith("_")})
        vae = AutoencoderKL(**{k: v for k, v in vae_cfg.items() if not k.startswith("_")})
        whisper = WhisperEncoder(WhisperConfig(**whisper_cfg))
    nets = mn.MuseTalkNetworks(unet=unet, vae=vae, whisper=whisper, files=files)
    for m in (unet, vae, whisper):
        m.eval().requires_grad_(False)
    nets = nets.to(device, dtype)
    stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in
                  (files.unet_weights, files.vae_weights, files.whisper_weights, files.unet_config))
    with mn._LOCK:
        mn._CACHE.clear()
        mn._CACHE[(stamp, device.split(":")[0], precision)] = nets


def warm_batches(face, max_rows: int) -> dict:
    """One MuseTalk step at every batch size the batcher can make (multiples of 4 up to max_rows): the first step
    of a shape pays its kernel set-up, which would otherwise land in some utterance's latency."""
    import torch

    from digital_human.engines.musetalk.pipeline import _PIPELINES

    out = {}
    for pipe in list(_PIPELINES):
        lat = torch.zeros((1, 8, 32, 32), device=pipe.device, dtype=pipe.dtype)
        win = torch.zeros((1, 50, 384), device=pipe.device, dtype=pipe.dtype)
        for rows in range(4, max_rows + 1, 4):
            t0 = time.perf_counter()
            pipe._generate_now(lat.expand(rows, -1, -1, -1).contiguous(), win.expand(rows, -1, -1).contiguous())
            if pipe.device.type == "cuda":
                torch.cuda.synchronize()
            out[rows] = round(1000 * (time.perf_counter() - t0), 1)
    return out


def tts_profile(voice, hops: list[int], repeats: int) -> dict:
    """Where CosyVoice 2's first live piece spends its time, for each first hop (speech tokens): the LM's prompt
    pass to its first token (the fast path reads its tokens back in blocks, the first of first hop + look-ahead
    tokens: then the time to that block), the tokens drawn before the piece, the flow and HiFT calls (synchronised at
    each border, so the parts add up to about the total), over `repeats` texts, medians in ms."""
    import statistics

    import torch

    runtime = voice.engine.runtime()
    sync = torch.cuda.synchronize if runtime.device.type == "cuda" else (lambda: None)
    marks: dict = {}
    tokens0, mel0, wave0 = runtime._tokens, runtime._mel, runtime._wave

    def timed(name, fn):
        def call(*a, **k):
            sync()
            t0 = time.perf_counter()
            out = fn(*a, **k)
            sync()
            marks[name] = marks.get(name, 0.0) + time.perf_counter() - t0
            return out
        return call

    def tokens(*a, **k):
        sync()
        t0 = time.perf_counter()
        for i, token in enumerate(tokens0(*a, **k)):
            if i == 0:
                marks["first_token"] = time.perf_counter() - t0
            marks["tokens"] = i + 1
            yield token

    runtime._tokens, runtime._mel, runtime._wave = tokens, timed("flow", mel0), timed("hift", wave0)
    out = {}
    try:
        for hop in hops:
            voice.first_hop_tokens = hop
            rows = []
            for i in range(repeats):
                marks.clear()
                text = ("Thank you for waiting, the package will arrive on Monday morning.", "Yes, of course.",
                        "I can help you with that.")[i % 3]
                sync()
                t0 = time.perf_counter()
                stream = voice.pieces(text)
                next(stream)
                total = time.perf_counter() - t0
                stream.close()
                rows.append({"total": total, **{k: v for k, v in marks.items()}})
            med = lambda key: round(1000 * statistics.median(r.get(key, 0.0) for r in rows), 1)  # noqa: E731
            out[str(hop)] = {"first_piece_ms": med("total"), "lm_first_tokens_ms": med("first_token"),
                             "flow_ms": med("flow"), "hift_ms": med("hift"),
                             "tokens_drawn": statistics.median(r.get("tokens", 0) for r in rows), "n": len(rows)}
    finally:
        runtime._tokens, runtime._mel, runtime._wave = tokens0, mel0, wave0
        voice.first_hop_tokens = None
    return out


def prefill_ab(voice, repeats: int) -> dict:
    """CosyVoice 2's static prefill against transformers' eager prompt pass, in this process: the same prompt's
    step-0 log-probs both ways (FP16 on the GPU: how far apart, and whether the likeliest tokens agree), then
    tts_profile with the static prefill's graphs captured. Leaves the decoder as the environment set it."""
    import torch

    from digital_human.engines.cosyvoice.lm import PREFILL_BUCKET

    runtime = voice.engine.runtime()
    decoder = runtime._lm_decoder()
    if decoder is None:
        return {"skipped": "no static decoder (not the fast path)"}
    was = decoder.static_prefill
    hidden = decoder.qwen.config.hidden_size
    out: dict = {"bucket": PREFILL_BUCKET}
    try:
        with torch.inference_mode():
            gen = torch.Generator(device="cpu").manual_seed(0)
            embeds = (0.05 * torch.randn(1, 150, hidden, generator=gen)).to(decoder.device)
            decoder.static_prefill = False
            eager = decoder.prefill(embeds).float()
            keys_eager = decoder.keys[0][:, :, :150].float().clone()
            decoder.static_prefill = True
            t0 = time.perf_counter()
            out["graphs"] = decoder.prepare_prefill(min(decoder.capacity, 1024))
            out["capture_s"] = round(time.perf_counter() - t0, 2)
            static = decoder.prefill(embeds).float()
            keys_static = decoder.keys[0][:, :, :150].float()
            out["log_prob_max_abs"] = round(float((eager - static).abs().max()), 5)
            out["keys_max_abs"] = round(float((keys_eager - keys_static).abs().max()), 5)
            out["top5_equal"] = bool(torch.equal(eager.topk(5).indices, static.topk(5).indices))
            decoder._reset()
        out["tts_profile"] = tts_profile(voice, [8, 4], repeats)
    finally:
        decoder.static_prefill = was
    return out


FACE_PROFILE_TTS_TEXT = ("Thank you for waiting, the package will arrive on Monday morning. If you are not at home, "
                         "the driver will leave it with a neighbour and put a card through your door. You can also "
                         "pick it up at the post office from Tuesday, with the card and a photo identity document.")


LANE_TEXTS = ("Thanks for calling, your order left the warehouse this morning and arrives on Friday.",
              "I can move the delivery to Monday if that suits you better, just say the word.")


def lanes_check(voice, repeats: int = 2) -> dict:
    """TTS lanes on this device: two utterances on lanes 0 and 1 each alone, then both at once from two threads (as
    two sessions' TTS stages, each call on its lane's stream). Whether at once gives the same audio as alone (the
    lanes share weights, nothing else), and the overlap: the two alone-times' sum over the wall time at once (2.0 =
    fully side by side, 1.0 = in turn). Medians over `repeats`."""
    import statistics

    def speak(lane: int) -> tuple[np.ndarray, float]:
        t0 = time.perf_counter()
        wave = np.concatenate([p.wave for p in voice._pieces(LANE_TEXTS[lane], lane)])
        return wave, time.perf_counter() - t0

    alone_s, together_s, equal, diff = [], [], True, 0.0
    for _ in range(repeats):
        alone = [speak(lane) for lane in (0, 1)]
        together: dict = {}
        start = threading.Barrier(2)

        def run(lane: int) -> None:
            start.wait()
            together[lane] = speak(lane)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=run, args=(lane,)) for lane in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        together_s.append(time.perf_counter() - t0)
        alone_s.append(alone[0][1] + alone[1][1])
        for lane in (0, 1):
            a, b = alone[lane][0], together[lane][0]
            equal = equal and a.shape == b.shape and bool(np.array_equal(a, b))
            if a.shape == b.shape:
                diff = max(diff, float(np.abs(a - b).max()))
    alone_med, together_med = statistics.median(alone_s), statistics.median(together_s)
    return {"lanes": voice.lanes, "alone_sum_s": round(alone_med, 3), "together_s": round(together_med, 3),
            "overlap": round(alone_med / together_med, 2), "audio_equal": equal, "max_abs_diff": diff,
            "repeats": repeats}


def _first_frame(face, wave: np.ndarray, rate: int) -> float:
    """Seconds from LiveFace.speech to its first frame (what a session's face stage waits for a piece's first frame)."""
    t0 = time.perf_counter()
    frames = face.speech(wave, rate, 0)
    try:
        next(frames)
        return time.perf_counter() - t0
    finally:
        frames.close()


def _face_times(face, wave: np.ndarray, rate: int, repeats: int, jitter: bool = False, stop=None) -> list:
    """_first_frame `repeats` times on this thread, in the stream sessions' face stages get (none when streams
    are off). jitter: a short pause before each, so that they land at varied points of a concurrent TTS's work."""
    from digital_human.engines import cuda_streams

    times = []
    with cuda_streams.thread_stream(face.cuda_device, cuda_streams.FACE_PRIORITY, role=cuda_streams.FACE_ROLE):
        for i in range(repeats):
            if stop is not None and stop():
                break
            if jitter:
                time.sleep(0.011 * (i % 7))
            times.append(_first_frame(face, wave, rate))
    return times


def _ms_stats(values: list) -> dict:
    import statistics

    v = sorted(1000 * x for x in values)
    if not v:
        return {"n": 0}
    return {"p50": round(statistics.median(v), 1), "p90": round(v[min(len(v) - 1, int(0.9 * len(v)))], 1),
            "min": round(v[0], 1), "max": round(v[-1], 1), "n": len(v)}


def _with_streams(on: bool):
    """DIGITAL_HUMAN_LIVE_STREAMS set for a measurement (the live stages' CUDA streams on or off), restored after."""
    import contextlib

    from digital_human.engines.cuda_streams import STREAMS_ENV

    @contextlib.contextmanager
    def scope():
        before = os.environ.get(STREAMS_ENV)
        os.environ[STREAMS_ENV] = "1" if on else "0"
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(STREAMS_ENV, None)
            else:
                os.environ[STREAMS_ENV] = before
    return scope()


def _under_tts(face, voice, wave: np.ndarray, repeats: int, streams: bool) -> dict:
    """The first frame of `wave` timed `repeats` times while another thread speaks a long text (voice.pieces, over
    and over): the contention a session's face stage meets from the TTS. Each thread runs in the stream a session's
    stage gets (engines/cuda_streams.py), or, with streams off, on the default stream as before."""
    from digital_human.engines import cuda_streams

    stop, started, made, errors = threading.Event(), threading.Event(), [0], []

    def tts() -> None:
        try:
            with cuda_streams.thread_stream(voice.cuda_device, cuda_streams.tts_priority(), role=cuda_streams.TTS_ROLE):
                while not stop.is_set():
                    for _ in voice.pieces(FACE_PROFILE_TTS_TEXT):
                        made[0] += 1
                        started.set()
                        if stop.is_set():
                            break
        except Exception as exc:  # noqa: BLE001 - reported with the figures
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
        finally:
            started.set()

    with _with_streams(streams):
        thread = threading.Thread(target=tts, name="face-profile-tts", daemon=True)
        thread.start()
        started.wait(300)
        try:
            times = _face_times(face, wave, voice.rate, repeats, jitter=True, stop=lambda: bool(errors))
        finally:
            stop.set()
            thread.join(timeout=300)
    return {"first_frame_ms": _ms_stats(times), "tts_pieces_made": made[0], "tts_error": errors[0] if errors else None}


def face_profile(face, voice, wave: np.ndarray, repeats: int) -> dict:
    """Where the first frame of a speech piece spends its time (MuseTalk on the photo: LiveFace.speech ->
    PhotoStream.crops): the whisper windows (engines.musetalk.audio.audio_windows), the first render step (reference
    latents, the batched UNet + VAE decode, the copy back, the resize into the crop), of which the model step
    (MuseTalkPipeline.generate_device: upload, UNet, VAE decode, uint8), and the paste into the full frame; the
    device synchronised at each border, `repeats` times, medians in ms. Then the whole first frame without the
    borders' syncs: alone, and while another thread speaks a long text, with every thread on the default stream
    (DIGITAL_HUMAN_LIVE_STREAMS=0, as before) and with the live stages' own streams."""
    import statistics

    import torch

    from digital_human.engines.musetalk import audio as mt_audio
    from digital_human.pipeline.live.face import _silent

    stream = getattr(face, "_stream", None)
    if stream is None:
        return {"error": "the face profile times MuseTalk on a photo (LiveFace's PhotoStream); this face has none"}
    spf = int(round(voice.rate / face.fps))
    wave = np.asarray(wave, np.float32)
    wave = np.concatenate([wave, np.zeros(-len(wave) % spf, np.float32)])
    out: dict = {"piece_s": round(len(wave) / voice.rate, 3), "frames": len(wave) // spf, "repeats": repeats,
                 "silent_piece": bool(_silent(wave)), "face_device": face.cuda_device,
                 "voice_device": voice.cuda_device}
    cuda = stream.pipe.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    marks: dict = {}

    def timed(name, fn):
        def call(*a, **k):
            if name in marks:  # the first call of the piece only (its first frame's)
                return fn(*a, **k)
            sync()
            t0 = time.perf_counter()
            result = fn(*a, **k)
            sync()
            marks[name] = time.perf_counter() - t0
            return result
        return call

    pipe, renderer_type = stream.pipe, stream._renderer_type
    windows0, render0, paste0 = mt_audio.audio_windows, renderer_type.render, face._paste
    had_step = "generate_device" in pipe.__dict__
    step0 = pipe.generate_device
    mt_audio.audio_windows = timed("windows", windows0)
    renderer_type.render = timed("render", render0)
    face._paste = timed("paste", paste0)
    pipe.generate_device = timed("step", step0)
    rows = []
    try:
        with _with_streams(False):
            for _ in range(repeats):
                marks.clear()
                sync()
                total = _first_frame(face, wave, voice.rate)
                rows.append({"total": total, **marks,
                             "other": total - sum(marks.get(k, 0.0) for k in ("windows", "render", "paste"))})
    finally:
        mt_audio.audio_windows, renderer_type.render, face._paste = windows0, render0, paste0
        if had_step:
            pipe.generate_device = step0
        else:
            del pipe.generate_device
    med = lambda key: round(1000 * statistics.median(r.get(key, 0.0) for r in rows), 1)  # noqa: E731
    parts = {"windows_ms": med("windows"), "render_ms": med("render"), "step_ms": med("step"),
             "paste_ms": med("paste"), "other_ms": med("other"), "total_ms": med("total")}
    out["parts_synced"] = parts
    for streams in (False, True):
        with _with_streams(streams):
            sync()
            out[f"alone_{'own_streams' if streams else 'default_stream'}"] = _ms_stats(
                _face_times(face, wave, voice.rate, repeats))
    out["with_tts_default_stream"] = _under_tts(face, voice, wave, repeats, streams=False)
    out["with_tts_own_streams"] = _under_tts(face, voice, wave, repeats, streams=True)
    return out


def save_state(args: argparse.Namespace) -> None:
    import_pack()
    from digital_human.engines.cosyvoice.random_release import write_random_release
    from gpu_cosyvoice import release_yaml

    folder = Path(args.work) / f"cosyvoice2_{args.size}"
    if not (folder / "hift.pt").is_file():
        yaml_text, qwen = release_yaml(args.size)
        write_random_release(folder, yaml_text, qwen, seed=1234)
    np.savez(args.save_state, **speaker_state(folder))
    print(f"speaker state of {folder} -> {args.save_state}")


def server_main(args: argparse.Namespace) -> None:
    import_pack()
    import torch

    from digital_human.pipeline.live.client import http
    from digital_human.pipeline.live.face import LiveFace
    from digital_human.pipeline.live.metrics import StageMetrics
    from digital_human.pipeline.live.server import LiveServer, RunningServer
    from digital_human.pipeline.live.session import SessionManager
    from digital_human.pipeline.live.voice import check_tts_lanes

    try:
        check_tts_lanes(args.tts_lanes, cuda=args.device.startswith("cuda"))  # lanes on CUDA: LANES_CUDA_ENV=1
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    phases = [] if args.phases == "none" else [parse_phase(p, args.listen) for p in args.phases.split(",")]
    report = {"benchmark": "gpu_live", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "commit": args.commit, "size": args.size, "device": args.device,
              "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
              "torch": torch.__version__, "python": platform.python_version(), "cpus": os.cpu_count(),
              "tokens_per_char": round(TOKENS_PER_CHAR, 4), "first_hop_tokens": args.first_hop or "default",
              "phases": []}

    def save() -> None:
        if "flow_kernels" in report:  # a compile that failed during the warm-up or a phase says so here
            report["flow_kernels"]["compile_note"] = getattr(getattr(voice.engine.runtime(), "_solver", None),
                                                             "compile_note", None)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))

    t0 = time.perf_counter()
    from digital_human.engines.cosyvoice.engine import FLOW_KERNELS_ENV, fast_path_from_env

    if args.flow_kernels == "off":  # the engine reads it when it makes its runtime (fast_path_from_env)
        os.environ.pop(FLOW_KERNELS_ENV, None)  # not one inherited from the shell: the report says off
    else:
        os.environ[FLOW_KERNELS_ENV] = args.flow_kernels
        try:
            fast_path_from_env()  # a wrong word: said now, before the voice is built
        except ValueError as exc:
            raise SystemExit(f"--flow-kernels: {exc}") from None
    from digital_human.engines import cuda_streams

    if args.tts_priority is None:
        os.environ.pop(cuda_streams.TTS_PRIORITY_ENV, None)
    else:
        os.environ[cuda_streams.TTS_PRIORITY_ENV] = str(args.tts_priority)
    report["tts_priority"] = cuda_streams.tts_priority()
    voice = build_voice(args.size, args.device, work / f"cosyvoice2_{args.size}", args.state, args.first_hop,
                        args.tts_lanes, args.tts_batch)
    solver = getattr(voice.engine.runtime(), "_solver", None)
    report["flow_kernels"] = {"mode": args.flow_kernels, "compile_note": getattr(solver, "compile_note", None)}
    report["tts_lanes"] = voice.lanes
    report["tts_batch"] = voice.batch_rows
    report["voice_build_s"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    models = work / "models"
    models.mkdir(exist_ok=True)
    if not (models / "face").exists():
        (models / "face").symlink_to(Path(args.face_models).resolve())
    os.environ["DIGITAL_HUMAN_MODELS"] = str(models)
    place_musetalk(args.size, args.device, models)
    from digital_human.pipeline.live.run import live_fast_path

    # serve's default: the compiled MuseTalk step on a CUDA GPU (--face-fast-path off: eager)
    fast = live_fast_path({"auto": None, "on": True, "off": False}[args.face_fast_path])
    face = LiveFace(Path(args.face), model="musetalk", max_side=512, fast_path=fast)
    report["face_fast_path"] = fast
    report["face"] = face.report.splitlines()[0]
    stream = getattr(face, "_stream", None)
    report["face_prepared_once_s"] = None if stream is None else round(stream.prepare_seconds, 3)
    report["face_build_s"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    piece = voice.warm(max_speech_seconds=max(token_limits("x" * 10 ** 4)["max_tokens"] / 25, 20.0))
    report["voice_prepared"] = voice.prepared
    face.warm(piece.wave, voice.rate)
    max_sessions = max((n for n, *_ in phases), default=1)
    report["warm_step_ms"] = warm_batches(face, 4 * max_sessions)
    report["warm_s"] = round(time.perf_counter() - t0, 1)
    if args.tts_profile:
        hop = voice.first_hop_tokens
        report["tts_profile"] = tts_profile(voice, [8, 4], args.tts_profile)
        voice.first_hop_tokens = hop
        if args.prefill_ab:
            report["static_prefill_ab"] = prefill_ab(voice, args.tts_profile)
            voice.first_hop_tokens = hop
    if args.lanes_check:
        if voice.lanes < 2:
            raise SystemExit("--lanes-check needs --tts-lanes 2 or more")
        report["lanes_check"] = lanes_check(voice, args.lanes_check)
    if args.face_profile:
        t1 = time.perf_counter()
        report["face_profile"] = face_profile(face, voice, piece.wave, args.face_profile)
        report["face_profile"]["seconds"] = round(time.perf_counter() - t1, 1)
    print(json.dumps({k: v for k, v in report.items() if k not in ("phases", "face_profile")}), flush=True)
    if "face_profile" in report:  # a line of its own (a log viewer cuts long lines)
        print(json.dumps({"face_profile": report["face_profile"]}), flush=True)
    save()
    manager = SessionManager(face, voice, max_sessions=max_sessions)
    report["opencv_threads"] = manager.opencv_threads
    report["switch_interval_ms"] = manager.switch_interval_ms
    server = RunningServer(LiveServer(manager))
    start = time.perf_counter()
    try:
        for sessions, utterances, audio, listen in phases:
            left = args.budget_s - (time.perf_counter() - start) if args.budget_s else 0
            if args.budget_s and left < 20:
                report["phases"].append({"sessions": sessions, "audio": audio,
                                         "skipped": f"--budget-s {args.budget_s} reached"})
                continue
            manager.metrics = StageMetrics()  # this phase's sessions' figures only
            pipe_stats = _batcher_stats()
            flow_before = voice.flow_batching  # --tts-batch: the flow solves shared in this phase
            lm_before = voice.lm_batching      # and the LM steps
            out = work / f"clients_{sessions}.json"
            cmd = [sys.executable, *(["-S"] if sys.flags.no_site else []), str(Path(__file__).resolve()), "--client", server.url, "--sessions", str(sessions),
                   "--utterances", str(utterances), "--ws-audio", audio, "--listen", str(listen),
                   "--out", str(out), "--deadline-s", str(max(10.0, left - 15) if
                                                                                        args.budget_s else 0)]
            t1 = time.perf_counter()
            sampler = StackSampler(interval_s=0.01, depth=4, group=live_thread_row) if args.sample_stacks else None
            # is the interpreter lock or the GPU what the phase waits on (benchmarks/_contention.py)
            gil = GilProbe()
            gpu = GpuUtilSampler() if str(args.device).startswith("cuda") else None
            try:
                gil.__enter__()
                if gpu is not None:
                    gpu.__enter__()
                if sampler is not None:
                    sampler.__enter__()
                proc = subprocess.run(cmd, capture_output=True, text=True,
                                      timeout=max(60, left + 30) if args.budget_s else None)
                stdout, stderr, failed = proc.stdout, proc.stderr, proc.returncode != 0
            except subprocess.TimeoutExpired as exc:  # keep what the clients printed (the 8-session phase of
                # 2026-12-03 ran past its time and its rows were lost with the whole phase)
                text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
                stdout, stderr, failed = text(exc.stdout), text(exc.stderr), True
            finally:
                if sampler is not None:
                    sampler.__exit__(None, None, None)
                if gpu is not None:
                    gpu.__exit__(None, None, None)
                gil.__exit__(None, None, None)
            phase = json.loads(out.read_text()) if out.is_file() else partial_phase(stdout, stderr)
            phase["contention"] = {"interpreter_lock": gil.report(),
                                   "gpu": gpu.report() if gpu is not None else {"error": "not a CUDA run"}}
            if sampler is not None:  # which of the server's threads spent the phase where (and their CPU seconds)
                phase["server_threads"] = sampler.report(top=5)
            phase.update(sessions=sessions, audio=audio, listen=listen, wall_s=round(time.perf_counter() - t1, 1),
                         server_metrics=http(server.url, "GET", "/metrics")[1], batcher=_batcher_delta(pipe_stats))
            flow_after = voice.flow_batching
            if flow_before and flow_after:
                phase["tts_flow_batching"] = {"calls": flow_after["calls"] - flow_before["calls"],
                                              "solves": flow_after["solves"] - flow_before["solves"],
                                              "largest_so_far": flow_after["largest"]}
            lm_after = voice.lm_batching
            if lm_before and lm_after:
                steps = lm_after["steps"] - lm_before["steps"]
                rows = lm_after["row_steps"] - lm_before["row_steps"]
                phase["tts_lm_batching"] = {"steps": steps, "row_steps": rows, "largest_so_far": lm_after["largest"],
                                            "mean_rows": round(rows / steps, 2) if steps else None}
            if failed or not phase.get("utterances"):
                phase["client_stderr"] = stderr[-2000:]
            report["phases"].append(phase)
            print(json.dumps({k: v for k, v in phase.items() if k not in ("rows", "server_metrics")}), flush=True)
            save()
    finally:
        server.stop()
    save()


def live_thread_row(name: str) -> str:
    """A server thread's row in the stack sampler: every session's thread of one stage together
    ("live-s3-1a2b3c4d-_clock" -> "live-_clock"), pools without their number."""
    import re

    name = re.sub(r"^live-s\d+-[0-9a-f]+-", "live-", name)
    return name.rstrip("0123456789_") or name


def partial_phase(stdout: str, stderr: str) -> dict:
    """A phase whose clients did not finish: the per-utterance rows they printed, and their percentiles."""
    from live import percentiles

    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith('{"session"')]
    done = [r for r in rows if "error" not in r]
    return {"error": "the clients did not finish: partial rows only", "utterances": len(done),
            "done": sum(r.get("state") == "done" for r in done), "rows": rows,
            "percentiles": {s: percentiles([r.get(s) for r in done]) for s in CLIENT_STAGES},
            "client_stderr_tail": stderr[-1000:]}


def parse_phase(spec: str, listen: float = 0.0) -> tuple[int, int, str, float]:
    """SESSIONS:UTTERANCES[:AUDIO][:listenF] -> (sessions, utterances, the websocket's audio codec, the phase's
    turn-taking factor: F, else `listen` (--listen)). Why per phase: one warm server measures the back-to-back load
    and a turn-taking one (e.g. 8:104,8:104:listen1) without paying the voice's warm-up twice."""
    parts = spec.split(":")
    audio = "opus"
    try:
        sessions, utterances = int(parts[0]), int(parts[1])
        for extra in parts[2:]:
            if extra in ("opus", "aac"):
                audio = extra
            elif extra.startswith("listen"):
                listen = float(extra[len("listen"):])
                if listen < 0:
                    raise ValueError(extra)
            else:
                raise ValueError(extra)
    except (ValueError, IndexError):
        raise SystemExit(f"--phases: {spec!r} is not SESSIONS:UTTERANCES[:opus|aac][:listenF] (F >= 0)") from None
    return sessions, utterances, audio, float(listen)


def _batcher_stats() -> tuple[int, int]:
    from digital_human.engines.musetalk.pipeline import _PIPELINES

    b = next((p.batcher for p in list(_PIPELINES) if p.batcher is not None), None)
    return (0, 0) if b is None else (b.calls, b.rows_run)


def _batcher_delta(before: tuple[int, int]) -> dict:
    calls, rows = (a - b for a, b in zip(_batcher_stats(), before))
    return {"steps": calls, "rows": rows, "mean_rows_per_step": round(rows / calls, 2) if calls else None}


# --- the clients ------------------------------------------------------------------------------------------------
CLIENT_STAGES = ("tts_lock", "tts_tokens", "tts_first_audio", "first_frame", "first_sent", "first_packet",
                 "client_first_frame", "client_first_audio")


def client_main(args: argparse.Namespace) -> None:
    import_pack()
    from live import percentiles, texts

    from digital_human.pipeline.live.client import LiveClient, http

    all_texts = texts(args.utterances)
    per_session = [all_texts[i::args.sessions] for i in range(args.sessions)]
    rows, summaries, lock = [], [], threading.Lock()
    start = time.perf_counter()
    barrier = threading.Barrier(args.sessions)

    def run(k: int) -> None:
        status, body = http(args.client, "POST", "/sessions")
        if status != 201:
            with lock:
                summaries.append({"session": k, "error": body})
            barrier.abort()
            return
        sid, rate = body["id"], body["sample_rate"]
        client = LiveClient(args.client, sid, keep_frames=False, audio=args.ws_audio)
        client.wait_for(lambda d: len(d.video) > 10, 30)
        try:
            barrier.wait(60)
        except threading.BrokenBarrierError:
            pass
        info0, w0 = http(args.client, "GET", f"/sessions/{sid}")[1], time.perf_counter()
        with client.lock:
            v0 = len(client.decoded.video)
        for i, text in enumerate(per_session[k]):
            if args.deadline_s and time.perf_counter() - start > args.deadline_s:
                break
            time.sleep(0.05 + 0.1 * ((k * 7 + i) % 5) / 5)  # sessions not in lockstep
            asked = time.perf_counter()
            status, body = http(args.client, "POST", f"/sessions/{sid}/say", {"text": text})
            if status != 202:
                with lock:
                    rows.append({"session": k, "chars": len(text), "error": body})
                continue
            uid = body["utterance"]
            first = heard = None
            # waits end by the deadline (+5 s), so the phase returns what it measured in its time
            limit = (lambda cap: max(1.0, min(cap, start + args.deadline_s + 5 - time.perf_counter()))) \
                if args.deadline_s else (lambda cap: cap)
            if client.wait_for(lambda d: any(e["type"] == "speech_start" and e["utterance"] == uid
                                             for e in d.events), limit(60)):
                with client.lock:
                    t0 = next(e["t"] for e in client.decoded.events
                              if e["type"] == "speech_start" and e["utterance"] == uid)
                client.wait_for(lambda d: bool(d.video) and d.video[-1][0] >= t0 - 1e-3, 10)
                client.wait_for(lambda d: bool(d.audio) and d.audio[-1][0] >= t0, 10)
                with client.lock:
                    first = min((a for t, a, _ in client.decoded.video if t >= t0 - 1e-3), default=None)
                    heard = min((a for t, a, pcm in client.decoded.audio if t + len(pcm) / rate > t0 + 1e-3),
                                default=None)
            state, info, u, end = "queued", {}, {}, time.perf_counter() + limit(120)
            while time.perf_counter() < end:
                info = http(args.client, "GET", f"/sessions/{sid}")[1]
                u = next((u for u in info.get("utterances", []) if u["id"] == uid), {})
                state = u.get("state", "?")
                if state in ("done", "interrupted", "failed"):
                    break
                time.sleep(0.05)
            starts, _, late = client.speech_marks(uid)
            row = {"session": k, "i": i, "chars": len(text), "state": state, "audio_s": u.get("audio_seconds"),
                   "frames": u.get("frames"), "stalls": max(0, len(starts) - 1), "late_frames": int(late),
                   **u.get("stages", {}), "client_first_frame": None if first is None else round(first - asked, 4),
                   "client_first_audio": None if heard is None else round(heard - asked, 4)}
            with lock:
                rows.append(row)
            print(json.dumps(row), flush=True)
            if args.listen and u.get("audio_seconds"):  # the person's turn: they answer for as long, times --listen
                turn = args.listen * float(u["audio_seconds"])
                time.sleep(min(turn, max(0.0, start + args.deadline_s - time.perf_counter())) if args.deadline_s
                           else turn)
        info1, w1 = http(args.client, "GET", f"/sessions/{sid}")[1], time.perf_counter()
        with client.lock:
            v1 = len(client.decoded.video)
        client.close()
        http(args.client, "DELETE", f"/sessions/{sid}")
        with lock:
            summaries.append({"session": k, "clock_fps": round((info1["clock_frame"] - info0["clock_frame"]) / (w1 - w0), 2),
                              "client_decoded_fps": round((v1 - v0) / (w1 - w0), 2), "seconds": round(w1 - w0, 1),
                              "client_error": None if client.error is None else repr(client.error)[:200]})

    threads = [threading.Thread(target=run, args=(k,)) for k in range(args.sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stages = CLIENT_STAGES
    done = [r for r in rows if "error" not in r]
    speech = sum(r["frames"] or 0 for r in done)
    out = {"utterances": len(done), "done": sum(r["state"] == "done" for r in done),
           "errors": len(rows) - len(done),
           "percentiles": {s: percentiles([r.get(s) for r in done]) for s in stages},
           "speech_frames": speech, "late_frames": sum(r["late_frames"] for r in done),
           "late_share": round(sum(r["late_frames"] for r in done) / max(1, speech), 4),
           "utterances_with_stalls": sum(r["stalls"] > 0 for r in done),
           "clock_fps_min": min((s["clock_fps"] for s in summaries if "clock_fps" in s), default=None),
           "client_decoded_fps_min": min((s["client_decoded_fps"] for s in summaries if "client_decoded_fps" in s),
                                         default=None),
           "sessions_detail": sorted(summaries, key=lambda s: s["session"]), "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", choices=("full", "reduced"), default="full")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--phases", default="1:16,8:104", help="SESSIONS:UTTERANCES[:opus|aac][:listenF],... run "
                        "one after another (the websocket stream's audio codec, default opus; the phase's --listen); "
                        "none: no sessions (profiles only)")
    parser.add_argument("--tts-lanes", type=int, default=1, help="CosyVoice 2 lanes (serve --tts-lanes): "
                        "utterances voiced at the same time (on CUDA only with DIGITAL_HUMAN_TTS_LANES_CUDA=1)")
    parser.add_argument("--tts-batch", type=int, default=1, help="CosyVoice 2 (serve --tts-batch): up to this many "
                        "sessions decode in the same LM steps and share flow solves (1 = off)")
    parser.add_argument("--lanes-check", type=int, default=0, help="with --tts-lanes >= 2: N repeats of two "
                        "utterances on two lanes alone and at once (same audio? how much overlap?)")
    parser.add_argument("--first-hop", type=int, default=0, help="CosyVoice 2's first piece in speech tokens "
                        "(0 = the engine's FIRST_HOP_TOKENS)")
    parser.add_argument("--tts-profile", type=int, default=0, help="before the sessions: CosyVoice 2's first live "
                        "piece timed by part (prompt + first token, flow, HiFT) this many times for first hops 8 and 4")
    parser.add_argument("--prefill-ab", action="store_true", help="with --tts-profile: CosyVoice 2's static "
                        "prefill against the eager prompt pass in this process (log-prob parity, then --tts-profile "
                        "again with its graphs)")
    parser.add_argument("--face-profile", type=int, default=0, help="before the sessions: the first frame of a "
                        "speech piece (the warm-up piece) timed by part (whisper windows, first render step, model "
                        "step, paste) this many times, then whole while another thread speaks, on the default stream "
                        "(DIGITAL_HUMAN_LIVE_STREAMS=0) and on the live stages' own streams")
    parser.add_argument("--face", default=str(ROOT.parent / "shared" / "data" / "image" / "face_01_female.jpg"))
    parser.add_argument("--face-models", default=os.environ.get("DIGITAL_HUMAN_MODELS", str(ROOT.parent / "models"))
                        + "/face")
    parser.add_argument("--work", default="/tmp/gpu_live")
    parser.add_argument("--face-fast-path", default="auto", choices=["auto", "on", "off"],
                        help="MuseTalk's compiled step (auto: serve's default, on with CUDA)")
    parser.add_argument("--tts-priority", type=int, default=None, help="the TTS streams' CUDA priority "
                        "(DIGITAL_HUMAN_LIVE_TTS_PRIORITY; default: engines/cuda_streams.TTS_PRIORITY, 0; -1 = the "
                        "talking head's)")
    parser.add_argument("--flow-kernels", default="off", help="CosyVoice 2's flow with fewer kernels: off, or "
                        "DIGITAL_HUMAN_COSYVOICE_FLOW_KERNELS's list (fused, compiled, encoder_graph; all)")
    parser.add_argument("--sample-stacks", action="store_true", help="sample the server's threads during each "
                        "phase (where each stage's threads spend the time, their CPU seconds)")
    parser.add_argument("--listen", type=float, default=0.0, help="turn-taking load: after each utterance a session "
                        "waits this many times its speech's length before the next (a person answering); 0 = "
                        "back-to-back speech, every session talking all the time (the default, the heaviest load)")
    parser.add_argument("--budget-s", type=float, default=0.0, help="start no phase, and no utterance, past this "
                        "many seconds of measuring (0 = no limit); the report says what was measured")
    parser.add_argument("--commit", default=os.environ.get("DH_COMMIT", ""))
    parser.add_argument("--state", default="", help="CosyVoice 2 speaker state (.npz from --save-state, made where "
                        "librosa is installed: the GPU machine has none)")
    parser.add_argument("--save-state", default="", help="write the speaker state of the --size release and stop")
    # client process
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--sessions", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--utterances", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--deadline-s", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--ws-audio", default="opus", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.listen < 0:
        parser.error(f"--listen {args.listen}: give 0 (back-to-back speech) or more (the person's turn, times the "
                     "utterance's speech)")
    if args.client:
        client_main(args)
    elif args.save_state:
        save_state(args)
    else:
        server_main(args)


if __name__ == "__main__":
    main()
