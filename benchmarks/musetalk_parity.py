"""MuseTalk 1.5 runtime vs the reference code (TMElyralab/MuseTalk), with seeded random weights.

Three steps, run by one command:
1. (pack python) write a random-weight release in the release's files and layout
   (engines/musetalk/random_release.py), cut a few seconds of speech and a video frame, find its face
   box with FaceAlign, make a blending mask;
2. (reference venv) run the reference's own code on those files: AudioProcessor.get_audio_feature /
   get_whisper_chunk with WhisperModel.from_pretrained, VAE.get_latents_for_unet (after
   torch.manual_seed(seed)), PositionalEncoding + UNet at timestep 0, VAE.decode_latents,
   blending.get_image (its face-parsing model replaced by the same mask);
3. (pack python) run engines/musetalk on the same files and inputs and compare stage by stage.

  python benchmarks/musetalk_parity.py --ref-checkout /tmp/musetalk-ref --ref-python /tmp/mt-ref-venv/bin/python \\
      --ref-path /tmp/mt-ref-shim --size full --work /tmp/mt-parity-full
  # reduced configuration + the committed CI fixture:
  python benchmarks/musetalk_parity.py ... --size reduced --work /tmp/mt-parity-red --fixture tests/fixtures/musetalk/reduced.npz

The reference venv: python3.11 -m venv; torch (CPU), diffusers==0.32.*, transformers==4.48.*, librosa,
einops, omegaconf, opencv-python-headless, soundfile. Its torchvision import is only for
transforms.Normalize; where no matching torchvision build exists, --ref-path may point at a folder
whose torchvision/transforms.py defines Normalize (x.sub(mean).div(std), as torchvision does).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
DATA = Path(os.environ.get("DIGITAL_HUMAN_DATA", ROOT.parent / "shared" / "data"))
FPS = 25
SEED = 7


def _random_release_module():
    spec = importlib.util.spec_from_file_location("mt_random_release", ROOT / "engines/musetalk/random_release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- 2. the reference (runs inside the reference venv; imports nothing from the pack) ------------
def run_reference(work: Path, checkout: Path, n_frames: int) -> None:
    import cv2
    import torch
    from PIL import Image

    os.chdir(checkout)
    sys.path.insert(0, str(checkout))
    _load = torch.load
    torch.load = lambda *a, **k: _load(*a, **dict(k, mmap=True))  # the 3.4 GB UNet is not copied twice
    from transformers import WhisperModel

    from musetalk.models.unet import PositionalEncoding, UNet
    from musetalk.models.vae import VAE
    from musetalk.utils.audio_processor import AudioProcessor
    from musetalk.utils.blending import get_image

    inp = np.load(work / "inputs.npz")
    base = work / "release" / "musetalk"
    out: dict[str, np.ndarray] = {}
    with torch.no_grad():
        processor = AudioProcessor(feature_extractor_path=str(base / "whisper"))
        whisper = WhisperModel.from_pretrained(str(base / "whisper")).to(dtype=torch.float32).eval()
        out["attn_implementation"] = np.array(str(whisper.config._attn_implementation))
        features, length = processor.get_audio_feature(str(work / "audio.wav"))
        chunks = processor.get_whisper_chunk(features, torch.device("cpu"), torch.float32, whisper, length, fps=FPS,
                                             audio_padding_length_left=2, audio_padding_length_right=2)
        out["whisper_chunks"] = chunks.numpy()
        out["librosa_length"] = np.array(length)

        vae = VAE(model_path=str(base / "sd-vae"))
        unet = UNet(unet_config=str(base / "musetalkV15" / "musetalk.json"),
                    model_path=str(base / "musetalkV15" / "unet.pth"), device=torch.device("cpu"))
        pe = PositionalEncoding(d_model=384)

        frame = inp["frame_bgr"]
        x1, y1, x2, y2 = (int(v) for v in inp["box"])
        y2 = min(y2 + 10, frame.shape[0])  # v1.5's extra_margin, as scripts/inference.py
        crop = cv2.resize(frame[y1:y2, x1:x2], (256, 256), interpolation=cv2.INTER_LANCZOS4)
        out["crop_bgr"] = crop
        torch.manual_seed(SEED)
        latents = vae.get_latents_for_unet(crop)
        out["latents"] = latents.numpy()

        n = min(n_frames, len(chunks))
        audio = pe(chunks[:n])
        pred = unet.model(latents.repeat(n, 1, 1, 1), torch.tensor([0]), encoder_hidden_states=audio).sample
        out["pred_latents"] = pred.numpy()
        image = vae.vae.decode((1 / vae.scaling_factor) * pred).sample
        out["decoded"] = (image / 2 + 0.5).clamp(0, 1).numpy()  # decode_latents before quantisation
        recon = vae.decode_latents(pred)  # uint8 BGR
        out["recon_bgr"] = recon

        mask = inp["face_mask"]

        def parsing(image, mode="raw"):  # stands in for FaceParsing: the same mask for both sides
            assert image.size == (mask.shape[1], mask.shape[0]), (image.size, mask.shape)
            return Image.fromarray(mask)

        blended = []
        for res in recon:
            face = cv2.resize(res.astype(np.uint8), (x2 - x1, y2 - y1))
            blended.append(get_image(frame.copy(), face, [x1, y1, x2, y2], mode="jaw", fp=parsing))
        out["blended_bgr"] = np.stack(blended)

        # a small synthetic blending case for the CI fixture (the real frame is too big to commit)
        rng = np.random.default_rng(SEED)
        small = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
        sbox = [40, 20, 100, 96]  # a box whose blending square leaves the image (clipping is exercised)
        sface = rng.integers(0, 256, (sbox[3] - sbox[1], sbox[2] - sbox[0], 3), dtype=np.uint8)
        side = 2 * int(max(sbox[2] - sbox[0], sbox[3] - sbox[1]) // 2 * 1.5)
        smask = (rng.random((side, side)) > 0.3).astype(np.uint8) * 255
        out["blend_case_image"], out["blend_case_face"], out["blend_case_mask"] = small, sface, smask
        out["blend_case_box"] = np.array(sbox)
        out["blend_case_out"] = get_image(small.copy(), sface, sbox, mode="jaw",
                                          fp=lambda image, mode="raw": Image.fromarray(smask))
    np.savez_compressed(work / "reference.npz", **out)
    print(f"reference: {n} frames, chunks {tuple(chunks.shape)}, latents {tuple(latents.shape)}")


# --- 1. inputs (pack python) ---------------------------------------------------------------------
def prepare(work: Path, size: str, seconds: float, video: Path, audio: Path) -> None:
    import soundfile as sf

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _bootstrap import import_pack

    import_pack()
    from digital_human.talking_head.musetalk.blend import square_box
    from digital_human.talking_head.musetalk.geometry import musetalk_box
    from digital_human.media.probe import read_video_frames
    from digital_human.vision.align import align_faces

    work.mkdir(parents=True, exist_ok=True)
    if not (work / "release" / "musetalk" / "musetalkV15" / "unet.pth").is_file():
        _random_release_module().write_release(work / "release", size, seed=SEED)
    wave, rate = sf.read(str(audio), dtype="float32", always_2d=True)
    wave = wave.mean(1)[: int(seconds * rate)]
    sf.write(str(work / "audio.wav"), wave, rate, subtype="FLOAT")
    frames, fps = read_video_frames(str(video), max_frames=1)
    frame_rgb = np.ascontiguousarray(frames[0])
    track = align_faces(frame_rgb[None], fps)
    box = musetalk_box(track.landmarks[0], frame_rgb.shape[0])
    xs, ys, xe, ye = square_box((box[0], box[1], box[2], min(box[3] + 10, frame_rgb.shape[0])))
    side = xe - xs
    yy, xx = np.mgrid[0:side, 0:side]
    face_mask = ((((xx - side / 2) / (side * 0.3)) ** 2 + ((yy - side * 0.55) / (side * 0.35)) ** 2) < 1)
    np.savez(work / "inputs.npz", frame_bgr=frame_rgb[:, :, ::-1].copy(), box=np.array(box),
             face_mask=(face_mask * 255).astype(np.uint8), rate=np.array(rate))


# --- 3. the pack on the same inputs ----------------------------------------------------------------
def run_pack(work: Path, n_frames: int) -> dict[str, np.ndarray]:
    import soundfile as sf
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _bootstrap import import_pack

    import_pack()
    from digital_human.engines.musetalk.audio import audio_windows, feature_extractor
    from digital_human.talking_head.musetalk.blend import crop_face, extend_box, paste_face, resize_to_box
    from digital_human.engines.musetalk.files import locate
    from digital_human.engines.musetalk.networks import load_networks
    from digital_human.engines.musetalk.pipeline import MuseTalkPipeline

    inp = np.load(work / "inputs.npz")
    files = locate(work / "release")
    net = load_networks(files)
    wave, rate = sf.read(str(work / "audio.wav"), dtype="float32")
    n_all = int(np.floor(len(wave) / rate * FPS))
    windows = audio_windows(net.whisper, feature_extractor(files.whisper_dir), wave, rate, FPS, n_all)
    frame_rgb = np.ascontiguousarray(inp["frame_bgr"][:, :, ::-1])
    box = extend_box(inp["box"], frame_rgb.shape[0])
    crop = crop_face(frame_rgb, box)
    pipe = MuseTalkPipeline(net, seed=SEED)
    latents = pipe.encode_references(crop[None])
    n = min(n_frames, n_all)
    w = windows(0, n)
    pred = pipe.unet_step(latents.repeat(n, 1, 1, 1), w)
    decoded = pipe.decode(pred)
    faces = pipe.to_uint8(decoded)
    blended = np.stack([paste_face(frame_rgb, resize_to_box(f, box), box, inp["face_mask"]) for f in faces])
    with torch.no_grad():
        return {"whisper_chunks": windows(0, n_all).numpy(), "crop": crop, "latents": latents.numpy(),
                "pred_latents": pred.numpy(), "decoded": decoded.numpy(), "recon": faces, "blended": blended}


def compare(ref: dict, ours: dict) -> dict:
    def maxabs(a, b):
        return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())

    rep = {
        "whisper_chunks_shape": list(ref["whisper_chunks"].shape),
        "whisper_chunks_max_abs": maxabs(ref["whisper_chunks"], ours["whisper_chunks"])
        if ref["whisper_chunks"].shape == ours["whisper_chunks"].shape else float("inf"),
        "crop_max_abs": maxabs(ref["crop_bgr"][:, :, ::-1], ours["crop"]),
        "latents_max_abs": maxabs(ref["latents"], ours["latents"]),
        "pred_latents_max_abs": maxabs(ref["pred_latents"], ours["pred_latents"]),
        "decoded_max_abs": maxabs(ref["decoded"], ours["decoded"]),
        "recon_uint8_max_abs": maxabs(ref["recon_bgr"][..., ::-1], ours["recon"]),
        "blended_uint8_max_abs": maxabs(ref["blended_bgr"][..., ::-1], ours["blended"]),
        "blended_pixels_differing": int(np.count_nonzero(ref["blended_bgr"][..., ::-1] != ours["blended"])),
        "frames": int(len(ours["recon"])),
        "attn_implementation": str(ref["attn_implementation"]),
    }
    rep["pass"] = bool(rep["whisper_chunks_max_abs"] <= 1e-5 and rep["decoded_max_abs"] <= 1e-3
                       and rep["blended_uint8_max_abs"] <= 1)
    return rep


FIXTURE_CHUNK_FRAMES = (0, 12, 24, 36, -1)  # whisper windows kept (all of them would be 1.5 MB)


def write_fixture(path: Path, work: Path, ref: dict, frames: int) -> None:
    """The CI fixture: inputs and reference outputs of the reduced configuration; the weights are
    re-made from the seed by random_release.write_release (so they are not committed)."""
    import soundfile as sf

    wave, rate = sf.read(str(work / "audio.wav"), dtype="float32")
    path.parent.mkdir(parents=True, exist_ok=True)
    keep = [i % len(ref["whisper_chunks"]) for i in FIXTURE_CHUNK_FRAMES]
    np.savez_compressed(
        path, seed=np.array(SEED), fps=np.array(FPS), wave=wave, rate=np.array(rate), crop_bgr=ref["crop_bgr"],
        n_chunks=np.array(len(ref["whisper_chunks"])), chunk_frames=np.array(keep),
        whisper_chunks=ref["whisper_chunks"][keep].astype(np.float32), latents=ref["latents"],
        pred_latents=ref["pred_latents"][:frames], decoded0_center=ref["decoded"][0, :, 64:192, 64:192],
        recon_bgr=ref["recon_bgr"][:frames],
        **{k: ref[k] for k in ref if k.startswith("blend_case_")})
    print(f"fixture {path}: {path.stat().st_size / 1e6:.2f} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step", choices=["all", "reference"], default="all")
    ap.add_argument("--ref-checkout", type=Path, required=True)
    ap.add_argument("--ref-python", default=sys.executable)
    ap.add_argument("--ref-path", default="", help="extra PYTHONPATH entries for the reference run")
    ap.add_argument("--size", choices=["full", "reduced"], default="full")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--frames", type=int, default=4, help="video frames through UNet/decode/blend")
    ap.add_argument("--video", type=Path, default=DATA / "video" / "talk_en_male_01a.mp4")
    ap.add_argument("--audio", type=Path, default=DATA / "audio" / "spk_en_male_01.wav")
    ap.add_argument("--fixture", type=Path, default=None)
    ap.add_argument("--ref-commit", default="", help="the reference's commit when the checkout is an export")
    args = ap.parse_args()
    if args.step == "reference":
        run_reference(args.work.resolve(), args.ref_checkout.resolve(), args.frames)
        return
    work = args.work.resolve()
    prepare(work, args.size, args.seconds, args.video, args.audio)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(args.ref_checkout.resolve()), args.ref_path] if p))
    subprocess.run([args.ref_python, str(HERE), "--step", "reference", "--ref-checkout", str(args.ref_checkout),
                    "--work", str(work), "--frames", str(args.frames)], check=True, env=env)
    ref = dict(np.load(work / "reference.npz"))
    ours = run_pack(work, args.frames)
    rev = subprocess.run(["git", "-C", str(args.ref_checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    report = dict(compare(ref, ours), size=args.size, seconds=args.seconds,
                  reference_commit=args.ref_commit or rev.stdout.strip() or "unknown")
    print(json.dumps(report, indent=2))
    (work / "report.json").write_text(json.dumps(report, indent=2))
    if args.fixture:
        write_fixture(args.fixture, work, ref, min(args.frames, 2))


if __name__ == "__main__":
    main()
