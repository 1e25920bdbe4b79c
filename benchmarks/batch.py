"""Batch throughput on Ray: speech seconds rendered per wall second with 1 vs N workers.

Runs `digital-human batch` (batch.driver.run_batch, a local Ray started per configuration) on the
same job file for each worker count: `--jobs` jobs of about 10 s of speech each (distinct texts, so
no two share a content key), the portrait model and one photo, the nearest bundled voice
(no_imitate: the voice fit is once per batch and not what this measures). The wall time counts from
the workers' start (engines load inside it, once per worker) to the last video written. Reports the
speed-up over 1 worker (the baseline, same run), per-job latency, the host's load average (other
processes share the CPU) and, on CUDA machines, GPU utilisation sampled by nvidia-smi.

  python benchmarks/batch.py [--jobs 20] [--workers 1 2] [--gpu] [--json benchmarks/out/batch.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bootstrap import import_pack  # noqa: E402

DATA = Path(os.environ.get("DIGITAL_HUMAN_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
TEXT_10S = ("Good morning everyone. Today I want to show you how a digital twin can read any text aloud, "
            "in my own voice, with my own face.")


class GpuSampler:
    """Mean GPU utilisation (%) per GPU while running, from `nvidia-smi -lms` (absent: None)."""

    def __init__(self, period_ms: int = 500) -> None:
        self.samples: list[list[float]] = []
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                          f"-lms={period_ms}"], stdout=subprocess.PIPE, text=True)
            self.thread = threading.Thread(target=self._read, daemon=True)
            self.thread.start()

    def _read(self) -> None:
        row: list[float] = []
        for line in self.proc.stdout:
            row.append(float(line.strip() or 0))
            if len(row) == self.gpus:
                self.samples.append(row)
                row = []

    @property
    def gpus(self) -> int:
        try:
            import torch

            return max(1, torch.cuda.device_count())
        except ImportError:
            return 1

    def stop(self) -> list[float] | None:
        if self.proc is None:
            return None
        self.proc.terminate()
        self.proc.wait(10)
        if not self.samples:
            return None
        return [round(statistics.mean(col), 1) for col in zip(*self.samples)]


def write_jobs(path: Path, jobs: int, text: str, voice: Path | None, speaker: Path | None, face: Path) -> None:
    lines = []
    for i in range(jobs):
        job = {"name": f"b{i:03d}", "text": f"Part {i + 1}. {text}", "face": str(face), "no_imitate": True}
        job.update({"speaker": str(speaker)} if speaker else {"voice": str(voice)})
        lines.append(json.dumps(job))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def run_config(jobs_file: Path, workers: int, gpu: bool, cpus_per_worker: float) -> dict:
    from digital_human.batch.driver import BatchOptions, run_batch

    out = Path(tempfile.mkdtemp(prefix=f"dh-batch-bench-{workers}-"))
    load_before = os.getloadavg()
    sampler = GpuSampler() if gpu else None
    try:
        report = run_batch(BatchOptions(jobs_file, out, workers=workers, gpus_per_job=1 if gpu else 0,
                                        cpus_per_worker=cpus_per_worker, object_store_mb=512))
    finally:
        util = sampler.stop() if sampler else None
        shutil.rmtree(out, ignore_errors=True)
    done = [j for j in report["jobs"] if j["status"] == "done"]
    latency = sorted(j["seconds"] for j in done)
    return {"workers": workers, "jobs_done": len(done), "jobs_failed": report["counts"].get("failed", 0),
            "speech_seconds": report["rendered_speech_seconds"], "wall_seconds": report["render_wall_seconds"],
            "throughput": report["speech_seconds_per_wall_second"],
            "job_seconds_median": round(statistics.median(latency), 2) if latency else None,
            "job_seconds_max": round(latency[-1], 2) if latency else None,
            "first_job_seconds": round(min(j["seconds"] for j in done), 2) if done else None,
            "load_before": [round(x, 1) for x in load_before], "load_after": [round(x, 1) for x in os.getloadavg()],
            "gpu_util_percent": util, "errors": sorted({j["error"] for j in report["jobs"] if j["error"]})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--text", default=TEXT_10S, help="each job's text (default: about 10 s of speech)")
    parser.add_argument("--voice", type=Path, default=DATA / "audio" / "spk_en_03.wav")
    parser.add_argument("--speaker", type=Path, help="saved speaker .npz instead of --voice")
    parser.add_argument("--face", type=Path, default=DATA / "image" / "face_01_female.jpg")
    parser.add_argument("--gpu", action="store_true", help="one worker per GPU (--gpus-per-job 1)")
    parser.add_argument("--cpus-per-worker", type=float, default=1.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import_pack()
    with tempfile.TemporaryDirectory() as tmp:
        jobs_file = Path(tmp) / "jobs.jsonl"
        write_jobs(jobs_file, args.jobs, args.text, args.voice, args.speaker, args.face)
        results = []
        for workers in args.workers:
            result = run_config(jobs_file, workers, args.gpu, args.cpus_per_worker)
            results.append(result)
            print(json.dumps(result), flush=True)
    base = results[0]["throughput"] or 0.0
    for r in results:
        r["speedup_vs_first"] = round(r["throughput"] / base, 2) if base and r["throughput"] else None
    report = {"jobs": args.jobs, "text_chars": len(args.text), "gpu": args.gpu, "cpu_count": os.cpu_count(),
              "results": results}
    print("| workers | jobs | speech s | wall s | speech s per wall s | speed-up | job s (median / max) | "
          "load avg before -> after | GPU util % |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['workers']} | {r['jobs_done']}/{args.jobs} | {r['speech_seconds']:.1f} | {r['wall_seconds']:.1f} | "
              f"{r['throughput']} | {r['speedup_vs_first']}x | {r['job_seconds_median']} / {r['job_seconds_max']} | "
              f"{r['load_before'][0]} -> {r['load_after'][0]} | {r['gpu_util_percent']} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
