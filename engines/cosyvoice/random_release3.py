"""A random-weight `Fun-CosyVoice3-0.5B`-shaped folder for tests, benchmarks and the real-server check.

Same support files as the CosyVoice 2 writer (random_release.py: Qwen2 config, byte-level tokenizer, random
ONNX graphs with the release's input/output signatures), with the CosyVoice 3 names (cosyvoice3.yaml,
speech_tokenizer_v3.onnx). Random weights say nothing about speech quality.
"""
from __future__ import annotations

from pathlib import Path

from .random_release import campplus_stand_in, speech_tokenizer_stand_in, write_tokenizer


def write_support_files3(folder: Path, qwen_config: dict, speech_vocab: int = 100) -> None:
    import json

    folder = Path(folder)
    blank = folder / "CosyVoice-BlankEN"
    blank.mkdir(parents=True, exist_ok=True)
    (blank / "config.json").write_text(json.dumps(qwen_config, indent=1))
    write_tokenizer(blank, int(qwen_config.get("eos_token_id", 0)))
    campplus_stand_in(folder / "campplus.onnx")
    speech_tokenizer_stand_in(folder / "speech_tokenizer_v3.onnx", speech_vocab)


def write_random_release3(folder: Path, yaml_text: str, qwen_config: dict, seed: int = 1234) -> Path:
    """A complete random-weight CosyVoice 3 folder for a cosyvoice3.yaml text and Qwen2 config (any size).

    The key -> shape manifest comes from this pack's modules built on the meta device; weights are
    random_weights.seeded_state_dict (the reference-side tool writes the same values for the same names);
    the rotary table keeps its computed values, as there."""
    import torch

    from .dit import DiTFlow
    from .lm import SpeechLM3, qwen2_from_config
    from .random_weights import seeded_state_dict
    from .release3 import build_hift, configs_from_yaml, read_config

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cosyvoice3.yaml").write_text(yaml_text)
    lm_cfg, flow_cfg, hift_cfg, look = configs_from_yaml(read_config(folder / "cosyvoice3.yaml"))
    write_support_files3(folder, qwen_config, speech_vocab=flow_cfg.vocab_size)
    builders = {"llm": lambda: SpeechLM3(qwen2_from_config(folder / "CosyVoice-BlankEN"), **lm_cfg),
                "flow": lambda: DiTFlow(flow_cfg), "hift": lambda: build_hift(flow_cfg, hift_cfg, look)}
    for name, build in builders.items():
        module = build() if name == "hift" else None
        if module is None:
            try:
                with torch.device("meta"):
                    module = build()
            except RuntimeError:
                module = build()
        own = module.state_dict()
        shapes = {k: tuple(v.shape) for k, v in own.items() if not k.endswith("inv_freq")}
        state = seeded_state_dict(shapes, seed)
        state.update({k: v.detach().to("cpu") if v.device.type != "meta" else _inv_freq(v.shape[0] * 2)
                      for k, v in own.items() if k.endswith("inv_freq")})
        del module
        torch.save(state, folder / f"{name}.pt")
    return folder


def _inv_freq(dim: int):
    import torch

    return 1.0 / (10000.0 ** (torch.arange(0, dim, 2).float() / dim))
