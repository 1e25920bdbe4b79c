"""Can the audio side of `clone` generalise better from 01a to 01b? Two probes behind RESULTS.md's 2026-11-30 clone notes (CPU).

No images and no generator: FaceAlign's lip landmarks of 01a/01b and their log-mel windows, as in
mouth_audio_analysis.py.
  1. phones: pocketsphinx's phone-loop recogniser (its US-English acoustic model and phone language
     model ship in the PyPI wheel) labels every 10 ms; one-hot phones at several offsets around each
     frame, alone and next to the pooled log-mel, feed ridge regressions trained on 01a and tested on
     01b (mouth opening correlation; the first four lip-shape components as mouth-landmark distance
     vs baseline (a)). A text-free phonetic code would carry over to new words if it beat the mel.
  2. audio-path probe: the clone's AudioEncoder plus a linear head, trained on 01a to predict the
     whitened lip-shape components (fit_clone's shape loss without the image path), with the same
     jitter, dropout and batch as fit_clone, and optionally the time-stretch augmentation
     (train_avatar.stretch_windows); printed: correlation of the first three components on 01b.

  python research/clone_audio_probes.py [--probe-seeds 0 1 2] [--stretches 1 1.25 1.4] [--skip-probe]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]
from _bootstrap import import_pack  # noqa: E402

TRAIN, TEST = "talk_en_male_01a", "talk_en_male_01b"


def phone_segments(wave: np.ndarray, sr: int) -> list[tuple[str, int, int]]:
    """(phone, first, last 10-ms frame) from pocketsphinx's phone loop (no words, no text)."""
    import librosa
    from pocketsphinx import Decoder, get_model_path

    w = librosa.resample(np.asarray(wave, np.float32), orig_sr=sr, target_sr=16000)
    pcm = (np.clip(w, -1, 1) * 32767).astype(np.int16).tobytes()
    model = get_model_path()
    decoder = Decoder(hmm=f"{model}/en-us/en-us", allphone=f"{model}/en-us/en-us-phone.lm.bin", lm=None, lw=2.0,
                      pip=0.3, beam=1e-20, pbeam=1e-20, loglevel="FATAL")
    decoder.start_utt()
    decoder.process_raw(pcm, full_utt=True)
    decoder.end_utt()
    return [(s.word, s.start_frame, s.end_frame) for s in decoder.seg()]


def phone_features(segments, phones: list[str], frames: int, fps: float, offsets) -> np.ndarray:
    """[frames, len(offsets) * len(phones)] one-hot phone labels at each offset (10-ms steps) around each frame."""
    labels = np.full(100 * int(frames / fps + 2), phones.index("SIL"))
    for phone, first, last in segments:
        labels[first:last + 1] = phones.index(phone)
    eye = np.eye(len(phones))
    centres = np.round(np.arange(frames) / fps * 100).astype(int)
    return np.concatenate([eye[labels[np.clip(centres + o, 0, len(labels) - 1)]] for o in offsets], axis=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(os.environ.get(
        "DIGITAL_HUMAN_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")))
    ap.add_argument("--cache", type=Path, default=Path("/tmp/dh_talking_head_eval"))
    ap.add_argument("--probe-seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--stretches", type=float, nargs="+", default=[1.0, 1.25, 1.4])
    ap.add_argument("--probe-steps", type=int, default=1500)
    ap.add_argument("--skip-probe", action="store_true")
    args = ap.parse_args()
    import_pack()
    import eval_talking_head as eth
    from mouth_audio_analysis import LipShapes, load, pooled, ridge

    from digital_human.vision.lipsync_metrics import mouth_landmark_distance

    clips = {}
    for name in (TRAIN, TEST):
        eth.VIDEOS = {"x": f"{name}.mp4"}
        track, wave, sr = eth.load_clip("x", args.data, args.cache)
        lms, windows, opening = load(name, args.data, args.cache)
        clips[name] = dict(lms=lms, windows=windows, opening=opening, found=np.asarray(track.found, bool),
                           frames=len(track), fps=track.fps, segments=phone_segments(wave, sr))
    a, b = clips[TRAIN], clips[TEST]

    shapes = LipShapes(a["lms"], b["lms"])  # lip shapes in a common frame, baseline (a)
    norm_a, norm_b, mean_a, s, vt = shapes.norm_a, shapes.norm_b, shapes.mean_a, shapes.s, shapes.vt
    as_frames, base = shapes.as_frames, shapes.base

    # 1. phones vs mel, ridge 01a -> 01b
    k = 4
    comps_a = (norm_a - mean_a) @ vt[:k].T

    def ridge_row(label: str, xa: np.ndarray, xb: np.ndarray, lam: float) -> None:
        opening = ridge(xa, a["opening"], xb, lam)
        shape = np.stack([ridge(xa, comps_a[:, j], xb, lam) for j in range(k)], axis=1)
        mld = 100 * (mouth_landmark_distance(as_frames(shape @ vt[:k] + mean_a), b["lms"]) / base - 1)
        print(f"  {label:34s} ridge {lam:6g}: opening corr {np.corrcoef(opening, b['opening'])[0, 1]:.3f}, "
              f"{k}-component shape MLD {mld:+.1f}% vs baseline (a)", flush=True)

    phones = sorted({p for c in (a, b) for p, _, _ in c["segments"]})
    print(f"1. phone-loop recognition: {len(a['segments'])} / {len(b['segments'])} phone segments in 01a / 01b, "
          f"{len(phones)} phone labels")
    mel_a, mel_b = pooled(a["windows"]), pooled(b["windows"])
    for lam in (300, 1000):
        ridge_row("pooled log-mel", mel_a, mel_b, lam)
    for span, step in ((150, 30), (200, 40), (300, 50)):
        offsets = range(-span // 10, span // 10 + 1, step // 10)
        pa = phone_features(a["segments"], phones, a["frames"], a["fps"], offsets)[a["found"]]
        pb = phone_features(b["segments"], phones, b["frames"], b["fps"], offsets)[b["found"]]
        for lam in (100, 1000):
            ridge_row(f"phones +-{span} ms every {step}", pa, pb, lam)
        ridge_row(f"log-mel + phones +-{span} ms", np.hstack([mel_a, pa]), np.hstack([mel_b, pb]), 3000)
    if args.skip_probe:
        return

    # 2. the audio path alone: AudioEncoder + linear head -> whitened lip-shape components
    import torch
    import torch.nn.functional as F

    from digital_human.engines.clone_model import AudioEncoder
    from digital_human.talking_head.clone.train import augment_windows

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    kk = 8
    scale = s[:kk] / np.sqrt(len(norm_a))
    ya = torch.from_numpy((((norm_a - mean_a) @ vt[:kk].T) / scale).astype(np.float32))
    yb = ((norm_b - mean_a) @ vt[:kk].T) / scale
    xa, xb = torch.from_numpy(a["windows"][:, None].copy()), torch.from_numpy(b["windows"][:, None].copy())
    print(f"2. audio-path probe: AudioEncoder(256, 32) + linear head, {args.probe_steps} steps of batch 32, "
          "jitter 1, dropout 0.3; 01b correlation of lip-shape components 1-3")
    for seed in args.probe_seeds:
        for stretch in args.stretches:
            t0 = time.perf_counter()
            torch.manual_seed(seed)
            rng = np.random.default_rng(seed)
            encoder, head = AudioEncoder(256, 32), torch.nn.Linear(256, kk)
            opt = torch.optim.Adam([*encoder.parameters(), *head.parameters()], 5e-4)
            for _ in range(args.probe_steps):
                i = torch.from_numpy(rng.integers(0, len(xa), 32))
                emb = F.dropout(encoder(augment_windows(xa[i], 1.0, stretch)), 0.3)
                loss = F.mse_loss(head(emb), ya[i])
                opt.zero_grad()
                loss.backward()
                opt.step()
            encoder.eval()
            with torch.no_grad():
                pred = head(encoder(xb)).numpy()
            corr = [np.corrcoef(pred[:, j], yb[:, j])[0, 1] for j in range(3)]
            print(f"  seed {seed} time stretch {stretch:g}: {' '.join(f'{c:.3f}' for c in corr)} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
