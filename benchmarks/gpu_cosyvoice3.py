"""CosyVoice 3 speed: FP32 eager (the reference path) vs the fast path, one process, one machine.

Builds a random-weight folder of the released architecture (`--size full`: Qwen2 0.5 B with the 6761-row
speech table, 22-block 1024-wide DiT flow, 512-channel causal HiFT; random_release3.write_random_release3;
the cosyvoice3.yaml is the reduced fixture's, made by the reference tool from the reference's yaml, widened
back) and times CosyVoice3Runtime.speak on a fixed length of speech: the LM is held to exactly --tokens
tokens (250 = 10 s at 25 Hz) by min/max length (every stop token masked). The prompt is a 3 s synthetic
signal through the runtime's own speaker_state (ONNX stand-ins for the front-end models), zero-shot mode.

Per setting (fresh runtime each): one warm-up call (compile, graph capture), then --repeats timed calls:
RTF = wall / audio seconds, seconds per stage (device synchronized at stage borders), peak GPU memory;
streaming: time from the call to the first audio piece of speak_stream (25-token hops) after a warm-up.
The fast path's parity on the same weights: LM log-probabilities under teacher forcing (static-cache step
vs transformers), flow mel (FP16 graphed vs FP32), vocoder waveform (folded weight norm vs weight-normed).

  python benchmarks/gpu_cosyvoice3.py --device cuda --out benchmarks/results/gpu_cosyvoice3_h200.json
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import ROOT, import_pack  # noqa: E402
from gpu_cosyvoice import pct, sync  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "cosyvoice" / "reduced_v3.npz"
TEXT = "The quick brown fox jumps over the lazy dog near the river bank."
PROMPT_TEXT = "This is the voice of the speaker."
SEED = 7


def release_yaml(size: str) -> tuple[str, dict]:
    import numpy as np

    sys.path.insert(0, str(ROOT / "tools"))
    from cosyvoice3_parity import QWEN_FULL, REDUCTIONS

    meta = json.loads(str(np.load(FIXTURE, allow_pickle=False)["meta"][()]))
    text = meta["yaml"]
    if size == "reduced":
        return text, meta["qwen_config"]
    for full, reduced in REDUCTIONS:
        text, n = re.subn(rf"(?<![\w_]){re.escape(reduced)}", full.replace("\\", ""), text)
        if n != 1:
            raise SystemExit(f"undoing reduction '{reduced}' matched {n} times")
    return text, QWEN_FULL


def run_setting(name: str, folder: Path, device: str, args, state: dict, text_ids: list[int]) -> dict:
    import numpy as np
    import torch

    from digital_human.engines.cosyvoice.engine import FastPath
    from digital_human.engines.cosyvoice.engine3 import CosyVoice3Runtime

    fast = {"eager_fp32": None, "fast": FastPath(), "fast_host_sampler": FastPath(lm_device_sampling=False)}[name]
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    t0 = time.perf_counter()
    rt = CosyVoice3Runtime(folder, device, fast=fast)
    sync(torch, dev)
    load_s = time.perf_counter() - t0
    limits = {"min_tokens": args.tokens, "max_tokens": args.tokens}
    rows = []
    for i in range(args.repeats + 1):
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        timings: dict[str, float] = {}
        sync(torch, dev)
        start = time.perf_counter()
        wave, n = rt.speak(text_ids, state, torch.Generator().manual_seed(SEED), timings=timings, **limits)
        wall = time.perf_counter() - start
        row = {"wall_s": wall, "audio_s": wave.size / 24000, "rtf": wall / (wave.size / 24000), "tokens": n, **timings}
        if cuda:
            row["peak_gpu_mib"] = torch.cuda.max_memory_allocated(dev) / 2 ** 20
        rows.append(row)
        print(f"  {name} {'warm-up' if i == 0 else 'run'}: {json.dumps({k: round(v, 4) for k, v in row.items()})}",
              flush=True)
    timed = rows[1:]
    result = {"setting": name, "load_s": load_s, "warmup": rows[0], "runs": timed,
              "rtf": pct([r["rtf"] for r in timed]), "wall_s": pct([r["wall_s"] for r in timed]),
              "audio_s": timed[0]["audio_s"], "tokens": timed[0]["tokens"],
              "lm_ms_per_token": 1000 * min(r["lm_s"] for r in timed) / timed[0]["tokens"]}
    for stage in ("lm_s", "flow_s", "hift_s"):
        result[stage] = pct([r[stage] for r in timed])
    if cuda:
        result["peak_gpu_mib"] = max(r["peak_gpu_mib"] for r in timed)
    if args.stream:
        ttfa = []
        for _ in range(args.repeats + 1):
            sync(torch, dev)
            start = time.perf_counter()
            pieces = rt.speak_stream(text_ids, state, torch.Generator().manual_seed(SEED), **limits)
            first = next(pieces)
            ttfa.append(time.perf_counter() - start)
            pieces.close()
        result["ttfa_s"] = pct(ttfa[1:])
        result["ttfa_warmup_s"] = ttfa[0]
        result["first_piece_s"] = first.size / 24000
        print(f"  {name} time to first audio: {result['ttfa_s']}", flush=True)
    # same seed, same audio (a second seeded call)
    again, _ = rt.speak(text_ids, state, torch.Generator().manual_seed(SEED), **limits)
    result["same_seed_same_audio"] = bool(np.array_equal(again, wave))
    if fast is not None:
        result["parity"] = parity(rt, text_ids, state, limits)
        print(f"  {name} parity: {json.dumps(result['parity'])}", flush=True)
    del rt
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


def parity(rt, text_ids: list[int], state: dict, limits: dict) -> dict:
    import numpy as np
    import torch

    x = rt._inputs(text_ids, state)
    out = {}
    with torch.inference_mode():
        lm = rt.models.lm
        tokens = list(lm.generate(x["text"], x["prompt_text"], x["lm_prompt"],
                                  generator=torch.Generator().manual_seed(SEED), **limits))
        ref = lm.logits_trace(x["text"], x["prompt_text"], x["lm_prompt"], tokens[:-1])
        dec = rt._lm_decoder()
        emb = lm.prompt_embeddings(x["text"], x["prompt_text"], x["lm_prompt"])
        rows = [dec.prefill(emb)] + [dec.step(t) for t in tokens[:-1]]
        out["lm_logp_max_abs"] = float((torch.stack(rows) - ref.float()).abs().max())
        out["lm_greedy_same"] = bool(torch.equal(torch.stack(rows)[:, :lm.speech_token_size].argmax(-1),
                                                 ref[:, :lm.speech_token_size].argmax(-1)))
        token = torch.as_tensor(tokens, dtype=torch.int32, device=rt.device)[None]
        flow = rt.models.flow
        mel_ref = flow.inference(token, x["prompt_token"], x["prompt_feat"], x["embedding"])
        mel_fast = flow.inference(token, x["prompt_token"], x["prompt_feat"], x["embedding"], solver=rt._flow_solver())
        out["flow_mel_max_abs"] = float((mel_ref - mel_fast).abs().max())
        out["flow_mel_rel"] = out["flow_mel_max_abs"] / float(mel_ref.abs().max())
        rt.models.hift.to(rt.device)
        w_ref = rt.models.hift.inference(mel_ref)
        w_fast = rt._wave(mel_ref)
        out["hift_wave_max_abs"] = float((w_ref - w_fast).abs().max())
        out["hift_wave_rel"] = out["hift_wave_max_abs"] / float(w_ref.abs().max())
        err = (w_ref - rt._wave(mel_fast)).float()
        out["flow_hift_wave_snr_db"] = float(10 * np.log10(float((w_ref.float() ** 2).mean())
                                                           / max(float((err ** 2).mean()), 1e-30)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=("full", "reduced"), default="full")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=250)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--settings", default="eager_fp32,fast")
    parser.add_argument("--no-stream", dest="stream", action="store_false")
    parser.add_argument("--folder", default="/tmp/cv3-bench-release")
    parser.add_argument("--out", required=True)
    parser.add_argument("--state", default="", help="speaker state + text ids (.npz from --save-state)")
    parser.add_argument("--save-state", default="", help="write the speaker state + text ids and stop")
    args = parser.parse_args()
    import_pack()
    import numpy as np
    import torch
    import transformers

    from digital_human.engines.cosyvoice.engine3 import CosyVoice3Runtime
    from digital_human.engines.cosyvoice.random_release3 import write_random_release3

    folder = Path(args.folder) / args.size
    start = time.perf_counter()
    if not (folder / "hift.pt").is_file():
        yaml_text, qwen = release_yaml(args.size)
        write_random_release3(folder, yaml_text, qwen, seed=1234)
    build_s = time.perf_counter() - start
    print(f"release ({args.size}) ready in {build_s:.1f} s", flush=True)
    t = np.arange(3 * 24000) / 24000
    voice = (0.3 * np.sin(2 * np.pi * 140 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
             + 0.02 * np.random.default_rng(0).standard_normal(t.size)).astype(np.float32)
    if args.state:  # made beforehand (--save-state) where librosa is installed (the GPU machine has none)
        saved = dict(np.load(args.state))
        text_ids = saved.pop("text_ids").tolist()
        state = saved
    else:
        front = CosyVoice3Runtime(folder, "cpu")
        state = front.speaker_state(voice, 24000, PROMPT_TEXT)
        text_ids = front.text_ids(TEXT)
        del front
    if args.save_state:
        np.savez(args.save_state, text_ids=np.array(text_ids, np.int32), **state)
        return
    gc.collect()
    report = {"benchmark": "gpu_cosyvoice3", "size": args.size, "device": args.device, "tokens": args.tokens,
              "repeats": args.repeats, "text_tokens": len(text_ids), "prompt_tokens": int(state["prompt_token"].size),
              "release_build_s": build_s, "torch": torch.__version__, "transformers": transformers.__version__,
              "python": platform.python_version(), "cpu_threads": torch.get_num_threads(),
              "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None, "settings": {}}
    for name in args.settings.split(","):
        try:
            report["settings"][name] = run_setting(name, folder, args.device, args, state, text_ids)
        except Exception as exc:  # noqa: BLE001 - one broken setting must not lose the others' numbers
            import traceback

            traceback.print_exc()
            report.setdefault("failed_settings", {})[name] = repr(exc)
            gc.collect()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    print("| setting | RTF median (min-max) | wall s | LM s | flow s | HiFT s | TTFA ms | peak GPU MiB |")
    for name, r in report["settings"].items():
        ttfa = f"{1000 * r['ttfa_s']['median']:.0f}" if "ttfa_s" in r else "-"
        print(f"| {name} | {r['rtf']['median']:.4f} ({r['rtf']['min']:.4f}-{r['rtf']['max']:.4f}) | "
              f"{r['wall_s']['median']:.3f} | {r['lm_s']['median']:.3f} | {r['flow_s']['median']:.3f} | "
              f"{r['hift_s']['median']:.3f} | {ttfa} | {r.get('peak_gpu_mib', 0):.0f} |")


if __name__ == "__main__":
    main()
