"""`clone` on the GPU: (i) training wall time on 01a until the held-out target on 01b is met,
(ii) generator inference frames/s at 256-px crops: eager FP32 vs the engine loader's torch FP16
(+ batching, CUDA graphs), plus ONNX Runtime for reference.

The GPU machine has no ffmpeg/librosa/mediapipe: inputs come from a pack made on the CPU machine
(`eval_talking_head.py --prepare`), holding JPEG crops, crop landmarks, mel windows, 01b's audio and
the face-mesh ONNX (run on ONNX Runtime CPU to re-measure generated mouths).

  python benchmarks/eval_talking_head.py --prepare benchmarks/out/th_pack.npz     # CPU machine
  python benchmarks/gpu_talking_head.py --pack benchmarks/out/th_pack.npz --out $OUT      # ~150 s training
  python benchmarks/gpu_talking_head.py --pack ... --out $OUT --budget 60 --eval-every 600 --final-frames 300 --skip-infer
  python benchmarks/gpu_talking_head.py --pack ... --out /tmp/x --tiny             # CPU smoke test

Target (held-out 01b, crop space): mouth-landmark distance <= 0.7 x baseline (a), |lag| <= 40 ms,
correlation >= 0.5 x the real video's. The mouths are blended into the real 01b crops through the
lower-face mask, so PSNR outside the mask is exact by construction here (it is measured on full
frames by eval_talking_head.py).

Periodic evaluations score the first --eval-frames frames of 01b (default 300 = 10 s; the face mesh
runs on the CPU and dominates their cost); the final one scores all of 01b (or --final-frames). Every evaluation line
shows the training loss and the generated hole's mean/std/saturated fraction, so a frozen or
saturated generator is visible at once, and the JSON report is rewritten after each evaluation (a
time-out still leaves the results so far).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402
from eval_talking_head import PACK_VERSION, blend_in_crop, lip_scores, meets_target  # noqa: E402


def load_pack(path: Path) -> dict:
    import cv2

    with np.load(path, allow_pickle=False) as z:
        if int(z["version"]) != PACK_VERSION:
            raise SystemExit(f"{path}: pack version {int(z['version'])}, expected {PACK_VERSION}; re-run --prepare")
        pack = {k: z[k] for k in z.files}
    for key in ("a", "b"):
        blob, off = pack[f"{key}_jpg"], pack[f"{key}_jpg_offsets"]
        crops = [cv2.imdecode(blob[off[i]:off[i + 1]], cv2.IMREAD_COLOR) for i in range(len(off) - 1)]
        pack[f"{key}_crops"] = np.stack([cv2.cvtColor(c, cv2.COLOR_BGR2RGB) for c in crops])
        pack[f"{key}_landmarks"] = pack[f"{key}_landmarks"].astype(np.float32)
        pack[f"{key}_windows"] = pack[f"{key}_windows"].astype(np.float32)
    pack["mel_config"] = json.loads(bytes(pack["mel_config"]).decode())
    return pack


def pack_visemes(pack: dict, key: str, config, phones: bool = True, drive_gain: float = 1.0) -> np.ndarray:
    """The viseme windows of clip `key` for `config` (conditioning.condition_windows' layout): the viseme
    features (zeros without phones) and, for a mouth_drive config, portrait's drive with or without phones,
    its jaw and lip openings times drive_gain (clipped to 0..1)."""
    from digital_human.engines.clone_model import VISEME_CHANNELS
    from digital_human.talking_head.visemes import feature_windows

    feats = pack[f"{key}_visemes"] if phones else np.zeros_like(pack[f"{key}_visemes"])
    if config.mouth_drive:
        name = f"{key}_drive" if phones else f"{key}_drive_audio"
        if name not in pack:
            raise SystemExit("--drive needs a pack with portrait's drive: re-run eval_talking_head.py --prepare")
        feats = np.concatenate([feats, pack[name]], axis=1)
        opening = slice(VISEME_CHANNELS, VISEME_CHANNELS + 2)
        feats[:, opening] = np.clip(feats[:, opening] * np.float32(drive_gain), 0.0, 1.0)
    return feature_windows(feats, config.viseme_frames)


def footage_gain(pack: dict) -> float:
    """A drive gain that a video reference could supply at inference: the driven footage's (01b's) average
    mouth opening over the training footage's (01a's). Tried on 2026-12-02: the generator's mouths
    did not change with it (RESULTS.md), so the product has no such gain."""
    from digital_human.talking_head.clone.train import mouth_opening

    def mean_opening(key: str) -> float:
        return float(mouth_opening(pack[f"{key}_landmarks"][pack[f"{key}_found"]]).mean())

    return mean_opening("b") / mean_opening("a")


def mesh_runner(pack: dict, workdir: Path):
    from digital_human.engines.face.detect import engine_runner
    from digital_human.engines.spec import ModelSpec

    path = workdir / "face_mesh.onnx"
    path.write_bytes(pack["face_mesh_onnx"].tobytes())
    spec = ModelSpec(name="face_mesh_eval", onnx_path=path, input_names=("input",),
                     output_names=("landmarks", "face_flag"))
    return engine_runner(spec, backend="onnxruntime")


class HeldOut:
    """Scores generated 01b regions against the real 01b crops (mesh re-measured on both)."""

    def __init__(self, pack: dict, config, run_mesh, neutral_crop: np.ndarray, frames: int | None) -> None:
        from digital_human.talking_head.clone.infer import MASK_JAW_MARGIN
        from digital_human.engines.clone_model import crops_to_regions
        from digital_human.vision.lipsync_metrics import remeasure_landmarks
        from digital_human.vision.paste import lower_face_mask

        n = len(pack["b_crops"]) if not frames else min(frames, len(pack["b_crops"]))
        self.crops, self.lms = pack["b_crops"][:n], pack["b_landmarks"][:n]
        self.config, self.run_mesh, self.fps = config, run_mesh, float(pack["b_fps"])
        self.neutral_crop = neutral_crop
        self.windows = pack["b_windows"][:n]
        self.visemes = None  # 01b's viseme windows for a viseme config (its own speech's aligner phones)
        if config.viseme_frames:
            self.visemes = pack_visemes(pack, "b", config)[:n]
        self.pack, self.n = pack, n
        self.wave = pack["b_wave16k"].astype(np.float32) / 32767.0
        self.wave = self.wave[: int(round(n / self.fps * 16000))]
        self.masks = np.stack([lower_face_mask(lm, self.crops.shape[1], jaw_margin=MASK_JAW_MARGIN) for lm in self.lms])
        self.sources = crops_to_regions(self.crops, config)
        self.reference = crops_to_regions(neutral_crop[None], config)
        self.real = remeasure_landmarks(self.crops, self.lms, run_mesh)
        # frames inside an aligned P/B/M of 01b (eval_talking_head.py --prepare; older packs have none)
        self.bilabial = pack["b_bilabial"][:n].astype(bool) if "b_bilabial" in pack else None
        baseline = blend_in_crop(self.crops, np.broadcast_to(neutral_crop, self.crops.shape), self.masks)
        self.baseline = lip_scores(remeasure_landmarks(baseline, self.lms, run_mesh), self.real, self.wave, 16000, self.fps)

        self._baselines: dict[int, dict] = {len(self.crops): self.baseline}

    def __len__(self) -> int:
        return len(self.crops)

    def set_drive_gain(self, gain: float) -> None:
        """Drive the generator with 01b's drive openings times `gain` from now on (mouth_drive configs)."""
        self.visemes = pack_visemes(self.pack, "b", self.config, drive_gain=gain)[: self.n]

    def baseline_for(self, n: int) -> dict:
        """Baseline (a) scores on the first n frames (cached; the subset's own reference point)."""
        from digital_human.vision.lipsync_metrics import remeasure_landmarks

        n = min(int(n), len(self.crops))
        if n not in self._baselines:
            base = blend_in_crop(self.crops[:n], np.broadcast_to(self.neutral_crop, self.crops[:n].shape), self.masks[:n])
            self._baselines[n] = lip_scores(remeasure_landmarks(base, self.lms[:n], self.run_mesh), self.real[:n],
                                            self.wave_for(n), 16000, self.fps)
        return self._baselines[n]

    def wave_for(self, n: int) -> np.ndarray:
        return self.wave[: int(round(n / self.fps * 16000))]

    def generate_regions(self, model, n: int, batch: int = 64, reference: np.ndarray | None = None) -> np.ndarray:
        """uint8 [n, 3, h, w] generated regions for the first n frames, from the model's CURRENT weights
        in FP32 (no autocast), exactly as inference would see them. reference: [1, 3, h, w] region
        (default: the avatar's neutral frame)."""
        import torch

        dev = next(model.parameters()).device
        reference = self.reference if reference is None else reference
        out = []
        with torch.inference_mode():
            for s in range(0, n, batch):
                e = min(s + batch, n)
                src = torch.from_numpy(self.sources[s:e]).to(dev).float() / 255
                ref = torch.from_numpy(reference).to(dev).float().expand_as(src) / 255
                aud = torch.from_numpy(self.windows[s:e]).to(dev).float()
                vis = None if self.visemes is None else torch.from_numpy(self.visemes[s:e]).to(dev).float()
                out.append((model(src, ref, aud, vis).float().clamp(0, 1) * 255).round().byte().cpu().numpy())
        return np.concatenate(out)

    def generate(self, model, n: int | None = None, batch: int = 64) -> np.ndarray:
        from digital_human.engines.clone_model import regions_into_crops

        n = len(self.crops) if n is None else min(int(n), len(self.crops))
        regions = self.generate_regions(model, n, batch)
        return blend_in_crop(self.crops[:n], regions_into_crops(self.crops[:n], regions, self.config), self.masks[:n])

    def landmarks(self, regions: np.ndarray) -> np.ndarray:
        """Face mesh re-measured on the first len(regions) crops with these generated regions pasted."""
        from digital_human.engines.clone_model import regions_into_crops
        from digital_human.vision.lipsync_metrics import remeasure_landmarks

        n = len(regions)
        crops = blend_in_crop(self.crops[:n], regions_into_crops(self.crops[:n], regions, self.config), self.masks[:n])
        return remeasure_landmarks(crops, self.lms[:n], self.run_mesh)

    def diagnostics(self, pred_lms: np.ndarray) -> dict:
        """Timing and closure next to lip_scores: the lag curve against the speech envelope (the bar's lag is
        its argmax), the lag and correlation of the mouth opening against the REAL 01b opening (the same
        lag_curve, a far stronger signal than the envelope), the opening's spread against the real one, and the
        bilabial closure fractions of eval_visemes.py (frames inside an aligned P/B/M whose inner-lip gap is
        under each threshold) for these landmarks and the real 01b's. `opening` is kept for the dump."""
        from eval_visemes import closure_fractions

        from digital_human.vision.lipsync_metrics import av_lag, lag_curve, mouth_opening, speech_envelope

        n = len(pred_lms)
        pred_open, real_open = mouth_opening(pred_lms), mouth_opening(self.real[:n])
        env = speech_envelope(self.wave_for(n), 16000, self.fps, n)
        lags, curve = lag_curve(pred_open, env, self.fps)
        lag_real, corr_real = av_lag(pred_open, real_open, self.fps)
        out = {"lag_curve_ms": [float(v) for v in lags * 1000.0 / self.fps], "lag_curve": [float(v) for v in curve],
               "lag_vs_real_ms": lag_real, "corr_vs_real": corr_real,
               "open_std_ratio": float(pred_open.std() / max(real_open.std(), 1e-9)), "opening": pred_open}
        if self.bilabial is not None:
            inside = self.bilabial[:n]
            out.update(bilabial_frames=int(inside.sum()), **closure_fractions(pred_open, inside),
                       **{f"real_{k}": v for k, v in closure_fractions(real_open, inside).items()})
        return out

    def score(self, model, n: int | None = None) -> dict:
        """Lip scores of the model on the first n frames of 01b (all by default), plus statistics of the
        generated hole (mean, std over frames and pixels, fraction at 0 or 255: a saturated generator
        shows std ~0 / saturation ~1 here) and the baseline MLD of the same frames."""
        n = len(self.crops) if n is None else min(int(n), len(self.crops))
        regions = self.generate_regions(model, n)
        hole = regions[:, :, self.config.hole_row():].astype(np.float32) / 255
        pred = self.landmarks(regions)
        row = lip_scores(pred, self.real[:n], self.wave_for(n), 16000, self.fps)
        row.update(self.diagnostics(pred))
        row.update(frames=n, baseline_mld=self.baseline_for(n)["mld"], hole_mean=float(hole.mean()),
                   hole_std=float(hole.std()), hole_frame_std=float(hole.std(axis=0).mean()),
                   hole_saturated=float(((hole <= 0) | (hole >= 1)).mean()))
        return row


def train_to_target(pack: dict, args, run_mesh, out_dir: Path, report: dict) -> dict:
    from digital_human.engines.clone_model import GeneratorConfig, save_generator
    from digital_human.talking_head.clone.train import fit_clone, prepare_data

    config = GeneratorConfig(base_channels=4, levels=2, audio_channels=4, audio_dim=16, crop_size=256) if args.tiny \
        else GeneratorConfig()
    n_a = 120 if args.tiny else len(pack["a_crops"])
    visemes = phoneless = None
    if args.visemes or args.drive:  # TrainAvatar(visemes=True[, mouth_drive=True]): the footage's own track
        from dataclasses import replace

        from digital_human.talking_head.clone.train import VISEME_FRAMES

        if "a_visemes" not in pack:
            raise SystemExit("--visemes needs a pack with viseme tracks: re-run eval_talking_head.py --prepare")
        config = replace(config, viseme_frames=VISEME_FRAMES, mouth_drive=bool(args.drive))
        visemes = pack_visemes(pack, "a", config)[:n_a]
        phoneless = pack_visemes(pack, "a", config, phones=False)[:n_a] if args.drive else None
    data = prepare_data(pack["a_crops"][:n_a], pack["a_landmarks"][:n_a], pack["a_found"][:n_a],
                        pack["a_windows"][:n_a], float(pack["a_fps"]), config, visemes=visemes,
                        visemes_without_phones=phoneless)
    t_held = time.perf_counter()
    held = HeldOut(pack, config, run_mesh, pack["a_crops"][data.neutral], 90 if args.tiny else (args.final_frames or None))
    base = held.baseline["mld"]
    sub = min(args.eval_frames, len(held)) if args.eval_frames else len(held)
    sub_base = held.baseline_for(sub)["mld"]
    print(f"baseline (a) MLD {base:.4f}; target <= {0.7 * base:.4f}; real lag {held.baseline['real_lag_ms']:.1f} ms "
          f"corr {held.baseline['real_corr']:.3f}  ({len(held)} frames; periodic evals on the first {sub}: "
          f"baseline MLD {sub_base:.4f}; set-up {time.perf_counter() - t_held:.0f} s)", flush=True)
    curve: list[dict] = []
    reached: dict = {}
    losses: list[tuple[int, float]] = []
    t0 = time.perf_counter()
    result: dict = {"config": config.to_dict(), "amp": not args.no_amp, "seed": args.seed,
                    "shape_weight": args.shape_weight, "audio_dropout": args.audio_dropout,
                    "mouth_weight": args.mouth_weight, "augment_audio": args.augment_audio,
                    "time_stretch": args.time_stretch, "visemes": bool(args.visemes or args.drive),
                    "mouth_drive": bool(args.drive), "viseme_dropout": args.viseme_dropout,
                    "audio_mute": args.audio_mute,
                    "average_weights": args.average_weights, "baseline_a": held.baseline,
                    "eval_frames": sub, "baseline_a_eval_frames": held.baseline_for(sub), "curve": curve,
                    "loss_curve": losses, "target_reached": False, "reached_at": None,
                    "footage_seconds": len(data.usable) / data.fps}
    report["train"] = result

    def save() -> None:  # after every evaluation: a time-out keeps what was measured so far
        result["wall_seconds_incl_eval"] = time.perf_counter() - t0
        write_report(out_dir, report)

    def line(row: dict, tag: str) -> str:
        ok = meets_target(row, row["baseline_mld"])
        return (f"{tag} {row['step']:5d} train {row['train_s']:6.1f} s  loss {row['loss']:.4f}  MLD {row['mld']:.4f} "
                f"({100 * row['mld_vs_baseline']:+.1f}% vs a) lag {row['lag_ms']:+.1f} ms corr {row['corr']:.3f} "
                f"({row['corr_ratio']:.2f} x real)  hole mean {row['hole_mean']:.3f} std {row['hole_std']:.3f} "
                f"frame-std {row['hole_frame_std']:.4f} sat {row['hole_saturated']:.2f}  eval {row['eval_s']:.1f} s "
                f"wall {time.perf_counter() - t0:.0f} s{'  TARGET' if ok else ''}")

    def monitor(model, step: int, train_s: float, loss: float) -> bool:
        te = time.perf_counter()
        row = held.score(model, sub)
        row.update(step=step, train_s=train_s, loss=loss, eval_s=time.perf_counter() - te,
                   mld_vs_baseline=row["mld"] / row["baseline_mld"] - 1)
        row.pop("opening", None)
        curve.append(row)
        ok = meets_target(row, row["baseline_mld"])
        if ok and not reached:
            reached.update(row)
            result.update(target_reached=True, reached_at=dict(reached))
        print(line(row, "step"), flush=True)
        save()
        return bool(ok and args.stop_at_target)

    fit = fit_clone(data, config, steps=args.steps, time_budget_s=args.budget, device=args.device,
                    batch_size=args.batch, monitor=monitor, monitor_every=args.eval_every, amp=not args.no_amp,
                    augment_audio=args.augment_audio, seed=args.seed, shape_weight=args.shape_weight,
                    audio_dropout=args.audio_dropout, mouth_weight=args.mouth_weight, time_stretch=args.time_stretch,
                    average_weights=args.average_weights, viseme_dropout=args.viseme_dropout,
                    audio_mute=args.audio_mute,
                    progress=lambda s, n, l: losses.append((s, l)) if s % 50 == 0 else None,
                    status=lambda text: print(text, flush=True))
    te = time.perf_counter()
    final = held.score(fit.model)
    final.update(step=fit.steps, train_s=fit.seconds, loss=fit.loss, eval_s=time.perf_counter() - te,
                 mld_vs_baseline=final["mld"] / base - 1, averaged_steps=fit.averaged_steps)
    openings = {"real_b": mouth_opening_of(held.real), "final": final.pop("opening")}
    print(line(final, "final" if not fit.averaged_steps else "avg  "), flush=True)
    print(diag_line(final), flush=True)
    if fit.last_model is not None:  # --average-weights: the last step's weights too, on the same frames
        te = time.perf_counter()
        last = held.score(fit.last_model)
        last.update(step=fit.steps, train_s=fit.seconds, loss=fit.loss, eval_s=time.perf_counter() - te,
                    mld_vs_baseline=last["mld"] / base - 1)
        openings["final_last"] = last.pop("opening")
        result["final_last"] = last
        print(line(last, "last "), flush=True)
        print(diag_line(last), flush=True)
    if args.calibrate and config.mouth_drive:  # the inference-time drive gain from the footages' average openings
        gain = footage_gain(pack)
        held.set_drive_gain(gain)
        te = time.perf_counter()
        cal = held.score(fit.model)
        cal.update(step=fit.steps, train_s=fit.seconds, loss=fit.loss, eval_s=time.perf_counter() - te,
                   mld_vs_baseline=cal["mld"] / base - 1, drive_gain=gain)
        openings["final_calibrated"] = cal.pop("opening")
        result["final_calibrated"] = cal
        print(line(cal, f"gain {gain:.3f}"), flush=True)
        print(diag_line(cal), flush=True)
        held.set_drive_gain(1.0)
    np.savez_compressed(out_dir / "openings.npz", **openings)
    if args.dump:  # before save_generator, which moves the model to the CPU
        dump_for_analysis(pack, held, fit.model, data, out_dir, run_mesh)
    save_generator(fit.model.float().cpu(), out_dir / "clone_01a.safetensors")
    result.update(device=fit.device, steps=fit.steps, train_seconds=fit.seconds, final_loss=fit.loss, final=final,
                  skipped_steps=fit.skipped, zero_grad_steps=fit.dead_steps,
                  final_meets_target=meets_target(final, base))
    save()
    return result


def mouth_opening_of(lms: np.ndarray) -> np.ndarray:
    from digital_human.vision.lipsync_metrics import mouth_opening

    return mouth_opening(lms)


def diag_line(row: dict) -> str:
    closed = "".join(f"  closed<{g} {row[f'closed_{g}']:.2f} (real {row[f'real_closed_{g}']:.2f})"
                     for g in (0.02, 0.03) if f"closed_{g}" in row)
    return (f"      vs real opening: lag {row['lag_vs_real_ms']:+.1f} ms corr {row['corr_vs_real']:.3f}  opening std "
            f"{row['open_std_ratio']:.2f} x real{closed}"
            + (f"  ({row['bilabial_frames']} P/B/M frames)" if "bilabial_frames" in row else ""))


def dump_for_analysis(pack: dict, held: "HeldOut", model, data, out_dir: Path, run_mesh) -> None:
    """landmarks.npz (re-measured landmark subsets of real 01b, baseline (a), the clone with the avatar's neutral
    reference and with 01b's own neutral frame as reference, the clone and the real frames on 01a) and the
    weights in FP16 (the FP32 file is over the device's 16 MiB return limit) for CPU-side analysis."""
    from safetensors.torch import save_file

    from digital_human.engines.clone_model import crops_to_regions
    from digital_human.talking_head.clone.train import pick_neutral_frame
    from digital_human.vision.lipsync_metrics import remeasure_landmarks

    n = len(held)
    b_usable = np.flatnonzero(pack["b_found"][:n])
    b_neutral = pick_neutral_frame(held.lms, b_usable)
    ref_b = crops_to_regions(held.crops[b_neutral][None], held.config)
    base = blend_in_crop(held.crops, np.broadcast_to(held.neutral_crop, held.crops.shape), held.masks)
    arrays = {"real_b": held.real, "base_b": remeasure_landmarks(base, held.lms, run_mesh),
              "clone_b": held.landmarks(held.generate_regions(model, n)),
              "clone_b_refb": held.landmarks(held.generate_regions(model, n, reference=ref_b)),
              "b_neutral": np.array(b_neutral), "a_neutral": np.array(data.neutral)}
    a_held = HeldOut({**pack, "b_crops": pack["a_crops"], "b_landmarks": pack["a_landmarks"],
                      "b_windows": pack["a_windows"], "b_wave16k": pack["a_wave16k"], "b_fps": pack["a_fps"]},
                     held.config, run_mesh, held.neutral_crop, None)
    arrays.update(real_a=a_held.real, clone_a=a_held.landmarks(a_held.generate_regions(model, len(a_held))))
    # the metrics' points only (lips, rigid alignment points, eye corners), x/y: the whole mesh of
    # ~4,800 frames would be over the device's return limit
    from digital_human.vision.align import TEMPLATE_INDEX
    from digital_human.vision.lipsync_metrics import MOUTH_POINTS, RIGHT_EYE_OUTER, LEFT_EYE_OUTER

    points = np.array(sorted(set(MOUTH_POINTS) | {int(i) for i in TEMPLATE_INDEX} | {RIGHT_EYE_OUTER, LEFT_EYE_OUTER}))
    small = {k: (np.asarray(v, np.float32)[:, points, :2] if np.ndim(v) == 3 else np.asarray(v)) for k, v in arrays.items()}
    np.savez_compressed(out_dir / "landmarks.npz", points=points, **small)
    state = {k: v.detach().half().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out_dir / "clone_01a_fp16.safetensors"),
              metadata={"config": json.dumps(held.config.to_dict()), "model": "clone"})
    print(f"dumped landmarks.npz and FP16 weights to {out_dir}", flush=True)


def score_weights(pack: dict, paths: list[Path], run_mesh) -> list[dict]:
    """Held-out scores of trained weights (e.g. the FP16 files of --dump runs) on all of 01b, each alone
    and, for more than one, their outputs averaged (an ensemble), with 01a's neutral frame as reference."""
    import torch

    from digital_human.engines.clone_model import load_generator
    from digital_human.talking_head.clone.train import prepare_data

    class Averaged(torch.nn.Module):
        def __init__(self, models) -> None:
            super().__init__()
            self.models = torch.nn.ModuleList(models)

        def forward(self, source, reference, audio, visemes=None):
            return sum(m(source, reference, audio, visemes) for m in self.models) / len(self.models)

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    models = [load_generator(Path(p)).to(dev).eval() for p in paths]
    config = models[0].config
    data = prepare_data(pack["a_crops"], pack["a_landmarks"], pack["a_found"], pack["a_windows"],
                        float(pack["a_fps"]), config)
    held = HeldOut(pack, config, run_mesh, pack["a_crops"][data.neutral], None)
    base = held.baseline["mld"]
    candidates = [(str(p), m) for p, m in zip(paths, models)]
    if len(models) > 1:
        candidates.append((f"average of {len(models)}", Averaged(models)))
    rows = []
    for label, model in candidates:
        row = held.score(model)
        row.pop("opening")
        row.update(weights=label, mld_vs_baseline=row["mld"] / base - 1, meets_target=meets_target(row, base))
        rows.append(row)
        print(f"{label}: MLD {row['mld']:.4f} ({100 * row['mld_vs_baseline']:+.1f}% vs a) lag {row['lag_ms']:+.1f} ms "
              f"corr {row['corr_ratio']:.2f} x real{'  TARGET' if row['meets_target'] else ''}", flush=True)
    return rows


def write_report(out_dir: Path, report: dict) -> None:
    path = out_dir / "gpu_talking_head.json"
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(report, indent=2, default=float))
    tmp.replace(path)


def bench_inference(args, weights: Path | None) -> list[dict]:
    """Generator frames/s at 256-px crops (the region of each crop) for several paths."""
    import torch

    from digital_human.engines import loader
    from digital_human.engines.clone_model import (CloneGenerator, GeneratorConfig, export_generator_onnx,
                                                   generator_spec, load_generator, save_generator)

    cuda = torch.cuda.is_available()
    workdir = Path(tempfile.mkdtemp(prefix="clone_bench_"))
    model = load_generator(weights) if weights and weights.is_file() else CloneGenerator(GeneratorConfig()).eval()
    save_generator(model, workdir / "generator.safetensors")
    parity = export_generator_onnx(model, workdir / "generator.onnx")
    spec = generator_spec(workdir / "generator.onnx")
    frames = 64 if args.tiny else 1024
    batches = [1, 8] if args.tiny else [1, 16, 32, 64]
    rows: list[dict] = []

    def timeit(label: str, fn, batch: int) -> None:
        src, ref, aud = (t.numpy() for t in model.example_inputs(batch))
        feeds = {"source": src, "reference": ref, "audio": aud}
        for _ in range(3):
            fn(feeds)
        if cuda:
            torch.cuda.synchronize()
        reps = max(2, frames // batch)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn(feeds)
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        rows.append({"path": label, "batch": batch, "fps": reps * batch / dt, "ms_per_batch": 1000 * dt / reps})
        print(f"  {label:<40} batch {batch:3d}: {reps * batch / dt:9.1f} frames/s", flush=True)

    dev = "cuda" if cuda else "cpu"
    eager = load_generator(workdir / "generator.safetensors").to(dev)

    def run_eager(feeds):
        with torch.inference_mode():
            out = eager(*(torch.from_numpy(feeds[k]).to(dev) for k in ("source", "reference", "audio")))
            return out.cpu().numpy()

    for b in batches:
        timeit(f"eager FP32 torch-{dev}", run_eager, b)
    if cuda:
        runner = loader.get(spec, backend="torch", precision="fp16")
        for b in batches:
            timeit(f"loader {runner.backend} fp16 (+CUDA graphs)", runner, b)
        from digital_human.engines import backend_torch

        no_graphs = backend_torch.load(spec, "cuda", "fp16", use_cuda_graphs=False)
        for b in batches:
            timeit("torch-cuda fp16 (no CUDA graphs)", no_graphs, b)
    if not cuda:  # the GPU machine's ONNX Runtime is CPU-only: not a GPU path worth its device time
        ort = loader.get(spec, backend="onnxruntime", precision="fp32")
        for b in batches:
            timeit(f"loader {ort.backend} fp32", ort, b)
    if cuda:  # FP16 output vs FP32 on the same inputs
        src, ref, aud = (t.numpy() for t in model.example_inputs(8, seed=5))
        a = runner({"source": src, "reference": ref, "audio": aud})["region"]
        b_ = run_eager({"source": src, "reference": ref, "audio": aud})
        rows.append({"path": "fp16 vs fp32 max abs diff (0..1 scale)", "value": float(np.abs(a - b_).max())})
    rows.append({"path": "onnx parity max abs diff", "value": parity.max_abs_diff})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pack", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=float,
                    help="training seconds (default 150 without --steps; with --steps, no time limit unless given)")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--eval-every", type=int, default=1000, help="steps between held-out scorings (0: final only)")
    ap.add_argument("--eval-frames", type=int, default=300,
                    help="01b frames scored at the periodic evaluations (0: all)")
    ap.add_argument("--final-frames", type=int, default=0,
                    help="01b frames held out at all (the final evaluation scores these; 0: all 812)")
    ap.add_argument("--no-amp", action="store_true", help="train in FP32 instead of bf16 autocast")
    ap.add_argument("--augment-audio", type=float, default=1.0,
                    help="strength of fit_clone's audio window jitter (0 = off, the setting before 2026-11-29's "
                         "second run)")
    ap.add_argument("--skip-infer", action="store_true", help="skip the generator inference benchmark")
    ap.add_argument("--stop-at-target", action="store_true")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, few frames and steps")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--seed", type=int, default=0, help="training seed")
    ap.add_argument("--visemes", action="store_true",
                    help="train with the viseme conditioning (TrainAvatar visemes=True; the pack's aligner phones)")
    ap.add_argument("--drive", action="store_true",
                    help="--visemes plus portrait's mouth drive (TrainAvatar mouth_drive=True; needs a pack with *_drive)")
    ap.add_argument("--calibrate", action="store_true",
                    help="--drive: also score with the drive's openings scaled to 01b's average opening over 01a's")
    ap.add_argument("--viseme-dropout", type=float, default=0.3, help="fit_clone's viseme_dropout")
    ap.add_argument("--audio-mute", type=float, default=0.0, help="fit_clone's audio_mute (viseme configs)")
    ap.add_argument("--score-weights", type=Path, nargs="+",
                    help="no training: score these weights (e.g. --dump's FP16 files) and, if several, their average")
    # the recipe's three regularisers (fit_clone's defaults; the recipe before 2026-11-29's third run: 0 / 0 / 4)
    ap.add_argument("--shape-weight", type=float, default=0.2, help="fit_clone's lip-shape loss weight")
    ap.add_argument("--audio-dropout", type=float, default=0.3, help="fit_clone's audio-embedding dropout")
    ap.add_argument("--time-stretch", type=float, default=1.0,
                    help="fit_clone's audio time-stretch augmentation (max factor; 1 = off)")
    ap.add_argument("--average-weights", type=float, default=0.0,
                    help="fit_clone's tail weight average: share of the run at its end whose weights are averaged "
                         "(0 = off); the final scoring then covers the average and the last step's weights")
    ap.add_argument("--mouth-weight", type=float, default=10.0, help="clone_loss's extra weight on the mouth box")
    ap.add_argument("--dump", action="store_true",
                    help="also write landmarks.npz and FP16 weights for CPU-side analysis")
    args = ap.parse_args()
    if args.tiny:
        args.steps, args.budget, args.eval_every, args.batch = args.steps or 6, None, 3, args.batch or 4
        args.eval_frames = min(args.eval_frames or 60, 60)
    elif args.budget is None and args.steps is None:
        args.budget = 150.0
    import_pack()
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu",
                    "torch": torch.__version__, "cuda": torch.version.cuda}
    pack = load_pack(args.pack)
    workdir = Path(tempfile.mkdtemp(prefix="clone_eval_"))
    if args.score_weights:
        report["scored"] = score_weights(pack, args.score_weights, mesh_runner(pack, workdir))
        write_report(args.out, report)
    elif not args.skip_train:
        train_to_target(pack, args, mesh_runner(pack, workdir), args.out, report)
        write_report(args.out, report)
    if not args.skip_infer:
        weights = args.out / "clone_01a.safetensors"
        print("inference (generator only, 256-px crops):", flush=True)
        report["inference"] = bench_inference(args, None if args.tiny else weights)
        write_report(args.out, report)
    print(f"wrote {args.out / 'gpu_talking_head.json'}", flush=True)


if __name__ == "__main__":
    main()
