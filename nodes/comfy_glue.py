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
        where = "in ComfyUI's input folder" if in_comfyui() else f"(looked at {path})"
        raise FileNotFoundError(f"{what} '{name}' was not found {where}. "
                                "Upload it into ComfyUI's input folder or check the name.")
    return path


# --- Prompt-time checks (VALIDATE_INPUTS) -----------------------------------------------------------
# ComfyUI calls a node's VALIDATE_INPUTS when the prompt is queued, with the widget values it names, and
# refuses the prompt with the returned text; so a bad value fails before any work. Messages name the
# input and the fix and never show install paths. (ComfyUI skips its own min/max/list checks for the
# inputs a VALIDATE_INPUTS takes, so these only take inputs that have no such limits.)

def check_plain_name(value: str, what: str, example: str, where: str) -> bool | str:
    """True for a plain file/folder name (no folders, no '..'); else the message saying the fix."""
    name = str(value or "").strip()
    if not name:
        return True  # empty means "don't save" where the node allows it; the node says otherwise
    if "/" in name or "\\" in name or name.startswith(".") or ":" in name:
        return (f"{what} '{value}' must be a plain name without folders, such as '{example}': it is saved "
                f"in {where}. Remove the folder part.")
    return True


def without_server_paths(message: str) -> str:
    """`message` with the models folder's absolute path written as ComfyUI users know it
    (models/digital_human): prompt-time messages go to whoever sent the prompt, not only to the server's owner."""
    from ..paths import models_root

    return message.replace(str(models_root()), "models/digital_human")


def check_output_prefix(prefix: str, what: str = "filename_prefix") -> bool | str:
    """True when `prefix` stays inside ComfyUI's output folder (relative, no '..' part)."""
    text = str(prefix or "").strip()
    parts = text.replace("\\", "/").split("/")
    if not text or text.startswith(("/", "\\")) or (len(text) > 1 and text[1] == ":") or ".." in parts:
        return (f"{what} '{prefix}' must stay inside ComfyUI's output folder: use a relative prefix such as "
                "'digital_human/clone' (no leading '/', no '..').")
    return True


def require_fps(fps: float, node: str) -> float:
    """A linked fps is only known at run time: refuse 0/negative before the node does any work."""
    value = float(fps)
    if not value > 0:
        raise ValueError(f"{node}: fps is {value:g}; the frame rate must be above 0. Set the fps (or the Frame "
                         "Rate node that feeds it) to e.g. 25.")
    return value


# --- Errors as ComfyUI shows them ----------------------------------------------------------------------
# ComfyUI names a failed node's exception by its module and class. It imports a pack under its folder
# path, so the pack's own exception classes would read '/.../custom_nodes/digital_human.audio.decode.
# AudioDecodeError'. Node functions re-raise them as the builtin class they derive from (same message).

_PACK_PREFIX = __name__.rsplit(".nodes.comfy_glue", 1)[0]


def plain_exception(exc: BaseException) -> BaseException:
    """`exc` as its nearest builtin base class when the pack defined it; other exceptions unchanged."""
    kind = type(exc)
    if kind.__module__ == "builtins" or not kind.__module__.startswith(_PACK_PREFIX):
        return exc
    for base in kind.__mro__[1:]:
        if base.__module__ == "builtins" and issubclass(base, Exception) and base is not KeyError:
            return base(str(exc))
    return exc


def with_plain_errors(node_classes: dict[str, type], force: bool = False) -> dict[str, type]:
    """Inside ComfyUI (or with `force`), wrap each node's FUNCTION so the pack's exceptions reach ComfyUI
    as builtin ones (see above). The CLI and tests keep the specific classes."""
    import functools

    if not (force or in_comfyui()):
        return node_classes
    for cls in node_classes.values():
        func = getattr(cls, cls.FUNCTION)
        if getattr(func, "_dh_plain_errors", False):
            continue

        @functools.wraps(func)
        def run(self, *args, __func=func, **kwargs):
            try:
                return __func(self, *args, **kwargs)
            except Exception as exc:
                plain = plain_exception(exc)
                if plain is exc:
                    raise
                raise plain from exc

        run._dh_plain_errors = True  # type: ignore[attr-defined]
        setattr(cls, cls.FUNCTION, run)
    return node_classes
