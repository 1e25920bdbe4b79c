"""Does the cloned voice keep the speaker's pitch from ~85 Hz (deep man) to ~300 Hz (high woman)? (issue 36)

Run from the repo root (the pack importable, models from `setup`):

    python benchmarks/voice_pitch_range.py [--clips NAME ...] [--no-loop] [--json out.json]

Per clip: a speaker profile and a fitted voice from the clip (at most MAX_SECONDS of it, the fit sees the whole
clip: this benchmark measures pitch, not identity), then the two test sentences of benchmarks/voice_clone.py
(never the fit's probe) spoken by the fitted voice at speed 1. The error is the clone's median F0 over the
speaker's, both measured the way a listener hears pitch (voice/pitch.py listener_median_f0: median YIN F0 over
clearly voiced frames); pYIN's reading (the estimator before issue 36) is reported beside it as a cross-check.
Bar: every clip within +-10 %.

Clips: real recordings from ../shared/data (SOURCES.md), and, where no real voice sits at a range's edge,
recordings of that language's speakers SHIFTED in pitch (marked `shifted` in the output). Shifting is done by
resampling (voice/formant.py formant_shift): pitch, formants and tempo all move by the same factor, which is
how a larger or smaller vocal tract and a lower or higher voice move together; the shifted clip is a test of the
pitch fit only and its identity is never scored (it is nobody's voice).

--no-loop: the fit without issue 36's closed-loop pitch correction (clone.PITCH_LOOP_STEPS = 0: the search's
pitch, measured but not corrected), the comparison run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from digital_human.audio import decode_audio, prepare_reference  # noqa: E402
from digital_human.voice import clone  # noqa: E402
from digital_human.voice.formant import formant_shift  # noqa: E402
from digital_human.voice.pitch import listener_median_f0, median_f0  # noqa: E402
from digital_human.voice.speaker import extract_speaker_profile, reference_pitch  # noqa: E402
from digital_human.voice.tts import SAMPLE_RATE, synthesize_speech  # noqa: E402

DATA = REPO.parent / "shared" / "data"
MAX_SECONDS = 25.0  # a clip's first 25 s: the fit-time bar's longest clip
TOLERANCE = 0.10
# Two test sentences per language, as benchmarks/voice_clone.py speaks them (disjoint from the probe).
TEST_SENTENCES = {
    "en": "The old lighthouse keeper wrote a letter to his daughter every winter evening. "
          "Fresh bread and warm soup were waiting for everyone who helped in the garden.",
    "zh": "今天天气很好，我们一起去公园散步吧。他每天晚上都会给家里打电话，问问父母的身体怎么样。",
}
# name -> (file under DATA, language, pitch the clip is shifted to in Hz, or None for the real recording)
CLIPS: dict[str, tuple[str, str, float | None]] = {
    "en_male_deep_shifted_85": ("audio/spk_en_male_04_bilingual.m4a", "en", 85.0),
    "zh_male_deep_shifted_85": ("audio/spk_zh_male_04_bilingual.m4a", "zh", 85.0),
    "en_male_ng_talk_01a": ("video/talk_en_male_01a.mp4", "en", None),  # a real deep English man, ~90 Hz
    "zh_male_04_bilingual": ("audio/spk_zh_male_04_bilingual.m4a", "zh", None),
    "en_male_04_bilingual": ("audio/spk_en_male_04_bilingual.m4a", "en", None),
    "en_male_01": ("audio/spk_en_male_01.wav", "en", None),
    "en_male_obama_talk_02b": ("video/talk_en_male_02b.mp4", "en", None),
    "zh_male_01": ("audio/spk_zh_male_01.wav", "zh", None),
    "zh_male_shifted_166": ("audio/spk_zh_male_01.wav", "zh", 166.0),  # issue 36's Mandarin man sat at 166 Hz
    "zh_female_01": ("audio/spk_zh_female_01.wav", "zh", None),
    "en_female_02": ("audio/spk_en_female_02.mp3", "en", None),
    "zh_03": ("audio/spk_zh_03.wav", "zh", None),
    "en_female_feifei_talk_03a": ("video/talk_en_female_03a.mp4", "en", None),  # ~295 Hz
    "zh_female_high_shifted_300": ("audio/spk_zh_female_01.wav", "zh", 300.0),
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def load_clip(name: str):
    """(prepared audio, shift factor or None) of a clip, shifted to its target pitch when it has one."""
    rel, _lang, target_hz = CLIPS[name]
    wave, rate = decode_audio(DATA / rel, max_seconds=MAX_SECONDS)
    if target_hz is None:
        return prepare_reference(wave, rate, source=name, min_speech_seconds=3.0), None
    real = prepare_reference(wave, rate, source=f"{name} (before shifting)", min_speech_seconds=3.0)
    factor = float(target_hz) / reference_pitch(real.waveform, real.sample_rate, real.segments)
    shifted = formant_shift(real.waveform, real.sample_rate, factor)
    return prepare_reference(shifted, real.sample_rate, source=name, min_speech_seconds=3.0), factor


def bench_clip(name: str, seed: int) -> dict:
    rel, lang, target_hz = CLIPS[name]
    prepared, factor = load_clip(name)
    profile = extract_speaker_profile(prepared, cache=False, name=name)
    speaker_hz = reference_pitch(prepared.waveform, prepared.sample_rate, prepared.segments)
    speaker_pyin = median_f0(np.concatenate([prepared.waveform[a:b] for a, b in prepared.segments]),
                             prepared.sample_rate)
    start = time.perf_counter()
    fitted, result = clone.fit_voice(profile, seed=seed, language=lang, reference=prepared)
    fit_seconds = time.perf_counter() - start
    speech = synthesize_speech(TEST_SENTENCES[lang], fitted).waveform
    clone_hz, clone_pyin = listener_median_f0(speech, SAMPLE_RATE), median_f0(speech, SAMPLE_RATE)
    error = clone_hz / speaker_hz - 1
    row = {
        "clip": name, "file": rel, "language": lang, "shifted": factor is not None,
        "shift_factor": factor, "speech_s": round(prepared.speech_seconds, 2),
        "speaker_f0": speaker_hz, "clone_f0": clone_hz, "f0_error": error,
        "within_10pct": bool(np.isfinite(error) and abs(error) <= TOLERANCE),
        "speaker_f0_pyin": speaker_pyin, "clone_f0_pyin": clone_pyin,
        "f0_error_pyin": clone_pyin / speaker_pyin - 1,
        "probe_f0_speed1": float(fitted.extras.get(clone.KEY_FITTED_PITCH, np.nan)),
        "base_voice": result.base_voice, "f0_scale": result.f0_scale, "formant_scale": result.formant_scale,
        "fit_seconds": fit_seconds, "probe_similarity": result.similarity,
    }
    log(f"{name}: speaker {speaker_hz:.0f} Hz, clone {clone_hz:.0f} Hz ({error:+.1%}; pYIN {row['f0_error_pyin']:+.1%}) "
        f"via {result.base_voice} x{result.f0_scale:.2f} formants x{result.formant_scale:.2f}, fit {fit_seconds:.0f} s")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clips", nargs="+", choices=sorted(CLIPS), help="default: all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-loop", action="store_true", help="without the closed-loop pitch correction")
    parser.add_argument("--json", type=Path, help="write the results here (rewritten after every clip)")
    args = parser.parse_args()
    if args.no_loop:
        clone.PITCH_LOOP_STEPS = 0
    os.environ.setdefault("DIGITAL_HUMAN_MODELS", str(REPO.parent / "models"))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    report = {"benchmark": "voice_pitch_range", "date": time.strftime("%Y-%m-%d"), "commit": commit,
              "machine": f"{os.cpu_count()}-core CPU ({platform.machine()})", "seed": args.seed,
              "pitch_loop": not args.no_loop, "tolerance": TOLERANCE, "clips": []}
    for name in args.clips or list(CLIPS):
        log(f"--- {name}")
        report["clips"].append(bench_clip(name, args.seed))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False))
    rows = report["clips"]
    print("| clip | language | shifted | speaker F0 Hz | clone F0 Hz | error | pYIN error | base voice (pitch x, formants x) | fit s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['clip']} | {r['language']} | {'x%.2f' % r['shift_factor'] if r['shifted'] else 'no'} | "
              f"{r['speaker_f0']:.0f} | {r['clone_f0']:.0f} | {r['f0_error']:+.1%} | {r['f0_error_pyin']:+.1%} | "
              f"{r['base_voice']} ({r['f0_scale']:.2f}, {r['formant_scale']:.2f}) | {r['fit_seconds']:.0f} |")
    within = sum(r["within_10pct"] for r in rows)
    print(f"\n{within} of {len(rows)} clips within +-{TOLERANCE:.0%}")
    return 0 if within == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
