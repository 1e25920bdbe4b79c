"""The files of the `Fun-CosyVoice3-0.5B` release folder and how a folder's version is told; plain Python only.

Kept apart from release3.py (which imports torch to load them), as files.py is for CosyVoice 2, so that the
CLI's input checks and ComfyUI's validation name missing files in milliseconds, before the extra is installed.
"""
from __future__ import annotations

from pathlib import Path

RELEASE_NAME = "Fun-CosyVoice3-0.5B"
CONFIG = "cosyvoice3.yaml"
RELEASE_FILES: dict[str, str] = {
    CONFIG: "model configuration",
    "llm.pt": "speech-token language model weights",
    "flow.pt": "DiT flow-matching decoder weights",
    "hift.pt": "causal HiFT vocoder weights",
    "campplus.onnx": "speaker embedder (CAM++)",
    "speech_tokenizer_v3.onnx": "speech tokenizer (v3)",
    "CosyVoice-BlankEN/config.json": "Qwen2 configuration",
    "CosyVoice-BlankEN/vocab.json": "Qwen2 tokenizer vocabulary",
    "CosyVoice-BlankEN/merges.txt": "Qwen2 tokenizer merges",
    "CosyVoice-BlankEN/tokenizer_config.json": "Qwen2 tokenizer configuration",
}


def default_folder() -> Path:
    from ...paths import models_root

    return models_root() / "cosyvoice" / RELEASE_NAME  # not model_dir(): validation must not create it


def detect_version(folder: str | Path) -> str | None:
    """'cosyvoice3', 'cosyvoice2' or None, from the folder's files (config name, speech tokenizer name)."""
    folder = Path(folder)
    if (folder / CONFIG).is_file() or (folder / "speech_tokenizer_v3.onnx").is_file():
        return "cosyvoice3"
    if (folder / "cosyvoice2.yaml").is_file() or (folder / "speech_tokenizer_v2.onnx").is_file():
        return "cosyvoice2"
    return None


def missing_files(folder: Path) -> list[str]:
    from .files import missing_files as missing_of

    return missing_of(folder, RELEASE_FILES)


def missing_message(folder: Path, missing: list[str]) -> str:
    from .files import release_missing_message

    return release_missing_message("CosyVoice 3", RELEASE_NAME, RELEASE_FILES, folder, missing)


def files_problem() -> str | None:
    """None when the default release folder is complete; else every missing file (voice/engines.py's
    `files` hook), or that a CosyVoice 2 folder is in its place."""
    folder = default_folder()
    if detect_version(folder) == "cosyvoice2":
        return (f"{folder} holds a CosyVoice 2 release (cosyvoice2.yaml / speech_tokenizer_v2.onnx); the "
                f"cosyvoice3 engine runs the {RELEASE_NAME} folder only (cosyvoice3.yaml, speech_tokenizer_v3.onnx).")
    missing = missing_files(folder)
    return missing_message(folder, missing) if missing else None
