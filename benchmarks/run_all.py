"""One entry point for the measurements: runs every benchmark that fits the machine it is on.

CPU machine: voice cloning quality + TTS speed, face chain, whole chain (text to MP4; it saves the fitted
voice as <out>/speaker.npz for the GPU run).
GPU machine (torch with CUDA): TTS (needs `gpu_tts.py --make-tokens` output made on a CPU machine),
the small models, the clone generator (needs `eval_talking_head.py --prepare` output) and the whole chain
(needs <out>/speaker.npz from the CPU run, since fitting a voice needs librosa; see gpu_setup.py for
what a bare GPU machine needs carried over).
Each script writes its JSON under --out; RESULTS.md is written by hand from those, with the machine named.

  python benchmarks/run_all.py [--out benchmarks/out] [--quick]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def plan(out: Path, quick: bool, cuda: bool) -> list[list[str]]:
    py = [sys.executable]
    if cuda:
        steps = [py + [str(HERE / "gpu_models.py"), "--out", str(out / "gpu_models.json")]]
        tokens = out / "tts_tokens.json"
        if tokens.exists():
            steps.append(py + [str(HERE / "gpu_tts.py"), "--tokens", str(tokens), "--out", str(out)])
        pack = out / "th_pack.npz"
        if pack.exists():
            steps.append(py + [str(HERE / "gpu_talking_head.py"), "--pack", str(pack), "--out", str(out),
                               "--budget", "60" if quick else "300"])
        speaker = out / "speaker.npz"
        if speaker.exists():
            steps.append(py + [str(HERE / "chain.py"), "--speaker", str(speaker), "--models", "portrait", "clone",
                               "--json", str(out / "chain_gpu.json")] + (["--lengths", "10s"] if quick else []))
        return steps
    return [
        py + [str(HERE / "voice_clone.py"), "--json", str(out / "voice_clone.json")] + (["--quick"] if quick else []),
        py + [str(HERE / "face_chain.py"), "--json", str(out / "face_chain.json")],
        py + [str(HERE / "chain.py"), "--speaker", str(out / "speaker.npz"), "--json", str(out / "chain.json")]
        + (["--lengths", "10s"] if quick else []),
        py + [str(HERE / "gpu_tts.py"), "--make-tokens", str(out / "tts_tokens.json")],
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "out")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for cmd in plan(args.out, args.quick, cuda):
        print("$", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            failed.append(Path(cmd[1]).name)
    print("failed: " + ", ".join(failed) if failed else "all benchmarks finished", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
