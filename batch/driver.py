"""The batch driver: reads the job file, skips finished jobs, fits each voice once, hands jobs to
free workers, retries jobs whose worker died, writes every video atomically and a summary.

Scheduling is done here rather than by Ray's task retries so that each outcome is known: a job's
own error (bad input) fails that job only and is not retried; a worker's death (killed process,
lost node) re-queues its job for another worker, up to `retries` times, while Ray restarts the
actor. Voice fits are shared through the object store (and kept under OUT/.refs/speakers for the
next run); a job waits for its fit, other jobs do not.
"""
from __future__ import annotations

import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import stop_signals
from ..atomic_file import atomic_path
from .cluster import connect, import_ray, pool_shape, worker_env
from .jobs import Job, read_jobs
from .progress import Progress

log = logging.getLogger("digital_human.batch")

SUMMARY_NAME = "summary.json"


@dataclass
class BatchOptions:
    jobs_file: Path
    out_dir: Path
    address: str | None = None
    gpus_per_job: float | None = None
    workers: int | None = None
    cpus_per_worker: float = 1.0
    retries: int = 2
    object_store_mb: int = 512
    # test/monitoring hook: called as on_dispatch(job_record, worker_info) when a job is handed out
    on_dispatch: Callable[[dict[str, Any], dict[str, Any]], None] | None = None
    progress: bool = True


@dataclass
class _Record:
    job: Job
    status: str = "pending"
    output: str | None = None
    error: str | None = None
    attempts: int = 0
    worker: dict[str, Any] | None = None
    queued_at: float = 0.0
    started_at: float | None = None
    seconds: float | None = None
    audio_seconds: float | None = None
    face_track: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    backend: Any = None
    duplicate_of: int | None = None
    avoid: set[int] = field(default_factory=set)  # worker slots where this job's worker died
    failures: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        job = self.job
        return {"index": job.index, "line": job.line, "name": job.name, "key": job.key, "status": self.status,
                "output": self.output, "error": self.error, "attempts": self.attempts, "worker": self.worker,
                "seconds": self.seconds, "audio_seconds": self.audio_seconds, "face_track": self.face_track,
                "timings": self.timings, "backend": self.backend, "duplicate_of": self.duplicate_of,
                "worker_failures": self.failures}


@dataclass
class _Fit:
    key: str
    job: Job  # the first job using this clip (its clip and fit options)
    status: str = "pending"  # pending, running, done, failed
    ref: Any = None  # ObjectRef of the speaker .npz bytes
    error: str | None = None
    attempts: int = 0
    seconds: float | None = None
    worker: dict[str, Any] | None = None
    cached: bool = False
    avoid: set[int] = field(default_factory=set)


class _Worker:
    def __init__(self, slot: int, handle: Any) -> None:
        self.slot = slot
        self.handle = handle
        self.info: dict[str, Any] = {"slot": slot}
        self.state = "starting"  # starting, idle, busy, dead
        self.pings = 0
        self.faces: set[str] = set()  # face hashes this worker has aligned (schedule alike jobs here)


def _error_text(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # RayTaskError wraps the worker's own exception
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def _write_summary(out_dir: Path, report: dict[str, Any]) -> Path:
    path = out_dir / SUMMARY_NAME
    with atomic_path(path) as partial:
        partial.write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    return path


def check_batch_parts(jobs: list[Job], same_machine: bool) -> None:
    """Ray's extra is installed, and (workers on this machine) every optional model the jobs pick has its
    extra and files: one PreflightError naming each pip line and missing file, before Ray starts. What
    belongs to one job (an unknown model name, a clone avatar not trained yet) fails that job alone."""
    from ..optional_parts import extra_problem
    from ..preflight import PreflightError
    from ..talking_head.registry import UnknownModelError, model_problem, resolve

    problems = [extra_problem("batch", "batch", ("ray",))]
    if same_machine:  # a remote cluster's nodes have their own installation: their workers check it
        by_model: dict[str, list[str]] = {}
        for job in jobs:
            by_model.setdefault(str(job.options.get("model") or "portrait"), []).append(job.label)
        for model, users in sorted(by_model.items()):
            try:
                if resolve(model)[0].per_avatar:
                    continue
            except UnknownModelError:
                continue
            problem = model_problem(model)
            if problem:
                problems.append(f"{', '.join(users[:3])}{' ...' if len(users) > 3 else ''}: --model {model}: "
                                f"{problem}")
    found = [p for p in problems if p]
    if found:
        raise PreflightError("\n".join(found))


def run_batch(opts: BatchOptions) -> dict[str, Any]:
    """Run every job of `opts.jobs_file` not already rendered into `opts.out_dir`; returns the report
    (also written to OUT/summary.json). report["ok"] is False when any job failed."""
    started = time.perf_counter()
    out_dir = Path(opts.out_dir)
    jobs = read_jobs(Path(opts.jobs_file))
    records = [_Record(job) for job in jobs]
    todo: list[_Record] = []
    first_by_key: dict[str, _Record] = {}
    for record in records:
        job = record.job
        if job.error:
            record.status, record.error = "failed", job.error
            continue
        output = out_dir / job.output_name()
        record.output = str(output)
        if job.key in first_by_key:  # the same job twice: render once
            record.duplicate_of = first_by_key[job.key].job.index
            continue
        first_by_key[job.key] = record
        if output.is_file():
            record.status = "skipped"  # rendered by an earlier run (resume)
        else:
            todo.append(record)
    if todo:  # Ray and the jobs' optional models are checked before anything is started or written
        check_batch_parts([r.job for r in todo], same_machine=opts.address is None or opts.address == "auto")
    out_dir.mkdir(parents=True, exist_ok=True)
    workers_info: list[dict[str, Any]] = []
    fits: list[dict[str, Any]] = []
    render_seconds = 0.0
    started_ray = False
    ray = None
    if todo:
        ray = import_ray()
        cpu_only = opts.gpus_per_job == 0 or (opts.gpus_per_job is None and opts.address is None
                                              and not _local_gpus())
        num_cpus = opts.workers * opts.cpus_per_worker if (opts.workers and cpu_only) else None
        env = worker_env(same_machine=opts.address is None or opts.address == "auto",
                         cpus_per_worker=opts.cpus_per_worker, gpu=not cpu_only)
        started_ray = connect(opts.address, opts.object_store_mb, num_cpus)
        # ray.init replaced the SIGTERM handler with a plain exit: take it back, so a stopped batch unwinds
        # like Ctrl-C (summary written, Ray shut down, exit 143)
        stop_signals.claim()
        try:
            loop_start = time.perf_counter()
            scheduler = _Scheduler(ray, opts, out_dir, todo, env)
            workers_info = scheduler.run()
            fits = scheduler.fits_summary()
            render_seconds = time.perf_counter() - loop_start
        finally:
            for record in todo:
                if record.status in ("pending", "running"):
                    record.status, record.error = "interrupted", "the batch stopped before this job finished"
            _finish(records, first_by_key)
            report = _report(records, out_dir, started, render_seconds, workers_info)
            report["voice_fits"] = fits
            _write_summary(out_dir, report)
            if started_ray:
                ray.shutdown()
    else:
        _finish(records, first_by_key)
        report = _report(records, out_dir, started, render_seconds, workers_info)
        report["voice_fits"] = []  # nothing left to render: Ray is not even started
        _write_summary(out_dir, report)
    return report


def _local_gpus() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:  # pragma: no cover - torch is a requirement
        return False


def _finish(records: list[_Record], first_by_key: dict[str, _Record]) -> None:
    for record in records:
        if record.duplicate_of is not None:
            first = first_by_key[record.job.key]
            record.status, record.error = first.status, first.error
            record.output = first.output if first.status in ("done", "skipped") else None
        elif record.status not in ("done", "skipped"):
            record.output = None


def _report(records: list[_Record], out_dir: Path, started: float, render_seconds: float,
            workers: list[dict[str, Any]]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for record in records:
        counts[record.status] = counts.get(record.status, 0) + 1
    rendered = [r for r in records if r.status == "done" and r.duplicate_of is None]
    speech = sum(r.audio_seconds or 0.0 for r in rendered)
    return {"ok": all(r.status in ("done", "skipped") for r in records),
            "outputs": [r.output for r in records if r.output and r.status in ("done", "skipped")],
            "summary": str(out_dir / SUMMARY_NAME), "counts": counts, "jobs": [r.summary() for r in records],
            "rendered_speech_seconds": round(speech, 3), "render_wall_seconds": round(render_seconds, 3),
            "speech_seconds_per_wall_second": round(speech / render_seconds, 4) if render_seconds else None,
            "total_seconds": round(time.perf_counter() - started, 3), "workers": workers}


class _Scheduler:
    """Hands work to free workers and reacts to each outcome; one Ray call per worker at a time."""

    def __init__(self, ray: Any, opts: BatchOptions, out_dir: Path, todo: list[_Record],
                 env: dict[str, str]) -> None:
        from .worker import Renderer

        self.ray = ray
        self.opts = opts
        self.out_dir = out_dir
        self.refs_dir = out_dir / ".refs" / "speakers"
        self.todo = todo
        self.fits: dict[str, _Fit] = {}
        for record in todo:
            key = record.job.voice_fit_key()
            if key and key not in self.fits:
                self.fits[key] = _Fit(key, record.job)
        self.pending: deque[_Record] = deque(todo)
        self.blobs: dict[str, Any] = {}  # sha256 -> ObjectRef of the file's bytes
        self.uses: dict[str, int] = {}  # sha256 -> jobs/fits still needing it (to free the object store)
        for record in todo:
            for sha in self._needs(record):
                self.uses[sha] = self.uses.get(sha, 0) + 1
        for fit in self.fits.values():
            cached = self.refs_dir / f"{fit.key}.npz"
            if cached.is_file():  # fitted by an earlier run of this batch
                fit.ref, fit.status, fit.cached, fit.seconds = ray.put(cached.read_bytes()), "done", True, 0.0
            else:
                sha = fit.job.files["voice"].sha256
                self.uses[sha] = self.uses.get(sha, 0) + 1
        shape = pool_shape(ray.cluster_resources(), len(todo), opts.workers, opts.gpus_per_job,
                           opts.cpus_per_worker)
        actor = ray.remote(Renderer).options(num_cpus=shape.cpus, num_gpus=shape.gpus,
                                             max_restarts=max(0, opts.retries), max_task_retries=0,
                                             runtime_env={"env_vars": env})
        self.workers = [_Worker(slot, actor.remote(slot)) for slot in range(shape.workers)]
        self.in_flight: dict[Any, tuple[str, Any, _Worker]] = {}
        for worker in self.workers:
            self._ping(worker)
        self.progress = Progress(len(todo), enabled=opts.progress)
        log.info("batch: %d job(s) to render, %d voice fit(s), %d worker(s) of %g CPU / %g GPU",
                 len(todo), len(self.fits), shape.workers, shape.cpus, shape.gpus)

    # -- inputs ---------------------------------------------------------------------------------
    @staticmethod
    def _needs(record: _Record) -> list[str]:
        files = record.job.files
        return [files[k].sha256 for k in ("speaker", "face") if k in files]

    def _blob(self, sha: str, path: Path) -> Any:
        if sha not in self.blobs:
            self.blobs[sha] = self.ray.put(path.read_bytes())
        return self.blobs[sha]

    def _release(self, shas: list[str]) -> None:
        for sha in shas:
            self.uses[sha] -= 1
            if self.uses[sha] <= 0:
                self.blobs.pop(sha, None)  # last user done: the object store may free it

    # -- dispatch -------------------------------------------------------------------------------
    def _ping(self, worker: _Worker) -> None:
        self.in_flight[worker.handle.info.remote()] = ("info", None, worker)

    def _allowed(self, avoid: set[int], worker: _Worker) -> bool:
        """Not on a worker where this item's worker died before, unless every live worker is one."""
        return worker.slot not in avoid or {w.slot for w in self._live()} <= avoid

    def _next_fit(self, worker: _Worker) -> _Fit | None:
        return next((f for f in self.fits.values() if f.status == "pending" and self._allowed(f.avoid, worker)),
                    None)

    def _ready(self, record: _Record) -> bool:
        key = record.job.voice_fit_key()
        return key is None or self.fits[key].status in ("done", "failed")

    def _next_job(self, worker: _Worker) -> _Record | None:
        ready = [r for r in self.pending if self._ready(r)]
        if not ready:
            return None
        elsewhere = [r for r in ready if self._allowed(r.avoid, worker)]
        same_face = [r for r in elsewhere if r.job.files["face"].sha256 in worker.faces]
        pick = (same_face or elsewhere or [None])[0]
        if pick is not None:
            self.pending.remove(pick)
        return pick

    def _live(self) -> list[_Worker]:
        return [w for w in self.workers if w.state != "dead"]

    def _dispatch(self) -> None:
        for worker in self.workers:
            if worker.state != "idle":
                continue
            fit = self._next_fit(worker)
            if fit is not None:
                self._start_fit(fit, worker)
                continue
            record = self._next_job(worker)
            while record is not None and not self._start_job(record, worker):
                record = self._next_job(worker)

    def _start_fit(self, fit: _Fit, worker: _Worker) -> None:
        voice = fit.job.files["voice"]
        fit.status, fit.attempts, fit.worker = "running", fit.attempts + 1, worker.info
        worker.state = "busy"
        fit.seconds = time.perf_counter()
        self.in_flight[worker.handle.fit_voice.remote(fit.job, self._blob(voice.sha256, voice.path))] = \
            ("fit", fit, worker)

    def _start_job(self, record: _Record, worker: _Worker) -> bool:
        job = record.job
        key = job.voice_fit_key()
        if key is not None:
            fit = self.fits[key]
            if fit.status == "failed":
                record.status, record.error = "failed", f"voice fit of '{job.files['voice'].path}' failed: {fit.error}"
                self._release(self._needs(record))
                self.progress.update(record.status, record.audio_seconds)
                return False
            speaker_key, speaker_ref = key, fit.ref
        else:
            own = job.files["speaker"]
            speaker_key, speaker_ref = own.sha256, self._blob(own.sha256, own.path)
        face = job.files["face"]
        record.status, record.attempts, record.worker = "running", record.attempts + 1, worker.info
        record.started_at = time.perf_counter()
        worker.state = "busy"
        ref = worker.handle.render.remote(job, speaker_key, speaker_ref, self._blob(face.sha256, face.path))
        self.in_flight[ref] = ("job", record, worker)
        self.progress.update("running", None)
        if self.opts.on_dispatch is not None:
            self.opts.on_dispatch(record.summary(), dict(worker.info))
        return True

    # -- outcomes -------------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        errors = self.ray.exceptions
        try:
            while True:
                self._dispatch()
                if not self.in_flight:
                    break
                done, _ = self.ray.wait(list(self.in_flight), num_returns=1, timeout=5.0)
                for ref in done:
                    kind, item, worker = self.in_flight.pop(ref)
                    try:
                        value = self.ray.get(ref)
                    except errors.RayTaskError as exc:  # the job's own failure: not retried
                        self._failed(kind, item, worker, _error_text(exc))
                    except errors.RayActorError as exc:  # the worker died (killed, lost node, OOM)
                        self._worker_died(kind, item, worker, exc)
                    except errors.RayError as exc:  # lost input object, crashed task: retry, worker may be fine
                        self._worker_died(kind, item, worker, exc)
                    else:
                        self._succeeded(kind, item, worker, value)
                if not self._live():
                    self._abandon("no live workers left (each died more than --retries times)")
                    break
        finally:
            self.progress.close()
            for worker in self.workers:  # free their GPUs now: a long-lived driver would keep them alive
                try:
                    self.ray.kill(worker.handle, no_restart=True)
                except Exception as exc:  # already gone
                    log.debug("batch: worker %d: %s", worker.slot, exc)
        return [w.info | {"state": w.state} for w in self.workers]

    def fits_summary(self) -> list[dict[str, Any]]:
        return [{"key": f.key, "voice": str(f.job.files["voice"].path), "status": f.status, "error": f.error,
                 "cached": f.cached, "seconds": f.seconds if f.status != "running" else None,
                 "attempts": f.attempts, "worker": f.worker} for f in self.fits.values()]

    def _succeeded(self, kind: str, item: Any, worker: _Worker, value: Any) -> None:
        if kind == "info":
            worker.info, worker.state, worker.pings = value, "idle", 0
            return
        worker.state = "idle"
        if kind == "fit":
            item.seconds = round(time.perf_counter() - item.seconds, 3)
            with atomic_path(self.refs_dir / f"{item.key}.npz") as partial:
                partial.write_bytes(value)
            item.ref, item.status = self.ray.put(value), "done"
            self._release([item.job.files["voice"].sha256])
            return
        record: _Record = item
        worker.info = value["worker"]
        worker.faces.add(record.job.files["face"].sha256)
        with atomic_path(record.output) as partial:  # never a half-written video under the final name
            partial.write_bytes(value["video"])
        report = value["report"]
        record.status, record.worker = "done", value["worker"]
        record.seconds = round(time.perf_counter() - record.started_at, 3)
        record.audio_seconds = report.get("audio_seconds")
        record.timings, record.backend = report.get("timings", {}), report.get("backend")
        record.face_track = value.get("face_track")
        self._release(self._needs(record))
        self.progress.update("done", record.audio_seconds)

    def _failed(self, kind: str, item: Any, worker: _Worker, error: str) -> None:
        if kind == "info":  # the actor could not even start (import error, missing Ray resources)
            worker.state = "dead"
            log.error("batch: worker %d failed to start: %s", worker.slot, error)
            return
        worker.state = "idle"
        if kind == "fit":
            item.status, item.error = "failed", error
            item.seconds = round(time.perf_counter() - item.seconds, 3)
            self._release([item.job.files["voice"].sha256])
            return
        item.status, item.error = "failed", error
        item.seconds = round(time.perf_counter() - item.started_at, 3)
        self._release(self._needs(item))
        self.progress.update("failed", None)
        log.warning("batch: %s failed: %s", item.job.label, error)

    def _worker_died(self, kind: str, item: Any, worker: _Worker, exc: BaseException) -> None:
        worker.state = "starting"  # Ray restarts it (max_restarts); the ping says when, or that it is gone
        if kind == "info":
            worker.pings += 1
            if isinstance(exc, self.ray.exceptions.ActorDiedError) or worker.pings > 20:
                worker.state = "dead"
                log.warning("batch: worker %d is gone: %s", worker.slot, _error_text(exc))
            else:  # unreachable for now (restarting, network): ask again
                time.sleep(1.0)
                self._ping(worker)
            return
        self._ping(worker)
        reason = f"worker {worker.slot} (pid {worker.info.get('pid')}) died: {_error_text(exc)}"
        log.warning("batch: %s", reason)
        item.avoid.add(worker.slot)
        if kind == "fit":
            item.status = "pending" if item.attempts <= self.opts.retries else "failed"
            item.error = None if item.status == "pending" else reason
            return
        record: _Record = item
        record.failures.append(reason)
        if record.attempts <= self.opts.retries:
            record.status = "pending"
            self.pending.appendleft(record)  # next free worker, another one if there is one
            self.progress.update("retry", None)
        else:
            record.status, record.error = "failed", f"{reason}; gave up after {record.attempts} attempts"
            self._release(self._needs(record))
            self.progress.update("failed", None)

    def _abandon(self, reason: str) -> None:
        for fit in self.fits.values():
            if fit.status in ("pending", "running"):
                fit.status, fit.error = "failed", reason
        for record in list(self.pending):
            record.status, record.error = "failed", reason
            self.progress.update("failed", None)
        self.pending.clear()
