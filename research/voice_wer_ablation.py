"""Which modification of a fitted voice costs English intelligibility? (issue 18, v7 of the voice fit)

    python research/voice_wer_ablation.py fit spk_en_female_02 /tmp/f02.npz [--seed 1]  # fit once (benchmark split)
    python research/voice_wer_ablation.py ablate /tmp/f02.npz [--only base,full] [name=f0:formant:offset:eq ...]
    python research/voice_wer_ablation.py noise /tmp/f02.npz base full           # recogniser noise on saved waves

`fit` fits the speaker as benchmarks/voice_clone.py does (clone part of its split, seed 0) and saves
the profile. `ablate` speaks the benchmark's WER sentences (24 since v9 of the benchmark) with the fitted voice and with each of
its modifications (timbre offset, pitch, formant scale, EQ) removed or applied alone, and scores them
with the benchmark's recogniser (pocketsphinx); extra variants are given as
name=f0_scale:formant_scale:offset(0/1):eq(0/1). It writes <profile>.ablate.json and the waves of
each variant (<profile>.<variant>.npy) for `noise`, which re-transcribes them unchanged, with leading
silence and with faint white noise, to show how far the WER moves without any audible change.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from benchmarks import asr  # noqa: E402
from benchmarks.voice_clone import WER_SENTENCES  # noqa: E402

SR = 24000


def fit(name: str, out: Path, seed: int = 0) -> None:
    from benchmarks import voice_clone as vc
    from digital_human.audio import load_reference
    from digital_human.voice.clone import fit_voice
    from digital_human.voice.speaker import extract_speaker_profile

    clips = vc.clip_paths(vc.DEFAULT_DATA)
    prepared = load_reference(clips[name], min_speech_seconds=1.0)
    try:
        part = vc.split_clip(prepared, name).clone
    except vc.SkipSpeaker:  # too short to split: the benchmark fits such a clip whole (pitch_only_speaker)
        part = prepared
    profile = extract_speaker_profile(part, name=name)
    start = time.perf_counter()
    fitted, result = fit_voice(profile, budget=vc.DEFAULT_BUDGET, seed=seed, language=vc.speaker_language(name),
                               reference=part)
    print(f"fit {time.perf_counter() - start:.0f} s: {result.base_voice} pitch x{result.f0_scale:.3f} "
          f"formants x{result.formant_scale:.3f}", flush=True)
    fitted.save_npz(out)


def ablate(profile_path: Path, only: list[str] | None, extra: list[str]) -> None:
    from digital_human.voice.imitation import apply_offset
    from digital_human.voice.speaker import SpeakerProfile
    from digital_human.voice.tts import (KEY_BASE_VOICE, KEY_EQ, KEY_F0, KEY_FORMANT, KEY_OFFSET, VoiceChoice,
                                         bundled_voices, synthesize_voices)

    ex = SpeakerProfile.load_npz(profile_path).extras
    base = np.asarray(bundled_voices()[str(ex[KEY_BASE_VOICE])], np.float32)
    moved = apply_offset(base, np.asarray(ex[KEY_OFFSET], np.float32))
    f0, fm = float(ex[KEY_F0]), float(ex[KEY_FORMANT])
    eq = np.asarray(ex[KEY_EQ], np.float32).reshape(-1) if KEY_EQ in ex else None
    variants = {  # name -> (pack, f0 scale, formant scale, EQ)
        "base": (base, 1.0, 1.0, None), "full": (moved, f0, fm, eq),
        "full-noEQ": (moved, f0, fm, None), "full-noOffset": (base, f0, fm, eq), "full-pitch1": (moved, 1.0, fm, eq),
        "full-formant1": (moved, f0, 1.0, eq),
        "base+pitch": (base, f0, 1.0, None), "base+formant": (base, 1.0, fm, None), "base+EQ": (base, 1.0, 1.0, eq),
        "base+offset": (moved, 1.0, 1.0, None), "base+pitch+formant": (base, f0, fm, None),
    }
    for item in extra:
        name, spec = item.split("=")
        s = spec.split(":")
        variants[name] = (moved if len(s) > 2 and s[2] == "1" else base, float(s[0]), float(s[1]),
                          eq if len(s) > 3 and s[3] == "1" else None)
        only = None if only is None else only + [name]
    if extra and only is None:
        only = [item.split("=")[0] for item in extra]
    results = {}
    for name, (pack, f, m, e) in variants.items():
        if only and name not in only:
            continue
        waves = [synthesize_voices(s, [VoiceChoice(pack, f, name, e, m)])[0].waveform for s in WER_SENTENCES]
        hyps = [asr.transcribe(w, SR) for w in waves]
        wers = [asr.wer(r, h) for r, h in zip(WER_SENTENCES, hyps)]
        results[name] = {"f0": f, "formant": m, "eq": e is not None, "wer": float(np.mean(wers)), "sentences": wers,
                         "hyps": hyps}
        print(f"{name:22s} f0 x{f:.2f} formants x{m:.2f} WER {np.mean(wers):.3f}", flush=True)
        np.save(f"{profile_path}.{name}.npy", np.array(waves, dtype=object), allow_pickle=True)
    out = Path(f"{profile_path}.ablate.json")
    old = json.loads(out.read_text()) if out.exists() else {}
    out.write_text(json.dumps({**old, **results}, indent=1))


def noise(profile_path: Path, names: list[str]) -> None:
    def with_noise(w: np.ndarray, snr_db: float, seed: int) -> np.ndarray:
        level = np.sqrt(np.mean(w ** 2)) / 10 ** (snr_db / 20)
        return (w + np.random.default_rng(seed).standard_normal(w.size).astype(np.float32) * level).astype(np.float32)

    perturbations = {
        "same": lambda w: w, "same again": lambda w: w,
        "pad 10ms": lambda w: np.pad(w, (240, 0)), "pad 37ms": lambda w: np.pad(w, (888, 0)),
        "pad 71ms": lambda w: np.pad(w, (1704, 0)),
        "noise 45dB s0": lambda w: with_noise(w, 45, 0), "noise 45dB s1": lambda w: with_noise(w, 45, 1),
        "noise 35dB s0": lambda w: with_noise(w, 35, 0), "gain 0.5 (pre-norm)": lambda w: w * 0.5,
    }
    for name in names:
        waves = np.load(f"{profile_path}.{name}.npy", allow_pickle=True)
        row = {label: float(np.mean([asr.wer(r, asr.transcribe(fn(w), SR)) for r, w in zip(WER_SENTENCES, waves)]))
               for label, fn in perturbations.items()}
        print(name, json.dumps({k: round(v, 3) for k, v in row.items()}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("fit")
    p.add_argument("speaker")
    p.add_argument("profile", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("ablate")
    p.add_argument("profile", type=Path)
    p.add_argument("--only", help="comma-separated variant names")
    p.add_argument("extra", nargs="*", help="name=f0:formant:offset(0/1):eq(0/1)")
    p = sub.add_parser("noise")
    p.add_argument("profile", type=Path)
    p.add_argument("names", nargs="+")
    args = parser.parse_args()
    if args.cmd == "fit":
        fit(args.speaker, args.profile, args.seed)
    elif args.cmd == "ablate":
        ablate(args.profile, args.only.split(",") if args.only else None, args.extra)
    else:
        noise(args.profile, args.names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
