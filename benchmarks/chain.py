"""Whole chain, text to MP4, per stage: the main job's speed on this machine (CPU or GPU).

Runs the same code as `digital-human run` (TTS in the fitted voice -> FaceAlign -> the headless video
path: model crops -> paste-back + smoothing + YUV on the GPU -> encoder) and its ComfyUI node chain
(TRT_TalkingHead -> TemporalSmooth -> VideoMux) for ~10 s and ~60 s of speech, warm (models loaded, voice fitted
beforehand: fitting happens once per voice and is reported separately), median of repeats, next to the
same chain with every neural stage forced to eager FP32 torch (the baseline, measured in the same run).
On a CUDA machine it also reports peak GPU memory per run and, with --unload, the peak with each stage's
models released after use (the small-GPU mode) next to keeping everything loaded.

  python benchmarks/chain.py [--repeats 2] [--json benchmarks/out/chain.json]
  python benchmarks/chain.py --speaker spk.npz ...        # a saved DH_SPEAKER (fitted once, reused;
                                                         # machines without librosa need this)
  python benchmarks/chain.py --models portrait clone     # clone: random-weight avatar of the photo
                                                         # (its speed does not depend on the weights)
  python benchmarks/chain.py --paths headless node       # the CLI's headless video path and/or the nodes
  python benchmarks/chain.py --save-audio DIR            # write each length's TTS speech as DIR/speech_<len>.wav
  python benchmarks/chain.py --audio-dir DIR             # use those WAVs instead of TTS (a machine without the
                                                         # TTS model; the tts column is then 0); with PYTHONPATH
                                                         # pointing at another checkout, the same rows of that
                                                         # version (old vs new in one run)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402

DATA = Path(os.environ.get("DIGITAL_HUMAN_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
TEXTS = {
    "10s": "Good morning everyone. Today I want to show you how a digital twin can read any text aloud, "
           "in my own voice, with my own face.",
}
TEXTS["60s"] = " ".join([TEXTS["10s"],
    "The first step records a short clip of my voice and finds the speech in it. The second step measures what my "
    "voice sounds like and picks the closest synthetic voice, then nudges it towards mine. The third step turns the "
    "text into speech, reading numbers like 3.5 percent, dates like March 5th, and prices like $12.99 the way a "
    "person would. Then the face is found in a photo, the mouth is animated from the sound, the flicker is smoothed "
    "away, and finally everything is written into a video file that plays in any browser. All of this runs on an "
    "ordinary computer, and much faster on a graphics card."])
RANDOM_AVATAR = "bench_random"


def _cuda():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def run_chain(text: str, speaker, face_image, backend: str, out_dir: Path, model: str = "portrait",
              unload: bool = False, headless: bool = False, speech=None) -> dict[str, float]:
    """One text -> MP4 run through the nodes; stage seconds, audio seconds and (CUDA) peak GPU MiB.
    unload: release each stage's models once the stage is done (engines.loader.release).
    headless: after TTS and FaceAlign, the CLI's headless video path (model crops -> render_talking_video:
    paste-back + smoothing on the GPU, YUV frames streamed to the encoder); its columns: talking head =
    the model's crops, smooth = paste-back + smoothing, mux = compose + encode."""
    from digital_human.audio import to_comfy_audio
    from digital_human.engines import loader
    from digital_human.media.mux import mux_video
    from digital_human.media.probe import probe_media
    from digital_human.nodes.image_convert import image_to_uint8
    from digital_human.nodes.talking_head_nodes import TRT_TalkingHead
    from digital_human.nodes.video_nodes import FaceAlign, TemporalSmooth
    from digital_human.nodes.voice_nodes import TRT_TTS

    t: dict[str, float] = {}
    torch = _cuda()
    if torch is not None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    def stage(name, fn, *a, **k):
        start = time.perf_counter()
        result = fn(*a, **k)
        if torch is not None:
            torch.cuda.synchronize()
        t[name] = time.perf_counter() - start
        return result

    if speech is None:
        speech = stage("tts", TRT_TTS()._synthesize, text, speaker, "en", 1.0, 1.0, "auto", backend, "auto")
    else:  # pre-made speech (--audio-dir): no TTS stage
        t["tts"] = 0.0
    if unload:
        loader.release("voice")
    faces, _, _ = stage("align", FaceAlign().align, face_image, 25.0, backend=backend)
    path = out_dir / f"chain_{backend}_{model.replace(':', '_')}{'_headless' if headless else ''}.mp4"
    if headless:
        from digital_human.talking_head.render_video import render_talking_video
        from digital_human.talking_head.registry import generate_crops

        gen = stage("talking_head", generate_crops, faces, speech.waveform, speech.sample_rate, model, 25.0,
                    backend=backend)
        if unload:
            loader.release("face")
        result = stage("video", render_talking_video, gen, speech.waveform, speech.sample_rate, path,
                       smooth_strength=0.5)
        video = t.pop("video")
        # the streaming path overlaps generation, paste-back, smoothing and encoding: one time for all
        # (reported under mux; older versions report paste_smooth separately)
        t["smooth"] = result.timings.get("paste_smooth", 0.0)
        t["to_uint8"] = 0.0
        t["mux"] = video - t["smooth"]
    else:
        out = stage("talking_head", TRT_TalkingHead().animate, faces,
                    to_comfy_audio(speech.waveform, speech.sample_rate), model=model, fps=25.0, backend=backend)
        if unload:
            loader.release("face")
        frames, track, _ = out["result"]
        smoothed, _ = stage("smooth", TemporalSmooth().smooth, frames, strength=0.5, fps=25.0, faces=track)
        pixels = stage("to_uint8", image_to_uint8, smoothed)
        stage("mux", mux_video, pixels, speech.waveform, speech.sample_rate, 25.0, path)
    t["total"] = sum(t.values())
    t["audio_s"] = speech.audio_seconds
    probe = probe_media(path)  # outside the timing: the benchmark's own check that the MP4 is valid
    if probe.video_codec != "h264" or probe.frame_count < 1 or abs(probe.video_duration - speech.audio_seconds) > 0.1:
        raise RuntimeError(f"chain output {path} is not a valid MP4 of the speech: {probe}")
    if torch is not None:
        t["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
    return t


def headless_parity(text: str, speaker, face_image, model: str) -> dict:
    """The headless path's frames (torch on CUDA when present) against the node path's (CPU paste-back,
    numpy smoothing, image_to_uint8) for the same generated crops: PSNR, max and share of pixel
    values off by more than 2; and the YUV conversion on the device against the CPU's, byte for byte."""
    import numpy as np
    import torch

    from digital_human.talking_head.driver import paste_generated
    from digital_human.talking_head.render_video import compose_chunks, paste_and_smooth
    from digital_human.media.yuv import rgb_to_yuv420p
    from digital_human.nodes.image_convert import image_to_uint8, uint8_to_image
    from digital_human.talking_head.registry import generate_crops
    from digital_human.nodes.video_nodes import FaceAlign, TemporalSmooth
    from digital_human.nodes.voice_nodes import TRT_TTS

    speech = TRT_TTS()._synthesize(text, speaker, "en", 1.0, 1.0, "auto", "auto", "auto")
    faces, _, _ = FaceAlign().align(face_image, 25.0)
    gen = generate_crops(faces, speech.waveform, speech.sample_rate, model, 25.0)
    node = paste_generated(gen)
    images, _ = TemporalSmooth().smooth(uint8_to_image(node.frames), strength=0.5, fps=25.0, faces=node.track)
    expected = image_to_uint8(images)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    boxes = paste_and_smooth(gen, smooth_strength=0.5, device=device)
    chunks = list(compose_chunks(gen, boxes, device))
    got = np.concatenate([c.cpu().numpy() for c in chunks])
    diff = np.abs(got.astype(np.int16) - expected.astype(np.int16))
    mse = float(np.mean(diff.astype(np.float64) ** 2))
    yuv_device = rgb_to_yuv420p(chunks[0]).cpu()
    yuv_cpu = rgb_to_yuv420p(chunks[0].cpu())
    return {"model": model.split(":")[0], "device": device, "frames": int(len(got)),
            "psnr_db": round(10 * np.log10(255.0 ** 2 / mse), 2) if mse else float("inf"),
            "max_abs": int(diff.max()), "share_over_2": float((diff > 2).mean()),
            "yuv_device_equals_cpu": bool(torch.equal(yuv_device, yuv_cpu))}


class WavSpeech:
    """Speech read from a 16-bit WAV (stdlib only, so any version of the pack can be timed on it)."""

    def __init__(self, path: Path):
        import wave

        import numpy as np

        with wave.open(str(path), "rb") as wav:
            self.sample_rate = wav.getframerate()
            pcm = np.frombuffer(wav.readframes(wav.getnframes()), np.int16)
        self.waveform = pcm.astype(np.float32) / 32768.0  # mono, as the TTS returns it
        self.audio_seconds = self.waveform.shape[0] / self.sample_rate

    @staticmethod
    def save(path: Path, waveform, sample_rate: int) -> None:
        import wave

        import numpy as np

        pcm = (np.clip(np.asarray(waveform, np.float32).reshape(-1), -1.0, 1.0) * 32767.0).astype(np.int16)
        path.parent.mkdir(parents=True, exist_ok=True)
        with wave.open(str(path), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(int(sample_rate))
            wav.writeframes(pcm.tobytes())


def load_or_fit_speaker(voice: Path, speaker_file: Path | None):
    """DH_SPEAKER with the fitted voice: from `speaker_file` when it exists, else fitted from `voice`
    (and saved to `speaker_file` when given). Returns (speaker, seconds spent fitting or loading)."""
    from digital_human.nodes.voice_nodes import ExtractSpeakerEmbedding, LoadReferenceAudio
    from digital_human.voice.speaker import SpeakerProfile

    start = time.perf_counter()
    if speaker_file is not None and speaker_file.is_file():
        return SpeakerProfile.load_npz(speaker_file), time.perf_counter() - start
    reference, _ = LoadReferenceAudio().load(audio_file=str(voice))
    speaker, _ = ExtractSpeakerEmbedding().extract(reference, imitate=True)
    if speaker_file is not None:
        speaker.save_npz(speaker_file)
    return speaker, time.perf_counter() - start


def random_avatar(face_image) -> str:
    """A clone avatar of the photo with random generator weights (seeded), for speed runs only."""
    import torch

    from digital_human.talking_head.audio_features import MelConfig
    from digital_human.talking_head.clone.avatar_store import save_avatar
    from digital_human.engines.clone_model import CloneGenerator, GeneratorConfig
    from digital_human.nodes.video_nodes import FaceAlign

    faces, _, _ = FaceAlign().align(face_image, 25.0)
    config = GeneratorConfig(crop_size=faces.crop_size)
    torch.manual_seed(0)
    save_avatar(CloneGenerator(config), RANDOM_AVATAR, faces.crops[0], faces.crop_landmarks()[0], MelConfig(),
                {"steps": 0, "loss": float("nan"), "note": "random weights: speed benchmarks only", "neutral_frame": 0,
                 "frames": 1, "source_fps": 25.0, "train_seconds": 0.0, "device": "none", "seed": 0,
                 "footage_seconds": 0.0, "date": ""}, check_onnx=False)
    return f"clone:{RANDOM_AVATAR}"


def environment() -> dict:
    import numpy as np

    info = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(), "python": platform.python_version(), "numpy": np.__version__}
    torch = _cuda()
    if torch is not None:
        info.update(device=torch.cuda.get_device_name(0), torch=torch.__version__, cuda=torch.version.cuda)
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--face", type=Path, default=DATA / "image" / "face_02_male.png")
    parser.add_argument("--voice", type=Path, default=DATA / "audio" / "spk_en_male_01.wav")
    parser.add_argument("--speaker", type=Path, help="saved DH_SPEAKER .npz (fitted voice); written if missing")
    parser.add_argument("--lengths", nargs="*", default=list(TEXTS))
    parser.add_argument("--models", nargs="*", default=["portrait"], choices=["portrait", "clone"])
    parser.add_argument("--no-baseline", action="store_true", help="skip the eager FP32 rows")
    parser.add_argument("--paths", nargs="*", default=["headless", "node"], choices=["headless", "node"],
                        help="headless = the CLI's video path; node = the ComfyUI node chain")
    parser.add_argument("--parity", action="store_true",
                        help="also compare the headless path's frames with the node path's (10 s of speech)")
    parser.add_argument("--unload", action="store_true", help="also run with stage unloading (peak GPU memory)")
    parser.add_argument("--save-audio", type=Path, help="write each length's TTS speech as DIR/speech_<len>.wav, exit")
    parser.add_argument("--audio-dir", type=Path, help="speech from DIR/speech_<len>.wav instead of TTS")
    args = parser.parse_args()
    import_pack()
    import numpy as np
    from PIL import Image

    from digital_human.nodes.image_convert import uint8_to_image

    if args.audio_dir:
        speaker, fit_seconds = None, 0.0
        speeches = {length: WavSpeech(args.audio_dir / f"speech_{length}.wav") for length in args.lengths}
    else:
        speaker, fit_seconds = load_or_fit_speaker(args.voice, args.speaker)
        speeches = {}
    if args.save_audio:
        from digital_human.nodes.voice_nodes import TRT_TTS

        for length in args.lengths:
            speech = TRT_TTS()._synthesize(TEXTS[length], speaker, "en", 1.0, 1.0, "auto", "auto", "auto")
            WavSpeech.save(args.save_audio / f"speech_{length}.wav", speech.waveform, speech.sample_rate)
        return
    with Image.open(args.face) as img:
        face = uint8_to_image(np.asarray(img.convert("RGB"))[None])
    out_dir = Path(tempfile.mkdtemp(prefix="dh-chain-"))
    import digital_human

    report = {**environment(), "pack": str(Path(digital_human.__file__).resolve().parent),
              "voice_fit_or_load_s": round(fit_seconds, 2), "rows": []}
    models = {"portrait": "portrait"}
    if "clone" in args.models:
        models["clone"] = random_avatar(face)
    configs = []  # (backend, unload, headless, label)
    if "headless" in args.paths:
        configs.append(("auto", False, True, "headless path (auto)"))
    if "node" in args.paths:
        configs.append(("auto", False, False, "node path (auto)"))
    if args.unload and _cuda() is not None:
        configs.append(("auto", True, False, "node path, stages unloaded"))
    if not args.no_baseline:
        configs.append(("torch", False, False, "eager FP32 torch (baseline)"))
    for length in args.lengths:
        for model_key in args.models:
            for backend, unload, headless, label in configs:
                def once() -> dict[str, float]:
                    return run_chain(TEXTS[length], speaker, face, backend, out_dir, models[model_key], unload,
                                     headless, speeches.get(length))

                once()  # warm-up
                runs = [once() for _ in range(args.repeats)]
                median = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
                median["rtf"] = round(median["total"] / median["audio_s"], 3)
                row = {"speech": length, "model": model_key, "config": label, **median}
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
    if args.parity:
        report["parity"] = [headless_parity(TEXTS["10s"], speaker, face, models[m]) for m in args.models]
        for row in report["parity"]:
            print(json.dumps(row), flush=True)
    baselines = {(r["speech"], r["model"]): r["total"] for r in report["rows"] if r["config"].startswith("eager")}
    for r in report["rows"]:  # speed-up of each row over the eager FP32 chain of the same speech and model
        base = baselines.get((r["speech"], r["model"]))
        r["vs_eager"] = round(base / r["total"], 3) if base else None
    print(f"\n{report.get('device', report['machine'])}")
    print("| speech | model | config | audio s | tts | align | talking head | smooth | to uint8 | mux | total s | "
          "vs eager | x real time | peak GPU MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in report["rows"]:
        ratio = f"{r['vs_eager']:.2f}x" if r["vs_eager"] else "-"
        print(f"| {r['speech']} | {r['model']} | {r['config']} | {r['audio_s']:.1f} | {r['tts']:.2f} | {r['align']:.2f} | "
              f"{r['talking_head']:.2f} | {r['smooth']:.2f} | {r['to_uint8']:.2f} | {r['mux']:.2f} | {r['total']:.2f} | "
              f"{ratio} | {r['rtf']:.3f} | {r.get('peak_gpu_mib', float('nan')):.0f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
