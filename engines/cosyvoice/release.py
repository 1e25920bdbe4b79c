"""The `CosyVoice2-0.5B` release folder: file checks, config, strict weight loading.

Files stay as downloaded (`models/digital_human/cosyvoice/CosyVoice2-0.5B/` by default). Every file
is checked up front and one error lists all missing ones. Checkpoints load with
torch.load(weights_only=True) and strict key and shape checks; ONNX files run on the engine layer.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import yaml

from .flow import CausalFlow, FlowConfig
from .hift import HiFT, HiFTConfig, canonical_hift_keys
from .files import RELEASE_FILES, RELEASE_NAME, missing_files, missing_message  # noqa: F401 (their home)
from .lm import SamplingConfig, SpeechLM, qwen2_from_config

LICENSE = "CosyVoice 2 code and weights: Apache-2.0 (FunAudioLLM/CosyVoice)"


class ReleaseFilesMissing(FileNotFoundError):
    pass


class UnsupportedRelease(ValueError):
    """A CosyVoice release this runtime does not run (CosyVoice 3)."""


# CosyVoice 3 (Fun-CosyVoice3-0.5B) keeps the file names llm.pt / flow.pt / hift.pt but not the networks:
# its LM puts sos/task/eos in the speech-token table (6561 + 200 rows, no bias on the head), its flow
# decoder is a 22-block DiT with no conformer encoder, its vocoder is the causal HiFT, and its prompt
# tokens come from speech_tokenizer_v3.onnx. Refuse such a folder by name instead of failing on keys.
COSYVOICE3_CLASSES = ("CosyVoice3LM", "CausalMaskedDiffWithDiT", "CausalHiFTGenerator")


def _cosyvoice3_error(folder: Path, why: str) -> UnsupportedRelease:
    return UnsupportedRelease(
        f"{folder} is a CosyVoice 3 release ({why}), not CosyVoice 2. CosyVoice 3 has other networks under "
        f"the same file names (DiT flow decoder, causal HiFT vocoder, another LM token layout, "
        f"speech_tokenizer_v3.onnx), so the cosyvoice2 engine cannot load it: use the engine cosyvoice3 for "
        f"this folder, or the {RELEASE_NAME} folder (cosyvoice2.yaml, speech_tokenizer_v2.onnx) with cosyvoice2.")


def check_release(folder: str | Path) -> Path:
    """Raise one error naming every missing file and where it goes (a CosyVoice 3 folder: say so)."""
    folder = Path(folder)
    if (folder / "cosyvoice3.yaml").is_file():
        raise _cosyvoice3_error(folder, "it has cosyvoice3.yaml")
    missing = missing_files(folder)
    if missing:
        raise ReleaseFilesMissing(missing_message(folder, missing))
    return folder


# --- cosyvoice2.yaml: a HyperPyYAML file; read the plain values without running its tags ----------
class _TagLoader(yaml.SafeLoader):
    pass


def _any_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    value = loader.construct_scalar(node)
    return {"__ref__": value} if suffix == "ref" else value


_TagLoader.add_multi_constructor("!", _any_tag)


def _resolve(value: Any, top: dict) -> Any:
    if isinstance(value, dict) and set(value) == {"__ref__"}:
        text = value["__ref__"].strip()
        parts = [p.strip() for p in text.split("*")]
        result = 1
        for part in parts:  # "<a>" or "<a> * <b>"
            if not (part.startswith("<") and part.endswith(">")):
                raise ValueError(f"cosyvoice2.yaml: cannot read reference '{text}'")
            item = _resolve(top[part[1:-1]], top)
            result = item if len(parts) == 1 else result * item
        return result
    if isinstance(value, dict):
        return {k: _resolve(v, top) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, top) for v in value]
    return value


def classes_built(text: str, names: tuple[str, ...]) -> list[str]:
    """The class names among `names` that a HyperPyYAML text builds with !new:."""
    return [name for name in names if re.search(rf"!new:[\w.]*\b{name}\b", text)]


def read_yaml_values(text: str) -> dict:
    """A HyperPyYAML text's plain values (tags become data, nothing is run)."""
    raw = yaml.load(text, Loader=_TagLoader)  # noqa: S506 - SafeLoader subclass, tags become data
    return raw if isinstance(raw, dict) else {}


def resolve(value: Any, top: dict) -> Any:
    return _resolve(value, top)


def read_config(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    found = classes_built(text, COSYVOICE3_CLASSES)
    if found:  # a CosyVoice 3 configuration under the CosyVoice 2 file name
        raise _cosyvoice3_error(path.parent, f"{path.name} builds {', '.join(found)}")
    raw = yaml.load(text, Loader=_TagLoader)  # noqa: S506 - SafeLoader subclass, tags become data
    if not isinstance(raw, dict) or not all(k in raw for k in ("llm", "flow", "hift")):
        raise ValueError(f"{path} is not a CosyVoice 2 configuration (no llm/flow/hift sections)")
    return {k: _resolve(raw[k], raw) for k in ("llm", "flow", "hift", "sample_rate") if k in raw}


def _pick(cls, values: dict) -> Any:
    names = {f.name for f in fields(cls)}
    return cls(**{k: (tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v)
                  for k, v in values.items() if k in names})


def configs_from_yaml(cfg: dict) -> tuple[dict, FlowConfig, HiFTConfig]:
    llm, flow, hift = cfg["llm"], cfg["flow"], cfg["hift"]
    enc, dec = flow["encoder"], flow["decoder"]
    est, cfm = dec["estimator"], dec["cfm_params"].get("content", dec["cfm_params"])
    if list(est["channels"]) != [est["channels"][0]]:
        raise ValueError(f"flow estimator channels {est['channels']}: only one U-Net level is supported")
    if enc.get("use_cnn_module") or enc.get("macaron_style"):
        raise ValueError("flow encoder with conv module / macaron feed-forward is not CosyVoice 2; unsupported")
    if cfm.get("solver", "euler") != "euler" or cfm.get("t_scheduler", "cosine") != "cosine":
        raise ValueError("flow decoder: only the Euler solver on the cosine schedule is supported")
    flow_cfg = FlowConfig(
        vocab_size=int(flow["vocab_size"]), input_size=int(flow["input_size"]),
        spk_embed_dim=int(flow["spk_embed_dim"]), token_mel_ratio=int(flow["token_mel_ratio"]),
        pre_lookahead_len=int(flow["pre_lookahead_len"]), encoder_heads=int(enc["attention_heads"]),
        encoder_units=int(enc["linear_units"]), encoder_blocks=int(enc["num_blocks"]),
        estimator_in=int(est["in_channels"]), estimator_channels=int(est["channels"][0]),
        estimator_blocks=int(est["n_blocks"]), estimator_mid_blocks=int(est["num_mid_blocks"]),
        estimator_heads=int(est["num_heads"]), estimator_head_dim=int(est["attention_head_dim"]),
        cfg_rate=float(cfm["inference_cfg_rate"]))
    hift_values = dict(hift)
    hift_values["n_fft"] = int(hift["istft_params"]["n_fft"])
    hift_values["hop_len"] = int(hift["istft_params"]["hop_len"])
    hift_values["f0_channels"] = int(hift["f0_predictor"]["cond_channels"])
    hift_cfg = _pick(HiFTConfig, hift_values)
    sampling = llm.get("sampling") or {}
    lm_cfg = {"speech_token_size": int(llm["speech_token_size"]),
              "sampling": _pick(SamplingConfig, sampling if isinstance(sampling, dict) else {})}
    return lm_cfg, flow_cfg, hift_cfg


def load_state(path: Path) -> dict[str, torch.Tensor]:
    # mmap: the LM checkpoint is 2 GB; its pages are read once while copying into the model.
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if not isinstance(state, dict):
        raise ValueError(f"{path} is not a state dict")
    return state


def load_strict(module: torch.nn.Module, state: dict[str, torch.Tensor], path: Path,
                config_name: str = "cosyvoice2.yaml") -> None:
    """load_state_dict(strict=True) with one message listing missing, unexpected and mis-shaped keys."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
              for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        show = lambda items: ", ".join(items[:8]) + (f" ... ({len(items)} in all)" if len(items) > 8 else "")  # noqa: E731
        problems = [f"missing keys: {show(missing)}" if missing else "",
                    f"unexpected keys: {show(unexpected)}" if unexpected else "",
                    f"shape mismatches: {show(shapes)}" if shapes else ""]
        raise ValueError(f"{path} does not match its {config_name}: " + "; ".join(p for p in problems if p)
                         + ". Use the files of one release folder, unchanged.")
    module.load_state_dict(state, strict=True)


@dataclass
class CosyVoice2Models:
    lm: SpeechLM
    flow: CausalFlow
    hift: HiFT
    folder: Path
    sample_rate: int


def load_models(folder: str | Path) -> CosyVoice2Models:
    folder = check_release(folder)
    cfg = read_config(folder / "cosyvoice2.yaml")
    lm_cfg, flow_cfg, hift_cfg = configs_from_yaml(cfg)
    lm = SpeechLM(qwen2_from_config(folder / "CosyVoice-BlankEN"), **lm_cfg)
    load_strict(lm, load_state(folder / "llm.pt"), folder / "llm.pt")
    flow = CausalFlow(flow_cfg)
    load_strict(flow, load_state(folder / "flow.pt"), folder / "flow.pt")
    hift = HiFT(hift_cfg)
    load_strict(hift, canonical_hift_keys(load_state(folder / "hift.pt")), folder / "hift.pt")
    for module in (lm, flow, hift):
        module.eval()
    return CosyVoice2Models(lm, flow, hift, folder, int(cfg.get("sample_rate", hift_cfg.sampling_rate)))
