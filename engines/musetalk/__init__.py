"""MuseTalk 1.5 (TMElyralab, MIT): real-time lip-sync of a face crop from speech, as a talking-head model.

Users place the release's files under the pack's models folder (see files.py); nothing is
downloaded. Networks come from diffusers/transformers (optional extra `[musetalk]`); the glue
(audio windows, latents, blending conventions) is the pack's own, proven against the reference
code with random weights (benchmarks/musetalk_parity.py, tests/test_musetalk.py).
"""
