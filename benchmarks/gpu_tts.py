"""TTS speed on the GPU: Kokoro-82M through the engine loader, optimized path vs eager FP32.

Runs where the voice frontend's dependencies may be missing (the H200 machine): the phoneme token
ids come from a JSON file made on a CPU machine (`--make-tokens`), everything else is the pack's
own engine code. Writes a JSON report and the synthesized waveforms (.npy) for parity checks
(GE2E similarity, log-mel distance) done afterwards with `--parity`.

  python benchmarks/gpu_tts.py --make-tokens benchmarks/out/tts_tokens.json     # CPU machine
  python benchmarks/gpu_tts.py --tokens T.json --out DIR                          # GPU machine
  python benchmarks/gpu_tts.py --parity DIR                                       # CPU machine
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402

SENTENCES = {
    "10s": ("The quick brown fox jumps over the lazy dog near the river bank. "
            "After that, everyone went home and had a long conversation about the weather."),
    "short": "Hello there, how are you today?",
}


def make_tokens(path: Path, voice: str) -> None:
    import_pack()
    from digital_human.engines.kokoro.assets import kokoro_assets
    from digital_human.text import phonemize
    from digital_human.text.tokens import tokenize

    assets = kokoro_assets()
    payload = {"voice": voice, "utterances": {}}
    for key, text in SENTENCES.items():
        chunks = phonemize(text, "en")
        payload["utterances"][key] = [tokenize(c.phonemes, assets.vocab) for c in chunks]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))
    np.save(path.with_suffix(".voice.npy"), assets.voices[voice])
    print(f"wrote {path}")


def run_gpu(tokens_path: Path, out_dir: Path, repeats: int) -> dict:
    import_pack()
    import torch

    from digital_human.engines import loader
    from digital_human.engines.kokoro.synth import kokoro_model_spec, style_for, synthesize

    payload = json.loads(tokens_path.read_text())
    voice = np.load(tokens_path.with_suffix(".voice.npy"))
    spec = kokoro_model_spec("fp32")
    configs = [("torch", "fp32", "eager FP32 (baseline)"), ("torch", "fp16", "torch CUDA FP16 autocast")]
    if os.environ.get("BENCH_COMPILE") == "1":
        configs += [("torch", "fp32", "torch.compile FP32"), ("torch", "fp16", "torch.compile FP16 autocast")]
    if torch.cuda.is_available() is False:
        configs = [("onnxruntime", "fp32", "ORT CPU FP32"), ("torch", "fp32", "torch CPU FP32")]
    results: dict = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor(),
                     "torch": torch.__version__, "cuda": torch.version.cuda, "rows": []}
    out_dir.mkdir(parents=True, exist_ok=True)
    for backend, precision, label in configs:
        os.environ["DIGITAL_HUMAN_TORCH_COMPILE"] = "1" if "compile" in label else "0"
        runner = loader.get(spec, backend=backend, precision=precision)
        torch.cuda.reset_peak_memory_stats() if torch.cuda.is_available() else None
        for key, utterances in payload["utterances"].items():
            def once() -> tuple[np.ndarray, float]:
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                start = time.perf_counter()
                wave = np.concatenate([synthesize(ids, style_for(voice, len(ids)), 1.0, runner) for ids in utterances])
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                return wave, time.perf_counter() - start
            once()  # warm-up (cuDNN autotune, allocator)
            timings, wave = [], None
            for _ in range(repeats):
                wave, seconds = once()
                timings.append(seconds)
            median = statistics.median(timings)
            audio_s = len(wave) / 24000
            row = {"config": label, "backend": runner.backend, "precision": runner.precision, "utterance": key,
                   "audio_s": round(audio_s, 3), "median_s": round(median, 5), "rtf": round(median / audio_s, 5),
                   "notes": runner.info.notes,
                   "peak_mem_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None}
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
            np.save(out_dir / f"tts_{key}_{backend}_{precision}.npy", wave.astype(np.float32))
        loader.release()
    base = {r["utterance"]: r["median_s"] for r in results["rows"] if "baseline" in r["config"]}
    for row in results["rows"]:
        row["speedup_vs_eager_fp32"] = round(base[row["utterance"]] / row["median_s"], 2) if row["utterance"] in base else None
    (out_dir / "gpu_tts.json").write_text(json.dumps(results, indent=1))
    return results


def parity(out_dir: Path) -> None:
    import_pack()
    import librosa

    from digital_human.engines import speaker_encoder as se

    run = se.default_run_fn()
    for ref_path in sorted(out_dir.glob("tts_*_fp32.npy")):
        fast_path = Path(str(ref_path).replace("_fp32.npy", "_fp16.npy"))
        if not fast_path.exists():
            continue
        ref, fast = np.load(ref_path), np.load(fast_path)
        n = min(len(ref), len(fast))
        emb = [se.embed_utterance(librosa.resample(w, orig_sr=24000, target_sr=16000), run)[0] for w in (ref, fast)]
        mel = [np.log(librosa.feature.melspectrogram(y=w[:n], sr=24000, n_mels=80) + 1e-5) for w in (ref, fast)]
        snr = 10 * np.log10(np.sum(ref[:n] ** 2) / max(np.sum((ref[:n] - fast[:n]) ** 2), 1e-12))
        print(f"{fast_path.name}: length {len(fast)} vs {len(ref)} samples, GE2E cosine {se.cosine(*emb):.4f}, "
              f"log-mel L1 {np.abs(mel[0] - mel[1]).mean():.3f}, waveform SNR {snr:.1f} dB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--make-tokens", type=Path)
    parser.add_argument("--voice", default="jm_kumo")
    parser.add_argument("--tokens", type=Path)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--parity", type=Path)
    args = parser.parse_args()
    if args.make_tokens:
        make_tokens(args.make_tokens, args.voice)
    elif args.parity:
        parity(args.parity)
    else:
        run_gpu(args.tokens, args.out, args.repeats)


if __name__ == "__main__":
    main()
