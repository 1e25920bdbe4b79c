"""Connecting to Ray: a local instance kept small, or an existing cluster; and the worker pool's size."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..ray_env import connect_ray, worker_env  # noqa: F401 - worker_env: driver.py imports it from here

log = logging.getLogger("digital_human.batch")


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeError("batch needs Ray: pip install 'comfyui-digital-human[batch]' (or pip install "
                           "'ray[client]'), on the driver and on every node of the cluster") from None
    return ray


def connect(address: str | None, object_store_mb: int, num_cpus: float | None) -> bool:
    """Start (address None) or join a Ray cluster. Returns True when this process started it."""
    import_ray()  # the batch's own message when Ray is missing
    return connect_ray(address, object_store_mb, num_cpus, command="batch")


@dataclass(frozen=True)
class PoolShape:
    workers: int
    cpus: float
    gpus: float


def pool_shape(resources: dict[str, float], jobs: int, workers: int | None, gpus_per_job: float | None,
               cpus_per_worker: float) -> PoolShape:
    """One worker per `gpus_per_job` GPUs (default 1 when the cluster has GPUs), else one per
    `cpus_per_worker` CPUs; never more workers than jobs."""
    gpus = float(resources.get("GPU", 0.0))
    cpus = float(resources.get("CPU", 0.0))
    if gpus_per_job is None:
        gpus_per_job = 1.0 if gpus >= 1 else 0.0
    if gpus_per_job < 0 or cpus_per_worker <= 0:
        raise ValueError("--gpus-per-job must be >= 0 and --cpus-per-worker > 0")
    if gpus_per_job > 0:
        if gpus < gpus_per_job:
            raise ValueError(f"--gpus-per-job {gpus_per_job:g} but the Ray cluster has {gpus:g} GPU(s); "
                             "use --gpus-per-job 0 for CPU workers or join a cluster with GPUs (--address)")
        fit = int(gpus // gpus_per_job)
        per_cpu = min(cpus_per_worker, max(cpus / max(fit, 1), 0.0))
    else:
        if cpus < cpus_per_worker:
            raise ValueError(f"--cpus-per-worker {cpus_per_worker:g} but the Ray cluster has {cpus:g} CPU(s)")
        fit = int(cpus // cpus_per_worker)
        per_cpu = cpus_per_worker
    count = workers if workers else fit
    if workers and workers > fit:
        log.warning("batch: %d workers asked for, the cluster has room for %d now; the rest wait for "
                    "resources (an autoscaling cluster adds nodes)", workers, fit)
    return PoolShape(workers=max(1, min(count, jobs)), cpus=per_cpu, gpus=float(gpus_per_job))
