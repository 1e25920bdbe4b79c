"""Side-by-side work for the voice fit on a CPU (issue 18: a first-use fit within 60 s on 2 cores).

A fit scores ~16 candidate voices; each is two Kokoro calls (the two probe sentences) and GE2E
scoring, and Kokoro is ~85 % of the time. On the 2-core test machine one Kokoro call on ONNX
Runtime's default session (2 intra-op threads, spinning) took ~4.2 s of CPU for ~2 s of wall time;
on a 1-thread session it took ~2.9 s of CPU. Two calls at once on a shared 1-thread session used
both cores without the spinning (RESULTS_voice.md has the measurements). So on a CPU the fit runs
independent Kokoro calls - the chunks of one candidate, or the candidates of one batch - and the
scoring of independent candidates on `workers` threads, each call on one shared session with
cpu_count // workers intra-op threads (an ONNX Runtime session may be run from several threads at
once; a second ORT session would cost another ~180 MB for no measured gain).

The search stays sequential: imitation.py hands over batches of candidates that it would have
evaluated anyway without looking at each other's scores, and reads the scores back in order, so
the fitted voice does not depend on thread timing.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterable
from typing import TypeVar

import numpy as np

WORKERS_ENV = "DIGITAL_HUMAN_FIT_WORKERS"  # 1 = the sequential fit on the loader's sessions
MAX_WORKERS = 2  # measured on 2 cores only; more workers on bigger CPUs would split the cores further

T = TypeVar("T")
R = TypeVar("R")

_SESSIONS: dict[tuple, object] = {}
_SESSIONS_LOCK = threading.Lock()


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a container's cpuset), else the CPU count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def fit_workers() -> int:
    """How many candidate evaluations run side by side (DIGITAL_HUMAN_FIT_WORKERS overrides)."""
    env = os.environ.get(WORKERS_ENV, "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"{WORKERS_ENV} must be a whole number, got '{env}'") from None
    return max(1, min(MAX_WORKERS, usable_cpus()))


def threads_per_worker(workers: int) -> int:
    return max(1, usable_cpus() // max(1, workers))


def _cpu_session(spec, precision: str, threads: int):
    """A cached ONNX Runtime CPU runner of `spec` with `threads` intra-op threads."""
    from ..engines import backend_onnxruntime

    key = (spec.name, str(spec.cpu_onnx_path or spec.onnx_path), precision, threads)
    with _SESSIONS_LOCK:
        runner = _SESSIONS.get(key)
        if runner is None:
            runner = backend_onnxruntime.load(spec, "cpu", precision, threads=threads)
            _SESSIONS[key] = runner
        return runner


_USERS = [0]  # fits running now that may use the sessions


def release_sessions() -> int:
    """Drop the fit's own sessions; returns how many."""
    with _SESSIONS_LOCK:
        n = len(_SESSIONS)
        for runner in _SESSIONS.values():
            runner.release()
        _SESSIONS.clear()
        return n


def acquire() -> None:
    """A fit starts: its sessions stay open until the last running fit calls done()."""
    with _SESSIONS_LOCK:
        _USERS[0] += 1


def done() -> None:
    """A fit ended: when no other fit is running, its sessions (~180 MB) are released, so a long-lived
    process (ComfyUI) does not hold them between fits; the next fit opens them again (~1.6 s)."""
    with _SESSIONS_LOCK:
        _USERS[0] = max(0, _USERS[0] - 1)
        last = _USERS[0] == 0
    if last:
        release_sessions()


def kokoro_runner(backend: str, precision: str, workers: int):
    """Kokoro runner for `workers` concurrent calls, or None where the loader's own runner is the one
    to use (a single worker, a GPU or torch backend)."""
    if workers < 2:
        return None
    from ..engines import loader
    from ..engines.kokoro.synth import kokoro_model_spec

    spec = kokoro_model_spec("fp32")
    if loader.get(spec, backend=backend, precision=precision, stage="voice").info.backend != "onnxruntime-cpu":
        return None
    return _cpu_session(spec, precision, threads_per_worker(workers))


def ge2e_run_fn(backend: str, precision: str, workers: int) -> Callable[[np.ndarray], np.ndarray] | None:
    """GE2E mels -> embeddings for `workers` concurrent calls, or None (use the loader's, as above)."""
    if workers < 2:
        return None
    from ..engines import loader
    from ..engines import speaker_encoder as se

    spec = se.ge2e_model_spec()
    if loader.get(spec, backend=backend, precision=precision, stage="voice").info.backend != "onnxruntime-cpu":
        return None
    runner = _cpu_session(spec, precision, threads_per_worker(workers))
    return lambda mels: np.asarray(runner({"mels": mels})["embedding"], dtype=np.float32)


class WorkerPool:
    """map(fn, items) -> list in the items' order, on `workers` threads (inline for one worker or one
    item). Not re-entrant: work running on the pool must not map on it again (it would wait on itself)."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, int(workers))
        self._executor: ThreadPoolExecutor | None = None

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        items = list(items)
        if self.workers < 2 or len(items) < 2:
            return [fn(item) for item in items]
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="voice-fit")
        return list(self._executor.map(fn, items))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
