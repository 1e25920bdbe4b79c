"""A CosyVoice 3 folder is refused by name, before any file is missing-listed or loaded.

CosyVoice 3 (Fun-CosyVoice3-0.5B) ships llm.pt / flow.pt / hift.pt like CosyVoice 2 but other
networks behind them (DiT flow decoder, causal HiFT, another LM token layout) and
speech_tokenizer_v3.onnx; benchmarks/RESULTS.md lists the differences.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from digital_human.engines.cosyvoice.release import (
    ReleaseFilesMissing,
    UnsupportedRelease,
    check_release,
    read_config,
)

# The class lines of a CosyVoice 3 configuration (written for this test, same tag syntax as the release).
COSYVOICE3_MODEL_SECTIONS = """\
sample_rate: 24000
llm: !new:cosyvoice.llm.llm.CosyVoice3LM
    speech_token_size: 6561
flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    in_channels: 80
"""
COSYVOICE2_MODEL_SECTIONS = """\
sample_rate: 24000
llm: !new:cosyvoice.llm.llm.Qwen2LM
    speech_token_size: 6561
flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    input_size: 512
hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    in_channels: 80
"""


def cosyvoice3_folder(root: Path) -> Path:
    folder = root / "Fun-CosyVoice3-0.5B-2512"
    (folder / "CosyVoice-BlankEN").mkdir(parents=True)
    (folder / "cosyvoice3.yaml").write_text(COSYVOICE3_MODEL_SECTIONS)
    for name in ("llm.pt", "flow.pt", "hift.pt", "campplus.onnx", "speech_tokenizer_v3.onnx", "spk2info.pt"):
        (folder / name).write_bytes(b"")
    return folder


def test_cosyvoice3_folder_is_named_not_listed_as_missing_files(tmp_path):
    folder = cosyvoice3_folder(tmp_path)
    with pytest.raises(UnsupportedRelease) as err:
        check_release(folder)
    text = str(err.value)
    assert "CosyVoice 3" in text and "cosyvoice3.yaml" in text and "CosyVoice2-0.5B" in text
    assert not isinstance(err.value, ReleaseFilesMissing)
    assert isinstance(err.value, ValueError)  # the nodes' validation reports ValueError messages


def test_engine_check_files_reports_cosyvoice3(tmp_path):
    from digital_human.engines.cosyvoice.engine import CosyVoice2Engine

    with pytest.raises(UnsupportedRelease, match="CosyVoice 3"):
        CosyVoice2Engine(cosyvoice3_folder(tmp_path)).check_files()


def test_cosyvoice3_config_under_the_cosyvoice2_name_is_refused(tmp_path):
    path = tmp_path / "cosyvoice2.yaml"
    path.write_text(COSYVOICE3_MODEL_SECTIONS)
    with pytest.raises(UnsupportedRelease) as err:
        read_config(path)
    assert "CosyVoice3LM" in str(err.value) and "CausalMaskedDiffWithDiT" in str(err.value)


def test_cosyvoice2_config_still_reads(tmp_path):
    path = tmp_path / "cosyvoice2.yaml"
    path.write_text(COSYVOICE2_MODEL_SECTIONS)
    cfg = read_config(path)
    assert cfg["llm"]["speech_token_size"] == 6561 and cfg["flow"]["input_size"] == 512
