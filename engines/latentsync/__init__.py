"""LatentSync 1.6 / 1.5 (ByteDance; Apache-2.0 code; weights: their model card's licence): audio-conditioned latent diffusion
lip-sync of a face crop, as a talking-head model.

Engine side: the release's files (files.py; users place them, nothing is downloaded), the UNet3D
(unet.py: AnimateDiff-style, written from its config), whisper tiny features (audio.py), the
denoising of a window of frames (pipeline.py), the ONNX graph of the UNet step (export.py) and the
random-weight release writer for tests (random_release.py). The talking-head side (LatentSync's affine-to-template crop from FaceAlign's mesh,
the restore mask, the renderer) is talking_head/latentsync/. Proven against the reference code with
random weights (benchmarks/latentsync_parity.py, tests/test_latentsync.py).
"""
