"""The few ComfyUI services nodes use, with stand-ins that work in the CLI and in tests.

Inside ComfyUI: `comfy.utils.ProgressBar` (its hook also raises when the user presses Cancel) and
`folder_paths` for the input/output folders. Outside: progress is logged and the folders come from
arguments, so the same node code runs headless (`digital-human ...`).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..paths import resolve_inside

log = logging.getLogger("digital_human")


def in_comfyui() -> bool:
    try:
        import folder_paths  # type: ignore[import-not-found]  # noqa: F401
        import comfy.utils  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return False
    return True


_console = False  # the CLI turns this on: a bar on stderr instead of log lines (when stderr is a terminal)


def enable_console_progress(enabled: bool = True) -> None:
    """Draw Progress as a one-line bar on stderr outside ComfyUI (the CLI calls this)."""
    global _console
    _console = enabled


class Progress:
    """Progress for one long step: ComfyUI's bar in the UI, a stderr bar in the CLI on a terminal,
    a log line every 10% elsewhere."""

    def __init__(self, total: int, label: str) -> None:
        self.total = max(1, int(total))
        self.label = label
        self.done = 0
        self._last_logged = -1
        self._bar: Any = None
        self._start = time.monotonic()
        if in_comfyui():
            import comfy.utils  # type: ignore[import-not-found]

            self._bar = comfy.utils.ProgressBar(self.total)

    def update(self, steps: int = 1) -> None:
        self.done = min(self.total, self.done + steps)
        check_interrupted()
        if self._bar is not None:
            self._bar.update_absolute(self.done, self.total)
            return
        if _console and sys.stderr.isatty():
            self._draw()
            return
        decile = int(10 * self.done / self.total)
        if decile != self._last_logged:
            self._last_logged = decile
            log.info("%s: %d/%d", self.label, self.done, self.total)


    def _draw(self) -> None:
        width = 30
        filled = int(width * self.done / self.total)
        end = "\n" if self.done >= self.total else ""
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                         f"{time.monotonic() - self._start:.0f} s{end}")
        sys.stderr.flush()


def check_interrupted() -> None:
    """Raise ComfyUI's interruption exception when the user cancelled the prompt (no-op elsewhere)."""
    try:
        import comfy.model_management as mm  # type: ignore[import-not-found]
    except ImportError:
        return
    mm.throw_exception_if_processing_interrupted()


def interrupted() -> bool:
    """True once the user cancelled the prompt: for loops that take a `should_stop` callable."""
    try:
        check_interrupted()
    except Exception:  # ComfyUI raises its InterruptProcessingException
        return True
    return False


def input_directory() -> Path:
    if in_comfyui():
        import folder_paths  # type: ignore[import-not-found]

        return Path(folder_paths.get_input_directory())
    return Path(os.environ.get("DIGITAL_HUMAN_INPUT_DIR", Path.cwd()))


def output_directory() -> Path:
    if in_comfyui():
        import folder_paths  # type: ignore[import-not-found]

        return Path(folder_paths.get_output_directory())
    return Path(os.environ.get("DIGITAL_HUMAN_OUTPUT_DIR", Path.cwd() / "output"))


def temp_directory() -> Path:
    if in_comfyui():
        import folder_paths  # type: ignore[import-not-found]

        return Path(folder_paths.get_temp_directory())
    return output_directory() / "temp"


def list_input_files(extensions: tuple[str, ...]) -> list[str]:
    """File names (relative to the input folder) with one of `extensions`, for a combo widget."""
    if not in_comfyui() and "DIGITAL_HUMAN_INPUT_DIR" not in os.environ:
        return []  # stand-alone: files are given as paths, never listed from the working directory
    root = input_directory()
    if not root.is_dir():
        return []
    names = [str(p.relative_to(root)) for p in root.rglob("*")
             if p.is_file() and p.suffix.lower() in extensions and "clipspace" not in p.parts]
    return sorted(names)


def resolve_input_file(name: str, what: str) -> Path:
    """A user-chosen input file, confined to ComfyUI's input folder (absolute/../ names refused).

    In the stand-alone CLI the user types real paths on their own machine, so those are allowed there.
    """
    if not name or not str(name).strip():
        raise ValueError(f"{what}: no file chosen. Upload a file or pick one from the list.")
    if in_comfyui():
        import folder_paths  # type: ignore[import-not-found]

        # strip ComfyUI's "[input]"/"[output]" annotations, then confine to the input folder
        base = Path(folder_paths.get_input_directory())
        clean = str(name).replace(" [input]", "").replace(" [output]", "").replace(" [temp]", "")
        path = resolve_inside(clean, base, what=what)
    else:
        path = Path(name).expanduser()
        if not path.is_absolute():
            path = input_directory() / path
    if not path.is_file():
        raise FileNotFoundError(f"{what} '{name}' was not found (looked at {path}). "
                                "Upload it into ComfyUI's input folder or check the name.")
    return path
