"""A wall-clock stack sampler for benchmarks: where every thread of this process is, every few ms.

Why not cProfile: it sees one thread, and the render path runs on five (model, paste, encoder feed, mask and
crop pools) with most of the time in native calls (OpenCV, torch, pipe writes) that release the GIL. Sampling
sys._current_frames() from a thread sees each thread's Python frame at the moment, native calls included (the
frame that made the call), at the cost of the sampler's own GIL use (~0.1 ms a sample). Per-thread CPU seconds
come from /proc/self/task (Linux), the children's (ffmpeg: decoders, encoder) from getrusage.
"""
from __future__ import annotations

import os
import resource
import sys
import threading
import time
from collections import Counter
from typing import Any


def _where(frame, depth: int) -> str:
    """The innermost `depth` frames as 'file:function:line' joined innermost first."""
    parts = []
    while frame is not None and len(parts) < depth:
        code = frame.f_code
        parts.append(f"{os.path.basename(code.co_filename)}:{code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(parts)


def _task_cpu() -> dict[int, float]:
    """native thread id -> CPU seconds (user + system) of every thread of this process (Linux /proc)."""
    out: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            continue
    return out


class StackSampler:
    """with StackSampler() as s: ...; s.report() -> per thread: samples, top stacks, CPU seconds."""

    def __init__(self, interval_s: float = 0.004, depth: int = 3, group: Any = None) -> None:
        """group: thread name -> the row it is counted in (e.g. every live session's clock thread in one row);
        default: the name without a trailing pool number."""
        self.interval, self.depth = interval_s, depth
        self.group = group or (lambda name: name.rstrip("0123456789_") or name)
        self.counts: dict[str, Counter] = {}
        self.samples: Counter = Counter()
        self._stop = threading.Event()
        self._names: dict[int, str] = {}  # ident -> name
        self._native: dict[int, int] = {}  # ident -> native id
        self._last_cpu: dict[int, float] = {}  # native id -> CPU seconds last read (threads that end keep theirs)
        self.iterations = 0

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            self.iterations += 1
            if self.iterations % 10 == 0:
                self._last_cpu.update(_task_cpu())
            for t in threading.enumerate():
                self._names[t.ident] = t.name
                if t.native_id is not None:
                    self._native[t.ident] = t.native_id
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = self.group(self._names.get(ident, str(ident)))  # pool threads: one row per pool
                self.counts.setdefault(name, Counter())[_where(frame, self.depth)] += 1
                self.samples[name] += 1

    def __enter__(self) -> "StackSampler":
        self.t0 = time.perf_counter()
        self.cpu0 = _task_cpu()
        self.children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.proc0 = time.process_time()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.wall = time.perf_counter() - self.t0
        self.proc = time.process_time() - self.proc0
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.children = (c1.ru_utime + c1.ru_stime) - (self.children0.ru_utime + self.children0.ru_stime)
        cpu1 = {**self._last_cpu, **_task_cpu()}
        names = {nid: self._names.get(ident, str(ident)) for ident, nid in self._native.items()}
        self.thread_cpu: Counter = Counter()
        for tid, sec in cpu1.items():
            name = names.get(tid)
            name = "native (torch/OpenMP/other)" if name is None else self.group(name)
            self.thread_cpu[name] += sec - self.cpu0.get(tid, 0.0)

    def report(self, top: int = 12) -> dict:
        """{'wall_s', 'process_cpu_s', 'children_cpu_s' (ffmpeg processes that ended), 'threads': {name: {
        'samples', 'seconds' (wall, sampled), 'cpu_s', 'top': [[stack, seconds], ...]}}}"""
        per = self.wall / max(1, self.iterations)
        threads = {}
        for name, c in sorted(self.counts.items(), key=lambda kv: -self.samples[kv[0]]):
            threads[name] = {"samples": self.samples[name], "cpu_s": round(self.thread_cpu.get(name, 0.0), 3),
                             "top": [[k, round(v * per, 3)] for k, v in c.most_common(top)]}
        extra = {k: round(v, 3) for k, v in self.thread_cpu.items() if k not in threads}
        return {"wall_s": round(self.wall, 3), "process_cpu_s": round(self.proc, 3),
                "children_cpu_s": round(self.children, 3), "seconds_per_sample": round(per, 5),
                "threads": threads, "other_threads_cpu_s": extra}
