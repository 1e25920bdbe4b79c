"""The `Fun-CosyVoice3-0.5B` release folder: version detection, file checks, config, strict loading.

Files stay as downloaded (`models/digital_human/cosyvoice/Fun-CosyVoice3-0.5B/` by default). Every file is
checked up front and one error lists all missing ones. A CosyVoice 2 folder (cosyvoice2.yaml,
speech_tokenizer_v2.onnx) is told apart and refused by name rather than mis-loaded: both releases use the
file names llm.pt / flow.pt / hift.pt for different networks.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .causal_hift import CausalHiFT, FixedNoise, fixed_source_noise
from .dit import DiTFlow, DiTFlowConfig
from .files3 import (CONFIG, RELEASE_FILES, RELEASE_NAME, detect_version, missing_files,  # noqa: F401 (their home)
                     missing_message)
from .hift import HiFTConfig, canonical_hift_keys
from .lm import SamplingConfig, SpeechLM3, qwen2_from_config
from .release import (
    ReleaseFilesMissing,
    UnsupportedRelease,
    _pick,
    classes_built,
    load_state,
    load_strict,
    read_yaml_values,
    resolve,
)

LICENSE = "Fun-CosyVoice 3 code and weights: Apache-2.0 (FunAudioLLM/CosyVoice)"

V3_CLASSES = ("CosyVoice3LM", "CausalMaskedDiffWithDiT", "CausalHiFTGenerator")
V2_CLASSES = ("Qwen2LM", "CausalMaskedDiffWithXvec", "HiFTGenerator")


def engine_for_folder(folder: str | Path, default: str = "cosyvoice2") -> str:
    """The TTS engine name that runs this CosyVoice folder (the `auto` choice)."""
    return detect_version(folder) or default


def _cosyvoice2_error(folder: Path, why: str) -> UnsupportedRelease:
    return UnsupportedRelease(
        f"{folder} is a CosyVoice 2 release ({why}), not CosyVoice 3: its llm.pt / flow.pt / hift.pt hold other "
        f"networks (U-Net flow decoder, HiFT, speech_tokenizer_v2.onnx), so the cosyvoice3 engine cannot load "
        f"it. Use the engine cosyvoice2 for this folder, or the {RELEASE_NAME} folder (cosyvoice3.yaml, "
        f"speech_tokenizer_v3.onnx) with cosyvoice3.")


def check_release(folder: str | Path) -> Path:
    """Raise one error naming every missing file and where it goes (a CosyVoice 2 folder: say so)."""
    folder = Path(folder)
    if detect_version(folder) == "cosyvoice2":
        found = [n for n in ("cosyvoice2.yaml", "speech_tokenizer_v2.onnx") if (folder / n).is_file()]
        raise _cosyvoice2_error(folder, "it has " + " and ".join(found))
    missing = missing_files(folder)
    if missing:
        raise ReleaseFilesMissing(missing_message(folder, missing))
    return folder


def read_config(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    v2 = classes_built(text, V2_CLASSES)
    v3 = classes_built(text, V3_CLASSES)
    if v2 and not v3:
        raise _cosyvoice2_error(path.parent, f"{path.name} builds {', '.join(v2)}")
    if set(v3) != set(V3_CLASSES):
        raise ValueError(f"{path} does not build the CosyVoice 3 networks ({', '.join(V3_CLASSES)}); "
                         f"found {', '.join(v3) or 'none'}. Use the release's own {CONFIG}, unchanged.")
    raw = read_yaml_values(text)
    if not all(k in raw for k in ("llm", "flow", "hift")):
        raise ValueError(f"{path} is not a CosyVoice 3 configuration (no llm/flow/hift sections)")
    return {k: resolve(raw[k], raw) for k in ("llm", "flow", "hift", "sample_rate") if k in raw}


def configs_from_yaml(cfg: dict) -> tuple[dict, DiTFlowConfig, HiFTConfig, int]:
    llm, flow, hift = cfg["llm"], cfg["flow"], cfg["hift"]
    dec = flow["decoder"]
    est, cfm = dec["estimator"], dec["cfm_params"].get("content", dec["cfm_params"])
    if cfm.get("solver", "euler") != "euler" or cfm.get("t_scheduler", "cosine") != "cosine":
        raise ValueError("flow decoder: only the Euler solver on the cosine schedule is supported")
    look = flow["pre_lookahead_layer"]
    flow_cfg = DiTFlowConfig(
        vocab_size=int(flow["vocab_size"]), input_size=int(flow["input_size"]),
        spk_embed_dim=int(flow["spk_embed_dim"]), token_mel_ratio=int(flow["token_mel_ratio"]),
        pre_lookahead_len=int(flow["pre_lookahead_len"]), pre_lookahead_channels=int(look["channels"]),
        dim=int(est["dim"]), depth=int(est["depth"]), heads=int(est["heads"]), head_dim=int(est["dim_head"]),
        ff_mult=int(est.get("ff_mult", 4)), cfg_rate=float(cfm["inference_cfg_rate"]))
    if est.get("long_skip_connection"):
        raise ValueError("flow estimator with long_skip_connection is not the released CosyVoice 3; unsupported")
    hift_values = dict(hift)
    hift_values["n_fft"] = int(hift["istft_params"]["n_fft"])
    hift_values["hop_len"] = int(hift["istft_params"]["hop_len"])
    hift_values["f0_channels"] = int(hift["f0_predictor"]["cond_channels"])
    hift_cfg = _pick(HiFTConfig, hift_values)
    sampling = llm.get("sampling") or {}
    lm_cfg = {"speech_token_size": int(llm["speech_token_size"]),
              "sampling": _pick(SamplingConfig, sampling if isinstance(sampling, dict) else {})}
    return lm_cfg, flow_cfg, hift_cfg, int(hift.get("conv_pre_look_right", 4))


@dataclass
class CosyVoice3Models:
    lm: SpeechLM3
    flow: DiTFlow
    hift: CausalHiFT
    folder: Path
    sample_rate: int


def build_hift(flow_cfg: DiTFlowConfig, hift_cfg: HiFTConfig, look_right: int) -> CausalHiFT:
    noise: FixedNoise = fixed_source_noise(flow_cfg.vocab_size, flow_cfg.input_size, flow_cfg.spk_embed_dim, hift_cfg)
    return CausalHiFT(hift_cfg, noise, look_right)


def load_models(folder: str | Path) -> CosyVoice3Models:
    folder = check_release(folder)
    cfg = read_config(folder / CONFIG)
    lm_cfg, flow_cfg, hift_cfg, look_right = configs_from_yaml(cfg)
    lm = SpeechLM3(qwen2_from_config(folder / "CosyVoice-BlankEN"), **lm_cfg)
    load_strict(lm, load_state(folder / "llm.pt"), folder / "llm.pt", CONFIG)
    flow = DiTFlow(flow_cfg)
    load_strict(flow, load_state(folder / "flow.pt"), folder / "flow.pt", CONFIG)
    hift = build_hift(flow_cfg, hift_cfg, look_right)
    load_strict(hift, canonical_hift_keys(load_state(folder / "hift.pt")), folder / "hift.pt", CONFIG)
    for module in (lm, flow, hift):
        module.eval()
    return CosyVoice3Models(lm, flow, hift, folder, int(cfg.get("sample_rate", hift_cfg.sampling_rate)))
