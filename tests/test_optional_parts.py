"""Optional parts name their missing pip extra and files before any work (optional_parts.py).

The CLI tests hide installed packages from a child process (a sitecustomize that makes their import
fail, as an uninstalled package does), so they fail for real when a check is missing: without it,
`speak --engine cosyvoice2` fits the voice first and then dies with ModuleNotFoundError."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from digital_human import optional_parts, preflight
from digital_human.talking_head import registry
from digital_human.voice import engines

HIDE = '''
import importlib.abc, os, sys

HIDDEN = set(os.environ["DH_TEST_HIDE_MODULES"].split(","))


class _Uninstalled(importlib.abc.MetaPathFinder):
    """Makes these packages look uninstalled: finding or importing them fails as it would then."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
        return None


sys.meta_path.insert(0, _Uninstalled())
'''


def _hiding(tmp_path: Path, modules: str) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDE)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "DH_TEST_HIDE_MODULES": modules,
            "DIGITAL_HUMAN_MODELS": str(tmp_path / "models")}


def _cli(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess, dict, float]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "digital_human", *args, "--json"], capture_output=True, text=True,
                          env=env, timeout=120)
    lines = proc.stdout.strip().splitlines()
    return proc, (json.loads(lines[-1]) if lines else {}), time.perf_counter() - start


def test_missing_modules_are_found_without_importing_them(monkeypatch):
    assert optional_parts.missing_modules(("json", "no_such_module_dh", "no_such_parent_dh.child")) == [
        "no_such_module_dh", "no_such_parent_dh.child"]
    problem = optional_parts.extra_problem("model 'x'", "musetalk", ("json", "no_such_module_dh"))
    assert 'pip install "comfyui-digital-human[musetalk]"' in problem and "no_such_module_dh" in problem
    assert optional_parts.extra_problem("model 'x'", "musetalk", ("json",)) is None
    assert optional_parts.extra_problem("model 'x'", "", ()) is None


def test_every_declared_extra_exists_in_pyproject():
    """Each model's and engine's `extra` is a real [project.optional-dependencies] key (else the pip line lies)."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    extras = set(pyproject["project"]["optional-dependencies"])
    declared = {m.extra for m in registry.MODELS.values()} | {engines.engine_entry(n).extra for n in engines.ENGINES}
    assert declared - {""} <= extras, declared - extras
    assert registry.MODELS["musetalk"].extra == "musetalk" and engines.ENGINES["cosyvoice2"].extra == "cosyvoice"


def test_model_and_engine_problems_name_the_extra_and_every_file(tmp_path, monkeypatch):
    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(tmp_path))
    from dataclasses import replace

    # the extra's module made absent (this venv has the real ones installed)
    monkeypatch.setitem(registry.MODELS, "musetalk", replace(registry.MODELS["musetalk"],
                                                             modules=("no_such_module_dh",)))
    problem = registry.model_problem("musetalk")
    assert 'pip install "comfyui-digital-human[musetalk]"' in problem and "no_such_module_dh" in problem
    assert "musetalkV15/unet.pth" in problem and "whisper/config.json" in problem  # files in the same message

    monkeypatch.setitem(engines.ENGINES, "cosyvoice2", replace(engines.ENGINES["cosyvoice2"],
                                                               modules=("no_such_module_dh",)))
    problem = engines.engine_problem("cosyvoice2")
    assert 'pip install "comfyui-digital-human[cosyvoice]"' in problem
    for name in ("llm.pt", "flow.pt", "hift.pt", "CosyVoice-BlankEN/vocab.json"):
        assert name in problem, name
    assert engines.engine_problem("kokoro") is None
    assert "unknown TTS engine" in engines.engine_problem("nope")

    # ComfyUI's validation says the same, with the models folder as users know it (no server path)
    from digital_human.nodes.talking_head_nodes import TRT_TalkingHead
    from digital_human.nodes.voice_nodes import TRT_TTS

    for said in (TRT_TalkingHead.VALIDATE_INPUTS(model="musetalk"), TRT_TTS.VALIDATE_INPUTS(engine="cosyvoice2")):
        assert "comfyui-digital-human[" in said and str(tmp_path) not in said and "models/digital_human" in said


def test_a_new_engine_declares_its_extra_in_one_line(tmp_path, monkeypatch):
    """An engine entry with extra/modules/files is checked by the CLI's preflight with no other change."""
    monkeypatch.setitem(engines.ENGINES, "probe", engines.EngineEntry(
        "digital_human.voice.kokoro_engine:KokoroEngine", extra="probe", modules=("no_such_module_dh",),
        files="digital_human.engines.cosyvoice.files:files_problem"))
    monkeypatch.setenv("DIGITAL_HUMAN_MODELS", str(tmp_path))
    args = type("Args", (), {"engine": "probe", "model": "musetalk"})()
    with pytest.raises(preflight.PreflightError) as raised:
        preflight.check_optional_parts(args)
    text = str(raised.value)
    assert '--engine probe: TTS engine \'probe\' needs the optional [probe] extra' in text
    assert "--model musetalk:" in text and "unet.pth" in text and "llm.pt" in text
    # an entry written the old way (the factory string alone) still works: it needs nothing
    monkeypatch.setitem(engines.ENGINES, "plain", "digital_human.voice.kokoro_engine:KokoroEngine")
    assert engines.engine_problem("plain") is None and engines.engine_options("plain", True) == {}


def test_speak_without_the_cosyvoice_extra_stops_in_seconds(tmp_path, data_dir):
    env = _hiding(tmp_path, "transformers,yaml")
    out = tmp_path / "results" / "speech.wav"
    proc, report, seconds = _cli(env, "speak", "--engine", "cosyvoice2", "--voice",
                                 str(data_dir / "audio" / "spk_en_03.wav"), "--text", "Hello there.", "--out", str(out))
    assert proc.returncode == 2 and report.get("ok") is False, (proc.returncode, proc.stderr[-2000:])
    error = report["error"]
    assert 'pip install "comfyui-digital-human[cosyvoice]"' in error and "transformers" in error, error
    assert "llm.pt" in error and "cosyvoice2.yaml" in error, error
    assert "Traceback" not in proc.stderr and not (tmp_path / "results").exists()
    assert len(proc.stdout.strip().splitlines()) == 1  # one JSON error line
    assert seconds < 10, seconds


def test_animate_without_the_musetalk_extra_stops_in_seconds(tmp_path, data_dir):
    env = _hiding(tmp_path, "diffusers,transformers")
    out = tmp_path / "results" / "talk.mp4"
    proc, report, seconds = _cli(env, "animate", "--model", "musetalk", "--audio",
                                 str(data_dir / "audio" / "spk_en_03.wav"), "--face",
                                 str(data_dir / "image" / "face_01_female.jpg"), "--out", str(out))
    assert proc.returncode == 2 and report.get("ok") is False, (proc.returncode, proc.stderr[-2000:])
    error = report["error"]
    assert 'pip install "comfyui-digital-human[musetalk]"' in error and "diffusers" in error, error
    assert "musetalkV15/unet.pth" in error and "sd-vae/config.json" in error, error
    assert "Traceback" not in proc.stderr and not (tmp_path / "results").exists()
    assert seconds < 10, seconds


def test_batch_names_ray_and_the_models_extras_before_starting_anything(tmp_path, data_dir):
    jobs = tmp_path / "jobs.jsonl"
    job = {"text": "Hello.", "voice": str(data_dir / "audio" / "spk_en_03.wav"),
           "face": str(data_dir / "image" / "face_01_female.jpg")}
    jobs.write_text("\n".join(json.dumps({**job, **extra}) for extra in
                              ({"model": "musetalk"}, {"model": "clone:nobody"}, {})) + "\n")
    env = _hiding(tmp_path, "ray,diffusers")
    proc, report, seconds = _cli(env, "batch", str(jobs), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and report.get("ok") is False, (proc.returncode, proc.stderr[-2000:])
    error = report["error"]
    assert 'pip install "comfyui-digital-human[batch]"' in error and "ray" in error, error
    assert "job 0 (line 1): --model musetalk" in error and 'comfyui-digital-human[musetalk]' in error, error
    assert "musetalkV15/unet.pth" in error, error
    assert "nobody" not in error  # a job's own problem (an avatar not trained) fails that job alone
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()
    assert seconds < 10, seconds
