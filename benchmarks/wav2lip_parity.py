"""Wav2Lip runtime vs the reference code (Rudrabha/Wav2Lip inference.py), with seeded random weights.

Three steps, run by one command:
1. (pack python) write a random-weight checkpoint in the release's format (engines/wav2lip/random_release.py:
   {"state_dict": {"module.<key>": ...}, "optimizer": ..., ...}), decode a talking video's frames, track the face
   with FaceAlign and take the mesh's stand-in for S3FD's box on every frame, write 16 kHz speech;
2. (reference venv) run the reference's own inference.py main() unchanged on those files, with only its I/O
   replaced: cv2.VideoCapture serves the decoded frames (BGR), face_detection.FaceAlignment returns the FaceAlign
   boxes (its S3FD weights are not available), cv2.VideoWriter keeps the written frames, ffmpeg is not called;
   its load_model, audio.melspectrogram, datagen (pads, smoothing, crop, resize, half mask, batching), model
   forward and paste-back all run as written. librosa 0.9.2 runs its audio.py with stft's pad_mode set back to
   "reflect", the default of the librosa 0.7.0 its requirements.txt pins (0.9 changed it to "constant");
3. (pack python) run engines/wav2lip + talking_head/wav2lip on the same files and compare stage by stage
   (mel, windows, boxes, network input, network output) and end to end (pasted frames, the reference's own paste
   and the pack's crop-space paste), FP32 on the CPU, and time both.

  python benchmarks/wav2lip_parity.py --ref-checkout /tmp/w2l-ref --ref-python /tmp/wav2lip-venv/bin/python \\
      --work /tmp/w2l-parity [--fixture tests/fixtures/wav2lip/parity.npz]

The reference venv: python3.11 -m venv; torch (CPU), numpy, scipy, opencv, soundfile, librosa==0.9.2 (the
oldest librosa that installs with numpy 2; 0.7's pinned numba does not build on Python 3.11), tqdm.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
DATA = Path(os.environ.get("DIGITAL_HUMAN_DATA", ROOT.parent / "shared" / "data"))
SEED = 3
VIDEO = "video/talk_en_female_03a.mp4"
AUDIO = "audio/spk_en_03.wav"
FIXTURE_FRAMES = 3


# --- 2. the reference (runs inside the reference venv; imports nothing from the pack) ------------
def run_reference(work: Path, checkout: Path, tag: str) -> None:
    import functools

    import cv2
    import torch

    os.chdir(checkout)
    sys.path.insert(0, str(checkout))
    inputs = np.load(work / f"{tag}_inputs.npz")
    frames_bgr = inputs["frames"][..., ::-1].copy()
    (work / "face.mp4").write_bytes(b"")  # inference.py checks that --face is a file; Capture serves the frames
    rects = inputs["rects"]
    fps = float(inputs["fps"])
    sys.argv = ["inference.py", "--checkpoint_path", str(work / "wav2lip.pth"), "--face", str(work / "face.mp4"),
                "--audio", str(work / f"{tag}_speech.wav"), "--outfile", str(work / "unused.mp4")]
    import audio as ref_audio
    import librosa

    ref_audio.librosa.stft = functools.partial(librosa.stft, pad_mode="reflect")  # librosa 0.7.0's default
    import inference

    class Capture:  # cv2.VideoCapture over the decoded frames
        def __init__(self, _path):
            self.i = 0

        def get(self, prop):
            return fps if prop == cv2.CAP_PROP_FPS else 0

        def read(self):
            if self.i >= len(frames_bgr):
                return False, None
            self.i += 1
            return True, frames_bgr[self.i - 1].copy()

        def release(self):
            pass

    written: list = []

    class Writer:
        def __init__(self, *a, **k):
            pass

        def write(self, f):
            written.append(np.array(f))

        def release(self):
            pass

    class Detector:  # face_detection.FaceAlignment: the FaceAlign boxes, in the order frames are asked for
        seen = [0]

        def __init__(self, *a, **k):
            pass

        def get_detections_for_batch(self, images):
            out = []
            for _ in images:
                out.append(tuple(int(v) for v in rects[Detector.seen[0] % len(rects)]))
                Detector.seen[0] += 1
            return out

    recorded = {"mel": [], "img": [], "melb": [], "coords": [], "pred": []}
    real_mel = inference.audio.melspectrogram

    def mel_rec(wav):
        m = real_mel(wav)
        recorded["mel"].append(m)
        return m

    real_datagen = inference.datagen

    def datagen_rec(frames, mels):
        for img, melb, fr, coords in real_datagen(frames, mels):
            recorded["img"].append(img)
            recorded["melb"].append(melb)
            recorded["coords"] += [list(c) for c in coords]
            yield img, melb, fr, coords

    real_load = inference.load_model

    def load_rec(path):
        model = real_load(path)
        forward = model.forward

        def fwd(a, f):
            out = forward(a, f)
            recorded["pred"].append(out.detach().cpu().numpy())
            return out

        model.forward = fwd
        return model

    inference.cv2.VideoCapture = Capture
    inference.cv2.VideoWriter = Writer
    inference.face_detection.FaceAlignment = Detector
    inference.audio.melspectrogram = mel_rec
    inference.datagen = datagen_rec
    inference.load_model = load_rec
    inference.subprocess.call = lambda *a, **k: 0
    os.makedirs("temp", exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    t0 = time.perf_counter()
    inference.main()
    seconds = time.perf_counter() - t0
    np.savez_compressed(work / f"{tag}_reference.npz", mel=recorded["mel"][0],
                        img=np.concatenate(recorded["img"]).astype(np.float32),
                        melb=np.concatenate(recorded["melb"]).astype(np.float32),
                        coords=np.array(recorded["coords"], np.int64), pred=np.concatenate(recorded["pred"]),
                        frames=np.stack(written)[..., ::-1], seconds=np.float64(seconds))


# --- 1. and 3. the pack ----------------------------------------------------------------------------
def prepare(work: Path, tag: str, n_video: int, audio_seconds: float) -> None:
    import soundfile as sf

    from digital_human.engines.wav2lip.audio import to_16k
    from digital_human.engines.wav2lip.random_release import write_checkpoint
    from digital_human.media.probe import read_video_frames
    from digital_human.talking_head.wav2lip.geometry import detector_box
    from digital_human.vision.align import align_faces

    work.mkdir(parents=True, exist_ok=True)
    if not (work / "wav2lip.pth").is_file():
        write_checkpoint(work / "wav2lip.pth", SEED)
    frames, fps = read_video_frames(DATA / VIDEO, max_frames=n_video)
    track = align_faces(frames, fps)
    rects = np.stack([detector_box(track.landmarks[i]) for i in range(len(track))])
    wave, rate = sf.read(DATA / AUDIO, dtype="float32")
    wave16 = to_16k(wave if wave.ndim == 1 else wave.mean(1), rate)[: int(audio_seconds * 16000)]
    sf.write(work / f"{tag}_speech.wav", wave16, 16000, subtype="FLOAT")
    np.savez_compressed(work / f"{tag}_inputs.npz", frames=frames, rects=rects, fps=np.float64(fps),
                        landmarks=np.asarray(track.landmarks[np.arange(len(track))], np.float32),
                        affines=np.asarray(track.affines, np.float32))


def ours(work: Path, tag: str, ref: dict) -> tuple[dict, dict]:
    """Every stage of the pack's Wav2Lip on the reference's inputs; (metrics, arrays for the fixture)."""
    import soundfile as sf
    import torch

    from digital_human.engines.wav2lip import audio as w2l_audio
    from digital_human.engines.wav2lip.networks import inference_generator
    from digital_human.talking_head.driver import frame_schedule
    from digital_human.talking_head.wav2lip.crops import network_inputs, output_uint8
    from digital_human.talking_head.wav2lip.geometry import PADS, padded_boxes, paste_reference, smoothed_boxes
    from digital_human.vision.align import align_faces

    inp = np.load(work / f"{tag}_inputs.npz")
    frames, rects, fps = inp["frames"], inp["rects"], float(inp["fps"])
    wave, _ = sf.read(work / f"{tag}_speech.wav", dtype="float32")
    m: dict = {}
    t0 = time.perf_counter()
    mel = w2l_audio.melspectrogram(wave)
    m["mel_max_abs"] = float(np.abs(mel - ref["mel"]).max())
    n = len(ref["coords"])
    starts = w2l_audio.window_starts(n, fps, mel.shape[1])
    windows = w2l_audio.mel_windows(mel, starts)
    m["windows_max_abs"] = float(np.abs(windows - ref["melb"].transpose(0, 3, 1, 2)).max())
    h, w = frames.shape[1:3]
    boxes = smoothed_boxes(padded_boxes(rects, h, w, PADS))
    idx = frame_schedule(len(frames), n, "loop", fps, fps)
    ref_boxes = ref["coords"][:, [2, 0, 3, 1]]  # (y1, y2, x1, x2) -> x1, y1, x2, y2
    m["boxes_equal"] = bool((boxes[idx] == ref_boxes).all())
    from digital_human.talking_head.wav2lip.geometry import face_input

    faces = np.stack([face_input(frames[r], boxes[r])[..., ::-1] for r in idx])
    x = network_inputs(faces)
    m["input_max_abs"] = float(np.abs(x - ref["img"].transpose(0, 3, 1, 2)).max())
    net = inference_generator(work / "wav2lip.pth", "cpu", "fp32")
    t1 = time.perf_counter()
    with torch.inference_mode():
        pred = torch.cat([net(torch.from_numpy(windows[i:i + 128]),
                              torch.from_numpy(x[i:i + 128]).contiguous(memory_format=torch.channels_last))
                          for i in range(0, n, 128)])
    m["network_seconds_ours"] = time.perf_counter() - t1
    m["pred_max_abs"] = float((pred.numpy() - ref["pred"]).__abs__().max())
    out_u8 = output_uint8(pred)
    ref_u8 = (ref["pred"].transpose(0, 2, 3, 1) * 255.0).astype(np.uint8)
    m["pred_uint8_max_abs"] = int(np.abs(out_u8.astype(int) - ref_u8).max())
    m["pred_uint8_differing_fraction"] = float((out_u8 != ref_u8).mean())
    # end to end with the reference's own paste (geometry.paste_reference) on our outputs
    pasted = np.stack([paste_reference(frames[r][..., ::-1], out_u8[i], boxes[r])[..., ::-1]
                       for i, r in enumerate(idx)])
    m["frames_ref_paste_max_abs"] = int(np.abs(pasted.astype(int) - ref["frames"]).max())
    m["frames_ref_paste_mean_abs"] = float(np.abs(pasted.astype(int) - ref["frames"]).mean())
    m["seconds_ours_stages"] = time.perf_counter() - t0
    # the pack's own path: the renderer's crops in FaceAlign's crop space, pasted by the shared driver
    m.update(pack_path(work, tag, frames, fps, n, ref, boxes, idx))
    return m, {"pred_u8": ref_u8, "boxes": ref_boxes}


def pack_path(work: Path, tag: str, frames: np.ndarray, fps: float, n: int, ref: dict, boxes, idx) -> dict:
    """The pack's whole Wav2Lip (wav2lip_crops + paste_generated, the node path) on the same frames and speech:
    how far its crop-space paste is from the reference's box paste."""
    import soundfile as sf

    from digital_human.talking_head.driver import paste_generated
    from digital_human.talking_head.wav2lip.crops import wav2lip_crops
    from digital_human.vision.align import align_faces

    wave, rate = sf.read(work / f"{tag}_speech.wav", dtype="float32")
    track = align_faces(frames, fps)
    root = work / "models"
    (root / "wav2lip").mkdir(parents=True, exist_ok=True)
    link = root / "wav2lip" / "wav2lip.pth"
    if not link.exists():
        link.symlink_to(work / "wav2lip.pth")
    t0 = time.perf_counter()
    gen = wav2lip_crops(track, wave, rate, fps, loop_mode="loop", models_root=root, checkpoint="wav2lip",
                        precision="fp32")
    result = paste_generated(gen)
    seconds = time.perf_counter() - t0
    got = result.frames[:n].astype(int)
    want = ref["frames"].astype(int)
    inside = np.zeros(want.shape[:3], bool)
    for i, r in enumerate(idx):
        x1, y1, x2, y2 = boxes[r]
        inside[i, y1:y2, x1:x2] = True
    diff = np.abs(got - want)
    mse = float((diff[inside] ** 2).mean())
    return {"pack_frames": int(len(result.frames)), "reference_frames": int(n),
            "pack_seconds": seconds, "pack_box_mean_abs": float(diff[inside].mean()),
            "pack_box_psnr_db": float(10 * np.log10(255.0 ** 2 / max(mse, 1e-12))),
            "pack_outside_box_max_abs": int(diff[~inside].max()) if (~inside).any() else 0,
            "pack_outside_box_changed_fraction": float((diff[~inside] > 0).mean()) if (~inside).any() else 0.0}


def natural_paste(work: Path, tag: str) -> dict:
    """The two pastes on natural content: each frame's own 96x96 input face as the "output", pasted the
    reference's way (resize into the box) and the pack's way (into FaceAlign's crop, then the shared paste-back
    through the box mask); inside the box, how far the pack's is from the reference's (random-weight outputs are
    noise, the worst case for resampling; faces are not)."""
    import cv2

    from digital_human.talking_head.wav2lip.geometry import (PADS, box_mask, face_input, out_to_crop, padded_boxes,
                                                             paste_reference, smoothed_boxes)
    from digital_human.vision.paste import paste_back_batch

    inp = np.load(work / f"{tag}_inputs.npz")
    frames, affines = inp["frames"], inp["affines"].astype(np.float64)
    size = 256  # FaceAlign's default crop, as prepare() tracked
    h, w = frames.shape[1:3]
    boxes = smoothed_boxes(padded_boxes(inp["rects"], h, w, PADS))
    diffs, sq = [], []
    for r in range(len(frames)):
        out96 = face_input(frames[r], boxes[r])
        ref = paste_reference(frames[r], out96, boxes[r]).astype(int)
        crop = cv2.warpAffine(out96, out_to_crop(boxes[r], affines[r]), (size, size),
                              flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_REPLICATE)
        mask = box_mask(boxes[r], affines[r], size)
        ours = paste_back_batch(frames[r:r + 1].copy(), crop[None], affines[r:r + 1], mask[None],
                                color_match=False, keep_detail=False)[0].astype(int)
        x1, y1, x2, y2 = boxes[r]
        d = np.abs(ours[y1:y2, x1:x2] - ref[y1:y2, x1:x2])
        diffs.append(d.mean())
        sq.append((d.astype(np.float64) ** 2).mean())
    return {"natural_box_mean_abs": float(np.mean(diffs)),
            "natural_box_psnr_db": float(10 * np.log10(255.0 ** 2 / max(float(np.mean(sq)), 1e-12)))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref-checkout", type=Path, default=Path("/tmp/w2l-ref"))
    ap.add_argument("--ref-python", default="/tmp/wav2lip-venv/bin/python")
    ap.add_argument("--work", type=Path, default=Path("/tmp/w2l-parity"))
    ap.add_argument("--fixture", type=Path, default=None, help="also write the small CI fixture here")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "wav2lip_parity.json")
    ap.add_argument("--cases", default="full,small", help="full (75 frames, 3 s) and/or small (4 frames, 0.4 s)")
    ap.add_argument("--natural-only", action="store_true", help="only the natural-content paste figures, from the "
                    "inputs of an earlier run (no reference run), merged into --results")
    ap.add_argument("--reference-step", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reference_step:
        run_reference(args.work, args.ref_checkout, args.reference_step)
        return
    if args.natural_only:
        report = json.loads(args.results.read_text())
        for tag in args.cases.split(","):
            report["cases"].setdefault(tag, {}).update(natural_paste(args.work, tag))
            print(tag, report["cases"][tag])
        args.results.write_text(json.dumps(report, indent=1))
        return
    cases = {"full": (75, 3.0), "small": (4, 0.4)}  # small: the CI fixture's case (a 4-frame video)
    cases = {k: v for k, v in cases.items() if k in args.cases.split(",")}
    report = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": "CPU, 2 cores (shared)", "video": VIDEO, "audio": AUDIO,
              "seed": SEED, "precision": "fp32", "cases": {}}
    for tag, (n_video, seconds) in cases.items():
        prepare(args.work, tag, n_video, seconds)
        subprocess.run([args.ref_python, str(HERE), "--reference-step", tag, "--work", str(args.work),
                        "--ref-checkout", str(args.ref_checkout)], check=True)
        ref = dict(np.load(args.work / f"{tag}_reference.npz"))
        metrics, arrays = ours(args.work, tag, ref)
        metrics["reference_seconds"] = float(ref["seconds"])
        metrics.update(natural_paste(args.work, tag))
        report["cases"][tag] = metrics
        print(tag, json.dumps(metrics, indent=1))
        if tag == "small" and args.fixture is not None:
            inp = np.load(args.work / f"{tag}_inputs.npz")
            import soundfile as sf

            wave, _ = sf.read(args.work / f"{tag}_speech.wav", dtype="float32")
            args.fixture.parent.mkdir(parents=True, exist_ok=True)
            k = FIXTURE_FRAMES  # the network and paste stages of the first k output frames (the file < 2 MB)
            np.savez_compressed(args.fixture, frames=inp["frames"], rects=inp["rects"], fps=inp["fps"],
                                wave16k=wave, seed=np.int64(SEED), ref_mel=ref["mel"].astype(np.float32),
                                ref_melb=ref["melb"].astype(np.float32),
                                ref_coords=ref["coords"], ref_img_u8=np.round(ref["img"] * 255).astype(np.uint8),
                                ref_pred=ref["pred"][:k].astype(np.float32), ref_frames=ref["frames"][:k])
            print("fixture", args.fixture, args.fixture.stat().st_size, "bytes")
    args.results.parent.mkdir(parents=True, exist_ok=True)
    if args.results.is_file():  # a run of one case keeps the other's figures
        old = json.loads(args.results.read_text()).get("cases", {})
        report["cases"] = {**old, **report["cases"]}
    args.results.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
