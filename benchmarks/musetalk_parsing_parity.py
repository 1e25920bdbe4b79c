"""MuseTalk 1.5's face-parsing blend vs the pack's, with seeded random BiSeNet weights, plus the face-mesh
mask measured against the reference's blend region.

Steps, run by one command (the reference step runs in the reference venv, importing nothing from the pack):
1. (pack python) write random face-parse-bisent/ files in the release's format and names
   (engines/musetalk/random_release.write_face_parsing), take a real frame of a shared video, find
   MuseTalk's face box with FaceAlign (+10 px extra margin, as v1.5), a seeded noise "generated face",
   and an *ideal* label map of the blending square drawn from the face mesh (skin = face oval,
   nose = nose hull, lips and mouth = lip contours) for the geometry comparison;
2. (reference venv) the reference's own FaceParsing (its BiSeNet loaded from those files, cheek widths 90
   as v1.5's scripts) on the blending square: logits of its network, its mask in mode "jaw" (and
   "raw", "neck"), and blending.get_image with it; then get_image again with FaceParsing's network
   replaced by the ideal labels (one-hot logits), on a black frame with a white face, which gives
   get_image's blend mask itself;
3. (pack python) engines/musetalk/face_parsing on the same files and inputs; talking_head/musetalk's
   blend; and the pack's face-mesh paste mask (the renderer's, in crop space, pasted back to the frame
   as the driver does) compared with the reference's ideal-parsing blend mask.

  python benchmarks/musetalk_parsing_parity.py --ref-checkout /tmp/musetalk-ref \\
      --ref-python /tmp/mt-ref-venv/bin/python --work /tmp/mt-parsing \\
      [--fixture tests/fixtures/musetalk/face_parsing.npz]

torchvision: the reference imports transforms.ToTensor/Normalize/Compose only. Where the reference venv has
no torchvision build matching its torch, this script writes a stand-in with torchvision's arithmetic
(PIL -> uint8 HWC -> CHW float / 255; (x - mean) / std) and puts it first on the reference's path;
--no-shim when the venv has a working torchvision.
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
SEED = 7
CHEEK = 90  # v1.5 scripts' --left_cheek_width / --right_cheek_width
SMALL = 160  # the CI case: the frame shrunk to 160x160 (the fixture must stay small)

SHIM = '''"""Stand-in for torchvision.transforms in the reference venv (ToTensor, Normalize, Compose), with
torchvision's arithmetic; written by benchmarks/musetalk_parsing_parity.py."""
import numpy as np
import torch


class ToTensor:
    def __call__(self, pic):
        a = np.array(pic, np.uint8, copy=True)
        if a.ndim == 2:
            a = a[:, :, None]
        return torch.from_numpy(a).permute(2, 0, 1).contiguous().to(torch.get_default_dtype()).div(255)


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def __call__(self, x):
        mean = torch.as_tensor(self.mean, dtype=x.dtype).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=x.dtype).view(-1, 1, 1)
        return x.clone().sub_(mean).div_(std)


class Compose:
    def __init__(self, ts):
        self.ts = ts

    def __call__(self, x):
        for t in self.ts:
            x = t(x)
        return x
'''

# face-mesh contours for the ideal label map (MediaPipe indices)
LIPS_OUTER = (61, 146, 91, 181, 84, 17, 314, 405, 321, 375, 291, 409, 270, 269, 267, 0, 37, 39, 40, 185)
MOUTH_INNER = (78, 95, 88, 178, 87, 14, 317, 402, 318, 324, 308, 415, 310, 311, 312, 13, 82, 81, 80, 191)
NOSE_POINTS = (168, 6, 197, 195, 5, 4, 1, 19, 94, 2, 98, 97, 326, 327, 294, 278, 344, 440, 275, 45, 220, 115,
               48, 64, 129, 358, 279, 49, 209, 429, 102, 331)


def _random_release_module():
    spec = importlib.util.spec_from_file_location("mt_random_release", ROOT / "engines/musetalk/random_release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- 2. the reference (reference venv) ----------------------------------------------------------
def run_reference(work: Path, checkout: Path) -> None:
    import torch
    from PIL import Image

    sys.path.insert(0, str(checkout))
    os.chdir(work)  # FaceParsing reads ./models/face-parse-bisent/ (work/models -> the random release)
    from musetalk.utils.blending import face_seg, get_crop_box, get_image
    from musetalk.utils.face_parsing import FaceParsing

    inp = np.load(work / "inputs.npz")
    fp = FaceParsing(left_cheek_width=CHEEK, right_cheek_width=CHEEK)
    out: dict[str, np.ndarray] = {}
    for case in ("frame", "small"):
        image, face, box = inp[f"{case}_bgr"], inp[f"{case}_face_bgr"], [int(v) for v in inp[f"{case}_box"]]
        crop_box, _ = get_crop_box(box, 1.5)
        large = Image.fromarray(image[:, :, ::-1]).crop(crop_box)  # what get_image parses
        with torch.no_grad():
            x = fp.preprocess(large.resize((512, 512), Image.BILINEAR))[None]
            out[f"{case}_logits"] = fp.net(x)[0][0].numpy()
        for mode in ("jaw", "raw", "neck") if case == "frame" else ("jaw",):
            out[f"{case}_mask512_{mode}"] = np.array(fp(large, mode=mode))
        out[f"{case}_seg"] = np.array(face_seg(large, mode="jaw", fp=fp))
        out[f"{case}_blended_bgr"] = get_image(image.copy(), face, box, mode="jaw", fp=fp)

    # ideal parsing: the network's output replaced by one-hot logits of the mesh-drawn labels; a black
    # frame and a white face make get_image's output its own blend mask (paste of 255 over 0 through m is m)
    labels = torch.from_numpy(inp["ideal_labels512"].astype(np.int64))
    onehot = torch.nn.functional.one_hot(labels, 19).permute(2, 0, 1)[None].float()

    class IdealNet:
        def __call__(self, x):
            return (onehot,)

    fp.net = IdealNet()
    image, box = inp["frame_bgr"], [int(v) for v in inp["frame_box"]]
    crop_box, _ = get_crop_box(box, 1.5)
    out["ideal_mask512_jaw"] = np.array(fp(Image.fromarray(image[:, :, ::-1]).crop(crop_box), mode="jaw"))
    white = np.full((box[3] - box[1], box[2] - box[0], 3), 255, np.uint8)
    out["ideal_blend_mask"] = get_image(np.zeros_like(image), white, box, mode="jaw", fp=fp)[:, :, 0]
    import PIL

    out["pillow"] = np.array(PIL.__version__)
    out["torch"] = np.array(torch.__version__)
    np.savez_compressed(work / "reference.npz", **out)
    print("reference done")


# --- 1. inputs (pack python) ----------------------------------------------------------------------
def ideal_labels(landmarks: np.ndarray, square) -> np.ndarray:
    """uint8 [512, 512] CelebAMask-HQ labels of the blending square drawn from face-mesh landmarks (in the
    same pixel space as `square`): 1 skin (face oval), 10 nose (hull of the nose points), 12 lips, 11 mouth."""
    import cv2

    xs, ys, xe, _ = square
    scale = 512.0 / (xe - xs)
    lm = (np.asarray(landmarks, np.float64)[:, :2] - (xs, ys)) * scale
    from digital_human.vision.paste import FACE_OVAL

    out = np.zeros((512, 512), np.uint8)

    def fill(points, label, hull=False):
        pts = np.rint((lm[list(points)] - 0.5) * 16).astype(np.int32)  # pixel centres, 4 fractional bits
        if hull:
            pts = cv2.convexHull(pts)
        cv2.fillPoly(out, [pts.reshape(-1, 2)], int(label), lineType=cv2.LINE_8, shift=4)

    fill(FACE_OVAL, 1)
    fill(NOSE_POINTS, 10, hull=True)
    fill(LIPS_OUTER, 12)
    fill(MOUTH_INNER, 11)
    return out


def prepare(work: Path, video: Path) -> None:
    import cv2

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _bootstrap import import_pack

    import_pack()
    from digital_human.media.probe import read_video_frames
    from digital_human.talking_head.musetalk.blend import extend_box, square_box
    from digital_human.talking_head.musetalk.geometry import musetalk_box
    from digital_human.vision.align import align_faces

    work.mkdir(parents=True, exist_ok=True)
    rel = work / "release"
    if not (rel / "musetalk" / "face-parse-bisent" / "79999_iter.pth").is_file():
        _random_release_module().write_face_parsing(rel, seed=SEED)
    link = work / "models"
    if not link.exists():
        link.symlink_to(rel / "musetalk", target_is_directory=True)
    shim = work / "ref_shim" / "torchvision"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "__init__.py").write_text("")
    (shim / "transforms.py").write_text(SHIM)

    frames, fps = read_video_frames(str(video), max_frames=1)
    rgb = np.ascontiguousarray(frames[0])
    track = align_faces(rgb[None], fps)
    box = extend_box(musetalk_box(track.landmarks[0], rgb.shape[0]), rgb.shape[0])
    rng = np.random.default_rng(SEED)
    face = rng.integers(0, 256, (box[3] - box[1], box[2] - box[0], 3), dtype=np.uint8)
    small = cv2.resize(rgb, (SMALL, SMALL), interpolation=cv2.INTER_AREA)
    k = SMALL / rgb.shape[0]
    sbox = (int(box[0] * k), int(box[1] * k), int(box[2] * k), int(box[3] * k))
    sface = rng.integers(0, 256, (sbox[3] - sbox[1], sbox[2] - sbox[0], 3), dtype=np.uint8)
    np.savez(work / "inputs.npz", frame_bgr=rgb[:, :, ::-1].copy(), frame_box=np.array(box),
             frame_face_bgr=face, small_bgr=small[:, :, ::-1].copy(), small_box=np.array(sbox), small_face_bgr=sface,
             ideal_labels512=ideal_labels(track.landmarks[0], square_box(box)),
             video=np.array(str(video.name)))


# --- 3. the pack ------------------------------------------------------------------------------------
class IdealParser:
    """Stands in for FaceParser with mesh-drawn labels (FaceParser.mask's resize and jaw-mode steps)."""

    def __init__(self, landmarks: np.ndarray, square) -> None:
        self.landmarks, self.square = landmarks, square

    def mask(self, rgb: np.ndarray, mode: str = "jaw") -> np.ndarray:
        from PIL import Image

        from digital_human.engines.musetalk.face_parsing import labels_to_mask

        h, w = rgb.shape[:2]
        m = labels_to_mask(ideal_labels(self.landmarks, self.square), mode)
        return np.asarray(Image.fromarray(m).resize((w, h), Image.BICUBIC))


def region_stats(ref: np.ndarray, ours: np.ndarray) -> dict:
    """Blend masks (uint8 0..255, same frame) compared: IoU of their >= 128 regions, what each covers that
    the other does not (as a fraction of the reference region), mean |diff| over the union, row extents."""
    a, b = ref >= 128, ours >= 128
    union = a | b
    rows_a, rows_b = np.nonzero(a.any(1))[0], np.nonzero(b.any(1))[0]
    cols_a, cols_b = np.nonzero(a.any(0))[0], np.nonzero(b.any(0))[0]
    return {
        "iou": float((a & b).sum() / max(union.sum(), 1)),
        "ref_area_px": int(a.sum()), "ours_area_px": int(b.sum()),
        "ref_only_frac_of_ref": float((a & ~b).sum() / max(a.sum(), 1)),
        "ours_only_frac_of_ref": float((b & ~a).sum() / max(a.sum(), 1)),
        "mean_abs_diff_over_union": float(np.abs(ref.astype(float) - ours.astype(float))[union].mean() / 255.0),
        "rows_ref": [int(rows_a.min()), int(rows_a.max())] if len(rows_a) else None,
        "rows_ours": [int(rows_b.min()), int(rows_b.max())] if len(rows_b) else None,
        "cols_ref": [int(cols_a.min()), int(cols_a.max())] if len(cols_a) else None,
        "cols_ours": [int(cols_b.min()), int(cols_b.max())] if len(cols_b) else None,
    }


def run_pack(work: Path) -> tuple[dict, dict]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _bootstrap import import_pack

    import_pack()
    from digital_human.engines.musetalk.face_parsing import FaceParser, labels_to_mask, load_bisenet
    from digital_human.talking_head.musetalk.blend import cut_square, paste_face, parsing_face_mask, square_box
    from digital_human.talking_head.musetalk.crops import _MuseTalkRenderer
    from digital_human.vision.align import align_faces
    from digital_human.vision.paste import paste_back

    inp = dict(np.load(work / "inputs.npz"))
    parser = FaceParser(load_bisenet(work / "release" / "musetalk" / "face-parse-bisent" / "79999_iter.pth"))
    ours: dict[str, np.ndarray] = {}
    for case in ("frame", "small"):
        rgb = np.ascontiguousarray(inp[f"{case}_bgr"][:, :, ::-1])
        face = np.ascontiguousarray(inp[f"{case}_face_bgr"][:, :, ::-1])
        box = tuple(int(v) for v in inp[f"{case}_box"])
        large = cut_square(rgb, square_box(box))
        logits = parser.logits(large)
        ours[f"{case}_logits"] = logits
        labels = logits.argmax(0)
        for mode in ("jaw", "raw", "neck") if case == "frame" else ("jaw",):
            ours[f"{case}_mask512_{mode}"] = labels_to_mask(labels, mode)
        ours[f"{case}_seg"] = parser.mask(large, "jaw")
        ours[f"{case}_blended"] = paste_face(rgb, face, box, parsing_face_mask(rgb, box, parser))

    # the face-mesh mask as the pipeline makes it (crop space, renderer) pasted back to the frame like the
    # driver pastes (white crop over a black frame, no colour matching: the output is the mask), and the
    # pipeline's face-parsing path fed the ideal labels (crop space too), each vs the reference's region
    rgb = np.ascontiguousarray(inp["frame_bgr"][:, :, ::-1])
    track = align_faces(rgb[None], 25.0)
    white = np.full((track.crop_size, track.crop_size, 3), 255, np.uint8)

    def to_frame(mask_crop: np.ndarray) -> np.ndarray:
        return paste_back(np.zeros_like(rgb), white, track.affines[0], mask_crop, color_match=False)[:, :, 0]

    # the jaw-mode steps and get_image's mask on the ideal labels, in the frame as the reference does
    ours["ideal_mask512_jaw"] = labels_to_mask(inp["ideal_labels512"], "jaw")
    box = tuple(int(v) for v in inp["frame_box"])
    src_mask = parsing_face_mask(rgb, box, IdealParser(track.landmarks[0], square_box(box)))  # paste_face blends it
    ours["ideal_frame_blend_mask"] = paste_face(np.zeros_like(rgb), np.full((box[3] - box[1], box[2] - box[0], 3), 255,
                                                                             np.uint8), box, src_mask)[:, :, 0]
    mesh = _MuseTalkRenderer(None, track, np.array([0]), None, 1, None)
    ours["mesh_blend_mask"] = to_frame(mesh.mask(0))
    crop_lms = mesh.crop_lms[0]
    ideal = _MuseTalkRenderer(None, track, np.array([0]), None, 1, None,
                              parser=IdealParser(crop_lms, square_box(mesh.box(0))))
    ours["ideal_crop_space_blend_mask"] = to_frame(ideal.mask(0))
    return ours, {"crop_size": int(track.crop_size)}


def compare(ref: dict, ours: dict) -> dict:
    def maxabs(a, b) -> float:
        return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())

    rep: dict = {}
    for case in ("frame", "small"):
        lab_r, lab_o = ref[f"{case}_logits"].argmax(0), ours[f"{case}_logits"].argmax(0)
        top2 = np.sort(ref[f"{case}_logits"], 0)
        rep[case] = {
            "logits_max_abs": maxabs(ref[f"{case}_logits"], ours[f"{case}_logits"]),
            "logits_std": float(ref[f"{case}_logits"].std()),
            "label_pixels_differing_frac": float((lab_r != lab_o).mean()),
            "min_top2_logit_gap": float((top2[-1] - top2[-2]).min()),
            "label_histogram_ref": np.bincount(lab_r.ravel(), minlength=19).tolist(),
            "seg_pixels_differing_frac": float((ref[f"{case}_seg"] != ours[f"{case}_seg"]).mean()),
            "seg_max_abs": maxabs(ref[f"{case}_seg"], ours[f"{case}_seg"]),
            "blended_uint8_max_abs": maxabs(ref[f"{case}_blended_bgr"][..., ::-1], ours[f"{case}_blended"]),
            "blended_pixels_differing": int(np.count_nonzero(ref[f"{case}_blended_bgr"][..., ::-1]
                                                            != ours[f"{case}_blended"])),
        }
        for mode in ("jaw", "raw", "neck") if case == "frame" else ("jaw",):
            r, o = ref[f"{case}_mask512_{mode}"], ours[f"{case}_mask512_{mode}"]
            rep[case][f"mask512_{mode}_pixels_differing_frac"] = float((r != o).mean())
            rep[case][f"mask512_{mode}_on_frac"] = float((r > 0).mean())
    rep["ideal_labels_jaw_mask512_pixels_differing_frac"] = float((ref["ideal_mask512_jaw"]
                                                                   != ours["ideal_mask512_jaw"]).mean())
    rep["ideal_labels_jaw_mask512_on_frac"] = float((ref["ideal_mask512_jaw"] > 0).mean())
    rep["ideal_labels_frame_blend_mask_max_abs"] = maxabs(ref["ideal_blend_mask"], ours["ideal_frame_blend_mask"])
    rep["mesh_vs_reference_ideal_blend"] = region_stats(ref["ideal_blend_mask"], ours["mesh_blend_mask"])
    rep["pack_parsing_path_crop_space_vs_reference_ideal_blend"] = region_stats(
        ref["ideal_blend_mask"], ours["ideal_crop_space_blend_mask"])
    rep["pass"] = bool(all(rep[c]["blended_uint8_max_abs"] <= 1 and rep[c]["logits_max_abs"] <= 1e-3
                           for c in ("frame", "small"))
                       and rep["ideal_labels_jaw_mask512_pixels_differing_frac"] == 0.0
                       and rep["ideal_labels_frame_blend_mask_max_abs"] <= 1)
    return rep


LOGIT_STRIDE = 16


def write_fixture(path: Path, work: Path, ref: dict) -> None:
    """The CI fixture: the small case's inputs and the reference's outputs; the BiSeNet weights are
    re-made from the seed (random_release.write_face_parsing), so they are not committed."""
    inp = np.load(work / "inputs.npz")
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        path, seed=np.array(SEED), image_bgr=inp["small_bgr"], box=inp["small_box"], face_bgr=inp["small_face_bgr"],
        logit_stride=np.array(LOGIT_STRIDE), logits_strided=ref["small_logits"][:, ::LOGIT_STRIDE, ::LOGIT_STRIDE],
        labels512=ref["small_logits"].argmax(0).astype(np.uint8), mask512_jaw=ref["small_mask512_jaw"],
        seg=ref["small_seg"], blended_bgr=ref["small_blended_bgr"],
        ideal_labels512=inp["ideal_labels512"], ideal_mask512_jaw=ref["ideal_mask512_jaw"])
    print(f"fixture {path}: {path.stat().st_size / 1e3:.0f} KB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step", choices=["all", "reference"], default="all")
    ap.add_argument("--ref-checkout", type=Path, required=True)
    ap.add_argument("--ref-python", default=sys.executable)
    ap.add_argument("--ref-path", default="", help="extra PYTHONPATH entries for the reference run")
    ap.add_argument("--no-shim", action="store_true", help="the reference venv has a working torchvision")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--video", type=Path, default=DATA / "video" / "talk_de_male_04.mp4")
    ap.add_argument("--fixture", type=Path, default=None)
    ap.add_argument("--ref-commit", default="", help="the reference's commit when the checkout is an export")
    args = ap.parse_args()
    work = args.work.resolve()
    if args.step == "reference":
        run_reference(work, args.ref_checkout.resolve())
        return
    prepare(work, args.video)
    paths = ([] if args.no_shim else [str(work / "ref_shim")]) + [str(args.ref_checkout.resolve()), args.ref_path]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    subprocess.run([args.ref_python, str(HERE), "--step", "reference", "--ref-checkout", str(args.ref_checkout),
                    "--work", str(work)], check=True, env=env)
    ref = dict(np.load(work / "reference.npz"))
    ours, info = run_pack(work)
    import PIL

    rev = subprocess.run(["git", "-C", str(args.ref_checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    report = dict(compare(ref, ours), video=str(np.load(work / "inputs.npz")["video"]), **info,
                  reference_commit=args.ref_commit or rev.stdout.strip() or "unknown",
                  pillow={"reference": str(ref["pillow"]), "pack": PIL.__version__},
                  torch_reference=str(ref["torch"]), torchvision="stand-in" if not args.no_shim else "venv")
    print(json.dumps(report, indent=2))
    (work / "report.json").write_text(json.dumps(report, indent=2))
    np.savez_compressed(work / "masks.npz", ideal_ref=ref["ideal_blend_mask"], mesh=ours["mesh_blend_mask"],
                        ideal_crop=ours["ideal_crop_space_blend_mask"], frame_bgr=np.load(work / "inputs.npz")["frame_bgr"])
    if args.fixture:
        write_fixture(args.fixture, work, ref)


if __name__ == "__main__":
    main()
