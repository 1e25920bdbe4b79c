"""Held-out lip-sync evaluation of the talking-head models on talk_en_male_01a/01b (one person, one
recording). The clone avatar trains on 01a only; 01b's own frames (upper face kept) are driven by
01b's own audio, and the result is compared with the real 01b frames:

  * mouth-landmark distance (face mesh run again on the output, lips only, similarity-aligned on
    the rigid points, / inter-ocular distance) against the mesh on the real frames;
  * audio-visual lag and correlation (mouth opening vs speech envelope), next to the real video's;
  * PSNR outside the lower-face mask (the paste must not touch anything else).

Rows: (a) baseline = 01b frames with the mouth region copied from the avatar's neutral 01a frame;
(b) portrait (zero-shot); clone (trained here with the given budget, or --avatar NAME).

  python benchmarks/eval_talking_head.py --quick                 # CPU, a few training steps
  python benchmarks/eval_talking_head.py --device cuda --budget 300
  python benchmarks/eval_talking_head.py --prepare OUT.npz       # inputs for gpu_talking_head.py
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402

VIDEOS = {"a": "talk_en_male_01a.mp4", "b": "talk_en_male_01b.mp4"}
TARGET_MLD_RATIO = 0.7      # clone must be >= 30 % below baseline (a)
TARGET_LAG_MS = 40.0
TARGET_CORR_RATIO = 0.5
TARGET_PSNR_DB = 40.0
PACK_VERSION = 1


# --- metrics shared with gpu_talking_head.py (numpy + the pack, no media decoding) ----------------
def lip_scores(pred_lms: np.ndarray, real_lms: np.ndarray, wave: np.ndarray, sr: int, fps: float) -> dict:
    import_pack()
    from digital_human.vision.lipsync_metrics import av_lag, mouth_landmark_distance, mouth_opening, speech_envelope

    n = min(len(pred_lms), len(real_lms))
    env = speech_envelope(wave, sr, fps, n)
    lag, corr = av_lag(mouth_opening(pred_lms[:n]), env, fps)
    real_lag, real_corr = av_lag(mouth_opening(real_lms[:n]), env, fps)
    return {"mld": mouth_landmark_distance(pred_lms[:n], real_lms[:n]), "lag_ms": lag, "corr": corr,
            "real_lag_ms": real_lag, "real_corr": real_corr, "corr_ratio": corr / real_corr if real_corr > 0 else float("nan")}


def meets_target(row: dict, baseline_mld: float) -> bool:
    return (row["mld"] <= TARGET_MLD_RATIO * baseline_mld and abs(row["lag_ms"]) <= TARGET_LAG_MS
            and row["corr_ratio"] >= TARGET_CORR_RATIO and row.get("psnr_out", np.inf) >= TARGET_PSNR_DB)


def blend_in_crop(crops: np.ndarray, new_crops: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """crops * (1 - m) + new * m, uint8 (the paste-back done in crop space)."""
    m = np.asarray(masks, np.float32)[..., None]
    out = crops.astype(np.float32) * (1 - m) + new_crops.astype(np.float32) * m
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def print_table(rows: dict[str, dict], baseline_mld: float) -> None:
    print(f"{'model':<28}{'MLD':>8}{'vs (a)':>9}{'lag ms':>9}{'corr':>7}{'corr/real':>10}{'PSNR out':>10}  target")
    for name, r in rows.items():
        rel = r["mld"] / baseline_mld - 1
        psnr = r.get("psnr_out", float("nan"))
        ok = "yes" if name.startswith("clone") and meets_target(r, baseline_mld) else ("no" if name.startswith("clone") else "")
        print(f"{name:<28}{r['mld']:8.4f}{100 * rel:8.1f}%{r['lag_ms']:9.1f}{r['corr']:7.3f}{r['corr_ratio']:10.2f}"
              f"{psnr:10.1f}  {ok}")
    any_row = next(iter(rows.values()))
    print(f"real 01b: lag {any_row['real_lag_ms']:.1f} ms, corr {any_row['real_corr']:.3f}; target for clone: MLD <= "
          f"{TARGET_MLD_RATIO:.2f} x (a) = {TARGET_MLD_RATIO * baseline_mld:.4f}, |lag| <= {TARGET_LAG_MS:g} ms, "
          f"corr >= {TARGET_CORR_RATIO} x real, PSNR outside mask >= {TARGET_PSNR_DB:g} dB")


# --- CPU side: decoding, alignment --------------------------------------------------------------------
def load_clip(key: str, data_dir: Path, cache: Path):
    """(FaceTrack, mono wave, sr) of 01a/01b; the aligned track is cached (alignment takes ~40 s)."""
    import_pack()
    from digital_human.media.probe import read_video_audio, read_video_frames
    from digital_human.vision import align_faces
    from digital_human.vision.faces import FaceTrack

    path = data_dir / "video" / VIDEOS[key]
    cache.mkdir(parents=True, exist_ok=True)
    npz = cache / f"{path.stem}.npz"
    if npz.is_file():
        track = FaceTrack.load_npz(npz)
    else:
        from digital_human.engines.face.mediapipe_assets import install_face_models

        wheel = next((Path(d) for d in ("/tmp/mpwheel", "/tmp/dl") if any(Path(d).glob("mediapipe-0.10.21-*.whl"))), None)
        install_face_models(wheel_dir=wheel)
        frames, fps = read_video_frames(path)
        track = align_faces(frames, fps)
        track.save_npz(npz)
    wave, sr = read_video_audio(path)
    return track, wave.mean(0), sr


def prepare(out: Path, data_dir: Path, cache: Path, quality: int = 92) -> None:
    """Pack aligned 256-px crops (JPEG), crop landmarks, per-frame mel windows, 01b's audio and the
    face-mesh ONNX into one .npz for the GPU machine (no ffmpeg/librosa/mediapipe needed there)."""
    import_pack()
    import cv2

    from digital_human.engines.face.mediapipe_assets import face_model_paths
    from digital_human.talking_head.audio_features import MelConfig, windows_for_frames
    from digital_human.talking_head.phone_source import speech_phones
    from digital_human.talking_head.visemes import frame_features, viseme_track
    from eval_visemes import bilabial_frames

    arrays: dict[str, np.ndarray] = {"version": np.array(PACK_VERSION)}
    cfg = MelConfig()
    arrays["mel_config"] = np.frombuffer(json.dumps(cfg.to_dict()).encode(), np.uint8)
    for key in ("a", "b"):
        track, wave, sr = load_clip(key, data_dir, cache)
        blobs = [cv2.imencode(".jpg", cv2.cvtColor(c, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality])[1]
                 for c in track.crops]
        arrays[f"{key}_jpg"] = np.concatenate(blobs).astype(np.uint8)
        arrays[f"{key}_jpg_offsets"] = np.cumsum([0] + [len(b) for b in blobs]).astype(np.int64)
        arrays[f"{key}_landmarks"] = track.crop_landmarks().astype(np.float16)
        arrays[f"{key}_found"] = track.found.astype(bool)
        arrays[f"{key}_fps"] = np.array(float(track.fps))
        arrays[f"{key}_windows"] = windows_for_frames(wave, sr, track.fps, len(track), cfg).astype(np.float16)
        arrays[f"{key}_wave16k"] = np.clip(np.rint(wave * 32767), -32768, 32767).astype(np.int16)
        # the viseme track of the clip's own speech (the aligner's phone loop: no transcript ships with the
        # clips), for `clone` trained with visemes (gpu_talking_head.py --visemes); zeros when none found
        found = speech_phones(None, wave, sr, "auto")
        track_v = viseme_track(found.phones, track.fps, len(track)) if found.phones else None
        arrays[f"{key}_visemes"] = frame_features(track_v, len(track)).astype(np.float32)
        arrays.update(drive_arrays(key, found.phones, wave, sr, track.fps, len(track)))
        # frames inside an aligned P/B/M (eval_visemes.py's bilabial closure item, scored by gpu_talking_head.py)
        arrays[f"{key}_bilabial"] = bilabial_frames(
            [SimpleNamespace(label=p[0], start=p[1], end=p[2]) for p in found.phones or []], track.fps, len(track))
        print(f"{key}: {found.note}")
        assert sr == cfg.sample_rate, sr
    arrays["face_mesh_onnx"] = np.frombuffer(face_model_paths()["mesh"].read_bytes(), np.uint8)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **arrays)
    print(f"wrote {out} ({out.stat().st_size / 2 ** 20:.1f} MiB)")


def drive_arrays(key: str, phones, wave: np.ndarray, sr: int, fps: float, n: int) -> dict[str, np.ndarray]:
    """portrait's mouth drive [n, 4] of the clip's speech with its phones (`{key}_drive`) and without
    (`{key}_drive_audio`), for `clone` with mouth_drive (gpu_talking_head.py --drive)."""
    from digital_human.talking_head.clone.conditioning import frame_conditioning

    return {f"{key}_drive": frame_conditioning(phones, wave, sr, fps, n, True)[:, 6:],
            f"{key}_drive_audio": frame_conditioning(None, wave, sr, fps, n, True)[:, 6:]}


def frame_masks(track, crop_masks: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Crop-space masks -> frame-space [M, H, W] through the inverse affines (for PSNR outside)."""
    from digital_human.vision.align import warp_image

    inv = track.inverse_affines()[idx]
    h, w = track.frames.shape[1:3]
    return np.stack([warp_image(m, a, w, h, border="zero") for m, a in zip(crop_masks, inv)])


def avatar_from_weights(weights: Path, track_a, name: str):
    """An avatar of 01a around generator weights trained elsewhere (gpu_talking_head.py --dump writes
    them in FP16), with the neutral frame TrainAvatar would pick: scores GPU-trained weights through
    the product's own inference path (engine loader, full-frame paste-back) on this machine."""
    from digital_human.talking_head.audio_features import MelConfig
    from digital_human.talking_head.clone.avatar_store import save_avatar
    from digital_human.engines.clone_model import load_generator
    from digital_human.talking_head.clone.train import crops_at_size, pick_neutral_frame

    model = load_generator(Path(weights))
    crops, lms = crops_at_size(track_a, model.config.crop_size)
    neutral = pick_neutral_frame(lms, np.flatnonzero(track_a.found))
    return save_avatar(model, name, crops[neutral], lms[neutral], MelConfig(),
                       {"steps": None, "note": f"weights from {weights}", "neutral_frame": int(neutral),
                        "source_fps": float(track_a.fps), "frames": len(track_a)})


def evaluate(args: argparse.Namespace) -> dict:
    import_pack()
    from digital_human.talking_head.clone.avatar_store import load_avatar
    from digital_human.talking_head.clone.infer import animate_clone, clone_masks
    from digital_human.talking_head.portrait.animate import animate_portrait, portrait_masks
    from digital_human.talking_head.clone.train import train_avatar
    from digital_human.vision.lipsync_metrics import psnr_outside_mask, remeasure_landmarks

    data_dir, cache = Path(args.data), Path(args.cache)
    track_a, wave_a, sr = load_clip("a", data_dir, cache)
    track_b, wave_b, sr_b = load_clip("b", data_dir, cache)
    from digital_human.talking_head.driver import output_frame_count, schedule_track

    fps = track_b.fps
    if args.seconds:  # evaluate on the first part of 01b only (quick CPU runs)
        n = int(args.seconds * fps)
        track_b = schedule_track(track_b, np.arange(min(n, len(track_b))))
        wave_b = wave_b[: int(round(len(track_b) / fps * sr_b))]
    n = len(track_b)
    wave_b = wave_b[: int(round(n / fps * sr_b))]
    n_audio = output_frame_count(len(wave_b) / sr_b, fps)  # the soundtrack may end inside the last frame
    if n_audio < n:
        track_b, n = schedule_track(track_b, np.arange(n_audio)), n_audio
    idx = np.arange(n)
    results: dict[str, dict] = {}
    timings: dict[str, float] = {}

    # clone: train on 01a (or reuse an avatar, or generator weights trained elsewhere)
    if args.weights:
        info = avatar_from_weights(args.weights, track_a, args.name)
    elif args.avatar:
        info = load_avatar(args.avatar)
    else:
        t0 = time.perf_counter()
        last = {"t": 0.0}

        def show(step: int, total: int, loss: float) -> None:
            if time.perf_counter() - last["t"] > 10 or step == total:
                last["t"] = time.perf_counter()
                print(f"  step {step}/{total} loss {loss:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)

        info = train_avatar(track_a, wave_a, sr, args.name, steps=args.steps, time_budget_s=args.budget,
                            device=args.device, batch_size=args.batch, progress=show, status=print,
                            resume=not args.fresh)
        timings["train_s"] = time.perf_counter() - t0
    print(info.summary())

    real_lms = remeasure_landmarks(track_b.frames, track_b.landmarks)
    # (a) baseline: mouth region from the avatar's neutral frame, pasted like the clone's output
    neutral_crop, _ = info.reference()
    size = track_b.crop_size
    if neutral_crop.shape[0] != size:
        from digital_human.talking_head.clone.infer import _resize

        neutral_crop = _resize(neutral_crop, size)
    from digital_human.talking_head.driver import render_frames

    masks_c = clone_masks(track_b, idx)
    base_frames = render_frames(track_b, np.broadcast_to(neutral_crop, track_b.crops.shape).copy(), masks_c)
    base_lms = remeasure_landmarks(base_frames, track_b.landmarks)
    fm_c = frame_masks(track_b, masks_c, idx)
    results["(a) neutral-mouth baseline"] = {**lip_scores(base_lms, real_lms, wave_b, sr_b, fps),
                                             "psnr_out": psnr_outside_mask(base_frames, track_b.frames, fm_c)}
    t0 = time.perf_counter()
    port = animate_portrait(track_b, wave_b, sr_b, fps)
    timings["portrait_s"] = time.perf_counter() - t0
    port_lms = remeasure_landmarks(port.frames[:n], track_b.landmarks)
    fm_p = frame_masks(track_b, portrait_masks(track_b, idx), idx)
    results["(b) portrait"] = {**lip_scores(port_lms, real_lms, wave_b, sr_b, fps),
                               "psnr_out": psnr_outside_mask(port.frames[:n], track_b.frames, fm_p)}
    t0 = time.perf_counter()
    clone = animate_clone(info, track_b, wave_b, sr_b, fps, batch_size=32, backend=args.backend)
    timings["clone_infer_s"] = time.perf_counter() - t0
    clone_lms = remeasure_landmarks(clone.frames[:n], track_b.landmarks)
    label = f"clone ({info.meta['steps']} steps)" if info.meta.get("steps") is not None else "clone (given weights)"
    results[label] = {**lip_scores(clone_lms, real_lms, wave_b, sr_b, fps),
                      "psnr_out": psnr_outside_mask(clone.frames[:n], track_b.frames, fm_c)}
    baseline = results["(a) neutral-mouth baseline"]["mld"]
    print(f"\nheld-out 01b: {n} frames ({n / fps:.1f} s); clone backend {clone.backend}; {info.summary()}")
    print_table(results, baseline)
    report = {"frames": n, "rows": results, "timings": timings, "avatar": info.meta,
              "clone_meets_target": meets_target(results[label], baseline)}
    if args.save_frames:
        np.savez_compressed(args.save_frames, clone=clone.frames[:n], portrait=port.frames[:n], real=track_b.frames)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare", type=Path, help="write the GPU input pack (.npz) and exit")
    ap.add_argument("--data", default=os.environ.get("DIGITAL_HUMAN_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data")))
    ap.add_argument("--cache", default="/tmp/dh_talking_head_eval", help="aligned tracks are cached here")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--steps", type=int)
    ap.add_argument("--budget", type=float, help="training time budget in seconds")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--quick", action="store_true", help="CPU smoke: few steps, first 10 s of 01b")
    ap.add_argument("--seconds", type=float, help="evaluate on the first N seconds of 01b")
    ap.add_argument("--avatar", help="evaluate an existing avatar instead of training")
    ap.add_argument("--weights", type=Path, help="evaluate generator weights (.safetensors, e.g. from "
                    "gpu_talking_head.py --dump) as an avatar of 01a named --name, instead of training")
    ap.add_argument("--name", default="eval_01a")
    ap.add_argument("--fresh", action="store_true", help="ignore an existing checkpoint")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--json", type=Path, help="write the report here")
    ap.add_argument("--save-frames", type=Path)
    args = ap.parse_args()
    if args.prepare:
        prepare(args.prepare, Path(args.data), Path(args.cache))
        return
    if args.quick:
        args.steps = args.steps or 60
        args.seconds = args.seconds or 10.0
        args.device = "cpu" if args.device == "auto" else args.device
    report = evaluate(args)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=float))


if __name__ == "__main__":
    main()
