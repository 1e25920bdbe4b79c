"""Phone aligner (audio/phone_align.py): cost per second of audio, and how good its output is, on shared clips.

Cost: wall time of align_phones per second of audio (median of 3 runs after one warm-up that loads the
decoders; min-max spread), for forced alignment (transcript known) and the phone loop (no transcript).
The one-off decoder load is reported on its own.
Quality:
  - forced alignment with the right transcript vs an unrelated one: per-frame acoustic score of the
    speech phones and the resulting confidence (this is what FIT_SCORE_PER_FRAME was set from);
  - where a transcript is known, how often the phone loop's label equals the forced alignment's label
    on the speech frames (the phone loop's accuracy, taking the forced alignment as the reference).

    nice -n 5 python benchmarks/phone_align.py [--data ../shared/data] [--write benchmarks/RESULTS.md]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402

EN03_TEXT = "Some call me nature, others call me mother nature."  # SOURCES.md: upstream basic.toml
TTS_TEXTS = ["The old lighthouse keeper wrote a letter to his daughter every winter evening.",
             "Please bring me a bowl of warm soup and some bread before the movie begins."]
SECTION = "## Phone aligner (CPU) - `benchmarks/phone_align.py`"


def mono(path: Path, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    from digital_human.audio import decode_audio

    wave, rate = decode_audio(path, max_seconds=max_seconds)
    return wave.mean(axis=0).astype(np.float32), rate


def timed(fn, repeats: int = 3) -> tuple[float, float, float, object]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times), max(times), out


def frame_labels(result, n: int) -> np.ndarray:
    return np.array(result.labels_at((np.arange(n) + 0.5) / 100))


def speech_score(pa, wave: np.ndarray, rate: int, text: str) -> float | None:
    """Mean per-frame alignment score of the speech phones (None: the word pass found no path)."""
    w, _ = pa._to_pcm16(wave, rate)
    pcm = (np.clip(w, -1, 1) * 32767).astype("<i2").tobytes()
    words, _ = pa._words(text, pa._decoder("forced"))
    try:
        seg = pa._forced(pcm, words)
    except RuntimeError:
        pa._decoders.pop("forced", None)
        return None
    speech = [(frames, score) for name, _, frames, score in seg if pa._label(name) != pa.SILENCE]
    return sum(s for _, s in speech) / sum(f for f, _ in speech)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(os.environ.get(
        "DIGITAL_HUMAN_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")))
    ap.add_argument("--write", type=Path, help="replace (or append) this script's section in a RESULTS.md")
    ap.add_argument("--no-tts", action="store_true", help="skip the pack-TTS clips (they need `setup`'s models)")
    args = ap.parse_args()
    import_pack()
    from importlib.metadata import version

    from digital_human.audio import phone_align as pa

    lines = [SECTION, ""]
    load = os.getloadavg()[0]
    t = time.perf_counter()
    pa._decoder("forced")
    t_forced = time.perf_counter() - t
    t = time.perf_counter()
    pa._decoder("loop")
    t_loop = time.perf_counter() - t
    lines += [f"pocketsphinx {version('pocketsphinx')} (the wheel's en-us model), {os.cpu_count()}-core CPU shared with other jobs (1-min load average "
              f"{load:.1f} at the start), run under `nice -n 5`. One-off decoder load per process: forced "
              f"{t_forced:.2f} s (CMUdict), phone loop {t_loop:.2f} s.", ""]

    clips: list[tuple[str, np.ndarray, int, str | None]] = []
    wave, rate = mono(args.data / "audio" / "spk_en_03.wav")
    clips.append(("spk_en_03 (transcript from SOURCES.md)", wave, rate, EN03_TEXT))
    if not args.no_tts:
        from digital_human.voice.tts import synthesize_speech

        for i, text in enumerate(TTS_TEXTS):
            s = synthesize_speech(text, language="en")
            clips.append((f"pack TTS sentence {i + 1} (its own text)", s.waveform, s.sample_rate, text))
    for name in ("talk_en_male_01a", "talk_en_male_01b"):
        wave, rate = mono(args.data / "video" / f"{name}.mp4")
        clips.append((name, wave, rate, None))

    lines += ["| clip | audio s | method | cost per audio s: median (min-max) of 3 | confidence | phones "
              "| median phone ms | phone loop = forced label, speech frames |", "|---|---|---|---|---|---|---|---|"]
    for name, wave, rate, text in clips:
        seconds = len(wave) / rate
        pa.align_phones(wave, rate, text)  # warm-up (decoders are loaded once per process)
        modes = [("forced", text), ("phone loop", None)] if text else [("phone loop", None)]
        results = {}
        for mode, t in modes:
            med, lo, hi, result = timed(lambda w=wave, r=rate, t=t: pa.align_phones(w, r, t))
            results[mode] = result
            speech = [p for p in result.phones if p.label != pa.SILENCE]
            dur = np.median([p.end - p.start for p in speech]) * 1000 if speech else float("nan")
            agree = ""
            if mode == "phone loop" and "forced" in results and results["forced"].method == "forced":
                n = int(np.ceil(seconds * 100))
                ref, hyp = frame_labels(results["forced"], n), frame_labels(result, n)
                mask = ref != pa.SILENCE
                agree = f"{np.mean(ref[mask] == hyp[mask]):.2f}"
            lines.append(f"| {name} | {seconds:.1f} | {result.method} | {med / seconds * 1000:.0f} ms "
                         f"({lo / seconds * 1000:.0f}-{hi / seconds * 1000:.0f}) | {result.confidence:.2f} "
                         f"| {len(speech)} | {dur:.0f} | {agree} |")
        print(lines[-1], flush=True)

    # Calibration of FIT_SCORE_PER_FRAME: the right transcript vs the en03 transcript on other speech.
    lines += ["", "Right vs unrelated transcript (first 6 s of the talking clips; en03's transcript "
              "forced onto them): mean per-frame score of the speech phones, and what align_phones returns.",
              "", "| audio | transcript | score per frame | result |", "|---|---|---|---|"]
    cal = [(n, w, r, t, "right") for n, w, r, t in clips if t]
    for name in ("talk_en_male_01a", "talk_en_male_02a", "talk_en_female_03a", "talk_de_male_04"):
        w, r = mono(args.data / "video" / f"{name}.mp4", max_seconds=6)
        cal.append((name + " (6 s)", w, r, EN03_TEXT, "unrelated"))
    for name, w, r, text, kind in cal:
        score = speech_score(pa, w, r, text)
        res = pa.align_phones(w, r, text)
        said = f"{res.method}, confidence {res.confidence:.2f}" + (
            f" ({re.sub(r'[|]', '/', res.reason)})" if res.reason else "")
        lines.append(f"| {name} | {kind} | {'no path' if score is None else f'{score:.1f}'} | {said} |")
        print(lines[-1], flush=True)
    lines += ["", f"FIT_SCORE_PER_FRAME = {pa.FIT_SCORE_PER_FRAME}, MIN_CONFIDENCE = {pa.MIN_CONFIDENCE}. "
              f"1-min load average at the end {os.getloadavg()[0]:.1f}.", ""]
    text = "\n".join(lines)
    print(text)
    if args.write:
        old = args.write.read_text(encoding="utf-8")
        start = old.find(SECTION)
        if start >= 0:  # replace up to the next section
            nxt = old.find("\n## ", start + len(SECTION))
            new = old[:start] + text + (old[nxt:] if nxt >= 0 else "")
        else:
            new = old.rstrip("\n") + "\n\n" + text
        args.write.write_text(new if new.endswith("\n") else new + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
