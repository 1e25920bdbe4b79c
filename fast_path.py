"""The fast-path switches: node inputs and CLI options, with the environment variables as overrides.

MuseTalk's fast path is torch.compile of its generation step and VAE encoder, replayed as CUDA graphs;
CosyVoice 2's is the LM step on a static KV cache captured as a CUDA graph (compiled), plus the
flow and vocoder speed-ups (engines/cosyvoice/engine.py FastPath); LatentSync's is torch.compile of its UNet step
and VAE (engines/latentsync/pipeline.py FastPath). All are CUDA-only and all cost
time once per process before they pay off, so they are off by default and the user switches them on
(`fast_path` input, `--fast-path`). The variables, when set to 1 or 0, win over the switch, so a
deployment can force either way without editing workflows. Figures: benchmarks/RESULTS.md (H200).
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("digital_human")

# the same names the engines read (engines/musetalk/pipeline.py COMPILE_ENV, engines/cosyvoice/engine.py FAST_ENV)
MUSETALK_COMPILE_ENV = "DIGITAL_HUMAN_MUSETALK_COMPILE"
COSYVOICE_FAST_ENV = "DIGITAL_HUMAN_COSYVOICE_FAST"
SONIC_COMPILE_ENV = "DIGITAL_HUMAN_SONIC_COMPILE"
LATENTSYNC_COMPILE_ENV = "DIGITAL_HUMAN_LATENTSYNC_COMPILE"

# the first-use cost, said in the tooltips, the CLI help and the log when the switch is on
MUSETALK_COST = ("MuseTalk fast path (torch.compile + CUDA graphs, CUDA only): the first video of a process "
                 "compiles first, about 75 s on an H200 (step 58 s + encoder 15 s; benchmarks/RESULTS.md, "
                 "2026-12-01), then a request is ~1.3x faster than eager FP32 with less than half its GPU memory; "
                 "worth it for long clips or many requests. Ignored on the CPU. "
                 "Override: DIGITAL_HUMAN_MUSETALK_COMPILE=1 or 0.")
COSYVOICE_COST = ("CosyVoice fast path (the LM step as a CUDA graph on a static cache, CUDA only; the engine then "
                  "runs on the GPU): the first synthesis of a process compiles and captures it, about 30 s on an "
                  "H200, then speech comes ~10x faster than eager FP32 (RTF 0.043 vs 0.418; benchmarks/RESULTS.md, "
                  "2026-12-01). Ignored without a CUDA GPU. Override: DIGITAL_HUMAN_COSYVOICE_FAST=1 or 0.")

SONIC_COST = ("Sonic fast path (torch.compile of the UNet's blocks, CUDA only; frames within 1 level of eager "
              "FP16): the first video of a process compiles first, about 110 s on an H200, later videos of the same "
              "size reuse it; then 10 s of speech takes 37.7 s instead of 51.8 s at 25 steps "
              "(benchmarks/RESULTS_sonic.md, 2026-12-02). Ignored on the CPU. "
              "Override: DIGITAL_HUMAN_SONIC_COMPILE=1 or 0.")
LATENTSYNC_COST = ("LatentSync fast path (torch.compile of the UNet step and the VAE, CUDA only): the first 16-frame "
                   "window of a process compiles first, about 180 s on an H200, then the whole pipeline runs 1.71x "
                   "the reference's (6.0 vs 3.5 frames/s) with the same frames to FP16 rounding (max 1.25 of 255 "
                   "levels) and less GPU memory (7.9 vs 12.4 GiB peak; benchmarks/RESULTS.md, 2026-12-03); the "
                   "DeepCache mode compiles its cheap step too; worth it for long clips or many requests. Ignored on "
                   "the CPU. Override: DIGITAL_HUMAN_LATENTSYNC_COMPILE=1 or 0.")

_announced: set[str] = set()


def switch(requested: bool | None, env: str) -> bool | None:
    """The fast path's state: the variable `env` when it is 1 or 0, else `requested` (None: not asked)."""
    value = os.environ.get(env, "").strip()
    if value in ("0", "1"):
        return value == "1"
    return requested


def announce(what: str, cost: str) -> None:
    """Log the first-use cost once per process, when the switch is on (the wait is then no surprise)."""
    if what not in _announced:
        _announced.add(what)
        log.info("[digital_human] %s", cost)
