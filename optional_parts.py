"""Optional parts (a talking-head model, a TTS engine, Ray for `batch`) say what they need up front.

Each part declares the pip extra that installs its Python dependencies (pyproject.toml
[project.optional-dependencies]) and the top-level modules that extra provides. Whether those
modules are installed is answered with importlib.util.find_spec, which finds a module without
importing it: checking must cost milliseconds, not the seconds an import of transformers takes,
and must not fail halfway through someone else's import. The CLI's input checks and ComfyUI's
validation both word a missing extra with the one line that installs it.
"""
from __future__ import annotations

import importlib.util

PACKAGE = "comfyui-digital-human"  # the distribution name in pyproject.toml


def install_line(extra: str) -> str:
    """The command that installs `extra`: pip install "comfyui-digital-human[musetalk]"."""
    return f'pip install "{PACKAGE}[{extra}]"'


def missing_modules(modules: tuple[str, ...] | list[str]) -> list[str]:
    """The modules of `modules` that cannot be imported here (found without importing them)."""
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a dotted name whose parent is absent, or a broken __spec__
            found = False
        if not found:
            missing.append(name)
    return missing


def extra_problem(what: str, extra: str, modules: tuple[str, ...] | list[str]) -> str | None:
    """None when every module of `extra` is installed; else one sentence naming them and the pip line."""
    if not extra or not modules:
        return None
    missing = missing_modules(modules)
    if not missing:
        return None
    return (f"{what} needs the optional [{extra}] extra, which is not installed (missing Python "
            f"module{'s' if len(missing) > 1 else ''}: {', '.join(missing)}). Install it with: "
            f"{install_line(extra)}")


def join_problems(*problems: str | None) -> str | None:
    """Several problems of one part as one message (the extra first, then the files), or None."""
    found = [p for p in problems if p]
    return "\n".join(found) if found else None
