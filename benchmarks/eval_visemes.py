"""`portrait` with and without viseme timing, and with a mouth bank, on the held-out clip talk_en_male_01b (issue 17).

Same protocol as eval_talking_head.py's portrait row: 01b's own frames are driven by 01b's own audio
and compared with the real 01b frames (face mesh run again on both). 01b is a real recording, so its
phone timings come from the offline aligner (audio/phone_align.py, pocketsphinx; no transcript is
shipped with the clip, so it runs its phone loop unless --text is given). Rows:
  today     - portrait from loudness and spectral shape only (no phones),
  visemes   - portrait with the aligner's phones (viseme targets blended with the energy drive),
  visemes+bank - the same drive, with the lips and mouth taken from a mouth bank of another video of the
              person (talking_head/portrait/mouth_bank.py; default 01a, never 01b itself: its own frames
              would hand the real mouths back) instead of portrait's drawn interior.
Printed per row: mouth-landmark distance (MLD, / inter-ocular distance) to the real frames, mouth-region
SSIM against the real frames (vision/lipsync_metrics.mouth_ssim, grey, box around the real lips), lag and
correlation of the mouth opening with the speech envelope, and the bilabial closure fraction: on
frames whose time lies inside an aligned P/B/M, the share where the inner-lip gap (mesh) is below
GAP_MEET x inter-ocular distance, next to the real 01b's share on the same frames. The aligner's cost
is reported per second of audio; the bank's cost (building it from the bank video, choosing its frames)
apart from the animate time. --crops OUT.jpg writes mouth crops of a few frames (rows: real 01b, the
viseme row, the bank row) to judge by eye. Caveat: the P/B/M frames come from the same aligner that drives the
viseme row, so a wrong label counts for that row; the phone loop's labels agree with a forced
alignment on only 55-63 % of speech frames (phone_align.py).

  python benchmarks/eval_visemes.py [--seconds 0] [--cache /tmp/dh_talking_head_eval] [--json OUT]
                                    [--bank a|off] [--crops OUT.jpg]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402

GAP_MEETS = (0.02, 0.03)  # inner-lip gap / iod below which the lips count as meeting (two thresholds)
BILABIALS = frozenset({"P", "B", "M"})


def bilabial_frames(phones, fps: float, n: int) -> np.ndarray:
    t = np.arange(n) / fps
    inside = np.zeros(n, bool)
    for p in phones:
        if p.label in BILABIALS:
            inside |= (t >= p.start) & (t < p.end)
    return inside


def closure_fractions(opening: np.ndarray, frames: np.ndarray) -> dict[str, float]:
    if not frames.any():
        return {f"closed_{g}": float("nan") for g in GAP_MEETS}
    return {f"closed_{g}": float(np.mean(opening[frames] < g)) for g in GAP_MEETS}


def interleaved_render_ms(track, wave: np.ndarray, sr: int, fps: float, runs: list, chunk: int = 32) -> dict:
    """Render ms per frame of each run's crops (portrait_crops streaming; the paste-back is the same for
    all), measured chunk by chunk in turn so that load from other processes on the shared CPU falls on
    every run alike (the animate_s of rows run one after another is not comparable to 10 %)."""
    import_pack()
    from digital_human.talking_head.portrait.animate import portrait_crops

    gens = {name: portrait_crops(track, wave, sr, fps, phones=ph, mouth_bank=bank, streaming=True)
            for name, ph, bank in runs}
    spent = dict.fromkeys(gens, 0.0)
    n = len(next(iter(gens.values())))
    for start in range(0, n, chunk):
        for name, gen in gens.items():
            t0 = time.perf_counter()
            gen.chunk(start, min(start + chunk, n))
            spent[name] += time.perf_counter() - t0
    return {name: 1000.0 * s / n for name, s in spent.items()}


def write_crops(path: Path, real: np.ndarray, real_lms: np.ndarray, rows: dict[str, np.ndarray],
                count: int = 6, scale: int = 2) -> None:
    """Mouth crops of `count` frames spread over the clip, one row per version (real first), labelled."""
    import cv2

    picks = np.linspace(0.1, 0.9, count) * len(real)
    lips = real_lms[:, 0:468, :2]
    tiles = []
    for name, frames in [("real 01b", real), *rows.items()]:
        row = []
        for t in picks.astype(int):
            pts = lips[t, [61, 291, 0, 17, 152, 2]]
            iod = float(np.linalg.norm(lips[t, 263] - lips[t, 33]))
            cx, cy = pts[:2].mean(0)
            half = int(0.45 * iod)
            y0, x0 = int(cy - half), int(cx - half)
            box = frames[t, max(y0, 0):y0 + 2 * half, max(x0, 0):x0 + 2 * half]
            row.append(cv2.resize(np.ascontiguousarray(box), (2 * half * scale, 2 * half * scale),
                                  interpolation=cv2.INTER_CUBIC))
        size = min(r.shape[0] for r in row)
        strip = np.concatenate([r[:size, :size] for r in row], 1)
        label = np.full((22, strip.shape[1], 3), 255, np.uint8)
        cv2.putText(label, name, (4, 16), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
        tiles += [label, strip]
    width = min(t.shape[1] for t in tiles)
    image = np.concatenate([t[:, :width] for t in tiles], 0)
    cv2.imwrite(str(path), cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 92])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.environ.get("DIGITAL_HUMAN_DATA",
                                                     str(Path(__file__).resolve().parents[2] / "shared" / "data")))
    ap.add_argument("--cache", default="/tmp/dh_talking_head_eval", help="aligned tracks are cached here")
    ap.add_argument("--seconds", type=float, default=0.0, help="first N seconds of 01b (0 = all)")
    ap.add_argument("--text", default=None, help="transcript of 01b for forced alignment (default: phone loop)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--bank", default="a", choices=["a", "off"],
                    help="a: add the visemes+bank row with talk_en_male_01a as the mouth bank; off: no bank row")
    ap.add_argument("--crops", type=Path, help="write a before/after image of mouth crops here (.jpg/.png)")
    args = ap.parse_args()
    import_pack()
    from eval_talking_head import lip_scores, load_clip

    from digital_human.audio.phone_align import align_phones
    from digital_human.talking_head.driver import output_frame_count, schedule_track
    from digital_human.talking_head.portrait.animate import animate_portrait
    from digital_human.talking_head.portrait.mouth_bank import build_bank
    from digital_human.vision.lipsync_metrics import mouth_opening, mouth_ssim, remeasure_landmarks

    track, wave, sr = load_clip("b", Path(args.data), Path(args.cache))
    fps = track.fps
    n = len(track) if not args.seconds else min(len(track), int(args.seconds * fps))
    n = min(n, output_frame_count(len(wave) / sr, fps))
    track = schedule_track(track, np.arange(n))
    wave = wave[: int(round(n / fps * sr))]

    t0 = time.perf_counter()
    alignment = align_phones(wave, sr, text=args.text)
    align_s = time.perf_counter() - t0
    print(f"aligner: {alignment.method}, confidence {alignment.confidence:.2f}, {len(alignment.phones)} phones, "
          f"{align_s / (len(wave) / sr):.3f} s per s of audio {alignment.reason}")
    phones = [(p.label, p.start, p.end, alignment.confidence) for p in alignment.phones]
    inside = bilabial_frames(alignment.phones, fps, n)

    real_lms = remeasure_landmarks(track.frames, track.landmarks)
    real_open = mouth_opening(real_lms)
    rows: dict[str, dict] = {"real 01b": {**closure_fractions(real_open, inside),
                                          "opening_median": float(np.median(real_open))}}
    runs: list[tuple[str, object, object]] = [("today", None, "off"), ("visemes", phones, "off")]
    bank_info: dict = {}
    if args.bank == "a":
        bank_track, _, _ = load_clip("a", Path(args.data), Path(args.cache))
        t0 = time.perf_counter()
        bank = build_bank(bank_track, origin="talk_en_male_01a")
        bank_info = {"build_s": time.perf_counter() - t0, "bank_video_frames": len(bank_track),
                     "frames": len(bank), "stride": bank.stride, "patch_px": list(bank.patches.shape[2:0:-1]),
                     "megabytes": bank.nbytes / 2**20}
        del bank_track  # the bank keeps only its patches
        runs.append(("visemes+bank", phones, bank))
    frames_out: dict[str, np.ndarray] = {}
    for name, ph, mouth_bank in runs:
        t0 = time.perf_counter()
        res = animate_portrait(track, wave, sr, fps, phones=ph, mouth_bank=mouth_bank)
        seconds = time.perf_counter() - t0
        lms = remeasure_landmarks(res.frames[:n], track.landmarks)
        opening = mouth_opening(lms)
        rows[name] = {**lip_scores(lms, real_lms, wave, sr, fps), **closure_fractions(opening, inside),
                      "mouth_ssim": mouth_ssim(res.frames[:n], track.frames[:n], real_lms),
                      "opening_median": float(np.median(opening)), "animate_s": seconds,
                      "ms_per_frame": 1000.0 * seconds / n, "drive_s": res.timings.get("drive", float("nan"))}
        if "mouth_bank" in res.timings:  # choosing the bank frames (the bank was built above)
            rows[name]["bank_select_s"] = res.timings["mouth_bank"]
        if args.crops and name != "today":
            frames_out[name] = res.frames[:n]
        del res
    print(f"\n01b: {n} frames ({n / fps:.1f} s), {int(inside.sum())} frames inside an aligned P/B/M")
    head = (f"{'row':<13}{'MLD':>8}{'SSIM':>7}{'lag ms':>8}{'corr':>7}"
            + "".join(f"{'closed<' + str(g):>12}" for g in GAP_MEETS))
    print(head + f"{'open med':>10}{'animate s':>11}")
    for name, r in rows.items():
        mld = (f"{r['mld']:8.4f}{r['mouth_ssim']:7.3f}{r['lag_ms']:8.1f}{r['corr']:7.3f}" if "mld" in r
               else " " * 30)
        closed = "".join(f"{r[f'closed_{g}']:12.2f}" for g in GAP_MEETS)
        print(f"{name:<13}{mld}{closed}{r['opening_median']:10.3f}{r.get('animate_s', float('nan')):11.1f}")
    speed = interleaved_render_ms(track, wave, sr, fps, runs)
    for name, ms in speed.items():
        rows[name]["render_ms_per_frame_interleaved"] = ms
    print("render ms per frame (interleaved chunks): " + ", ".join(f"{k} {v:.1f}" for k, v in speed.items()))
    if bank_info:
        print(f"mouth bank: {bank_info['frames']} of 01a's {bank_info['bank_video_frames']} frames (every "
              f"{bank_info['stride']}), {bank_info['megabytes']:.1f} MB, built in {bank_info['build_s']:.2f} s; "
              f"frames chosen in {rows['visemes+bank'].get('bank_select_s', float('nan')):.2f} s")
    if args.crops:
        write_crops(args.crops, track.frames[:n], real_lms, frames_out)
    if args.json:
        report = {"frames": n, "fps": fps, "bilabial_frames": int(inside.sum()), "mouth_bank": bank_info,
                  "aligner": {"method": alignment.method, "confidence": alignment.confidence,
                              "seconds_per_audio_second": align_s / (len(wave) / sr), "reason": alignment.reason},
                  "rows": rows}
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
