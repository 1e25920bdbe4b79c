"""LatentSync's optional DeepCache-style faster mode vs the exact pipeline: how much the frames move.

Same random-weight release (reduced, seed 0) and inputs as the committed parity fixture
(tests/fixtures/latentsync/reduced.npz: frames, LatentSync's three points, speech), 20 DDIM steps, guidance 1.5,
seed 1247; the denoised faces of every window, exact (cache interval 0) vs interval 2 and 3. With random weights
the size of the difference says how far the approximation moves this network, not what a trained one does.
No time is recorded: the shared 2-core machine's load makes CPU timings meaningless, and the speed that matters
is the GPU's (not measured for this mode: no device time left).

  python benchmarks/latentsync_deepcache.py --out benchmarks/results/latentsync_deepcache.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "latentsync_deepcache.json")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT.parent))
    import torch

    from digital_human.engines.latentsync.audio import frame_windows, load_whisper, whisper_features
    from digital_human.engines.latentsync.files import locate
    from digital_human.engines.latentsync.pipeline import LatentSyncPipeline, load_networks
    from digital_human.engines.latentsync.random_release import write_release
    from digital_human.talking_head.latentsync.geometry import face_crop, smoothed_affines

    fx = dict(np.load(ROOT / "tests" / "fixtures" / "latentsync" / "reduced.npz"))
    root = Path(tempfile.mkdtemp(prefix="ls_deepcache_"))
    write_release(root, "reduced", seed=0)
    files = locate(root)
    net = load_networks(files)
    n = int(fx["ref_chunks_n"])
    feats = whisper_features(load_whisper(files.whisper), fx["wave"])
    chunks = frame_windows(feats, range(n), 25.0, net.feat_length)
    aff = smoothed_affines(fx["points"][:n], net.resolution)
    faces = np.stack([face_crop(f, m, net.resolution) for f, m in zip(fx["frames"][:n], aff)])
    rep: dict = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": "2-core CPU, FP32", "steps": args.steps, "frames": n,
                 "size": "reduced (random weights)"}
    outs = {}
    for interval in (0, 2, 3):
        pipe = LatentSyncPipeline(net, steps=args.steps, cache_interval=interval)
        g = torch.Generator().manual_seed(1247)
        noise = pipe.initial_noise(g)
        outs[interval] = torch.cat([pipe.window(faces[s:s + 16], chunks[s:s + 16], noise, g)
                                    for s in range(0, n, 16)]).numpy()
    for interval in (2, 3):
        d = np.abs(outs[interval] - outs[0]) * 127.5  # [-1, 1] -> 8-bit levels
        rep[f"interval_{interval}_max_levels"] = float(d.max())
        rep[f"interval_{interval}_mean_levels"] = float(d.mean())
        rep[f"interval_{interval}_full_unet_steps"] = len(range(0, args.steps, interval))
    print(json.dumps(rep, indent=2))
    args.out.write_text(json.dumps(rep, indent=2) + "\n")


if __name__ == "__main__":
    main()
