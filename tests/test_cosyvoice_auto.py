"""The `cosyvoice-auto` engine choice and the instruction input, checked from the files alone (no torch).

The choice is made from which release folder is complete and what its files say it is (files3.detect_version),
so these folders hold the release's file names only; tests/test_cosyvoice3.py runs the choice on random-weight
folders. The real loaders refuse a folder of the other version too (test_cosyvoice3.test_versions_are_told_apart).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from digital_human.engines.cosyvoice import files, files3
from digital_human.preflight import PreflightError, check_optional_parts
from digital_human.voice import engines

ROOT = Path(__file__).resolve().parents[1]
V3, V2 = files3.RELEASE_NAME, files.RELEASE_NAME


def _release(folder: Path, names) -> Path:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"x")
    return folder


@pytest.fixture
def cosy_root(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(tmp_path))
    (tmp_path / "cosyvoice").mkdir()
    return tmp_path / "cosyvoice"


def test_neither_folder_one_error_naming_both_folders_files(cosy_root):
    problem = engines.engine_problem("cosyvoice-auto")
    assert problem is not None and V3 in problem and V2 in problem
    assert all(str(cosy_root / V3 / n) in problem for n in files3.RELEASE_FILES)
    assert all(str(cosy_root / V2 / n) in problem for n in files.RELEASE_FILES)
    args = type("Args", (), {"engine": "cosyvoice-auto", "model": None, "instruction": ""})()
    with pytest.raises(PreflightError, match="--engine cosyvoice-auto") as err:
        check_optional_parts(args)
    assert "speech_tokenizer_v3.onnx" in str(err.value) and "speech_tokenizer_v2.onnx" in str(err.value)
    with pytest.raises(FileNotFoundError, match=V2):
        engines.get_engine("cosyvoice-auto")


def test_auto_prefers_v3_and_tells_misplaced_folders_apart(cosy_root):
    _release(cosy_root / V2, files.RELEASE_FILES)
    picked, why = engines.resolve_engine("cosyvoice-auto")
    assert picked == "cosyvoice2" and "CosyVoice 3 not used" in why
    _release(cosy_root / V3, files3.RELEASE_FILES)
    assert engines.resolve_engine("cosyvoice-auto")[0] == "cosyvoice3"
    assert engines.engine_problem("cosyvoice-auto") is None
    # a CosyVoice 2 release under the CosyVoice 3 name: skipped and named, never given to cosyvoice3
    for name in ("cosyvoice3.yaml", "speech_tokenizer_v3.onnx"):
        (cosy_root / V3 / name).unlink()
    _release(cosy_root / V3, ["cosyvoice2.yaml", "speech_tokenizer_v2.onnx"])
    picked, why = engines.resolve_engine("cosyvoice-auto")
    assert picked == "cosyvoice2" and "holds a CosyVoice 2 release" in why
    # and with a CosyVoice 3 release under the CosyVoice 2 name as well: neither runs, both named
    _release(cosy_root / V2, ["cosyvoice3.yaml"])
    problem = engines.engine_problem("cosyvoice-auto")
    assert "holds a CosyVoice 2 release" in problem and "holds a CosyVoice 3 release" in problem


def test_instruction_refused_before_work_by_engines_without_instruct_mode(cosy_root):
    from digital_human.nodes.voice_nodes import TRT_TTS

    problem = engines.instruction_problem("kokoro", "Speak slowly.")
    assert "'kokoro'" in problem and "cosyvoice3" in problem
    assert engines.instruction_problem("kokoro", "  ") is None
    assert engines.instruction_problem("cosyvoice3", "Speak slowly.") is None
    args = type("Args", (), {"engine": "kokoro", "model": None, "instruction": "Speak slowly."})()
    with pytest.raises(PreflightError, match="--instruction: the TTS engine 'kokoro'"):
        check_optional_parts(args)
    assert "'kokoro'" in TRT_TTS.VALIDATE_INPUTS(engine="kokoro", instruction="Speak slowly.")
    assert TRT_TTS.VALIDATE_INPUTS(engine="kokoro", instruction="") is True
    with pytest.raises(ValueError, match="'kokoro'"):  # before Kokoro is loaded or any text is spoken
        TRT_TTS().speak("Hello.", engine="kokoro", instruction="Speak slowly.")
    _release(cosy_root / V2, files.RELEASE_FILES)  # auto picks CosyVoice 2 here, which has no instruct mode
    assert "'cosyvoice2' (picked by cosyvoice-auto)" in engines.instruction_problem("cosyvoice-auto", "Slowly.")
    _release(cosy_root / V3, files3.RELEASE_FILES)
    assert engines.instruction_problem("cosyvoice-auto", "Slowly.") is None


def test_instruction_is_the_last_optional_input():
    from digital_human.nodes.voice_nodes import TRT_TTS

    optional = TRT_TTS.INPUT_TYPES()["optional"]
    assert list(optional)[-1] == "instruction" and "CosyVoice 3 only" in optional["instruction"][1]["tooltip"]
    assert "cosyvoice-auto" in optional["engine"][0]


def test_checks_import_no_torch(tmp_path):
    code = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("digital_human", {str(ROOT / "__init__.py")!r},
                                              submodule_search_locations=[{str(ROOT)!r}])
module = importlib.util.module_from_spec(spec); sys.modules["digital_human"] = module; spec.loader.exec_module(module)
from digital_human.voice import engines
from digital_human.nodes.voice_nodes import TRT_TTS
assert engines.engine_problem("cosyvoice-auto") and engines.instruction_problem("kokoro", "x")
assert isinstance(TRT_TTS.VALIDATE_INPUTS(engine="cosyvoice-auto", instruction="x"), str)
print("torch" in sys.modules)
"""
    env = {"PATH": "/usr/bin:/bin", "DIGITAL_HUMAN_MODELS": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"
