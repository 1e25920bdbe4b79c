"""Wav2Lip (Prajwal et al., ACM MM 2020; Rudrabha/Wav2Lip): lip-sync of a 96x96 face box from 16 mel frames.

Engine side: where the user's checkpoints go and how they are read (files.py; nothing is downloaded), the
generator network with the release's state-dict names and its inference form (networks.py), the release's
mel spectrogram and per-frame windows (audio.py), a random-weight release for tests (random_release.py) and
ONNX export (export.py). The talking-head side (box padding, crop and paste geometry from FaceAlign's mesh,
the renderer) is talking_head/wav2lip/. Both are compared with the reference code on random weights
(benchmarks/wav2lip_parity.py, tests/test_wav2lip_parity.py).
LICENCE: the Wav2Lip repository and its checkpoints are for personal / research / non-commercial use only.
"""
