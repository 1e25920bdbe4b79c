"""Inference-time variants of a trained `clone` on held-out 01b: does smoothing over time or averaging
references move the mouth-landmark distance? Behind RESULTS.md's 2026-11-30 clone notes (CPU, ~6 min per model).

Takes FP16 weights that `gpu_talking_head.py --dump` wrote and the pack of `eval_talking_head.py
--prepare`, and scores (as the harness does: all 812 frames, 01a's neutral frame as reference, face
mesh re-measured) the generated regions
  * as they are;
  * averaged over time with a Gaussian (sigma in frames) - pixel-level temporal smoothing;
  * generated from audio embeddings averaged over time (the same Gaussian on the embedding);
  * averaged over five references (the neutral frame and four frames spread over 01a).
With a dump's landmarks.npz also: the generated landmarks smoothed over time (an upper bound that
also smooths the face mesh's own per-frame noise).

  python research/clone_inference_variants.py --pack .carry4/th_pack.npz --weights W.safetensors [--landmarks L.npz]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]
from _bootstrap import import_pack  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", type=Path, required=True)
    ap.add_argument("--weights", type=Path, required=True)
    ap.add_argument("--landmarks", type=Path, help="the same run's landmarks.npz (--dump)")
    args = ap.parse_args()
    import_pack()
    import torch
    from scipy.ndimage import gaussian_filter1d

    import gpu_talking_head as gth
    from eval_talking_head import lip_scores

    from digital_human.engines.clone_model import crops_to_regions, load_generator
    from digital_human.talking_head.clone.train import pick_neutral_frame
    from digital_human.vision.lipsync_metrics import mouth_landmark_distance

    if args.landmarks:  # landmark-level smoothing first: instant
        from clone_landmark_analysis import full_mesh

        dump = np.load(args.landmarks)
        real, base, clone = (full_mesh(dump, k) for k in ("real_b", "base_b", "clone_b"))
        base_mld, pts = mouth_landmark_distance(base, real), dump["points"]
        for sigma in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0):
            smooth = clone.copy()
            if sigma:
                smooth[:, pts] = gaussian_filter1d(clone[:, pts], sigma, axis=0, mode="nearest")
            print(f"generated landmarks smoothed over time, sigma {sigma:g} frames: MLD "
                  f"{100 * (mouth_landmark_distance(smooth, real) / base_mld - 1):+.1f}% vs baseline (a)", flush=True)

    pack = gth.load_pack(args.pack)
    run_mesh = gth.mesh_runner(pack, Path(tempfile.mkdtemp(prefix="dh_mesh_")))
    model = load_generator(args.weights).float().eval()
    config = model.config
    usable = np.flatnonzero(np.asarray(pack["a_found"], bool))
    neutral = pick_neutral_frame(pack["a_landmarks"], usable)  # the avatar's reference, as prepare_data picks it
    held = gth.HeldOut(pack, config, run_mesh, pack["a_crops"][neutral], None)
    n, batch, base_mld = len(held), 64, held.baseline["mld"]

    def generate(embedding_sigma: float = 0.0, references=None) -> np.ndarray:
        with torch.inference_mode():
            emb = torch.cat([model.audio(torch.from_numpy(held.windows[s:s + batch]).float()) for s in range(0, n, batch)])
            if embedding_sigma:
                emb = torch.from_numpy(gaussian_filter1d(emb.numpy(), embedding_sigma, axis=0, mode="nearest"))
            references = [held.reference] if references is None else references
            out = np.zeros((n, *held.sources.shape[1:]), np.float32)
            for ref in references:
                for s in range(0, n, batch):
                    src = torch.from_numpy(held.sources[s:s + batch]).float() / 255
                    r = torch.from_numpy(ref).float().expand_as(src) / 255
                    out[s:s + batch] += model.render(src, r, emb[s:s + batch]).clamp(0, 1).numpy()
        return out / len(references)

    def score(label: str, regions: np.ndarray) -> None:
        row = lip_scores(held.landmarks((np.clip(regions, 0, 1) * 255).round().astype(np.uint8)), held.real,
                         held.wave, 16000, held.fps)
        print(f"{label:44s} MLD {100 * (row['mld'] / base_mld - 1):+.2f}% vs baseline (a), lag {row['lag_ms']:+.1f} ms, "
              f"corr {row['corr_ratio']:.2f} x real", flush=True)

    raw = generate()
    score("as generated", raw)
    for sigma in (0.75, 1.0, 1.5):
        score(f"pixels smoothed over time, sigma {sigma:g}", gaussian_filter1d(raw, sigma, axis=0, mode="nearest"))
    for sigma in (1.0, 2.0):
        score(f"audio embedding smoothed, sigma {sigma:g}", generate(embedding_sigma=sigma))
    spread = usable[np.linspace(0, len(usable) - 1, 6).astype(int)[1:-1]]
    refs = [held.reference] + [crops_to_regions(pack["a_crops"][i][None], config) for i in spread]
    score(f"averaged over {len(refs)} references", generate(references=refs))


if __name__ == "__main__":
    main()
