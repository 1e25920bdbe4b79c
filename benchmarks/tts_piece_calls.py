"""Torch calls from Python per CosyVoice 2 live-piece stage, eager (full-size architecture, random weights, CPU).

On a GPU each call is a launch (views excepted) that gives up the interpreter lock and must win it back, which under
8 live sessions' threads can wait; a stage replayed from a CUDA graph is one call. This counts, with a
TorchFunctionMode, what each stage would launch eagerly: the flow's 10-step solve (plain and with q/k/v fused,
engines/cosyvoice/flow_kernels.py), the token encoder (engines/cosyvoice/flow_encoder.py replays it), and HiFT on a
piece (engines/cosyvoice/hift_graph.py replays it). Counts, not times: they do not depend on the machine.

  python benchmarks/tts_piece_calls.py --out benchmarks/results/tts_piece_calls_cpu.json
"""
from __future__ import annotations

import argparse
import copy
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402

import_pack()


def count_calls(fn) -> int:
    """Torch functions and tensor methods called from Python while fn() runs."""
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.calls


def main() -> None:
    import torch

    from digital_human.engines.cosyvoice.flow import CausalFlow, FlowConfig, solve_ode
    from digital_human.engines.cosyvoice.flow_kernels import fuse_projections
    from digital_human.engines.cosyvoice.hift import HiFT, HiFTConfig, without_weight_norm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--frames", default="64,448", help="flow solve lengths")
    parser.add_argument("--tokens", default="86,300", help="encoder token counts (prompt + speech so far)")
    parser.add_argument("--hift-frames", default="16,72,108", help="HiFT piece lengths")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    flow = CausalFlow(FlowConfig()).eval()
    hift = without_weight_norm(HiFT(HiFTConfig()).eval())
    fused = copy.deepcopy(flow.decoder.estimator)
    fuse_projections(fused)
    commit = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[1]), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    report: dict = {"benchmark": "tts_piece_calls", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "commit": commit, "torch": torch.__version__, "python": platform.python_version(),
                    "flow_solve": {}, "encoder": {}, "hift": {}}
    with torch.inference_mode():
        for frames in (int(v) for v in args.frames.split(",")):
            inputs = [torch.randn(1, 80, frames), torch.randn(1, 80, frames), torch.ones(1, 1, frames),
                      torch.randn(1, 80), torch.randn(1, 80, frames)]
            x, mu, mask, spks, cond = inputs
            report["flow_solve"][str(frames)] = {
                name: count_calls(lambda est=est: solve_ode(est, x, mu, mask, spks, cond, 10, 0.7))
                for name, est in (("plain", flow.decoder.estimator), ("fused", fused))}
        for tokens in (int(v) for v in args.tokens.split(",")):
            ids = torch.randint(0, flow.cfg.vocab_size, (1, tokens))
            report["encoder"][str(tokens)] = count_calls(lambda: flow.encode(ids))
        for frames in (int(v) for v in args.hift_frames.split(",")):
            mel = torch.randn(1, 80, frames) - 4
            report["hift"][str(frames)] = count_calls(
                lambda: hift.inference(mel, generator=torch.Generator().manual_seed(0)))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
