"""The pack's side of the CosyVoice 3 parity check (tools/cosyvoice3_parity.py runs the reference side)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def write_release_from_fixture(data: Any, folder: Path) -> Path:
    """Rebuild a release folder (seeded weights, reference manifest; inv_freq computed) for a fixture."""
    import torch

    from .random_release3 import _inv_freq, write_support_files3
    from .random_weights import seeded_state_dict

    meta = json.loads(str(data["meta"][()]))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cosyvoice3.yaml").write_text(meta["yaml"])
    write_support_files3(folder, meta["qwen_config"], speech_vocab=meta["manifest"]["flow"]["input_embedding.weight"][0])
    for name, shapes in meta["manifest"].items():
        state = seeded_state_dict({k: tuple(s) for k, s in shapes.items() if not k.endswith("inv_freq")},
                                  meta["seeds"]["weights"])
        state.update({k: _inv_freq(2 * s[0]) for k, s in shapes.items() if k.endswith("inv_freq")})
        torch.save(state, folder / f"{name}.pt")
    return folder


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| relative to max |b|."""
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-12))


def compare(data: Any, folder: Path) -> dict[str, float]:
    """Run the pack on the recorded inputs: max |difference| per stage (tokens: count of mismatches)."""
    import torch

    from .features import prompt_mel
    from .release3 import load_models

    meta = json.loads(str(data["meta"][()]))
    models = load_models(folder)
    T = lambda k: torch.from_numpy(data[k])  # noqa: E731
    sts = models.lm.speech_token_size
    greedy_ref = data["out_lm_greedy_tokens"].tolist()
    logp = models.lm.logits_trace(T("in_lm_text"), T("in_lm_prompt_text"), T("in_lm_prompt_speech"), greedy_ref[:-1])
    greedy = logp[:, :sts].argmax(dim=-1).tolist()
    gen = torch.Generator().manual_seed(meta["seeds"]["lm"])
    sampled = list(models.lm.generate(T("in_lm_text"), T("in_lm_prompt_text"), T("in_lm_prompt_speech"), generator=gen))
    sampled_ref = data["out_lm_tokens"].tolist()
    mel = models.flow.inference(T("in_flow_token"), T("in_flow_prompt_token"), T("in_flow_prompt_feat"),
                                T("in_flow_embedding"))
    wave = models.hift.inference(T("out_flow_mel"))
    noise = models.hift.noise
    result = {
        "lm_greedy_mismatches": float(sum(a != b for a, b in zip(greedy, greedy_ref)) + abs(len(greedy) - len(greedy_ref))),
        "lm_greedy_steps": float(len(greedy_ref)),
        "lm_logp_max_abs": float(np.abs(logp.numpy() - data["out_lm_greedy_logp"]).max()),
        "lm_sampled_mismatches": float(len(sampled) != len(sampled_ref) or sum(a != b for a, b in zip(sampled, sampled_ref))),
        "lm_sampled_tokens": float(len(sampled_ref)),
        "flow_mel_max_abs": float(np.abs(mel.numpy() - data["out_flow_mel"]).max()),
        "flow_mel_rel": _rel(mel.numpy(), data["out_flow_mel"]),
        "hift_wave_max_abs": float(np.abs(wave.numpy() - data["out_hift_wave"]).max()),
        "hift_wave_rel": _rel(wave.numpy(), data["out_hift_wave"]),
        "noise_max_abs": float(max(np.abs(noise.start.numpy() - data["out_noise_start"]).max(),
                                   np.abs(noise.sine[:, :2000].numpy() - data["out_noise_sine_head"]).max(),
                                   np.abs(noise.sine[:, -50:].numpy() - data["out_noise_sine_tail"]).max(),
                                   np.abs(noise.branch[:, -50:].numpy() - data["out_noise_branch_tail"]).max())),
        "prompt_mel_max_abs": float(np.abs(prompt_mel(T("in_audio24k"), fmax=None).numpy() - data["out_prompt_mel"]).max()),
    }
    if "out_e2e_wave" in data and sampled:
        tokens = torch.tensor([sampled], dtype=torch.int32)
        e2e = models.hift.inference(models.flow.inference(tokens, T("in_flow_prompt_token"), T("in_flow_prompt_feat"),
                                                          T("in_flow_embedding")))
        if e2e.shape == data["out_e2e_wave"].shape:
            result["e2e_wave_rel"] = _rel(e2e.numpy(), data["out_e2e_wave"])
        else:
            result["e2e_wave_rel"] = float("inf")
    return result
