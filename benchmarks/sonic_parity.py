"""Sonic parity: the reference pipeline (jixiaozhong/Sonic, run from its own checkout and venv) and ours on the
same random-weight release (the release's layout and formats), photo, face box and speech, FP32 on the CPU,
compared stage by stage and end to end.

    # 1. the reference's side, in its own venv (its code is never copied here; only called):
    /tmp/sonic-venv/bin/python benchmarks/sonic_parity.py reference --ref /tmp/sonic-ref --work /tmp/sonic-parity
    # 2. ours, and the comparison (writes benchmarks/results/sonic_parity_<size>.json):
    python benchmarks/sonic_parity.py ours --work /tmp/sonic-parity [--fixture tests/fixtures/sonic/parity_reduced.npz]

`--size reduced` (default) writes a reduced release (same architecture, small widths) and runs 2 steps at
128 px; `--size full` writes SVD-XT/whisper-tiny-sized random weights (about 10 GB of files; hours on a CPU).
The face box is given to both (the reference's YOLO detector is replaced by FaceAlign's box in ours; here both
get the same box, so the comparison is of everything after detection).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

STEPS, RESOLUTION, SEED = 2, 128, 72589
BOX = (52.0, 40.0, 128.0, 136.0)  # x0, y0, x1, y1 of the face in the synthetic photo


def make_inputs(work: Path) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic 200x180 photo (smooth colour fields and a bright ellipse where the face box is) and 1.1 s of
    speech-like 16 kHz audio (harmonics with a moving pitch and envelope), both seeded."""
    rng = np.random.default_rng(3)
    yy, xx = np.mgrid[0:200, 0:180].astype(np.float32)
    photo = np.stack([90 + 60 * np.sin(xx / 23.0), 80 + 50 * np.cos(yy / 17.0), 120 + 40 * np.sin((xx + yy) / 31.0)], -1)
    face = ((xx - 90) / 38) ** 2 + ((yy - 88) / 48) ** 2 < 1
    photo[face] = [210, 170, 150]
    photo = np.clip(photo + rng.normal(0, 6, photo.shape), 0, 255).astype(np.uint8)
    t = np.arange(int(1.1 * 16000)) / 16000.0
    f0 = 140 + 30 * np.sin(2 * np.pi * 1.5 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16000.0
    wave = sum(np.sin(k * phase) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2)
    wave = (0.25 * wave / np.abs(wave).max() + rng.normal(0, 0.003, t.shape)).astype(np.float32)
    work.mkdir(parents=True, exist_ok=True)
    import soundfile as sf
    from PIL import Image

    Image.fromarray(photo).save(work / "photo.png")
    sf.write(work / "speech.wav", wave, 16000, subtype="FLOAT")
    return photo, wave


# --- the reference's side ---------------------------------------------------------------------------
def run_reference(ref: Path, work: Path) -> None:
    import torch

    sys.path.insert(0, str(ref))
    from diffusers import AutoencoderKLTemporalDecoder
    from diffusers.schedulers import EulerDiscreteScheduler
    from omegaconf import OmegaConf
    from transformers import AutoFeatureExtractor, CLIPVisionModelWithProjection, WhisperModel

    import src.utils.RIFE.IFNet_HDv3 as ifnet_module
    from sonic import test as reference_test
    from src.dataset.test_preprocess import image_audio_to_tensor, process_bbox
    from src.models.audio_adapter.audio_proj import AudioProjModel
    from src.models.audio_adapter.audio_to_bucket import Audio2bucketModel
    from src.models.base.unet_spatio_temporal_condition import UNetSpatioTemporalConditionModel, add_ip_adapters
    from src.pipelines.pipeline_sonic import SonicPipeline
    from src.utils.util import seed_everything

    root = work / "models" / "sonic"
    svd = root / "stable-video-diffusion-img2vid-xt"
    sizes = json.loads((work / "sizes.json").read_text())
    config = OmegaConf.load(ref / "config/inference/sonic.yaml")
    config.num_inference_steps, config.seed = STEPS, SEED
    vae = AutoencoderKLTemporalDecoder.from_pretrained(svd, subfolder="vae", variant="fp16").float()
    scheduler = EulerDiscreteScheduler.from_pretrained(svd, subfolder="scheduler")
    clip = CLIPVisionModelWithProjection.from_pretrained(svd, subfolder="image_encoder", variant="fp16").float()
    unet = UNetSpatioTemporalConditionModel.from_config(UNetSpatioTemporalConditionModel.load_config(svd, subfolder="unet"))
    add_ip_adapters(unet, [32], [config.ip_audio_scale])
    unet.load_state_dict(torch.load(root / "Sonic/unet.pth", map_location="cpu"), strict=True)
    a2t = AudioProjModel(seq_len=10, blocks=sizes["blocks"], channels=sizes["d_model"], intermediate_dim=sizes["inter"],
                         output_dim=sizes["dim"], context_tokens=32)
    a2b = Audio2bucketModel(seq_len=50, blocks=1, channels=sizes["d_model"], clip_channels=sizes["clip"],
                            intermediate_dim=sizes["inter"], output_dim=1, context_tokens=2)
    a2t.load_state_dict(torch.load(root / "Sonic/audio2token.pth", map_location="cpu"), strict=True)
    a2b.load_state_dict(torch.load(root / "Sonic/audio2bucket.pth", map_location="cpu"), strict=True)
    whisper = WhisperModel.from_pretrained(root / "whisper-tiny").eval()
    fe = AutoFeatureExtractor.from_pretrained(root / "whisper-tiny")
    block_init = ifnet_module.IFBlock.__init__

    def reduced_width(self, in_planes, c=90):  # the reduced release's width (the net is otherwise the reference's)
        block_init(self, in_planes, c=sizes["rife"])

    ifnet_module.IFBlock.__init__ = reduced_width
    from src.utils.RIFE.RIFE_HDv3 import RIFEModel

    rife = RIFEModel(device="cpu")
    rife.load_model(str(root / "RIFE"))
    pipe = SonicPipeline(unet=unet, image_encoder=clip, vae=vae, scheduler=scheduler).to(device="cpu", dtype=torch.float32)

    photo_path = work / "photo.png"
    h, w = np.asarray(__import__("PIL.Image").Image.open(photo_path)).shape[:2]
    crop = process_bbox(BOX, expand_radio=0.5, height=h, width=w)  # the demo's expand_ratio
    import cv2

    image = cv2.imread(str(photo_path))
    cv2.imwrite(str(work / "crop.png"), image[crop[1]:crop[3], crop[0]:crop[2]])
    box_in_crop = [BOX[0] - crop[0], BOX[1] - crop[1], BOX[2] - BOX[0], BOX[3] - BOX[1]]  # x, y, w, h as YOLO gives

    class GivenBox:  # stands in for the YOLO detector: the same box ours gets from FaceAlign
        def __call__(self, im, maxface=False):
            return [None], [1.0], [box_in_crop]

    recorded: dict[str, list] = {"tokens": [], "buckets": [], "latents": []}
    a2t.register_forward_hook(lambda m, i, o: recorded["tokens"].append(o.detach().clone()))
    a2b.register_forward_hook(lambda m, i, o: recorded["buckets"].append(o.detach().clone()))
    decode = pipe.decode_latents

    def keep_latents(latents, *a, **k):
        recorded["latents"].append(latents.detach().clone())
        return decode(latents, *a, **k)

    pipe.decode_latents = keep_latents
    t0 = time.perf_counter()
    with torch.no_grad():
        seed_everything(config.seed)
        data = image_audio_to_tensor(GivenBox(), fe, str(work / "crop.png"), str(work / "speech.wav"),
                                     limit=config.frame_num, image_size=RESOLUTION, area=config.area)
        stage = {"ref_img": data["ref_img"].numpy(), "face_mask": data["face_mask"][0].numpy(),
                 "clip_images": data["clip_images"].numpy()}
        height, width = data["ref_img"].shape[-2:]
        video = reference_test(pipe, config, wav_enc=whisper, audio_pe=a2t, audio2bucket=a2b, image_encoder=clip,
                               width=width, height=height, batch=data)
        results = []
        for idx in range(video.shape[2] - 1):
            results.append(video[:, :, idx])
            results.append(rife.inference(video[:, :, idx], video[:, :, idx + 1]).clamp(0, 1))
        results.append(video[:, :, -1])
        video = torch.stack(results, 2)
    seconds = time.perf_counter() - t0
    frames = (video[0].permute(1, 2, 3, 0) * 255).numpy().astype(np.uint8)  # save_videos_grid's conversion
    n = len(recorded["tokens"]) // 2
    np.savez_compressed(work / "reference.npz", crop_box=np.array(crop), frames=frames, frames_float=video[0].permute(1, 0, 2, 3).numpy(),
                        tokens=torch.cat(recorded["tokens"][0::2][:n], 1)[0].numpy(),
                        uncond=recorded["tokens"][1][0, 0].numpy(),
                        buckets=torch.stack([b[0, 0] * 16 + 16 for b in recorded["buckets"]]).numpy(),
                        latents=recorded["latents"][0].numpy(), seconds=seconds, **stage)
    print(f"reference: {frames.shape[0]} frames in {seconds:.1f} s")


# --- ours and the comparison ------------------------------------------------------------------------
def run_ours(work: Path, float_frames: bool = True) -> dict:
    import torch

    from digital_human.engines.sonic.files import locate
    from digital_human.engines.sonic.load import load_networks
    from digital_human.talking_head.sonic.crop import frame_photo
    from digital_human.talking_head.sonic.pipeline import SonicFrames, SonicLatents, SonicSettings
    import soundfile as sf
    from PIL import Image

    photo = np.asarray(Image.open(work / "photo.png").convert("RGB"))
    wave, _ = sf.read(work / "speech.wav", dtype="float32")
    nets = load_networks(locate(work / "models"))
    framing = frame_photo(photo, BOX, short_side=RESOLUTION)
    t0 = time.perf_counter()
    latents = SonicLatents(nets, framing, wave, SonicSettings(steps=STEPS, seed=SEED, resolution=RESOLUTION))
    latents.run()
    made = SonicFrames(latents)
    frames = made.uint8(0, made.count)
    frames_float = torch.stack([made.frame(j) for j in range(made.count)]).numpy() if float_frames else None
    seconds = time.perf_counter() - t0
    so = latents.stage_outputs
    out = {"crop_box": np.array(framing.crop_box), "frames": frames, "frames_float": frames_float,
            "ref_img": torch.from_numpy(framing.image.copy()).permute(2, 0, 1).float().div(255).sub(0.5).div(0.5).numpy(),
            "face_mask": framing.mask, "clip_images": nets.clip_processor(images=framing.clip_image,
                                                                          return_tensors="pt").pixel_values[0].numpy(),
            "tokens": so["tokens"].numpy(), "uncond": so["uncond"][0].numpy(), "buckets": so["buckets"].numpy(),
            "latents": latents.latents.numpy(), "seconds": seconds}
    return out


def compare(ref: dict, ours: dict) -> dict:
    out = {}
    for key in ("crop_box", "ref_img", "face_mask", "clip_images", "tokens", "uncond", "buckets", "latents",
                "frames_float"):
        a, b = np.asarray(ref[key], np.float64), np.asarray(ours[key], np.float64)
        if a.shape != b.shape:
            out[key] = {"shape_reference": list(a.shape), "shape_ours": list(b.shape)}
            continue
        out[key] = {"max_abs": float(np.abs(a - b).max()), "scale": float(np.abs(a).max())}
    fa, fb = np.asarray(ref["frames"], np.int64), np.asarray(ours["frames"], np.int64)
    out["frames_uint8"] = ({"count": [len(fa), len(fb)], "max_level_diff": int(np.abs(fa - fb).max()),
                            "share_equal": float((fa == fb).mean())} if fa.shape == fb.shape else
                           {"shape_reference": list(fa.shape), "shape_ours": list(fb.shape)})
    return out


def write_sizes(work: Path, reduced: bool) -> None:
    from digital_human.engines.sonic.random_release import clip_config, unet_config, whisper_config

    w, u, c = whisper_config(reduced), unet_config(reduced), clip_config(reduced)
    (work / "sizes.json").write_text(json.dumps({
        "blocks": w["encoder_layers"] + 1, "d_model": w["d_model"], "inter": 64 if reduced else 1024,
        "dim": u["cross_attention_dim"], "clip": c["projection_dim"], "rife": 16 if reduced else 90}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("side", choices=["prepare", "reference", "ours"])
    parser.add_argument("--ref", type=Path, default=Path("/tmp/sonic-ref"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/sonic-parity"))
    parser.add_argument("--size", choices=["reduced", "full"], default="reduced")
    parser.add_argument("--fixture", type=Path, help="also write the reference's outputs here for CI (ours side)")
    args = parser.parse_args()
    if args.side == "prepare":
        from digital_human.engines.sonic.random_release import write_random_release

        make_inputs(args.work)
        write_random_release(args.work / "models", seed=0, reduced=args.size == "reduced")
        write_sizes(args.work, args.size == "reduced")
        return
    if args.side == "reference":
        run_reference(args.ref, args.work)
        return
    ref = dict(np.load(args.work / "reference.npz"))
    ours = run_ours(args.work)
    report = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "size": args.size, "steps": STEPS, "resolution": RESOLUTION, "seed": SEED,
              "seconds_reference": float(ref["seconds"]), "seconds_ours": ours["seconds"], "stages": compare(ref, ours)}
    out = Path(__file__).parent / "results" / f"sonic_parity_{args.size}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    if args.fixture:
        keep = ("crop_box", "ref_img", "face_mask", "tokens", "buckets", "latents", "frames")
        np.savez_compressed(args.fixture, **{k: ref[k] for k in keep})


if __name__ == "__main__":
    main()
