"""CosyVoice 2 LM decode step: the fused step against the reference step, on one device, same weights.

Loads the LM of a random-weight release (the folder benchmarks/gpu_cosyvoice.py writes; built here if
missing) and compares lm.StaticDecoder(step="reference") with step="fused" (gemv "linear" and "reduce"),
all compiled and, on a GPU, captured as CUDA graphs:

- teacher-forced log-probabilities over the tokens the eager path draws (max |diff| against the reference
  step and against transformers' eager decode);
- host-sampler tokens for the same seed (eager, reference step, fused step): must be identical;
- replay time per step (CUDA events) and kernels per step (torch.profiler);
- parts, one layer's worth x 24 in one CUDA graph: attention over the cache at several filled lengths
  (what length buckets could save) written as reductions, as a grouped matmul, and as SDPA with
  enable_gqa; and the weight mat-vecs of each shape as F.linear (cuBLAS), as an inductor reduction, and
  against a transposed copy of the weight.

  python research/cosyvoice_step_check.py --out benchmarks/results/cosyvoice_step_check_h200.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "benchmarks")]
from _bootstrap import import_pack  # noqa: E402

SEED = 7


def graph_time(torch, fn: Callable[[], object], repeats: int = 50) -> float:
    """Milliseconds per call of fn replayed from one CUDA graph (warm-up on a side stream first)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def parts(torch, F, layers: int = 24, device: str = "cuda") -> dict:
    """Attention and mat-vec variants, each `layers` times in one graph (a step's worth)."""
    out: dict = {"attention_ms_per_step": {}, "gemv_ms_per_call": {}}
    dev = torch.device(device)
    kv, group, d = 2, 7, 64
    for length in (256, 512, 1024, 2560):
        q = torch.randn(1, kv * group, 1, d, device=dev)
        keys = torch.randn(1, kv, length, d, device=dev)
        values = torch.randn(1, kv, length, d, device=dev)
        pos = torch.tensor([length // 2], device=dev)
        positions = torch.arange(length, device=dev)

        def reduce_attn(q=q, keys=keys, values=values, pos=pos, positions=positions):
            qg = q.reshape(kv, group, 1, d)
            s = (qg * keys[0][:, None]).sum(-1) * 0.125
            s = torch.where(positions <= pos, s, -float("inf")).softmax(-1)
            return (s[..., None] * values[0][:, None]).sum(-2)

        def matmul_attn(q=q, keys=keys, values=values, pos=pos, positions=positions):
            qg = q.reshape(kv, group, d)
            s = torch.matmul(qg, keys[0].transpose(1, 2)) * 0.125
            s = torch.where(positions <= pos, s, -float("inf")).softmax(-1)
            return torch.matmul(s, values[0])

        def sdpa_attn(q=q, keys=keys, values=values, pos=pos, positions=positions):
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=(positions <= pos).view(1, 1, 1, -1),
                                                  scale=0.125, enable_gqa=True)

        ref = sdpa_attn().reshape(kv, group, d)
        for name, fn, comp in (("reduce", reduce_attn, True), ("matmul", matmul_attn, True),
                               ("sdpa_gqa_eager", sdpa_attn, False)):
            try:
                f = torch.compile(fn, dynamic=False) if comp else fn
                diff = float((f().reshape(kv, group, d) - ref).abs().max())
                ms = graph_time(torch, lambda f=f: [f() for _ in range(layers)])
                out["attention_ms_per_step"][f"{name}_L{length}"] = {"ms": ms, "max_abs_vs_sdpa": diff}
            except Exception as exc:  # noqa: BLE001 - one variant failing must not lose the others
                out["attention_ms_per_step"][f"{name}_L{length}"] = {"error": repr(exc)[:300]}
    for n, k in ((1152, 896), (896, 896), (9728, 896), (896, 4864), (6564, 896)):
        w = torch.randn(n, k, device=dev) * 0.02
        wt = w.t().contiguous()
        x = torch.randn(1, 1, k, device=dev)
        red = torch.compile(lambda x, w: (x.reshape(1, -1) * w).sum(-1), dynamic=False)
        ref = F.linear(x, w).reshape(-1)
        row = {"mbytes": w.numel() * 4 / 1e6}
        for name, fn in (("linear", lambda: F.linear(x, w)), ("reduce", lambda: red(x, w)),
                         ("x_at_wT_contig", lambda: torch.matmul(x, wt))):
            try:
                diff = float((fn().reshape(-1) - ref).abs().max())
                ms = graph_time(torch, lambda fn=fn: [fn() for _ in range(layers)]) / layers
                row[name] = {"ms": ms, "gb_per_s": w.numel() * 4 / ms / 1e6, "max_abs_vs_linear": diff}
            except Exception as exc:  # noqa: BLE001
                row[name] = {"error": repr(exc)[:300]}
        out["gemv_ms_per_call"][f"{n}x{k}"] = row
    return out


def profile_step(torch, dec, steps: int = 200, profiled: int = 20) -> dict:
    """Replay time by CUDA events; kernels per step and the largest ones by torch.profiler."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        dec.graph.replay()
    end.record()
    end.synchronize()
    out = {"replay_ms_per_step": start.elapsed_time(end) / steps}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(profiled):
            dec.graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    out["kernels_per_step"] = len(kernels) / profiled
    out["kernel_ms_per_step"] = sum(e.time_range.end - e.time_range.start for e in kernels) / 1000 / profiled
    by_name: dict[str, float] = defaultdict(float)
    for e in kernels:
        by_name[e.name[:90]] += (e.time_range.end - e.time_range.start) / 1000 / profiled
    out["top_kernels_ms_per_step"] = dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:14])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", default="/tmp/cv-bench-release/full")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=250)
    parser.add_argument("--variants", default="reference,fused_linear,fused_reduce")
    parser.add_argument("--no-parts", dest="parts", action="store_false")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import_pack()
    import torch
    import torch.nn.functional as F

    from digital_human.engines.cosyvoice.lm import StaticDecoder
    from digital_human.engines.cosyvoice.release import load_models

    torch.backends.cuda.matmul.allow_tf32 = False  # FP32 GEMVs stay FP32 (torch's default; set to be sure)
    folder = Path(args.folder)
    if not (folder / "llm.pt").is_file():
        from gpu_cosyvoice import release_yaml

        from digital_human.engines.cosyvoice.random_release import write_random_release

        yaml_text, qwen = release_yaml("full")
        write_random_release(folder, yaml_text, qwen, seed=1234)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    lm = load_models(folder).lm.to(dev)
    report: dict = {"torch": torch.__version__, "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                    "float32_matmul_precision": torch.get_float32_matmul_precision(), "tokens": args.tokens,
                    "gpu": torch.cuda.get_device_name(0) if cuda else None, "steps": {}}
    g = torch.Generator().manual_seed(0)
    vocab = lm.llm.model.model.embed_tokens.num_embeddings
    text = torch.randint(0, min(5000, vocab), (1, 64), generator=g)
    prompt_text = torch.randint(0, min(5000, vocab), (1, 8), generator=g)
    prompt_speech = torch.randint(0, lm.speech_token_size, (1, 75), generator=g)
    lm_args = (text.to(dev), prompt_text.to(dev), prompt_speech.to(dev))
    limits = {"min_tokens": args.tokens, "max_tokens": args.tokens}
    with torch.inference_mode():
        t0 = time.perf_counter()
        eager = list(lm.generate(*lm_args, generator=torch.Generator().manual_seed(SEED), **limits))
        report["eager_generate_s"] = time.perf_counter() - t0
        emb = lm.prompt_embeddings(*lm_args)
        trace = lm.logits_trace(*lm_args, eager[:-1]).float()
        rows_by: dict[str, torch.Tensor] = {}
        variants = {"reference": {"step": "reference"}, "fused_linear": {"step": "fused", "gemv": "linear"},
                    "fused_reduce": {"step": "fused", "gemv": "reduce"}}
        for name in args.variants.split(","):
            kw = variants[name]
            entry: dict = {}
            try:
                t0 = time.perf_counter()
                dec = StaticDecoder(lm, 2560, compile=True, **kw)
                entry["build_s"] = time.perf_counter() - t0
                rows = torch.stack([dec.prefill(emb)] + [dec.step(t) for t in eager[:-1]])
                rows_by[name] = rows
                entry["logp_max_abs_vs_eager"] = float((rows - trace).abs().max())
                if "reference" in rows_by:
                    entry["logp_max_abs_vs_reference_step"] = float((rows - rows_by["reference"]).abs().max())
                toks = list(lm.generate(*lm_args, generator=torch.Generator().manual_seed(SEED), decoder=dec, **limits))
                entry["host_sampler_tokens_equal_eager"] = toks == eager
                entry["tokens_differing_from_eager"] = sum(a != b for a, b in zip(toks, eager)) + abs(len(toks) - len(eager))
                if cuda and dec.graph is not None:
                    entry["profile"] = profile_step(torch, dec)
                del dec
            except Exception as exc:  # noqa: BLE001 - report and go on with the other variants
                traceback.print_exc()
                entry["error"] = repr(exc)[:500]
            report["steps"][name] = entry
            print(name, json.dumps(entry)[:1500], flush=True)
            Path(args.out).write_text(json.dumps(report, indent=1))
    if cuda and args.parts:
        try:
            report["parts"] = parts(torch, F)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            report["parts"] = {"error": repr(exc)[:500]}
        print(json.dumps(report["parts"]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
