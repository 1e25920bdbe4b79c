"""CosyVoice 2 speech-token language model: Qwen2 (transformers) + speech-token embeddings and head.

The Qwen2 body comes from transformers (optional extra `pip install .[cosyvoice]`), built from the
release's `CosyVoice-BlankEN/config.json`; every weight comes from `llm.pt`. Decoding follows the
released runtime: [sos] text [task] prompt-speech-tokens, then one token per step with a KV cache,
sampled by top-p/top-k nucleus sampling with the repetition-aware rule (VALL-E 2): when the drawn
token already occurs in the last `win_size` tokens, it is banned and a token is drawn from the full
distribution instead. All draws use one torch.Generator, so the same seed gives the same tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch import nn


def require_transformers():
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ImportError("CosyVoice 2 needs transformers for its Qwen2 language model: "
                          "pip install 'comfyui-digital-human[cosyvoice]' (or pip install transformers)") from exc
    return transformers


@dataclass(frozen=True)
class SamplingConfig:
    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1


def nucleus_pick(scores: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> int:
    probs, order = scores.softmax(dim=0).sort(descending=True, stable=True)
    # Keep adding the most likely tokens while the running float32 sum is below top_p (and fewer
    # than top_k are kept): a sequential float32 sum, so the cut falls where the reference's does.
    kept: list[float] = []
    total = np.float32(0.0)
    limit = np.float32(cfg.top_p)
    for value in probs[: cfg.top_k].tolist():
        if not (len(kept) == 0 or total < limit):
            break
        total = np.float32(total + np.float32(value))
        kept.append(value)
    draw = torch.tensor(kept, dtype=scores.dtype).multinomial(1, replacement=True, generator=generator)
    return int(order[int(draw)])


def ras_sample(scores: torch.Tensor, history: list[int], cfg: SamplingConfig,
               generator: torch.Generator | None) -> int:
    """Repetition-aware sampling on log-probabilities `scores` (1-D); may modify `scores`."""
    token = nucleus_pick(scores, cfg, generator)
    repeats = sum(1 for t in history[-cfg.win_size:] if t == token)
    if repeats >= cfg.win_size * cfg.tau_r:
        scores[token] = -float("inf")
        # drawn on the CPU (the generator's device), so a seed means the same on every device
        token = int(scores.softmax(dim=0).cpu().multinomial(1, replacement=True, generator=generator))
    return token


class _QwenHolder(nn.Module):
    """Keeps the `llm.model.*` key prefix of the released checkpoint."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model


def qwen2_from_config(config_dir: Path) -> nn.Module:
    transformers = require_transformers()
    config = transformers.Qwen2Config.from_pretrained(str(config_dir))
    config._attn_implementation = "sdpa"
    try:
        from transformers.modeling_utils import no_init_weights
    except ImportError:  # moved in some releases; then pay for the random initialisation
        from contextlib import nullcontext as no_init_weights

    with no_init_weights():  # every weight comes from llm.pt; skip 0.5 B random initialisations
        model = transformers.Qwen2ForCausalLM(config)
    model.tie_weights()  # skipped under no_init_weights; the release ties lm_head to embed_tokens
    return model


class SpeechLM(nn.Module):
    """Qwen2LM of CosyVoice 2 (inference only)."""

    def __init__(self, qwen: nn.Module, speech_token_size: int = 6561,
                 sampling: SamplingConfig = SamplingConfig()) -> None:
        super().__init__()
        hidden = qwen.config.hidden_size
        self.speech_token_size = speech_token_size
        self.sampling = sampling
        self.llm_embedding = nn.Embedding(2, hidden)  # 0 = sos, 1 = task id
        self.llm = _QwenHolder(qwen)
        self.llm_decoder = nn.Linear(hidden, speech_token_size + 3)
        self.speech_embedding = nn.Embedding(speech_token_size + 3, hidden)

    @property
    def stop_tokens(self) -> range:
        return range(self.speech_token_size, self.speech_token_size + 3)

    def prompt_embeddings(self, text: torch.Tensor, prompt_text: torch.Tensor,
                          prompt_speech_token: torch.Tensor) -> torch.Tensor:
        text_emb = self.llm.model.model.embed_tokens(torch.cat([prompt_text, text], dim=1).long())
        sos = self.llm_embedding.weight[0].reshape(1, 1, -1)
        task = self.llm_embedding.weight[1].reshape(1, 1, -1)
        parts = [sos, text_emb, task]
        if prompt_speech_token.shape[1]:
            parts.append(self.speech_embedding(prompt_speech_token.long()))
        return torch.cat(parts, dim=1)

    def _step(self, embeds: torch.Tensor, cache):
        out = self.llm.model.model(inputs_embeds=embeds,
                                   attention_mask=torch.ones(1, embeds.shape[1], dtype=torch.bool, device=embeds.device),
                                   use_cache=True, past_key_values=cache, return_dict=True)
        return out.last_hidden_state[:, -1], out.past_key_values

    @torch.inference_mode()
    def logits_trace(self, text: torch.Tensor, prompt_text: torch.Tensor, prompt_speech_token: torch.Tensor,
                     forced: list[int]) -> torch.Tensor:
        """Log-probabilities of each step when the tokens `forced` are fed back (teacher forcing)."""
        embeds, cache, rows = self.prompt_embeddings(text, prompt_text, prompt_speech_token), None, []
        for token in [None, *forced]:
            if token is not None:
                embeds = self.speech_embedding.weight[token].reshape(1, 1, -1)
            hidden, cache = self._step(embeds, cache)
            rows.append(self.llm_decoder(hidden).log_softmax(dim=-1)[0])
        return torch.stack(rows)

    @torch.inference_mode()
    def generate(self, text: torch.Tensor, prompt_text: torch.Tensor, prompt_speech_token: torch.Tensor,
                 generator: torch.Generator | None = None, min_token_text_ratio: float = 2,
                 max_token_text_ratio: float = 20) -> Iterator[int]:
        """Yield speech tokens one by one. text/prompt_text: [1, N] Qwen token ids."""
        min_len = int(text.shape[1] * min_token_text_ratio)
        max_len = int(text.shape[1] * max_token_text_ratio)
        embeds, cache, history = self.prompt_embeddings(text, prompt_text, prompt_speech_token), None, []
        for step in range(max_len):
            hidden, cache = self._step(embeds, cache)
            logp = self.llm_decoder(hidden).log_softmax(dim=-1)[0]
            if step < min_len:
                logp[self.speech_token_size] = -float("inf")
            token = ras_sample(logp, history, self.sampling, generator)
            if token in self.stop_tokens:
                return
            yield token
            history.append(token)
            embeds = self.speech_embedding.weight[token].reshape(1, 1, -1)
