"""The files of the `CosyVoice2-0.5B` release folder and where they go; plain Python only.

Kept apart from release.py (which imports torch and yaml to load them) so that the CLI's input
checks and ComfyUI's validation can list missing files in milliseconds, and before the [cosyvoice]
extra is even installed.
"""
from __future__ import annotations

from pathlib import Path

RELEASE_NAME = "CosyVoice2-0.5B"
RELEASE_FILES: dict[str, str] = {
    "cosyvoice2.yaml": "model configuration",
    "llm.pt": "speech-token language model weights",
    "flow.pt": "flow-matching decoder weights",
    "hift.pt": "HiFT vocoder weights",
    "campplus.onnx": "speaker embedder (CAM++)",
    "speech_tokenizer_v2.onnx": "speech tokenizer",
    "spk2info.pt": "built-in speaker table",
    "CosyVoice-BlankEN/config.json": "Qwen2 configuration",
    "CosyVoice-BlankEN/vocab.json": "Qwen2 tokenizer vocabulary",
    "CosyVoice-BlankEN/merges.txt": "Qwen2 tokenizer merges",
    "CosyVoice-BlankEN/tokenizer_config.json": "Qwen2 tokenizer configuration",
}


def default_folder() -> Path:
    from ...paths import models_root

    # not model_dir(): that creates the folder, and validating a prompt must not change the models folder
    return models_root() / "cosyvoice" / RELEASE_NAME


def missing_files(folder: Path, files: dict[str, str] = RELEASE_FILES) -> list[str]:
    return [name for name in files if not (folder / name).is_file()]


def release_missing_message(model: str, release: str, files: dict[str, str], folder: Path,
                            missing: list[str]) -> str:
    """One message naming every missing file of a CosyVoice release folder, what it is and where it goes."""
    lines = "\n".join(f"  {folder / name}  ({files[name]})" for name in missing)
    return (f"{model} needs the {release} release folder, as downloaded from FunAudioLLM "
            f"(Hugging Face / ModelScope, Apache-2.0); {len(missing)} file(s) missing:\n{lines}\n"
            f"Put the whole downloaded folder at {folder} (nothing is downloaded by this pack).")


def missing_message(folder: Path, missing: list[str]) -> str:
    return release_missing_message("CosyVoice 2", RELEASE_NAME, RELEASE_FILES, folder, missing)


def files_problem() -> str | None:
    """None when the default release folder is complete; else every missing file (voice/engines.py's
    `files` hook), or that a CosyVoice 3 folder is in its place."""
    from .files3 import detect_version

    folder = default_folder()
    if detect_version(folder) == "cosyvoice3":  # same file names, other networks: release.py refuses it too
        return (f"{folder} holds a CosyVoice 3 release (cosyvoice3.yaml / speech_tokenizer_v3.onnx); the "
                f"cosyvoice2 engine runs the "
                f"{RELEASE_NAME} folder only (cosyvoice2.yaml, speech_tokenizer_v2.onnx).")
    missing = missing_files(folder)
    return missing_message(folder, missing) if missing else None
