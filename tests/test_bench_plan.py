"""benchmarks/run_all.py: what runs where (no benchmark is started here)."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from benchmarks.run_all import plan  # noqa: E402


def _scripts(steps):
    return [Path(cmd[1]).name for cmd in steps]


def test_cpu_plan_saves_the_speaker_for_the_gpu_run(tmp_path):
    steps = plan(tmp_path, quick=True, cuda=False)
    assert _scripts(steps) == ["voice_clone.py", "face_chain.py", "chain.py", "gpu_tts.py"]
    chain = steps[2]
    assert chain[chain.index("--speaker") + 1] == str(tmp_path / "speaker.npz")


def test_gpu_plan_adds_what_its_inputs_allow(tmp_path):
    assert _scripts(plan(tmp_path, quick=False, cuda=True)) == ["gpu_models.py"]
    for name in ("tts_tokens.json", "th_pack.npz", "speaker.npz"):
        (tmp_path / name).write_bytes(b"x")
    steps = plan(tmp_path, quick=False, cuda=True)
    assert _scripts(steps) == ["gpu_models.py", "gpu_tts.py", "gpu_talking_head.py", "chain.py"]
    assert "clone" in steps[-1] and "--lengths" not in steps[-1]
