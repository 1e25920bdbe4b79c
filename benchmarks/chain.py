"""Whole chain, text to MP4, per stage: the main job's speed on this machine.

Runs the same node code as `digital-human run` (TTS in the fitted voice -> FaceAlign -> TRT_TalkingHead
portrait -> TemporalSmooth -> VideoMux) for ~10 s and ~60 s of speech, warm (models loaded, voice fitted
beforehand: fitting happens once per voice and is reported separately), median of repeats, next to the
same chain with every neural stage forced to eager FP32 torch (the baseline, measured in the same run).

  python benchmarks/chain.py [--repeats 2] [--json benchmarks/out/chain.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
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


def run_chain(text: str, speaker, face_image, backend: str, out_dir: Path) -> dict[str, float]:
    from digital_human.media.mux import mux_video
    from digital_human.nodes.image_convert import image_to_uint8
    from digital_human.nodes.talking_head_nodes import TRT_TalkingHead
    from digital_human.nodes.video_nodes import FaceAlign, TemporalSmooth
    from digital_human.nodes.voice_nodes import TRT_TTS
    from digital_human.audio import to_comfy_audio

    t: dict[str, float] = {}

    def stage(name, fn, *a, **k):
        start = time.perf_counter()
        result = fn(*a, **k)
        t[name] = time.perf_counter() - start
        return result

    speech = stage("tts", TRT_TTS()._synthesize, text, speaker, "en", 1.0, 1.0, "auto", backend, "auto")
    faces, _, _ = stage("align", FaceAlign().align, face_image, 25.0, backend=backend)
    out = stage("talking_head", TRT_TalkingHead().animate, faces, to_comfy_audio(speech.waveform, speech.sample_rate),
                model="portrait", fps=25.0, backend=backend)
    frames, track, _ = out["result"]
    smoothed, _ = stage("smooth", TemporalSmooth().smooth, frames, strength=0.5, fps=25.0, faces=track)
    pixels = stage("to_uint8", image_to_uint8, smoothed)
    stage("mux", mux_video, pixels, speech.waveform, speech.sample_rate, 25.0, out_dir / f"chain_{backend}.mp4")
    t["total"] = sum(t.values())
    t["audio_s"] = speech.audio_seconds
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--face", type=Path, default=DATA / "image" / "face_02_male.png")
    parser.add_argument("--voice", type=Path, default=DATA / "audio" / "spk_en_male_01.wav")
    parser.add_argument("--lengths", nargs="*", default=list(TEXTS))
    args = parser.parse_args()
    import_pack()
    import numpy as np
    from PIL import Image

    from digital_human.nodes.image_convert import uint8_to_image
    from digital_human.nodes.voice_nodes import ExtractSpeakerEmbedding, LoadReferenceAudio

    start = time.perf_counter()
    reference, _ = LoadReferenceAudio().load(audio_file=str(args.voice))
    speaker, _ = ExtractSpeakerEmbedding().extract(reference, imitate=True)
    fit_seconds = time.perf_counter() - start
    with Image.open(args.face) as img:
        face = uint8_to_image(np.asarray(img.convert("RGB"))[None])
    out_dir = Path(tempfile.mkdtemp(prefix="dh-chain-"))
    report = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "load_avg": os.getloadavg(), "voice_fit_s_(cached_after_first)": round(fit_seconds, 2), "rows": []}
    for length in args.lengths:
        for backend, label in (("auto", "node path (auto)"), ("torch", "eager FP32 torch (baseline)")):
            run_chain(TEXTS[length], speaker, face, backend, out_dir)  # warm-up: loads models
            runs = [run_chain(TEXTS[length], speaker, face, backend, out_dir) for _ in range(args.repeats)]
            median = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
            median["rtf"] = round(median["total"] / median["audio_s"], 3)
            row = {"speech": length, "config": label, **median}
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
    print("\n| speech | config | audio s | tts | align | talking head | smooth | mux | total s | x real time |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in report["rows"]:
        print(f"| {r['speech']} | {r['config']} | {r['audio_s']:.1f} | {r['tts']:.2f} | {r['align']:.2f} | "
              f"{r['talking_head']:.2f} | {r['smooth']:.2f} | {r['mux']:.2f} | {r['total']:.2f} | {r['rtf']:.2f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
