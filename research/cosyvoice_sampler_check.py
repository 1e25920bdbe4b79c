"""CosyVoice 2's device sampler (lm.ras_sample_tensor) against the reference sampler (lm.ras_sample), at full size.

Fixed log-probabilities over the released vocabulary (6561 speech tokens + 3 stop tokens; seeded random
logits, scaled so that the top-25 / top-p 0.8 nucleus holds several tokens), two RAS windows: empty, and
the two most likely tokens just drawn (so the repetition rule replaces them by a full-distribution draw).
For each: --draws draws of the tensor sampler on --device (batched, uniforms from a device generator),
--ref-draws draws of the host reference sampler, the exact probabilities of the reference rule
(parity.ras_distribution); chi-square goodness of fit of both against the exact probabilities, the largest
frequency difference between the two samplers, and determinism (same generator seed twice on the device).

  python research/cosyvoice_sampler_check.py --device cuda --out benchmarks/results/cosyvoice_sampler_h200.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]
from _bootstrap import import_pack  # noqa: E402

VOCAB = 6561 + 3


def chi2(counts, expected_p) -> dict:
    """Goodness of fit; tokens expected fewer than 5 times pooled into one bin."""
    import numpy as np
    from scipy import stats

    expected = expected_p * counts.sum()
    big = expected >= 5
    f_obs = np.append(counts[big], counts[~big].sum())
    f_exp = np.append(expected[big], expected[~big].sum())
    keep = f_exp > 0
    f_obs, f_exp = f_obs[keep], f_exp[keep]
    test = stats.chisquare(f_obs, f_exp * f_obs.sum() / f_exp.sum())
    return {"statistic": float(test.statistic), "dof": int(f_obs.size - 1), "p_value": float(test.pvalue)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--draws", type=int, default=1_000_000)
    parser.add_argument("--ref-draws", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import_pack()
    import numpy as np
    import torch

    from digital_human.engines.cosyvoice.lm import SamplingConfig, ras_sample, ras_sample_tensor
    from digital_human.engines.cosyvoice.parity import ras_distribution

    cfg = SamplingConfig()
    dev = torch.device(args.device)
    logp = (4.0 * torch.randn(VOCAB, generator=torch.Generator().manual_seed(2025))).log_softmax(dim=0)
    order = logp.argsort(descending=True).tolist()
    report = {"benchmark": "cosyvoice_sampler_check", "device": args.device, "vocab": VOCAB, "sampling": vars(cfg),
              "draws": args.draws, "ref_draws": args.ref_draws, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None, "cases": {}}

    def device_draws(window: list[int], seed: int) -> np.ndarray:
        gen = torch.Generator(dev).manual_seed(seed)
        lp = logp.to(dev)
        win = torch.tensor(([-1] * cfg.win_size + window)[-cfg.win_size:], device=dev)
        out = []
        for start in range(0, args.draws, args.batch):
            n = min(args.batch, args.draws - start)
            u = torch.rand(n, 2, generator=gen, device=dev)
            out.append(ras_sample_tensor(lp.expand(n, -1), win.expand(n, -1), u, cfg))
        return torch.cat(out).cpu().numpy()

    for case, window in (("empty_window", []), ("top2_repeated", order[:2])):
        exact = ras_distribution(logp, window, cfg)
        start = time.perf_counter()
        draws = device_draws(window, seed=1)
        device_s = time.perf_counter() - start
        again = device_draws(window, seed=1)
        counts = np.bincount(draws, minlength=VOCAB)
        gen = torch.Generator().manual_seed(3)
        start = time.perf_counter()
        ref = np.bincount([ras_sample(logp.clone(), list(window), cfg, gen) for _ in range(args.ref_draws)],
                          minlength=VOCAB)
        ref_s = time.perf_counter() - start
        f_dev, f_ref = counts / counts.sum(), ref / ref.sum()
        report["cases"][case] = {
            "window": window, "nucleus_size": int(np.count_nonzero(exact)) if not window else None,
            "exact_top5": {int(t): float(exact[t]) for t in np.argsort(-exact)[:5]},
            "device_top5": {int(t): float(f_dev[t]) for t in np.argsort(-exact)[:5]},
            "reference_top5": {int(t): float(f_ref[t]) for t in np.argsort(-exact)[:5]},
            "device_vs_exact_chi2": chi2(counts, exact), "reference_vs_exact_chi2": chi2(ref, exact),
            "device_vs_exact_max_abs_freq_diff": float(np.abs(f_dev - exact).max()),
            "reference_vs_exact_max_abs_freq_diff": float(np.abs(f_ref - exact).max()),
            "device_vs_reference_max_abs_freq_diff": float(np.abs(f_dev - f_ref).max()),
            "device_draws_outside_support": int(counts[exact == 0].sum()),
            "same_seed_same_draws": bool(np.array_equal(draws, again)),
            "device_s": device_s, "reference_s": ref_s}
        print(case, json.dumps(report["cases"][case]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
