"""The batch worker: a Ray actor that runs `run` jobs in one long-lived process.

Models load on the first job and stay loaded (the engine loader keeps them per process), so every
later job on the same worker starts warm. Input files arrive as bytes through Ray's object store
(no shared file system needed) and are kept on the node under their content hash; the finished
MP4 goes back the same way and the driver writes it. A face track is aligned once per worker and
reference (in memory; see `_remember_face_tracks`), a voice fit once per batch (driver's job).
"""
from __future__ import annotations

import contextlib
import inspect
import os
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Iterator

from ..atomic_file import atomic_path
from .jobs import Job

FACE_TRACKS_KEPT = 2  # a video's track holds its frames: keep few


def node_store(kind: str) -> Path:
    """Per-node folder for inputs kept by content hash (shared by the workers of one node)."""
    root = os.environ.get("DIGITAL_HUMAN_BATCH_STORE") or os.path.join(tempfile.gettempdir(),
                                                                      f"digital-human-batch-{os.getuid()}")
    path = Path(root) / kind
    path.mkdir(parents=True, exist_ok=True)
    return path


def materialise(key: str, name: str, data: bytes | memoryview) -> Path:
    """The file `name` with contents `data` (sha256 `key`) on this node; written once, atomically.
    The original name is kept (decoders look at the extension; the speaker is named after its clip)."""
    path = node_store("inputs") / key / Path(name).name
    if path.is_file() and path.stat().st_size == len(data):
        return path
    with atomic_path(path) as partial:
        partial.write_bytes(data)
    return path


def _remember_face_tracks(module: Any, attribute: str, limit: int) -> Callable[[], dict[str, int]]:
    """Wrap `module.attribute` (the main job's face file -> aligned track step) with an LRU memo keyed by its
    arguments. Input files are stored under their content hash, so the same path means the same
    bytes. A video's track read for a longer speech also serves a shorter one (the output only uses
    frames up to its own length); a photo's track serves any. Returns a counter reader.
    Why a wrapper: `run` stays the one code path, the batch only remembers its result."""
    from ..media.frame_source import is_photo

    original = getattr(module, attribute)
    signature = inspect.signature(original)
    memo: OrderedDict[Any, tuple[float | None, Any]] = OrderedDict()
    counts = {"aligned": 0, "reused": 0}

    def faces_from_file(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        params = {k: v for k, v in bound.arguments.items() if k != "timer"}
        speech = params.pop("speech_seconds", None)
        if "face" in params and is_photo(Path(params["face"])):
            speech = None
        key = tuple(sorted((k, str(v)) for k, v in params.items()))
        entry = memo.get(key)
        if entry is not None and (entry[0] is None or (speech is not None and speech <= entry[0])):
            memo.move_to_end(key)
            counts["reused"] += 1
            return entry[1]
        value = original(*args, **kwargs)
        counts["aligned"] += 1
        memo[key] = (speech, value)
        memo.move_to_end(key)
        while len(memo) > limit:
            memo.popitem(last=False)
        return value

    setattr(module, attribute, faces_from_file)
    return lambda: dict(counts)


@contextlib.contextmanager
def _stopping_the_worker() -> Iterator[None]:
    """SIGTERM during a job (Ray stopping the node, a cluster scaling down) unwinds the job like Ctrl-C,
    so its partial files are removed (stop_signals.py); then the worker exits as Ray's own SIGTERM
    handling would end it, and the driver re-runs the job elsewhere."""
    from ..stop_signals import Stopped, exit_code, stop_on_signals

    try:
        with stop_on_signals():
            yield
    except Stopped as stop:
        raise SystemExit(exit_code(stop)) from None


class Renderer:
    """One worker: `render` runs a job exactly as `digital-human run` would and returns the MP4 bytes."""

    def __init__(self, slot: int) -> None:
        from ..media.heap import bound_heap_growth
        from ..pipeline import main_job

        bound_heap_growth()  # a worker renders video after video: keep its heap flat (media/heap.py)
        self.slot = slot
        self.jobs_run = 0
        self._face_counts = _remember_face_tracks(main_job, "_faces_from_file", FACE_TRACKS_KEPT)
        self._work = Path(tempfile.mkdtemp(prefix="dh-batch-", dir=node_store("work")))

    def info(self) -> dict[str, Any]:
        import ray

        context = ray.get_runtime_context()
        return {"slot": self.slot, "pid": os.getpid(), "node_ip": ray.util.get_node_ip_address(),
                "node_id": context.get_node_id()[:12], "gpus": [str(g) for g in ray.get_gpu_ids()],
                "jobs_run": self.jobs_run}

    def fit_voice(self, job: Job, clip: bytes) -> bytes:
        """The voice fit of `job`'s clip (what `run --voice` computes) as a saved speaker (.npz bytes)."""
        from ..pipeline.main_job import StageTimer, _speaker_from_clip
        from ..pipeline.run_args import parse_run_args

        voice = job.files["voice"]
        clip_path = materialise(voice.sha256, voice.name, clip)
        # `run`'s parser fills the fit options' defaults; the fit never reads the face (placeholder)
        args = parse_run_args(job.run_argv({"voice": clip_path, "face": clip_path}, self._work / "unused.mp4"))
        out = self._work / f"{voice.sha256}.npz"
        with _stopping_the_worker():
            speaker, _ = _speaker_from_clip(StageTimer(), args)
            speaker.save_npz(out)
        try:
            return out.read_bytes()
        finally:
            out.unlink(missing_ok=True)

    def render(self, job: Job, speaker_key: str, speaker: bytes, face: bytes) -> dict[str, Any]:
        """Run `job` with the saved speaker `speaker` (its own .npz, or the shared voice fit stored
        under `speaker_key`) and the face file's bytes. Returns the MP4 bytes and `run`'s report."""
        from ..pipeline.main_job import run_job

        started = time.perf_counter()
        own = job.files.get("speaker")
        speaker_name = own.name if own else f"{Path(job.files['voice'].name).stem}.npz"
        paths = {"speaker": materialise(speaker_key, speaker_name, speaker),
                 "face": materialise(job.files["face"].sha256, job.files["face"].name, face)}
        out = self._work / job.output_name()
        before = self._face_counts()
        try:
            with _stopping_the_worker():
                report = run_job(job.run_argv(paths, out))
            video = out.read_bytes()
        finally:
            out.unlink(missing_ok=True)
        self.jobs_run += 1
        after = self._face_counts()
        return {"video": video, "report": report, "seconds": round(time.perf_counter() - started, 3),
                "face_track": "reused" if after["reused"] > before["reused"] else "aligned",
                "worker": self.info()}
