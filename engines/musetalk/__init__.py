"""MuseTalk 1.5 (TMElyralab, MIT): real-time lip-sync of a face crop from speech, as a talking-head model.

Engine side: the release's files (files.py; users place them under the pack's models folder, nothing is
downloaded), the networks from diffusers/transformers (networks.py; optional extra `[musetalk]`), the
whisper audio windows (audio.py), the inference session with its latent cache (pipeline.py) and ONNX
export (export.py). The talking-head side (face box, crop and blending conventions, the per-frame
renderer) is talking_head/musetalk/. Both are proven against the reference code with random weights
(benchmarks/musetalk_parity.py, tests/test_musetalk.py).
"""
