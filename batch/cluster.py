"""Connecting to Ray: a local instance kept small, or an existing cluster; and the worker pool's size."""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("digital_human.batch")

PASSED_ENV = ("DIGITAL_HUMAN_MODELS", "DIGITAL_HUMAN_FRAME_THREADS", "DIGITAL_HUMAN_BATCH_STORE")


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeError("batch needs Ray: pip install 'comfyui-digital-human[batch]' (or pip install "
                           "'ray[client]'), on the driver and on every node of the cluster") from None
    return ray


def package_path() -> str:
    """A folder from which `import digital_human` finds this very copy of the pack (the repository
    root is the package but need not be named digital_human, e.g. ComfyUI's custom_nodes/<pack>)."""
    root = Path(__file__).resolve().parents[1]
    if root.name == "digital_human":
        return str(root.parent)
    link_dir = Path(tempfile.gettempdir()) / f"digital-human-batch-{os.getuid()}" / "pythonpath" / \
        hashlib.sha256(str(root).encode()).hexdigest()[:16]
    link = link_dir / "digital_human"
    link_dir.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink() or link.resolve() != root:
        tmp = link_dir / f".link-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(root, target_is_directory=True)
        os.replace(tmp, link)  # atomic: a concurrent batch never sees a missing link
    return str(link_dir)


def worker_env(same_machine: bool, cpus_per_worker: float, gpu: bool) -> dict[str, str]:
    """Environment for the workers. On this machine (local instance, or `auto`) they import this
    copy of the pack and see the same models folder; a remote cluster has its own installation."""
    env: dict[str, str] = {}
    if same_machine:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_path(), os.environ.get("PYTHONPATH", "")) if p)
        env.update({k: os.environ[k] for k in PASSED_ENV if k in os.environ})
    if not gpu and "DIGITAL_HUMAN_FRAME_THREADS" not in env:
        env["DIGITAL_HUMAN_FRAME_THREADS"] = str(max(1, int(cpus_per_worker)))  # workers share the cores
    return env


def connect(address: str | None, object_store_mb: int, num_cpus: float | None) -> bool:
    """Start (address None) or join a Ray cluster. Returns True when this process started it."""
    ray = import_ray()
    if ray.is_initialized():  # called from a program that already joined a cluster: use that one
        return False
    if address is None:
        # "local": never attach to a cluster someone else started on this machine.
        try:
            ray.init(address="local", num_cpus=None if num_cpus is None else int(num_cpus),
                     object_store_memory=int(object_store_mb) << 20, include_dashboard=False,
                     log_to_driver=False, logging_level=logging.WARNING)
        except Exception as exc:
            if "timed out during startup" in str(exc):  # Ray gives a new node a fixed 30 s to register
                raise RuntimeError("the local Ray node did not start within Ray's fixed 30 s (is this machine "
                                   "overloaded?); start one with `ray start --head --num-cpus N` and run the "
                                   "batch with --address auto") from exc
            raise
        return True
    if not (address == "auto" or address.startswith("ray://") or ":" in address):
        raise ValueError(f"--address must be auto, ray://HOST:PORT or HOST:PORT, got '{address}'")
    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    return False


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
