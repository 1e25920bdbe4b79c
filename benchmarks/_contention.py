"""Two probes for a benchmark phase that runs slower than its parts: is the interpreter lock or the GPU saturated?

Why: the H200 run of 8 live sessions with the batched LM (2026-12-04, RESULTS_live.md) came out slower in every
stage after the LM, yet used 4 of 16 cores, and its stack sampler ran one iteration per 60 ms when asked for one
per 10 ms (24 ms in the run before). Both fit a contended interpreter lock, and both fit a busy GPU. These two
measure each directly:

- GilProbe: a thread that sleeps `interval_s` again and again and records how late it wakes. A sleeping thread
  holds no lock; waking, it must take the interpreter lock back, so the lateness beyond the OS timer's is the wait
  for that lock (on an idle interpreter, tens of microseconds).
- GpuUtilSampler: `nvidia-smi` in query-loop mode (an argument list, no shell) writing the GPU's busy percentage
  and memory every `interval_ms`; a machine without it reports why, and the phase goes on.
"""
from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time
from typing import Any


def _percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"n": len(ordered), "p50": round(at(0.50), 3), "p95": round(at(0.95), 3), "p99": round(at(0.99), 3),
            "max": round(ordered[-1], 3), "mean": round(statistics.fmean(ordered), 3)}


class GilProbe:
    """with GilProbe() as p: ...; p.report() -> the lateness of its wake-ups in ms (percentiles) and the share of
    the phase it spent waiting."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval = float(interval_s)
        self.late_ms: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        sleep, clock = time.sleep, time.perf_counter
        while not self._stop.is_set():
            t0 = clock()
            sleep(self.interval)
            self.late_ms.append(1000.0 * (clock() - t0 - self.interval))

    def __enter__(self) -> "GilProbe":
        self.t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="gil-probe", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.wall = time.perf_counter() - self.t0

    def report(self) -> dict[str, Any]:
        waited = sum(max(0.0, v) for v in self.late_ms) / 1000.0
        return {"interval_ms": 1000.0 * self.interval, "late_ms": _percentiles(self.late_ms),
                "waiting_share": round(waited / self.wall, 3) if getattr(self, "wall", 0) else None}


class GpuUtilSampler:
    """with GpuUtilSampler() as g: ...; g.report() -> the GPU's busy % and memory used over the phase, or why not."""

    QUERY = "utilization.gpu,memory.used"

    def __init__(self, interval_ms: int = 250, index: int = 0, executable: str | None = None) -> None:
        self.interval_ms, self.index = int(interval_ms), int(index)
        self.executable = executable or shutil.which("nvidia-smi")
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None
        self.util: list[float] = []
        self.memory_mib: list[float] = []

    def __enter__(self) -> "GpuUtilSampler":
        if self.executable is None:
            self.error = "nvidia-smi not found on PATH"
            return self
        cmd = [self.executable, f"--query-gpu={self.QUERY}", "--format=csv,noheader,nounits",
               f"--id={self.index}", f"--loop-ms={self.interval_ms}"]
        try:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        except OSError as exc:
            self.error = f"nvidia-smi did not start: {exc}"
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            out, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            try:
                self.util.append(float(parts[0]))
                self.memory_mib.append(float(parts[1]))
            except (ValueError, IndexError):
                continue
        if not self.util:
            self.error = f"nvidia-smi gave no readings: {(err or out).strip()[-300:]}"

    def report(self) -> dict[str, Any]:
        if self.error is not None:
            return {"error": self.error}
        busy = sum(1 for u in self.util if u >= 95.0)
        return {"interval_ms": self.interval_ms, "util_pct": _percentiles(self.util),
                "share_at_95_pct_or_more": round(busy / len(self.util), 3),
                "memory_used_mib_max": max(self.memory_mib)}
