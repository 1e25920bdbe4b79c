"""The `cosyvoice-auto` engine choice: which CosyVoice release folder is in place decides the engine; plain Python.

Fun-CosyVoice3-0.5B first (it clones better), else CosyVoice2-0.5B. A folder counts only when it is complete
and its files say it is the version its name says (files3.detect_version: a CosyVoice 2 release put under the
CosyVoice 3 name, or the reverse, is skipped and named, never handed to the other engine). No torch import:
the CLI's input checks and ComfyUI's validation call this before any work.
"""
from __future__ import annotations

from . import files, files3

AUTO = "cosyvoice-auto"


def choose() -> tuple[str | None, str]:
    """(engine name, why) for the folders in place now; (None, one message naming both folders' problems)."""
    v3_problem = files3.files_problem()
    if v3_problem is None:
        return "cosyvoice3", f"{files3.default_folder()} is a complete {files3.RELEASE_NAME} folder"
    v2_problem = files.files_problem()
    if v2_problem is None:
        first_line = v3_problem.splitlines()[0]
        return "cosyvoice2", (f"{files.default_folder()} is a complete {files.RELEASE_NAME} folder; "
                              f"CosyVoice 3 not used: {first_line}")
    return None, (f"{AUTO} runs CosyVoice 3 when its {files3.RELEASE_NAME} folder is complete, else CosyVoice 2 "
                  f"with {files.RELEASE_NAME}; neither is usable.\n{v3_problem}\n{v2_problem}")


def files_problem() -> str | None:
    """voice/engines.py's `files` hook: None when one of the two folders is usable, else both folders' problems."""
    engine, why = choose()
    return None if engine else why
