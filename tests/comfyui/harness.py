"""Drive a real ComfyUI server on loopback: start/stop, upload, queue, wait, websocket events.

Used by the pytest fixtures in this folder and by tools/export_workflows.py. Only the standard
library plus `websocket-client` (Apache-2.0); every wait is bounded by a timeout.

The server runs from COMFYUI_DIR with `--base-directory` pointing at a scratch folder whose
custom_nodes/ holds only this pack (a symlink to the checkout), so the user's own ComfyUI folders
and other custom nodes are never touched or loaded.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

PACK_ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = PACK_ROOT / "workflows"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"  # git-ignored: logs, outputs, screenshots
PACK_NAME = "digital_human"
LOOPBACK = "127.0.0.1"
UI_TEMPLATES = PACK_ROOT / "example_workflows"
# The template browser of ComfyUI 0.3.64 (frontend 1.27) shows a custom node's template by its file name:
# the card title is the file stem and the description the stem with '-'/'_' as spaces (there is no
# metadata file for custom-node templates). So each UI export is named by its card title; the API file
# keeps the short name. API stem -> UI file stem.
TEMPLATE_TITLES = {
    "voice_only": "Voice clone - text to speech in the voice of a clip",
    "clone_from_photo": "Talking photo - a photo and a voice clip to a lip-synced video",
    "clone_from_photo_fast": "Talking photo fast - one node from the face to the MP4",
    "clone_from_video": "Clone from video - train a clone of a talking person",
    "lipsync_video_musetalk": "Lip-sync a video with MuseTalk 1.5 - needs your MuseTalk files",
    "voice_clone_cosyvoice": "Voice clone with CosyVoice 2 - needs your CosyVoice files",
    "lipsync_video_wav2lip": "Lip-sync a video with Wav2Lip - needs your Wav2Lip checkpoint",
    "talking_photo_sonic": "Talking photo with Sonic - needs your Sonic files (non-commercial)",
    "voice_clone_cosyvoice3": "Voice clone with CosyVoice 3 - needs your Fun-CosyVoice3 files",
    "lipsync_video_latentsync": "Lip-sync a video with LatentSync - needs your LatentSync files",
}
# Workflows that run the user's own checkpoints (nothing is downloaded): without the files they are refused
# when queued, naming the missing files; test_comfyui_musetalk.py / test_comfyui_cosyvoice.py run them against
# a random-weight release laid out like the real one.
USER_FILES_WORKFLOWS = {"lipsync_video_musetalk": "musetalk", "voice_clone_cosyvoice": "cosyvoice",
                        "lipsync_video_wav2lip": "wav2lip",
                        "talking_photo_sonic": "sonic",
                        "voice_clone_cosyvoice3": "cosyvoice",
                        "lipsync_video_latentsync": "latentsync"}


def ui_template(api_name: str) -> Path:
    """example_workflows/<card title>.json for workflows/api/<api_name>.json."""
    return UI_TEMPLATES / f"{TEMPLATE_TITLES.get(api_name, api_name)}.json"


def api_workflow(ui_path: Path) -> Path:
    """workflows/api/<name>.json for a UI template file (inverse of ui_template)."""
    by_title = {title: name for name, title in TEMPLATE_TITLES.items()}
    return WORKFLOWS / "api" / f"{by_title.get(ui_path.stem, ui_path.stem)}.json"


class ComfyError(RuntimeError):
    """The server answered with an error (HTTP status >= 400) or a prompt failed."""

    def __init__(self, message: str, status: int = 0, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def free_port() -> int:
    """A currently free TCP port on loopback (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def prepare_base_dir(base: Path, comfy_dir: Path, models_dir: Path | None = None) -> Path:
    """Scratch ComfyUI base folder: custom_nodes/<pack> -> this checkout, fresh input/output/temp/user.

    models/ points at the checkout's models folder unless `models_dir` is given, so ComfyUI's own
    model folders (and models/digital_human, when the pack's setup wrote there) stay usable.
    """
    base.mkdir(parents=True, exist_ok=True)
    (base / "custom_nodes").mkdir(exist_ok=True)
    link = base / "custom_nodes" / PACK_NAME
    if not link.exists():
        link.symlink_to(PACK_ROOT, target_is_directory=True)
    for name in ("input", "output", "temp", "user"):
        (base / name).mkdir(exist_ok=True)
    models = base / "models"
    if not models.exists():
        models.symlink_to(models_dir or (comfy_dir / "models"), target_is_directory=True)
    return base


@contextlib.contextmanager
def server_with_user_files(comfy_dir: Path, models_root: Path, scratch: Callable[[str], Path], folder: str,
                           write: Callable[[Path], Any], python: str | None = None,
                           env: dict[str, str] | None = None) -> Iterator["ComfyServer"]:
    """A second ComfyUI whose models folder is the setup's (linked entry by entry, the voice cache included)
    plus `write(root)`'s user files under `folder` (a release laid out like the real one, random weights).
    scratch: makes a fresh temporary folder from a name (pytest's tmp_path_factory.mktemp).
    env: more environment for the server (a model's documented settings, e.g. fewer diffusion steps)."""
    root = scratch(f"{folder}-models")
    for entry in models_root.iterdir():
        if entry.name != folder:
            (root / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    write(root)
    base = prepare_base_dir(scratch(f"comfy-base-{folder}"), comfy_dir)
    server = ComfyServer(comfy_dir, base, python=python or os.environ.get("COMFYUI_PYTHON", sys.executable),
                         log_path=ARTIFACTS / f"comfyui-server-{folder}.log",
                         env={**(env or {}), "DIGITAL_HUMAN_MODELS": str(root)})
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class ComfyServer:
    """One ComfyUI process (`main.py --cpu`) listening on 127.0.0.1:<port>."""

    comfy_dir: Path
    base_dir: Path
    python: str = sys.executable
    port: int = 0
    log_path: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    _log_handle: Any = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, timeout: float = 600.0) -> "ComfyServer":  # a bound: start-up took > 4 min on the busy CPU
        main = Path(self.comfy_dir) / "main.py"
        if not main.is_file():
            raise FileNotFoundError(f"COMFYUI_DIR={self.comfy_dir} has no main.py; point it at a ComfyUI checkout")
        self.port = self.port or free_port()
        args = [self.python, str(main), "--cpu", "--listen", LOOPBACK, "--port", str(self.port),
                "--base-directory", str(self.base_dir), "--database-url", "sqlite:///:memory:",
                "--disable-auto-launch", *self.extra_args]
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        self.log_path = self.log_path or (Path(self.base_dir) / "comfyui.log")
        self._log_handle = open(self.log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen(args, cwd=str(self.comfy_dir), env=env, stdout=self._log_handle,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ComfyError(f"ComfyUI exited with code {self.proc.returncode} during start-up; "
                                 f"log: {self.log_path}\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/system_stats", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise ComfyError(f"ComfyUI did not answer on {self.url} within {timeout:.0f} s; log: {self.log_path}")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (then SIGKILL) our own process group: the server and anything it spawned."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=timeout)
            except ProcessLookupError:
                pass
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None

    def log_tail(self, chars: int = 4000) -> str:
        if self.log_path is None or not Path(self.log_path).is_file():
            return ""
        return Path(self.log_path).read_text(encoding="utf-8", errors="replace")[-chars:]


class ComfyClient:
    """HTTP + websocket client for one server; one client_id for every prompt it queues."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.client_id = uuid.uuid4().hex
        self.events = EventLog()
        self._ws: Any = None
        self._ws_thread: threading.Thread | None = None

    # --- HTTP -------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                raw: bytes | None = None) -> Any:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        hdrs = dict(headers or {})
        if body is not None and raw is None:
            hdrs.setdefault("Content-Type", "application/json")
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                payload = resp.read()
                kind = resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            payload = exc.read()
            try:
                parsed: Any = json.loads(payload)
            except ValueError:
                parsed = payload.decode(errors="replace")
            raise ComfyError(f"{method} {path} -> HTTP {exc.code}: {str(parsed)[:2000]}", exc.code, parsed) from None
        if "json" in kind:
            return json.loads(payload)
        return payload

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def object_info(self, node_type: str | None = None) -> dict[str, Any]:
        return self.get("/object_info" + (f"/{urllib.parse.quote(node_type)}" if node_type else ""))

    def upload(self, path: Path, name: str | None = None, subfolder: str = "", overwrite: bool = True) -> str:
        """POST /upload/image (ComfyUI's upload route takes any file type); returns the name to use in prompts."""
        boundary = uuid.uuid4().hex
        fields = {"type": "input", "subfolder": subfolder, "overwrite": "true" if overwrite else "false"}
        parts = []
        for key, value in fields.items():
            parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{value}\r\n'.encode())
        filename = name or Path(path).name
        parts.append((f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{filename}"\r\n'
                      "Content-Type: application/octet-stream\r\n\r\n").encode() + Path(path).read_bytes() + b"\r\n")
        parts.append(f"--{boundary}--\r\n".encode())
        answer = self.request("POST", "/upload/image", raw=b"".join(parts),
                              headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        return f"{answer['subfolder']}/{answer['name']}" if answer.get("subfolder") else answer["name"]

    def queue(self, prompt: dict[str, Any]) -> str:
        """POST /prompt; returns prompt_id. Raises ComfyError (with .body = node_errors) on HTTP 400."""
        answer = self.request("POST", "/prompt", {"prompt": prompt, "client_id": self.client_id})
        if answer.get("node_errors"):
            raise ComfyError(f"node errors: {answer['node_errors']}", 200, answer)
        return answer["prompt_id"]

    def history(self, prompt_id: str) -> dict[str, Any] | None:
        return self.get(f"/history/{prompt_id}").get(prompt_id)

    def wait(self, prompt_id: str, timeout: float = 300.0, poll: float = 0.5) -> dict[str, Any]:
        """Poll /history until the prompt finished (success or error); bounded by `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            entry = self.history(prompt_id)
            if entry and entry.get("status", {}).get("completed") is not None and (
                    entry["status"].get("completed") or entry["status"].get("status_str") == "error"):
                return entry
            time.sleep(poll)
        raise TimeoutError(f"prompt {prompt_id} not finished after {timeout:.0f} s")

    def run(self, prompt: dict[str, Any], timeout: float = 300.0) -> tuple[str, dict[str, Any]]:
        prompt_id = self.queue(prompt)
        return prompt_id, self.wait(prompt_id, timeout)

    def interrupt(self) -> None:
        self.request("POST", "/interrupt", {})

    def view(self, item: dict[str, str]) -> bytes:
        query = urllib.parse.urlencode({"filename": item["filename"], "subfolder": item.get("subfolder", ""),
                                        "type": item.get("type", "output")})
        return self.request("GET", f"/view?{query}")

    # --- websocket ----------------------------------------------------------------------------
    def connect_ws(self, timeout: float = 15.0) -> None:
        """Listen on /ws?clientId=... in a daemon thread; every JSON message goes to self.events."""
        import websocket  # websocket-client

        ws_url = self.url.replace("http://", "ws://") + f"/ws?clientId={self.client_id}"
        self._ws = websocket.create_connection(ws_url, timeout=timeout)
        self._ws.settimeout(1.0)

        def pump() -> None:
            while self._ws is not None:
                try:
                    message = self._ws.recv()
                except websocket.WebSocketTimeoutException:
                    continue
                except (websocket.WebSocketException, OSError):
                    return
                if isinstance(message, str):
                    try:
                        self.events.add(json.loads(message))
                    except ValueError:
                        continue

        self._ws_thread = threading.Thread(target=pump, name="comfy-ws", daemon=True)
        self._ws_thread.start()

    def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            ws.close()
        if self._ws_thread is not None:
            self._ws_thread.join(timeout=5)


class EventLog:
    """Thread-safe list of websocket messages with a bounded wait for a matching one."""

    def __init__(self) -> None:
        self._items: list[dict[str, Any]] = []
        self._cond = threading.Condition()

    def add(self, message: dict[str, Any]) -> None:
        with self._cond:
            self._items.append(message)
            self._cond.notify_all()

    def of(self, prompt_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        with self._cond:
            return [m for m in self._items if (m.get("data") or {}).get("prompt_id") == prompt_id
                    and (kind is None or m.get("type") == kind)]

    def wait_for(self, prompt_id: str, kind: str, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [m for m in self._items if m.get("type") == kind
                         and (m.get("data") or {}).get("prompt_id") == prompt_id]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no '{kind}' websocket message for prompt {prompt_id} in {timeout:.0f} s")
                self._cond.wait(timeout=min(left, 1.0))


def load_api_workflow(path: Path, inputs: dict[str, str] | None = None) -> dict[str, Any]:
    """An API-format workflow, as shipped or with some file inputs replaced.

    `inputs` maps an input name (e.g. "audio_file", "image", "video") to the uploaded file name; each
    must match at least one node, so a renamed widget is caught rather than silently ignored.
    """
    prompt = json.loads(Path(path).read_text(encoding="utf-8"))
    prompt.pop("_meta_workflow", None)
    for name, value in (inputs or {}).items():
        # Only widget values: FaceAlign's `image` input, say, is a link ([node, slot]) and stays one.
        hits = [node for node in prompt.values() if isinstance(node, dict)
                and isinstance(node.get("inputs", {}).get(name), str)]
        if not hits:
            raise KeyError(f"{path.name}: no node has an input named '{name}'")
        for node in hits:
            node["inputs"][name] = value
    return prompt


def node_errors_text(entry: dict[str, Any]) -> str:
    """The execution_error message of a finished /history entry ('' when none)."""
    for kind, data in entry.get("status", {}).get("messages", []):
        if kind == "execution_error":
            return f"{data.get('node_type')}#{data.get('node_id')}: {data.get('exception_message')}"
    return ""
