"""The pack's side of the CosyVoice 2 parity check (tools/cosyvoice_parity.py runs the reference side).

A reference record (.npz) holds the inputs and outputs of each stage, made by the reference code;
`compare` runs the pack's loader and networks on the same inputs. A fixture record also holds the
reference's key/shape manifest and the weight seed, so its release folder is rebuilt here.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def write_release_from_fixture(data: Any, folder: Path) -> Path:
    """Rebuild a release folder (seeded weights, reference manifest) for a fixture; returns it."""
    import torch

    from .random_release import write_support_files
    from .random_weights import seeded_state_dict

    meta = json.loads(str(data["meta"][()]))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cosyvoice2.yaml").write_text(meta["yaml"])
    write_support_files(folder, meta["qwen_config"], speech_vocab=meta["manifest"]["flow"]["input_embedding.weight"][0])
    for name, shapes in meta["manifest"].items():
        state = seeded_state_dict({k: tuple(s) for k, s in shapes.items()}, meta["seeds"]["weights"])
        torch.save(state, folder / f"{name}.pt")
    return folder


def compare(data: Any, folder: Path) -> dict[str, float]:
    """Run the pack on the recorded inputs; max |difference| per stage (tokens: count of mismatches)."""
    import torch

    from .features import prompt_mel
    from .release import load_models

    meta = json.loads(str(data["meta"][()]))
    models = load_models(folder)
    T = lambda k: torch.from_numpy(data[k])  # noqa: E731
    gen = torch.Generator().manual_seed(meta["seeds"]["lm"])
    tokens = list(models.lm.generate(T("in_lm_text"), T("in_lm_prompt_text"), T("in_lm_prompt_speech"), generator=gen))
    ref_tokens = data["out_lm_tokens"].tolist()
    logp = models.lm.logits_trace(T("in_lm_text"), T("in_lm_prompt_text"), T("in_lm_prompt_speech"), ref_tokens)
    ref_logp = data["out_lm_logp"]
    rows = min(len(ref_logp), len(logp))
    finite = np.isfinite(ref_logp[:rows])
    mel = models.flow.inference(T("in_flow_token"), T("in_flow_prompt_token"), T("in_flow_prompt_feat"),
                                T("in_flow_embedding"))
    wave = models.hift.inference(T("out_flow_mel"), generator=torch.Generator().manual_seed(meta["seeds"]["hift"]))
    feat = prompt_mel(T("in_audio24k"))
    return {
        "lm_token_mismatches": float(len(tokens) != len(ref_tokens) or sum(a != b for a, b in zip(tokens, ref_tokens))),
        "lm_tokens": float(len(tokens)),
        "lm_logp_max_abs": float(np.abs(logp[:rows].numpy()[finite] - ref_logp[:rows][finite]).max()),
        "flow_mel_max_abs": float(np.abs(mel.numpy() - data["out_flow_mel"]).max()),
        "flow_mel_ref_absmax": float(np.abs(data["out_flow_mel"]).max()),
        "hift_wave_max_abs": float(np.abs(wave.numpy() - data["out_hift_wave"]).max()),
        "hift_wave_ref_absmax": float(np.abs(data["out_hift_wave"]).max()),
        "prompt_mel_max_abs": float(np.abs(feat.numpy() - data["out_prompt_mel"]).max()),
    }


def ras_distribution(logp: Any, window: list[int], cfg: Any) -> np.ndarray:
    """Exact probabilities of lm.ras_sample's draw for 1-D log-probabilities `logp` and history `window`
    (float64), for checking samplers by their frequencies: the nucleus cut as ras_sample makes it
    (sequential float32 sum), each kept token drawn in proportion to its probability, and a drawn token
    repeated in the window replaced by a draw from the full distribution without it."""
    probs = logp.detach().float().softmax(dim=0).double().cpu().numpy()
    order = np.argsort(-probs, kind="stable")
    kept, total = [], np.float32(0.0)
    for token in order[: cfg.top_k]:
        if kept and not total < np.float32(cfg.top_p):
            break
        total = np.float32(total + np.float32(probs[token]))
        kept.append(int(token))
    nucleus = probs[kept] / probs[kept].sum()
    recent = window[-cfg.win_size:]
    out = np.zeros_like(probs)
    for token, q in zip(kept, nucleus):
        if recent.count(token) >= cfg.win_size * cfg.tau_r:
            rest = probs.copy()
            rest[token] = 0.0
            out += q * rest / rest.sum()
        else:
            out[token] += q
    return out
