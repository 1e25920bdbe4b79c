"""Where the pack keeps models and caches, and safe resolution of user-supplied file names.

Order for the models root (first that applies):
1. `DIGITAL_HUMAN_MODELS` environment variable (tests, CI, headless installs);
2. ComfyUI's models folder (`<ComfyUI>/models/digital_human`) when running inside ComfyUI, or when the
   pack sits in `<ComfyUI>/custom_nodes/` (so `python -m digital_human setup` run from there writes
   where ComfyUI will look);
3. `~/.cache/digital_human/models` for the stand-alone CLI.
"""
from __future__ import annotations

import os
from pathlib import Path

PACK_DIR = Path(__file__).resolve().parent
MODELS_SUBDIR = "digital_human"


def comfyui_home() -> Path | None:
    """`<ComfyUI>` when this pack is installed as `<ComfyUI>/custom_nodes/<pack>` (the path as imported,
    not resolved: the pack may be a symlink there), else None."""
    pack = Path(__file__).absolute().parent
    home = pack.parent.parent
    if pack.parent.name == "custom_nodes" and (home / "main.py").is_file():
        return home
    return None


def _comfy_models_root() -> Path | None:
    try:
        import folder_paths  # type: ignore[import-not-found]  # only exists inside ComfyUI
    except ImportError:
        home = comfyui_home()  # e.g. `setup` run from <ComfyUI>/custom_nodes
        return home / "models" if home is not None and (home / "models").is_dir() else None
    return Path(folder_paths.models_dir)


def models_root() -> Path:
    """Root folder of every file this pack downloads, converts or trains."""
    env = os.environ.get("DIGITAL_HUMAN_MODELS")
    if env:
        root = Path(env).expanduser()
    else:
        comfy = _comfy_models_root()
        root = comfy / MODELS_SUBDIR if comfy else Path.home() / ".cache" / "digital_human" / "models"
    root.mkdir(parents=True, exist_ok=True)
    return root


def model_dir(*parts: str) -> Path:
    """A sub-folder of the models root, created on demand (e.g. model_dir("kokoro"))."""
    path = models_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir(*parts: str) -> Path:
    """Derived, re-creatable files (speaker-embedding cache, converted graphs)."""
    return model_dir("cache", *parts)


INPUT_HINT = "Put the file into ComfyUI's input folder (or upload it) and pass its name only."


def resolve_inside(name: str | os.PathLike[str], *allowed_roots: Path, what: str = "file",
                   hint: str = INPUT_HINT) -> Path:
    """Resolve `name` and refuse anything that leaves `allowed_roots` (../, absolute paths, symlinks out).

    Names coming from a prompt must never reach other files on the server. The message names the
    input and the fix, not the server's folders (it is shown to whoever sent the prompt).
    """
    if not allowed_roots:
        raise ValueError("resolve_inside needs at least one allowed root")
    raw = Path(name)
    for root in allowed_roots:
        root_real = Path(root).resolve()
        candidate = (root_real / raw).resolve() if not raw.is_absolute() else raw.resolve()
        if candidate == root_real or root_real in candidate.parents:
            return candidate
    raise ValueError(f"{what} '{name}' is outside the allowed folders. {hint}")
