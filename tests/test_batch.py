"""`digital-human batch` on Ray: job checking and content keys (no Ray), then real batches on a local
Ray with two workers (outputs, resume, a bad job, a killed worker) and on a two-node cluster on
this machine. Tiny texts and the portrait model keep the rendering short."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from digital_human.batch.jobs import Job, read_jobs

ray = pytest.importorskip("ray", reason="batch needs Ray: pip install 'ray[client]'")

TEXTS = ["Hi.", "Good day.", "Thanks.", "Bye now."]


def _write_jobs(path: Path, data_dir: Path, texts: list[str], extra: list[dict] | None = None) -> Path:
    voice = data_dir / "audio" / "spk_en_03.wav"
    face = data_dir / "image" / "face_01_female.jpg"
    lines = [{"name": f"j{i}", "text": t, "voice": str(voice), "no_imitate": True, "face": str(face), "smooth": 0}
             for i, t in enumerate(texts)]
    lines += extra or []
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


# --- the job file (driver side, no Ray) ---------------------------------------------------------
def _one(tmp_path: Path, obj: dict) -> Job:
    path = tmp_path / "jobs.jsonl"
    path.write_text(json.dumps(obj) + "\n", encoding="utf-8")
    return read_jobs(path)[0]


def test_job_keys_follow_content(tmp_path, data_dir):
    face = data_dir / "image" / "face_01_female.jpg"
    voice = data_dir / "audio" / "spk_en_03.wav"
    base = {"text": "Hello.", "voice": str(voice), "face": str(face)}
    job = _one(tmp_path, base)
    assert job.error is None and len(job.key) == 64
    assert job.options["language"] == "auto" and job.options["model"] == "portrait"  # run's defaults
    (tmp_path / "t.txt").write_text("Hello.", encoding="utf-8")
    # a text file and the same text inline, or a copy of the clip under another name: same job
    assert _one(tmp_path, {**base, "text": None, "text_file": "t.txt"}).key == job.key
    copy = tmp_path / "copy.wav"
    copy.write_bytes(voice.read_bytes())
    assert _one(tmp_path, {**base, "voice": "copy.wav"}).key == job.key
    # what changes the video changes the key
    assert _one(tmp_path, {**base, "text": "Hello!"}).key != job.key
    assert _one(tmp_path, {**base, "speed": 1.1}).key != job.key
    copy.write_bytes(voice.read_bytes()[:-2000])
    assert _one(tmp_path, {**base, "voice": "copy.wav"}).key != job.key
    assert job.voice_fit_key() == _one(tmp_path, {**base, "text": "Other."}).voice_fit_key()
    assert job.voice_fit_key() != _one(tmp_path, {**base, "no_imitate": True}).voice_fit_key()


@pytest.mark.parametrize("obj, message", [
    ({"text": "x", "voice": "missing.wav", "face": "f.jpg"}, "voice file"),
    ({"text": "x", "voice": "v.wav"}, "--face"),
    ({"text": "x", "voice": "v.wav", "face": "f.jpg", "model_": "portrait"}, "unknown field"),
    ({"text": "x", "voice": "v.wav", "face": "f.jpg", "language": "fr"}, "invalid choice"),
    ({"text": "x", "voice": "v.wav", "face": "f.jpg", "no_imitate": "yes"}, "switch"),
    ({"text": "x", "voice": "v.wav", "face": "f.jpg", "name": "../escape"}, "name"),
    ({"voice": "v.wav", "face": "f.jpg"}, "--text"),
])
def test_bad_jobs_fail_alone_with_clear_errors(tmp_path, obj, message):
    (tmp_path / "v.wav").write_bytes(b"RIFF")
    (tmp_path / "f.jpg").write_bytes(b"\xff\xd8")
    path = tmp_path / "jobs.jsonl"
    good = {"text": "x", "voice": "v.wav", "face": "f.jpg"}
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(obj) + "\nnot json\n", encoding="utf-8")
    jobs = read_jobs(path)
    assert [j.line for j in jobs] == [1, 3, 4]
    assert jobs[0].error is None
    assert jobs[1].error.startswith("line 3: ") and message in jobs[1].error
    assert "not valid JSON" in jobs[2].error


def test_face_tracks_are_aligned_once_per_worker():
    from digital_human.batch.worker import _remember_face_tracks

    calls = []

    class Module:  # the signature of cli._faces_from_file
        @staticmethod
        def _faces_from_file(timer, face, fps, backend, max_seconds, max_side=None, speech_seconds=None,
                             face_index=0):
            calls.append(face)
            return (face, fps, speech_seconds)

    counts = _remember_face_tracks(Module, "_faces_from_file", limit=3)
    faces = Module._faces_from_file
    first = faces(None, Path("/s/a.mp4"), None, "auto", 60.0, 1920, 5.0)
    assert faces(None, Path("/s/a.mp4"), None, "auto", 60.0, 1920, 3.0) is first  # shorter speech: reused
    assert faces(None, Path("/s/a.mp4"), None, "auto", 60.0, 1920, 8.0) is not first  # longer: read again
    assert faces(None, Path("/s/a.mp4"), 30.0, "auto", 60.0, 1920, 2.0)[1] == 30.0  # other fps: its own
    photo = faces(None, Path("/s/p.jpg"), None, "auto", 60.0, speech_seconds=2.0)
    assert faces(None, Path("/s/p.jpg"), None, "auto", 60.0, speech_seconds=9.0) is photo  # a photo: any length
    faces(None, Path("/s/b.jpg"), None, "auto", 60.0, speech_seconds=1.0)  # evicts the least recently used
    assert counts() == {"aligned": 5, "reused": 2} and len(calls) == 5
    faces(None, Path("/s/a.mp4"), None, "auto", 60.0, 1920, 1.0)  # a.mp4@None-fps was evicted
    assert counts()["aligned"] == 6


# --- real batches -----------------------------------------------------------------------------
def _mp4s(out: Path) -> list[Path]:
    return sorted(out.glob("*.mp4"))


def _check_videos(report: dict, out: Path, names: list[str]) -> None:
    from digital_human.media.probe import probe_media

    done = {j["name"]: j for j in report["jobs"] if j["status"] == "done"}
    assert sorted(done) == sorted(names), report["jobs"]
    for job in done.values():
        probe = probe_media(Path(job["output"]))
        assert probe.has_audio and probe.video_duration > 0.3 and job["audio_seconds"] > 0.3
        assert abs(probe.audio_duration - job["audio_seconds"]) < 0.2
    assert not list(out.glob(".*partial*")), "a temporary file was left behind"


@pytest.fixture
def local_ray(tmp_path, monkeypatch):
    """A local Ray of 2 CPUs with a small object store (`ray start --head`, joined by run_batch)."""
    with _ray_nodes(tmp_path, monkeypatch, [2]):
        yield


def test_local_batch_bad_job_killed_worker_and_resume(tmp_path, data_dir, setup_models, local_ray):
    from digital_human.batch.driver import BatchOptions, run_batch

    jobs = _write_jobs(tmp_path / "jobs.jsonl", data_dir, TEXTS,
                       extra=[{"name": "missing", "text": "x", "voice": "nowhere.wav",
                               "face": str(data_dir / "image" / "face_01_female.jpg")}])
    out = tmp_path / "out"
    killed: list[dict] = []

    def kill_first_worker(job: dict, worker: dict) -> None:
        # kill the first job's worker process while it renders (the job takes seconds; 1.5 s in)
        if not killed:
            killed.append({"job": job["name"], "pid": worker["pid"], "slot": worker["slot"]})
            threading.Timer(1.5, os.kill, (worker["pid"], signal.SIGKILL)).start()

    report = run_batch(BatchOptions(jobs, out, workers=2, retries=2, on_dispatch=kill_first_worker))
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(report, default=str))
    _check_videos(report, out, [f"j{i}" for i in range(len(TEXTS))])
    assert len(_mp4s(out)) == len(TEXTS)  # every job once
    by_name = {j["name"]: j for j in report["jobs"]}
    # the missing clip failed alone, with the file named
    assert by_name["missing"]["status"] == "failed" and "nowhere.wav" in by_name["missing"]["error"]
    assert report["ok"] is False and report["counts"] == {"done": len(TEXTS), "failed": 1}
    # the killed worker's job was run again (elsewhere when possible) and finished once
    retried = [j for j in report["jobs"] if j["worker_failures"]]
    assert retried and all(j["status"] == "done" and j["attempts"] == 2 for j in retried), report["jobs"]
    assert f"pid {killed[0]['pid']}" in retried[0]["worker_failures"][0]
    assert retried[0]["worker"]["pid"] != killed[0]["pid"]
    # one voice fit for the four jobs sharing the clip
    assert len(report["voice_fits"]) == 1 and report["voice_fits"][0]["status"] == "done"
    assert {w["slot"] for w in report["workers"]} == {0, 1}
    _assert_gone([w["pid"] for w in report["workers"]])

    stamps = {p.name: p.stat().st_mtime_ns for p in _mp4s(out)}
    again = run_batch(BatchOptions(jobs, out, workers=2))
    assert [j["status"] for j in again["jobs"]] == ["skipped"] * len(TEXTS) + ["failed"]
    assert again["workers"] == [] and {p.name: p.stat().st_mtime_ns for p in _mp4s(out)} == stamps


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}")
        for host in ("127.0.0.1", socket.gethostbyname(socket.gethostname())):
            try:
                with socket.create_connection((host, port), timeout=1):
                    return
            except OSError:
                pass
        time.sleep(1)
    raise TimeoutError(f"Ray head did not open port {port} in {seconds:.0f} s")


@contextlib.contextmanager
def _ray_nodes(tmp_path: Path, monkeypatch, cpus: list[int]):
    """A head node plus len(cpus)-1 more on this machine (own temp dirs), each a `ray start --block`
    child of this test, joined by this process. Teardown stops exactly these (SIGTERM: Ray drains and
    stops the node's processes) rather than every Ray process of the user (`ray stop`)."""
    ray_cli = Path(sys.executable).with_name("ray")
    ray_cli = str(ray_cli) if ray_cli.exists() else "ray"
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the driver (this process) joins without a token
    port = _free_port()
    procs: list[subprocess.Popen] = []
    logs = [open(tmp_path / f"node{i}.log", "wb") for i in range(len(cpus))]
    # Ray's socket paths live under --temp-dir and must stay under 107 bytes: short folders in /tmp
    temp_dirs = [tempfile.mkdtemp(prefix="dhray") for _ in cpus]
    try:
        for i, n in enumerate(cpus):
            common = ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", str(n), "--num-gpus", "0",
                      "--object-store-memory", str(100 << 20), "--disable-usage-stats", "--temp-dir", temp_dirs[i]]
            role = (["--head", "--port", str(port), "--include-dashboard", "false", "--ray-client-server-port",
                     str(_free_port())] if i == 0 else ["--address", f"127.0.0.1:{port}"])
            procs.append(subprocess.Popen([ray_cli, "start", *role, *common], env=env, stdout=logs[i],
                                          stderr=subprocess.STDOUT))
            if i == 0:
                _wait_port(port, procs[0], 180)
        deadline = time.monotonic() + 180
        while True:  # the GCS port opens before the head node has registered: join once it has
            try:
                ray.init(address=f"127.0.0.1:{port}", log_to_driver=False)
                break
            except ConnectionError:
                if time.monotonic() > deadline or procs[0].poll() is not None:
                    raise
                time.sleep(2)
        while sum(n["Alive"] for n in ray.nodes()) < len(cpus):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("nodes did not join: " + (tmp_path / "node1.log").read_text()[-2000:])
            time.sleep(1)
        yield
    finally:
        ray.shutdown()
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs:
            log.close()
        for folder in temp_dirs:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def two_node_cluster(tmp_path, monkeypatch):
    """Head + one more node on this machine, 1 CPU each."""
    with _ray_nodes(tmp_path, monkeypatch, [1, 1]):
        yield


def test_two_node_cluster(tmp_path, data_dir, setup_models, two_node_cluster):
    from digital_human.batch.driver import BatchOptions, run_batch

    jobs = _write_jobs(tmp_path / "jobs.jsonl", data_dir, TEXTS[:3])
    out = tmp_path / "out"
    report = run_batch(BatchOptions(jobs, out, address="auto"))
    assert report["ok"], report["jobs"]
    _check_videos(report, out, ["j0", "j1", "j2"])
    # one worker per node (1 CPU each), each on its own node
    assert len({w["node_id"] for w in report["workers"]}) == 2
    _assert_gone([w["pid"] for w in report["workers"]])


def _assert_gone(pids: list[int], seconds: float = 60.0) -> None:
    """run_batch ends its workers: their processes exit (or this test kills the leftovers and fails)."""
    deadline = time.monotonic() + seconds
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if Path(f"/proc/{p}").exists() and "zombie" not in _state(p)]
        time.sleep(0.5)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"worker processes {alive} still running after the batch"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].split("\n", 1)[0].lower()
    except (OSError, IndexError):
        return "zombie"
