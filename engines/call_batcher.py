"""One model call for the requests of several threads: a worker collects the pending requests for a few
milliseconds, stacks their inputs along the first axis, runs the function once and hands each caller its rows.

Why: live sessions each make a few frames at a time (4 per step) on their own thread; one model step over all
sessions' rows keeps a GPU busy with one large batch instead of many small ones. Bounded: at most `max_waiting`
requests wait (a caller beyond that blocks: back-pressure, never growth); a batch holds at most `max_rows` rows.
A lone caller waits for nobody: the worker waits for more only while other callers have been active (asked, or
got an answer) within `active_s`, and stops waiting as soon as every active caller has a request in the batch. `quantum`: every call is
padded (the last row repeated) to a multiple of this many rows, so a caller's rows come out the same whatever
else shares the call (see _pad).
`join`: instead of stacking, a function that makes one call's arguments from the requests' (a list of each
request's argument tuple, in order): for rows that need more than a stack, e.g. padding along another axis
(CosyVoice 2's flow solves of different lengths, engines/cosyvoice/flow_batch.py). Caller i still gets rows
[sum of the earlier requests' rows, + its rows) of the result; rows past the last request's are padding.

Torch tensors on CUDA: the caller's stream is recorded with an event that the worker's stream waits for before
it stacks the inputs, and the caller's stream waits for an event recorded after the call, so the rows may be
made and used on any stream (the call itself returns once its work is queued, as the function does); the rows a
caller gets are marked as used on its stream (record_stream), so their memory, allocated on the worker's stream, is
not handed out again there before the caller's queued work on them has run. `stream_priority`: the worker runs
the calls on a CUDA stream of its own at that priority (engines/cuda_streams.py; the live talking head's steps
have deadlines), instead of its current (the default) stream.
"""
from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np


class _Request:
    __slots__ = ("args", "rows", "done", "result", "error", "ready", "caller")

    def __init__(self, args: tuple, caller: int) -> None:
        self.args, self.caller = args, caller
        self.rows = int(args[0].shape[0])
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.ready: Any = None  # the caller's CUDA event (its inputs are made), or None


def _is_cuda(x: Any) -> bool:
    return getattr(getattr(x, "device", None), "type", None) == "cuda"


def _cat(parts: list) -> Any:
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    import torch

    return torch.cat(parts)


def _pad(x: Any, quantum: int) -> Any:
    """x with its last row repeated up to a multiple of `quantum` rows: the call sees few distinct batch sizes
    (each new shape may cost a cuDNN plan or a CPU kernel blocking of its own, and on the CPU a convolution can
    round a row differently at another batch size: MuseTalk's at 1-3 or 5 rows vs 4 or 8, by 1 in uint8)."""
    extra = -x.shape[0] % quantum
    if not extra:
        return x
    if isinstance(x, np.ndarray):
        return np.concatenate([x, np.repeat(x[-1:], extra, axis=0)])
    import torch

    return torch.cat([x, x[-1:].expand(extra, *x.shape[1:])])


class CallBatcher:
    """`batcher(*args)` = `fn(*args)`, run together with other threads' calls. Every argument is an array or
    tensor whose first axis is rows (the same count in each); `fn` returns one array/tensor (or a tuple of
    them) with a row per input row, in order, and each row's result must not depend on the other rows."""

    def __init__(self, fn: Callable[..., Any], *, window_s: float = 0.004, max_rows: int = 64,
                 max_waiting: int = 32, active_s: float = 0.5, quantum: int = 1,
                 name: str = "call-batcher", stream_priority: int | None = None,
                 join: Callable[[list[tuple]], tuple] | None = None) -> None:
        self.fn, self.window_s, self.max_rows = fn, float(window_s), max(1, int(max_rows))
        self.join = join
        self.quantum = max(1, int(quantum))
        self.active_s = float(active_s)
        self._queue: queue.Queue[_Request] = queue.Queue(maxsize=max(1, int(max_waiting)))
        self._held: _Request | None = None  # a request that did not fit the last batch: first of the next
        self._last_seen: dict[int, float] = {}
        self._seen_lock = threading.Lock()
        self._closed = threading.Event()
        self.stream_priority = stream_priority
        self._streams: dict[Any, Any] = {}  # the worker's own CUDA stream per device (stream_priority)
        self.calls = 0      # batched calls run
        self.rows_run = 0   # rows through them (rows_run / calls = the mean batch)
        self.largest = 0    # the most requests in one call
        self._worker = threading.Thread(target=self._run, name=name, daemon=True)
        self._worker_id: int | None = None
        self._worker.start()

    def __call__(self, *args: Any) -> Any:
        if threading.get_ident() == self._worker_id:  # fn itself calling back in: run it directly
            return self.fn(*args)
        if self._closed.is_set():
            raise RuntimeError("the call batcher is closed")
        if not args or any(a.shape[0] != args[0].shape[0] for a in args):
            raise ValueError("every argument of a batched call needs the same number of rows (first axis)")
        request = _Request(args, threading.get_ident())
        if any(_is_cuda(a) for a in args):
            import torch

            request.ready = torch.cuda.Event()
            request.ready.record(torch.cuda.current_stream(args[0].device))
        with self._seen_lock:
            self._last_seen[request.caller] = time.perf_counter()
        self._queue.put(request)  # blocks while max_waiting requests wait: back-pressure
        request.done.wait()
        if request.error is not None:
            raise request.error
        result, finished = request.result
        if finished is not None:  # the rows are used on the caller's stream: after the batched call's work
            import torch

            current = torch.cuda.current_stream(args[0].device)
            current.wait_event(finished)
            for part in result if isinstance(result, tuple) else (result,):
                if _is_cuda(part):  # made on the worker's stream, freed after the caller's use is queued
                    part.record_stream(current)
        return result

    def close(self) -> None:
        self._closed.set()
        self._worker.join(timeout=5)

    def _worker_stream(self, device: Any) -> Any:
        """The stream the worker runs a CUDA call on: its own at stream_priority (made once per device; none when
        streams are switched off, engines/cuda_streams.py), else its current stream."""
        import torch

        if self.stream_priority is not None:
            from .cuda_streams import new_stream, streams_enabled

            if streams_enabled():
                key = str(device)
                if key not in self._streams:
                    self._streams[key] = new_stream(device, self.stream_priority)
                if self._streams[key] is not None:
                    return self._streams[key]
        return torch.cuda.current_stream(device)

    def _others_active(self, batch: list[_Request]) -> bool:
        """Whether a caller active within active_s has no request in `batch` yet (its next one may come)."""
        now = time.perf_counter()
        with self._seen_lock:
            for caller in [c for c, t in self._last_seen.items() if now - t > self.active_s]:
                del self._last_seen[caller]
            return bool(set(self._last_seen) - {r.caller for r in batch})

    def _collect(self) -> list[_Request]:
        first, self._held = self._held, None
        while first is None:
            if self._closed.is_set():
                return []
            try:
                first = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
        batch, rows = [first], first.rows
        deadline = time.perf_counter() + self.window_s
        while rows < self.max_rows and self._others_active(batch):
            remaining = deadline - time.perf_counter()
            try:  # short waits: a caller that went quiet stops counting as active after active_s
                item = self._queue.get(timeout=min(remaining, 0.02)) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                if remaining > 0:
                    continue
                break
            if rows + item.rows > self.max_rows:
                self._held = item
                break
            batch.append(item)
            rows += item.rows
        return batch

    def _run(self) -> None:
        self._worker_id = threading.get_ident()
        while not self._closed.is_set():
            batch = self._collect()
            if not batch:
                continue
            try:
                cuda = batch[0].ready is not None
                scope: Any = contextlib.nullcontext()
                if cuda:
                    import torch

                    stream = self._worker_stream(batch[0].args[0].device)
                    for r in batch:
                        stream.wait_event(r.ready)
                    scope = torch.cuda.stream(stream)
                with scope:
                    if self.join is not None:
                        stacked = list(self.join([r.args for r in batch]))
                    else:
                        stacked = [_pad(_cat([r.args[i] for r in batch]), self.quantum)
                                   for i in range(len(batch[0].args))]
                    out = self.fn(*stacked)
                finished = None
                if cuda:
                    finished = torch.cuda.Event()
                    finished.record(stream)
                at = 0
                for r in batch:
                    rows = slice(at, at + r.rows)
                    r.result = (tuple(o[rows] for o in out) if isinstance(out, tuple) else out[rows], finished)
                    at += r.rows
                self.calls += 1
                self.rows_run += at
                self.largest = max(self.largest, len(batch))
            except BaseException as exc:  # noqa: BLE001 - every caller of the batch gets the error
                for r in batch:
                    r.error = exc
            now = time.perf_counter()
            with self._seen_lock:  # active from its answer on: its next request follows soon after
                for r in batch:
                    self._last_seen[r.caller] = now
            for r in batch:
                r.done.set()
