"""CosyVoice 2 speed: FP32 eager (the reference path) vs the fast path, one process, one machine.

Builds a random-weight release folder of the released architecture (`--size full`: Qwen2 0.5 B, 6561
speech tokens, 256-channel flow estimator, 512-channel HiFT; random_release.write_random_release) and
times CosyVoice2Runtime.speak on a fixed length of speech: random weights rarely draw a stop token, so
the LM is held to exactly --tokens speech tokens (250 = 10 s at 25 Hz) by min/max length. The prompt is
a 3 s synthetic signal through the runtime's own speaker_state (ONNX stand-ins for the front-end models).

Per setting (each in a fresh runtime, loaded once): one warm-up call (graph capture, cuDNN plans), then
--repeats timed calls: wall seconds, RTF = wall / audio seconds (median, min-max), seconds per stage
(LM, flow, HiFT; the device is synchronized at stage borders), torch.cuda.max_memory_allocated
(reset before each call; models included). Streaming: time from the call to the first audio piece of
speak_stream (25-token hops), median of --repeats after a warm-up. Parity of the fast path on the same
weights: sampled tokens vs eager (same seed), LM log-probabilities under teacher forcing, flow mel and HiFT
waveform on the same inputs. Per setting also: whether two calls with the same seed draw the same tokens, and for
the CUDA-graphed LM step where its time goes (lm_step_profile: replay time by CUDA events, kernel count and
kernel time by torch.profiler). "fast" draws its tokens on the GPU (other draws than eager for a seed);
"fast_host_sampler" keeps the host sampler (the eager path's tokens). The LM step is the fused one
(lm.StaticDecoder step="fused") unless the setting says otherwise: "fast_lm_reference_step" is the first
version of the step, "fast_lm_gemv_linear" the fused step with its mat-vecs through cuBLAS (F.linear),
"fast_run4" the fast path of run 4 (HiFT's source noise drawn inline, not during the flow); with it in the
settings, every setting's tokens and last waveform are compared with its (same seed).

  python benchmarks/gpu_cosyvoice.py --device cuda --out benchmarks/results/gpu_cosyvoice_h200.json
  nice -n 10 python benchmarks/gpu_cosyvoice.py --device cpu --tokens 50 --repeats 1 --settings eager_fp32 \
      --out benchmarks/results/cpu_cosyvoice.json
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import ROOT, import_pack  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "cosyvoice" / "reduced.npz"
TEXT = "The quick brown fox jumps over the lazy dog near the river bank."
PROMPT_TEXT = "This is the voice of the speaker."
SEED = 7


def release_yaml(size: str) -> tuple[str, dict]:
    """cosyvoice2.yaml text and Qwen2 config: the reduced fixture's (made by the reference tool from the
    released yaml), widened back to the release by undoing tools/cosyvoice_parity.py's reductions."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "tools"))
    from cosyvoice_parity import QWEN_FULL, REDUCTIONS

    meta = json.loads(str(np.load(FIXTURE, allow_pickle=False)["meta"][()]))
    text = meta["yaml"]
    if size == "reduced":
        return text, meta["qwen_config"]
    for full, reduced in REDUCTIONS:
        text, n = re.subn(re.escape(reduced), full.replace("\\", ""), text)
        if n != 1:
            raise SystemExit(f"undoing reduction '{reduced}' matched {n} times")
    return text, QWEN_FULL


def pct(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_setting(name: str, folder: Path, device: str, args, state: dict, text_ids: list[int],
                waves: dict | None = None) -> tuple[dict, list]:
    import torch

    from digital_human.engines.cosyvoice.engine import CosyVoice2Runtime, FastPath

    fast = {"eager_fp32": None, "eager_fp32_offload": None, "fast": FastPath(),
            "fast_host_sampler": FastPath(lm_device_sampling=False),
            "fast_nocompile": FastPath(lm_compile=False), "fast_lm_bf16": FastPath(lm_bf16=True),
            "fast_lm_bf16_host_sampler": FastPath(lm_bf16=True, lm_device_sampling=False),
            "fast_hift_fp16": FastPath(hift_half=True),
            "fast_lm_reference_step": FastPath(lm_step="reference"),
            "fast_lm_gemv_reduce": FastPath(lm_gemv="reduce"),
            "fast_lm_gemv_linear": FastPath(lm_gemv="linear"),
            "fast_run4": FastPath(hift_prefetch=False)}[name]
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    t0 = time.perf_counter()
    rt = CosyVoice2Runtime(folder, device, fast=fast, offload=name.endswith("offload"))
    sync(torch, dev)
    load_s = time.perf_counter() - t0
    limits = {"min_tokens": args.tokens, "max_tokens": args.tokens}
    rows, tokens_seen = [], None
    for i in range(args.repeats + 1):  # the first is the warm-up
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        timings: dict[str, float] = {}
        gen = torch.Generator().manual_seed(SEED)
        sync(torch, dev)
        start = time.perf_counter()
        wave, n = rt.speak(text_ids, state, gen, timings=timings, **limits)
        wall = time.perf_counter() - start
        audio_s = wave.size / 24000
        row = {"wall_s": wall, "audio_s": audio_s, "rtf": wall / audio_s, "tokens": n, **timings}
        if cuda:
            row["peak_gpu_mib"] = torch.cuda.max_memory_allocated(dev) / 2 ** 20
        rows.append(row)
        if waves is not None:
            waves[name] = wave  # the last call's waveform (same seed every call): compared between settings
        print(f"  {name} {'warm-up' if i == 0 else 'run'}: {json.dumps({k: round(v, 4) for k, v in row.items()})}",
              flush=True)
    # the tokens of two seeded calls (the token comparison between settings; determinism)
    x = rt._inputs(text_ids, state)
    seqs = []
    for _ in range(2):
        gen = torch.Generator().manual_seed(SEED)
        with torch.inference_mode(), rt._stage("lm_s", rt.models.lm, None):
            seqs.append(list(rt._tokens(x, gen, **limits)))
    tokens_seen = seqs[0]
    timed = rows[1:]
    result = {"setting": name, "load_s": load_s, "warmup": rows[0], "runs": timed,
              "rtf": pct([r["rtf"] for r in timed]), "wall_s": pct([r["wall_s"] for r in timed]),
              "audio_s": timed[0]["audio_s"], "tokens": timed[0]["tokens"],
              "same_seed_same_tokens": seqs[0] == seqs[1],
              "lm_ms_per_token": 1000 * statistics.median(r["lm_s"] for r in timed) / timed[0]["tokens"]}
    if fast is not None:
        dec = rt._decoder
        result["lm_device_sampling"] = fast.lm_device_sampling
        result["lm_step"], result["lm_gemv"] = fast.lm_step, fast.lm_gemv
        result["sampler_compiled"] = bool(dec is not None and dec.draw_compiled)
    for stage in ("lm_s", "flow_s", "hift_s"):
        result[stage] = pct([r[stage] for r in timed])
    if cuda:
        result["peak_gpu_mib"] = max(r["peak_gpu_mib"] for r in timed)
    if not rt.offload and args.stream:
        ttfa = []
        for i in range(args.repeats + 1):
            gen = torch.Generator().manual_seed(SEED)
            sync(torch, dev)
            start = time.perf_counter()
            pieces = rt.speak_stream(text_ids, state, gen, **limits)
            first = next(pieces)
            ttfa.append(time.perf_counter() - start)
            pieces.close()  # only the first piece is timed here
        result["ttfa_s"] = pct(ttfa[1:])
        result["ttfa_warmup_s"] = ttfa[0]
        result["first_piece_s"] = first.size / 24000
        print(f"  {name} time to first audio: {result['ttfa_s']}", flush=True)
    if fast is not None and cuda and not rt.offload:
        try:
            result["lm_step_profile"] = lm_step_profile(rt, text_ids, state)
            print(f"  {name} LM step: {json.dumps(result['lm_step_profile'])[:600]}", flush=True)
        except Exception as exc:  # noqa: BLE001 - the profile is extra: keep the setting's numbers
            result["lm_step_profile"] = {"error": repr(exc)}
    if name == "fast":
        result["parity"] = parity(rt, text_ids, state, limits)
    del rt
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result, tokens_seen


def lm_step_profile(rt, text_ids: list[int], state: dict, steps: int = 200, profiled: int = 20) -> dict:
    """Where an LM step's time goes: the captured step replayed back to back (CUDA events: the GPU's time
    per step, its in-graph gaps included), and torch.profiler's kernel records of `profiled` replays: kernels
    per step, the sum of their durations (the rest of the step's time is gaps between kernels) and the
    largest kernels by name."""
    import torch
    from collections import defaultdict

    dec = rt._lm_decoder()
    if dec is None or dec.graph is None:
        return {}
    lm = rt.models.lm
    x = rt._inputs(text_ids, state)
    with torch.inference_mode():
        emb = lm.prompt_embeddings(x["text"], x["prompt_text"], x["lm_prompt"])
        if dec.sampling is not None:
            dec.begin(emb, torch.Generator().manual_seed(SEED), 0)
        else:
            dec.prefill(emb)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        for _ in range(steps):
            dec.graph.replay()
        end.record()
        launch_s = time.perf_counter() - t0
        end.synchronize()
        out = {"replay_ms_per_step": start.elapsed_time(end) / steps, "host_launch_ms_per_step": 1000 * launch_s / steps,
               "sampler_in_graph": dec.sampling is not None}
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(profiled):
                dec.graph.replay()
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    out["profiled_kernels_per_step"] = len(kernels) / profiled
    if kernels:
        busy = sum(e.time_range.end - e.time_range.start for e in kernels)
        span = max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)
        out["kernel_ms_per_step"] = busy / 1000 / profiled
        out["span_ms_per_step"] = span / 1000 / profiled
        by_name: dict[str, float] = defaultdict(float)
        for e in kernels:
            by_name[e.name[:90]] += (e.time_range.end - e.time_range.start) / 1000 / profiled
        out["top_kernels_ms_per_step"] = dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:10])
    return out


def parity(rt, text_ids: list[int], state: dict, limits: dict) -> dict:
    """The fast path's networks against the reference modules held by the same runtime, same inputs."""
    import numpy as np
    import torch

    x = rt._inputs(text_ids, state)
    out = {}
    with torch.inference_mode():
        lm = rt.models.lm
        gen = torch.Generator().manual_seed(SEED)
        tokens = list(lm.generate(x["text"], x["prompt_text"], x["lm_prompt"], generator=gen, **limits))  # eager
        ref = lm.logits_trace(x["text"], x["prompt_text"], x["lm_prompt"], tokens[:-1])
        dec = rt._lm_decoder()
        emb = lm.prompt_embeddings(x["text"], x["prompt_text"], x["lm_prompt"])
        rows = [dec.prefill(emb)] + [dec.step(t) for t in tokens[:-1]]
        out["lm_logp_max_abs"] = float((torch.stack(rows) - ref.float()).abs().max())
        token = torch.as_tensor(tokens, dtype=torch.int32, device=rt.device)[None]
        flow = rt.models.flow
        mel_ref = flow.inference(token, x["prompt_token"], x["prompt_feat"], x["embedding"])
        mel_fast = flow.inference(token, x["prompt_token"], x["prompt_feat"], x["embedding"], solver=rt._flow_solver())
        out["flow_mel_max_abs"] = float((mel_ref - mel_fast).abs().max())
        out["flow_mel_ref_absmax"] = float(mel_ref.abs().max())
        out["flow_mel_mean_abs"] = float((mel_ref - mel_fast).abs().mean())
        rt.models.hift.to(rt.device)  # the reference (weight-normed, FP32) HiFT; the fast path uses a folded copy
        w_ref = rt.models.hift.inference(mel_ref, generator=torch.Generator().manual_seed(1))
        w_fast = rt._wave(mel_ref, torch.Generator().manual_seed(1))
        err = (w_ref - w_fast).float()
        out["hift_wave_max_abs"] = float(err.abs().max())
        out["hift_wave_snr_db"] = float(10 * np.log10(float((w_ref.float() ** 2).mean()) / max(float((err ** 2).mean()), 1e-30)))
        w_fast_all = rt._wave(mel_fast, torch.Generator().manual_seed(1))
        err = (w_ref - w_fast_all).float()
        out["flow_hift_wave_snr_db"] = float(10 * np.log10(float((w_ref.float() ** 2).mean()) / max(float((err ** 2).mean()), 1e-30)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=("full", "reduced"), default="full")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=250, help="speech tokens per call (25 per second)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settings", default="eager_fp32,fast,fast_host_sampler,fast_lm_reference_step,"
                        "fast_lm_gemv_reduce,fast_lm_bf16,fast_nocompile,eager_fp32_offload")
    parser.add_argument("--no-stream", dest="stream", action="store_false")
    parser.add_argument("--folder", default="/tmp/cv-bench-release")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import_pack()
    import numpy as np
    import torch
    import transformers

    from digital_human.engines.cosyvoice.engine import CosyVoice2Runtime
    from digital_human.engines.cosyvoice.random_release import write_random_release

    folder = Path(args.folder) / args.size
    start = time.perf_counter()
    if not (folder / "hift.pt").is_file():
        yaml_text, qwen = release_yaml(args.size)
        write_random_release(folder, yaml_text, qwen, seed=1234)
    build_s = time.perf_counter() - start
    print(f"release ({args.size}) ready in {build_s:.1f} s", flush=True)
    t = np.arange(3 * 24000) / 24000
    voice = (0.3 * np.sin(2 * np.pi * 140 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
             + 0.02 * np.random.default_rng(0).standard_normal(t.size)).astype(np.float32)
    # the speaker state and text ids need the tokenizer and ONNX front end only: a CPU runtime of the folder
    front = CosyVoice2Runtime(folder, "cpu")
    state = front.speaker_state(voice, 24000, PROMPT_TEXT)
    text_ids = front.text_ids(TEXT)
    del front
    gc.collect()
    report = {"benchmark": "gpu_cosyvoice", "size": args.size, "device": args.device, "tokens": args.tokens,
              "repeats": args.repeats, "text_tokens": len(text_ids), "prompt_tokens": int(state["prompt_token"].size),
              "release_build_s": build_s, "torch": torch.__version__, "transformers": transformers.__version__,
              "python": platform.python_version(), "cpu_threads": torch.get_num_threads(),
              "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,  # FP32 convolutions use TF32 when True
              "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
              "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
              "settings": {}}
    tokens, waves = {}, {}
    for name in args.settings.split(","):
        try:
            report["settings"][name], tokens[name] = run_setting(name, folder, args.device, args, state, text_ids,
                                                                 waves)
        except Exception as exc:  # noqa: BLE001 - one broken setting must not lose the others' numbers
            import traceback

            traceback.print_exc()
            report.setdefault("failed_settings", {})[name] = repr(exc)
            gc.collect()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))  # after each setting: a later failure keeps these
    if "eager_fp32" in tokens:
        ref = tokens["eager_fp32"]
        for name, seq in tokens.items():
            diff = [i for i, (a, b) in enumerate(zip(ref, seq)) if a != b]
            report["settings"][name]["tokens_differing_from_eager"] = len(diff) + abs(len(ref) - len(seq))
            report["settings"][name]["first_differing_token"] = diff[0] if diff else None
    if "fast_run4" in tokens:  # the run-4 fast path (HiFT draws inline): same seed, same tokens and waveform?
        ref, ref_wave = tokens["fast_run4"], waves.get("fast_run4")
        for name, seq in tokens.items():
            r = report["settings"][name]
            r["same_tokens_as_fast_run4"] = seq == ref
            if ref_wave is not None and name in waves and waves[name].shape == ref_wave.shape:
                r["wave_max_abs_vs_fast_run4"] = float(np.abs(waves[name] - ref_wave).max())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"| setting | RTF median (min-max) | wall s | LM s | flow s | HiFT s | TTFA ms | peak GPU MiB | tokens != eager |")
    for name, r in report["settings"].items():
        if "rtf" not in r:
            continue
        ttfa = f"{1000 * r['ttfa_s']['median']:.0f}" if "ttfa_s" in r else "-"
        print(f"| {name} | {r['rtf']['median']:.4f} ({r['rtf']['min']:.4f}-{r['rtf']['max']:.4f}) | "
              f"{r['wall_s']['median']:.3f} | {r['lm_s']['median']:.3f} | {r['flow_s']['median']:.3f} | "
              f"{r['hift_s']['median']:.3f} | {ttfa} | {r.get('peak_gpu_mib', 0):.0f} | "
              f"{r.get('tokens_differing_from_eager', '-')} |")
    if "fast" in report["settings"] and "parity" in report["settings"]["fast"]:
        print(json.dumps(report["settings"]["fast"]["parity"]))


if __name__ == "__main__":
    main()
