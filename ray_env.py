"""Ray plumbing shared by `batch` (batch/) and the live fleet (pipeline/live/fleet.py), which must not import
each other: starting or joining a cluster, a folder from which `import digital_human` finds this copy of the
pack, and the environment that points the workers at it and at the models. Ray itself is imported only inside
the functions that need it (an optional extra)."""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

PASSED_ENV = ("DIGITAL_HUMAN_MODELS", "DIGITAL_HUMAN_FRAME_THREADS", "DIGITAL_HUMAN_BATCH_STORE")


def package_path() -> str:
    """A folder from which `import digital_human` finds this very copy of the pack (the repository
    root is the package but need not be named digital_human, e.g. ComfyUI's custom_nodes/<pack>)."""
    root = Path(__file__).resolve().parent
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


def connect_ray(address: str | None, object_store_mb: int, num_cpus: float | None, command: str) -> bool:
    """Start (address None) or join a Ray cluster. Returns True when this process started it."""
    import ray

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
                                   f"{command} with --address auto") from exc
            raise
        return True
    if not (address == "auto" or address.startswith("ray://") or ":" in address):
        raise ValueError(f"--address must be auto, ray://HOST:PORT or HOST:PORT, got '{address}'")
    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    return False
