"""LatentSync runtime vs the reference code (bytedance/LatentSync), with seeded random weights, FP32 on the CPU.

Three steps, run by one command:
1. (pack python) write a random-weight release in the release's files and layout
   (engines/latentsync/random_release.py); cut speech and a few frames of a talking video; run FaceAlign and take
   LatentSync's three points (brow centres, nose centre) from its mesh (talking_head/latentsync/geometry.py);
2. (reference venv) run the reference's own LipsyncPipeline.__call__ end to end on those files and inputs, with
   only its I/O and its face detector replaced: read_video/read_audio/audio2feat return the same arrays,
   write_video captures the frames, the ffmpeg mux is skipped, and insightface's detector returns a 106-point
   array whose points at the reference's indices are the mesh's three points (so the reference's own
   affine_transform / AlignRestore / restore_img run); AlignRestore in FP32 on the CPU (the reference's CUDA path
   is FP16). Also: UNet3DConditionModel.from_pretrained + a strict load_state_dict of the same checkpoint, one UNet
   forward on a seeded input, whisper's transcribe-based features and feature2chunks;
3. (pack python) run engines/latentsync + talking_head/latentsync on the same files and inputs and compare stage by
   stage; the pack's own path (FaceTrack -> latentsync_crops -> the shared driver's paste) is compared on the
   frames whose random draws are the same (the first 16-frame window: the reference makes 1-2 frames more than the
   audio's length, so its last window has a different size and draws).

  python benchmarks/latentsync_parity.py --ref-checkout /tmp/latentsync-ref --ref-python /tmp/latentsync-venv/bin/python \\
      --work /tmp/ls-parity --fixture tests/fixtures/latentsync/reduced.npz

The reference venv: python3.11 -m venv; torch + torchvision (CPU use), diffusers==0.32.2, transformers==4.48.0,
einops==0.7.0, omegaconf==2.3.0, kornia==0.8.0, decord, matplotlib, imageio, opencv-python-headless, soundfile.
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
FPS = 25
SEED = 1247
STEPS = 3          # DDIM steps of the fixture (the schedule's arithmetic is the same at 20; the benchmark runs 20)
GUIDANCE = 1.5
FRAME_SIZE = 112   # reference frames are downscaled so the committed fixture stays small
N_FRAMES = 24
SECONDS = 0.8      # 20 output frames (pack), 22 (reference: feature2chunks)

# insightface 2d106 indices the reference averages (image_processor.ImageProcessor.affine_transform)
IDX_LEFT, IDX_RIGHT, IDX_NOSE = [43, 48, 49, 51, 50], [101, 102, 103, 104, 105], [74, 77, 83, 86]


# --- 2. the reference (runs inside the reference venv; imports nothing from the pack) ------------
def run_reference(work: Path, checkout: Path, steps: int, guidance: float) -> None:
    import torch
    from types import SimpleNamespace

    os.chdir(checkout)
    sys.path.insert(0, str(checkout))
    import types

    # face_detector.py imports insightface at module level; its FaceAnalysis is never constructed here (the
    # Detector below replaces it), so an empty module stands in for the package (which needs a C++ build)
    stub = types.ModuleType("insightface.app")
    stub.FaceAnalysis = None
    sys.modules.update({"insightface": types.ModuleType("insightface"), "insightface.app": stub})
    from diffusers import AutoencoderKL, DDIMScheduler
    from omegaconf import OmegaConf

    import latentsync.pipelines.lipsync_pipeline as lp
    from latentsync.models.unet import UNet3DConditionModel
    from latentsync.utils.affine_transform import AlignRestore
    from latentsync.utils.image_processor import ImageProcessor
    from latentsync.whisper.audio2feature import Audio2Feature

    inp = np.load(work / "inputs.npz")
    frames, points, wave = inp["frames"], inp["points"], inp["wave"]
    rel = work / "models" / "latentsync"
    config = OmegaConf.load(str(rel / "configs/unet/stage2_512.yaml"))
    res = int(config.data.resolution)
    out: dict[str, np.ndarray] = {}

    audio_encoder = Audio2Feature(model_path=str(rel / "whisper/tiny.pt"), device="cpu",
                                  num_frames=config.data.num_frames, audio_feat_length=config.data.audio_feat_length)
    feats = audio_encoder._audio2feat(wave)  # transcribe() takes the array as it takes a decoded file
    out["features"] = feats.numpy()
    chunks = audio_encoder.feature2chunks(feature_array=feats, fps=FPS)
    out["chunks"] = torch.stack(chunks).numpy()

    vae = AutoencoderKL.from_pretrained(str(rel / "sd-vae-ft-mse"), torch_dtype=torch.float32)
    vae.config.scaling_factor, vae.config.shift_factor = 0.18215, 0
    unet, _ = UNet3DConditionModel.from_pretrained(OmegaConf.to_container(config.model), str(rel / "latentsync_unet.pt"),
                                                   device="cpu")
    # the reference loads with strict=False: check the same file also loads strictly into its own class
    state = torch.load(str(rel / "latentsync_unet.pt"), weights_only=True)["state_dict"]
    result = torch.nn.Module.load_state_dict(unet, state, strict=False)
    out["unet_missing"] = np.array(len(result.missing_keys))
    out["unet_unexpected"] = np.array(len(result.unexpected_keys))
    unet = unet.float().eval()

    g = torch.Generator().manual_seed(3)
    lat = res // 8
    x = torch.randn(2, 13, 16, lat, lat, generator=g)
    a = torch.cat([torch.zeros(16, *out["chunks"].shape[1:]), torch.from_numpy(out["chunks"][:16])])
    with torch.no_grad():
        out["unet_out"] = unet(x, torch.tensor(501), encoder_hidden_states=a).sample.numpy()
    out["unet_in"] = x.numpy()

    scheduler = DDIMScheduler.from_pretrained(str(checkout / "configs"))
    pipe = lp.LipsyncPipeline(vae=vae, audio_encoder=audio_encoder, unet=unet, scheduler=scheduler).to("cpu")

    class Detector:  # insightface's FaceAnalysis stand-in: the mesh's three points at the reference's indices
        def __init__(self):
            self.i = 0

        def __call__(self, image):
            lmk = np.zeros((106, 2))
            p = points[self.i]
            lmk[IDX_LEFT], lmk[IDX_RIGHT], lmk[IDX_NOSE] = p[0], p[1], p[2]
            self.i += 1
            return (0, 0, image.shape[1], image.shape[0]), lmk

    class CpuImageProcessor(ImageProcessor):
        def __init__(self, resolution, device="cpu", mask_image=None):
            super().__init__(resolution, "cpu", mask_image)
            self.restorer = AlignRestore(resolution=resolution, device="cpu", dtype=torch.float32)
            self.face_detector = Detector()

    captured: dict[str, object] = {}
    lp.ImageProcessor = CpuImageProcessor
    lp.check_ffmpeg_installed = lambda: None
    lp.read_video = lambda path, use_decord=False: frames.copy()
    lp.read_audio = lambda path: torch.from_numpy(wave)
    audio_encoder.audio2feat = lambda path: feats
    lp.write_video = lambda path, video, fps: captured.__setitem__("frames", np.asarray(video))
    lp.sf = SimpleNamespace(write=lambda *a, **k: None)
    lp.subprocess = SimpleNamespace(run=lambda *a, **k: None)
    affine = pipe.affine_transform_video
    pipe.affine_transform_video = lambda v: captured.setdefault("affine", affine(v))
    restore_video = pipe.restore_video
    pipe.restore_video = lambda faces, *a: (captured.__setitem__("synced", faces.clone()), restore_video(faces, *a))[1]

    pipe(video_path="video.mp4", audio_path="audio.wav", video_out_path=str(work / "ref.mp4"), num_frames=16,
         video_fps=FPS, audio_sample_rate=16000, height=res, width=res, num_inference_steps=steps,
         guidance_scale=guidance, weight_dtype=torch.float32,
         mask_image_path=str(rel / "latentsync/utils/mask.png"), temp_dir=str(work / "temp"),
         generator=torch.Generator().manual_seed(SEED))
    faces, _, affines = captured["affine"]
    out["faces"] = faces.permute(0, 2, 3, 1).numpy().astype(np.uint8)
    out["affines"] = torch.cat(affines).numpy()
    out["synced"] = captured["synced"].numpy()
    out["frames"] = captured["frames"]
    np.savez(work / "reference.npz", **out)


# --- 1. inputs (pack python) ---------------------------------------------------------------------
def prepare(work: Path, video: Path, audio: Path) -> None:
    import cv2

    sys.path.insert(0, str(ROOT.parent))
    from digital_human.engines.latentsync.random_release import write_release
    from digital_human.engines.musetalk.audio import resample_16k
    from digital_human.media.frame_source import load_face_frames
    from digital_human.audio.decode import decode_audio

    work.mkdir(parents=True, exist_ok=True)
    write_release(work / "models", "reduced", seed=0)
    frames, fps, _ = load_face_frames(video, N_FRAMES / 25.0 + 0.2)
    frames = np.stack([cv2.resize(np.asarray(f), (FRAME_SIZE, FRAME_SIZE), interpolation=cv2.INTER_AREA)
                       for f in frames[:N_FRAMES]])
    wave, rate = decode_audio(audio)
    wave = resample_16k(np.asarray(wave, np.float32)[0][: int(SECONDS * rate)], rate)
    track = _track(frames)
    from digital_human.talking_head.latentsync.geometry import three_points

    points = np.stack([three_points(track.landmarks[r]) for r in range(len(track))])
    np.savez(work / "inputs.npz", frames=frames, points=points, wave=wave.astype(np.float32))


def _track(frames: np.ndarray):
    from digital_human.engines.face import detect
    from digital_human.engines.face.blazeface import face_detector_spec
    from digital_human.engines.face.facemesh import face_mesh_spec
    from digital_human.vision.align import align_faces

    runners = (detect.engine_runner(face_detector_spec(), backend="onnxruntime"),
               detect.engine_runner(face_mesh_spec(), backend="onnxruntime"))
    return align_faces(frames, float(FPS), runners=runners)


# --- 3. the pack on the same files (pack python) ------------------------------------------------
def run_pack(models: Path, inputs: dict, n_ref: int, steps: int, guidance: float,
             track=None) -> dict[str, np.ndarray]:
    """Every stage of the pack on `inputs` (frames, points, wave); n_ref: the reference's frame count."""
    import torch

    from digital_human.engines.latentsync.audio import frame_windows, load_whisper, whisper_features
    from digital_human.engines.latentsync.files import locate
    from digital_human.engines.latentsync.pipeline import LatentSyncPipeline, load_networks
    from digital_human.talking_head.latentsync.geometry import face_crop, restore, smoothed_affines

    files = locate(models)
    net = load_networks(files)
    out: dict[str, np.ndarray] = {}
    feats = whisper_features(load_whisper(files.whisper), inputs["wave"])
    out["features"] = feats.numpy()
    out["chunks"] = frame_windows(feats, range(n_ref), FPS, net.feat_length).numpy()
    with torch.no_grad():
        out["unet_out"] = net.unet(torch.from_numpy(inputs["unet_in"]), torch.tensor(501),
                                   torch.cat([torch.zeros(16, *out["chunks"].shape[1:]),
                                              torch.from_numpy(out["chunks"][:16])]), uncond_rows=1).numpy()
    res = net.resolution
    frames = inputs["frames"][:n_ref]
    affines = smoothed_affines(inputs["points"][:n_ref], res)
    out["affines"] = affines
    faces = np.stack([face_crop(f, m, res) for f, m in zip(frames, affines)])
    out["faces"] = faces
    pipe = LatentSyncPipeline(net, steps=steps, guidance=guidance)
    gen = torch.Generator().manual_seed(SEED)
    noise = pipe.initial_noise(gen)
    synced = [pipe.window(faces[s:s + 16], torch.from_numpy(out["chunks"][s:s + 16]), noise, gen).float()
              for s in range(0, n_ref, 16)]
    synced = torch.cat(synced)
    out["synced"] = synced.numpy()
    out["frames"] = np.stack([restore(f, s, m, res)[0] for f, s, m in zip(frames, synced, affines)])
    if track is not None:  # the pack's own path: FaceTrack -> latentsync_crops -> the shared driver's paste
        from digital_human.talking_head.driver import paste_generated
        from digital_human.talking_head.latentsync.crops import latentsync_crops

        gen_crops = latentsync_crops(track, inputs["wave"], 16000, float(FPS), loop_mode="loop", seed=SEED,
                                     models_root=models, steps=steps, guidance=guidance, streaming=False)
        out["pack_frames"] = paste_generated(gen_crops).frames
    return out


def compare(ref: dict, ours: dict) -> dict:
    def maxabs(a, b):
        return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())

    n = len(ref["frames"])
    rep = {
        "whisper_features_max_abs": maxabs(ref["features"], ours["features"]),
        "whisper_features_scale": float(np.abs(ref["features"]).max()),
        "audio_windows_max_abs": maxabs(ref["chunks"], ours["chunks"]),
        "unet_forward_max_abs": maxabs(ref["unet_out"], ours["unet_out"]),
        "unet_forward_scale": float(np.abs(ref["unet_out"]).max()),
        "affines_max_abs": maxabs(ref["affines"], ours["affines"]),
        "face_crops_max_abs_levels": maxabs(ref["faces"], ours["faces"]),
        "face_crops_mean_abs_levels": float(np.abs(ref["faces"].astype(float) - ours["faces"].astype(float)).mean()),
        "denoised_faces_max_abs": maxabs(ref["synced"], ours["synced"]),
        "frames_max_abs_levels": maxabs(ref["frames"], ours["frames"][:n]),
        "frames_mean_abs_levels": float(np.abs(ref["frames"].astype(float) - ours["frames"][:n].astype(float)).mean()),
        "frames_compared": n,
    }
    if "pack_frames" in ours:
        k = 16
        d = np.abs(ref["frames"][:k].astype(float) - ours["pack_frames"][:k].astype(float))
        changed = np.abs(ref["frames"][:k].astype(float) - ref["input_frames"][:k].astype(float)).max(-1) > 2
        rep["pack_path_frames_compared"] = k
        rep["pack_path_mean_abs_levels"] = float(d.mean())
        rep["pack_path_mean_abs_levels_in_changed_region"] = float(d.max(-1)[changed].mean()) if changed.any() else 0.0
        rep["pack_path_p99_levels"] = float(np.percentile(d, 99))
    if "unet_missing" in ref:
        rep["reference_strict_load_missing"] = int(ref["unet_missing"])
        rep["reference_strict_load_unexpected"] = int(ref["unet_unexpected"])
    return rep


def write_fixture(path: Path, work: Path, ref: dict) -> None:
    inp = dict(np.load(work / "inputs.npz"))
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, frames=inp["frames"], points=inp["points"], wave=inp["wave"],
                        ref_features=ref["features"].astype(np.float32), ref_chunks_n=np.array(len(ref["chunks"])),
                        ref_affines=ref["affines"], ref_faces=ref["faces"],
                        # the output frames as their change from the input (zero outside the mouth: compresses)
                        ref_frames_delta=ref["frames"].astype(np.int16) - inp["frames"][: len(ref["frames"])],
                        unet_in=ref["unet_in"], ref_unet_out=ref["unet_out"],
                        ref_synced=ref["synced"].astype(np.float16), steps=np.array(STEPS), seed=np.array(SEED))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", choices=["all", "reference"], default="all")
    ap.add_argument("--ref-checkout", type=Path, default=Path("/tmp/latentsync-ref"))
    ap.add_argument("--ref-python", default="/tmp/latentsync-venv/bin/python")
    ap.add_argument("--work", type=Path, default=Path("/tmp/ls-parity"))
    ap.add_argument("--video", type=Path, default=DATA / "video" / "talk_en_male_01a.mp4")
    ap.add_argument("--audio", type=Path, default=DATA / "audio" / "spk_en_03.wav")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--ref-rev", default="", help="the reference's commit when --ref-checkout is an archive")
    ap.add_argument("--fixture", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "latentsync_parity.json")
    args = ap.parse_args()
    if args.step == "reference":
        run_reference(args.work, args.ref_checkout, args.steps, GUIDANCE)
        return
    t0 = time.time()
    prepare(args.work, args.video, args.audio)
    subprocess.run([args.ref_python, str(HERE), "--step", "reference", "--ref-checkout", str(args.ref_checkout),
                    "--work", str(args.work), "--steps", str(args.steps)], check=True)
    ref = dict(np.load(args.work / "reference.npz"))
    inputs = dict(np.load(args.work / "inputs.npz"))
    ref["input_frames"] = inputs["frames"]
    inputs["unet_in"] = ref["unet_in"]
    ours = run_pack(args.work / "models", inputs, len(ref["chunks"]), args.steps, GUIDANCE, track=_track(inputs["frames"]))
    rep = compare(ref, ours)
    rev = subprocess.run(["git", "-C", str(args.ref_checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    rep.update({"date": time.strftime("%Y-%m-%d", time.gmtime()), "reference": "bytedance/LatentSync " + (rev.stdout.strip() or args.ref_rev or "(archive)"),
                "size": "reduced", "steps": args.steps, "guidance": GUIDANCE, "seed": SEED, "precision": "fp32 cpu",
                "frame_size": FRAME_SIZE, "seconds": round(time.time() - t0, 1)})
    print(json.dumps(rep, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rep, indent=2) + "\n")
    if args.fixture is not None:
        write_fixture(args.fixture, args.work, ref)


if __name__ == "__main__":
    main()
