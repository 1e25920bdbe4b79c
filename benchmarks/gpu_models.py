"""Small models on the GPU (or CPU): GE2E speaker encoder, face detector, face mesh.

For each: the optimized path the nodes use (engine loader: torch CUDA FP16 + CUDA graphs) next to
eager FP32 torch measured in the same run, medians over repeats after warm-up, with the max abs
difference between the two outputs. Needs only torch + numpy + onnx (the GPU machine's image), the
pack checkout and a models folder (DIGITAL_HUMAN_MODELS) holding speaker_encoder/ and face/.

  DIGITAL_HUMAN_MODELS=... python benchmarks/gpu_models.py --out results.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402


def _time(fn, repeats: int, sync) -> float:
    fn()
    fn()  # warm-up: cuDNN autotune, graph capture
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench(spec, feeds: dict, per_item: int, label: str, unit: str, repeats: int, device: str) -> list[dict]:
    import torch

    from digital_human.engines import loader

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows, outputs = [], {}
    configs = [("torch", "fp32", "eager FP32 (baseline)")]
    configs += [("torch", "fp16", "torch FP16 + CUDA graphs")] if device == "cuda" else [("onnxruntime", "fp32", "ONNX Runtime CPU")]
    for backend, precision, name in configs:
        loader.release()
        if device == "cuda" and "baseline" in name:
            from digital_human.engines import backend_torch

            # eager: the torch backend itself, without the CUDA graphs the loader's runner captures
            runner = backend_torch.load(spec, device, precision, use_cuda_graphs=False)
        else:
            runner = loader.get(spec, backend=backend, precision=precision)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        seconds = _time(lambda: runner(feeds), repeats, sync)
        outputs[name] = {k: np.asarray(v, np.float32) for k, v in runner(feeds).items()}
        rows.append({"model": label, "config": name, "backend": runner.backend, "precision": runner.precision,
                     "notes": runner.info.notes, "median_ms": round(seconds * 1000, 3),
                     f"ms_per_{unit}": round(seconds * 1000 / per_item, 4),
                     f"{unit}s_per_s": round(per_item / seconds, 1),
                     "peak_mem_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if device == "cuda" else None})
    base = rows[0]["median_ms"]
    ref = outputs[rows[0]["config"]]
    for row in rows:
        row["speedup_vs_eager_fp32"] = round(base / row["median_ms"], 2)
        got = outputs[row["config"]]
        row["max_abs_diff_vs_fp32"] = float(max(np.abs(got[k] - ref[k]).max() for k in ref))
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/gpu_models.json"))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    import_pack()
    import torch

    from digital_human.engines.face.blazeface import face_detector_spec
    from digital_human.engines.face.facemesh import face_mesh_spec
    from digital_human.engines.speaker_encoder import ge2e_model_spec

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rng = np.random.default_rng(0)
    rows = []
    # GE2E: a 10 s clip is 10 partial windows of 160 mel frames (rate 1.3/s, 50% overlap) -> batch 10
    rows += bench(ge2e_model_spec(), {"mels": rng.random((10, 160, 40), np.float32)}, 1, "GE2E 10 s clip", "clip",
                  args.repeats, device)
    det = rng.uniform(-1, 1, (args.batch, 128, 128, 3)).astype(np.float32)
    rows += bench(face_detector_spec(), {"input": det}, args.batch, f"face detector batch {args.batch}", "frame",
                  args.repeats, device)
    mesh = rng.uniform(0, 1, (args.batch, 192, 192, 3)).astype(np.float32)
    rows += bench(face_mesh_spec(), {"input": mesh}, args.batch, f"face mesh batch {args.batch}", "frame",
                  args.repeats, device)
    report = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
              "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
