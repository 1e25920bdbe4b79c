"""Sonic (jixiaozhong/Sonic, CVPR 2025; weights CC BY-NC-SA 4.0) on Stable Video Diffusion img2vid-xt (Stability
AI's non-commercial community licence): the release's files (files.py; nothing is downloaded), Sonic's own
networks (networks.py: audio2token, audio2bucket, the UNet's audio attention, RIFE), the strict loader over
diffusers/transformers blocks (load.py, extra `[sonic]`) and a random-weight release writer (random_release.py).
The talking-head side (framing, pipeline, contract glue) is talking_head/sonic/.
"""
